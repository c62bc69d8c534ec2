"""The benchmark runner, its reports and the replay simulator, on tiny fp64 models (fast).

Layers: hand cases of question loading, selection and method specs (with a clear error
for every bad input); an end-to-end run on a tiny model with the peers (``model.generate``
and its prompt lookup) that checks the recorded figures against what the hooks and the
stats must say, two-turn chats, the incremental save and ``--resume``; the report's
figures against hand-computed ones; the replay simulator's walk against hand cases and
an oracle drafter.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from test_lossless import hf_greedy
from tiny_models import VOCAB, tiny_model

from specdec.bench.judge import judge_sampled, locate_draw
from specdec.bench.methods import (
    PEERS,
    ForwardMeter,
    build_methods,
    datastore_kinds,
    parse_method,
    parse_methods,
    with_datastores,
)
from specdec.bench.questions import load_questions, select_questions
from specdec.bench.report import OVERALL, format_comparison, format_report, regressions, summarize
from specdec.bench.results import load_results
from specdec.bench.runner import BenchRun, BenchSettings
from specdec.bench.stream_replay import (
    ReplayVerifier,
    Stream,
    cost_table,
    judge,
    off_path_choice,
    recorded_streams,
    replay,
    replay_spec,
    replay_table,
)
from specdec.commands import main
from specdec.commands.bench import REPORT_FILE
from specdec.drafters import make_factory
from specdec.errors import SpecDecError
from specdec.sampling import SamplingParams, position_uniform
from specdec.types import DraftTree, Feedback

# -- a character tokenizer with a chat template, so tiny models can answer text questions --


class CharTokenizer:
    """Characters to ids in ``[2, VOCAB)``; chat turns are marked by id 0 (user) and 1 (assistant)."""

    chat_template = "tiny"
    eos_token_id = None

    def encode(self, text: str) -> list[int]:
        return [2 + ord(c) % (VOCAB - 2) for c in text]

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text)}

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                            tokenize: bool = True) -> list[int]:
        ids: list[int] = []
        for message in messages:
            ids += [0 if message["role"] == "user" else 1, *self.encode(message["content"])]
        return [*ids, 1] if add_generation_prompt else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + t % 26) for t in ids)

    def get_vocab(self) -> dict[str, int]:
        return {f"<{i}>": i for i in range(VOCAB)}

    def __len__(self) -> int:
        return VOCAB


QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["abc abc abc", "more abc"]},
    {"question_id": 82, "category": "coding", "turns": ["def f(): return f", "again"]},
    {"question_id": 161, "category": "translation", "turns": ["hello hello"]},
    {"question_id": 162, "category": "translation", "turns": ["xyz xyz xyz xyz"]},
    {"question_id": 163, "category": "translation", "turns": ["one two one two"]},
]


def write_questions(path: Path, records: list[Any]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


# -- questions -------------------------------------------------------------------------------


def test_questions_group_mt_bench(tmp_path: Path) -> None:
    questions = load_questions(write_questions(tmp_path / "q.jsonl", QUESTIONS))
    assert [q.category for q in questions] == ["mt_bench", "mt_bench", "translation", "translation", "translation"]
    assert questions[1].fine_category == "coding" and questions[1].turns == ("def f(): return f", "again")


def test_selection_is_evenly_spaced_per_category(tmp_path: Path) -> None:
    questions = load_questions(write_questions(tmp_path / "q.jsonl", QUESTIONS))
    assert [q.question_id for q in select_questions(questions, 1)] == [81, 161]
    assert [q.question_id for q in select_questions(questions, 2)] == [81, 82, 161, 162]
    assert [q.question_id for q in select_questions(questions, None, ["translation"])] == [161, 162, 163]
    assert len(select_questions(questions, 50)) == 5


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "q.jsonl:2 is not JSON"),
        ("[1, 2]", "expected an object, got list"),
        ('{"question_id": "x", "category": "qa", "turns": ["a"]}', "question_id must be an int, got 'x'"),
        ('{"question_id": 5, "category": "", "turns": ["a"]}', "category must be a non-empty string, got ''"),
        ('{"question_id": 5, "category": "qa", "turns": []}', "turns must be a non-empty list"),
        ('{"question_id": 1, "category": "qa", "turns": ["a"]}', "question_id 1 appears twice"),
    ],
)
def test_bad_question_files_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text('{"question_id": 1, "category": "qa", "turns": ["a"]}\n' + line + "\n")
    with pytest.raises(SpecDecError, match=message.replace("[", r"\[")):
        load_questions(path)


def test_missing_and_empty_question_files(tmp_path: Path) -> None:
    with pytest.raises(SpecDecError, match="no question file at"):
        load_questions(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(SpecDecError, match="holds no questions"):
        load_questions(tmp_path / "empty.jsonl")


def test_bad_selections(tmp_path: Path) -> None:
    questions = load_questions(write_questions(tmp_path / "q.jsonl", QUESTIONS))
    with pytest.raises(SpecDecError, match="per_category must be a positive int, got 0"):
        select_questions(questions, 0)
    with pytest.raises(SpecDecError, match="unknown category 'rag'; the file has: mt_bench, translation"):
        select_questions(questions, 1, ["rag"])


# -- method specs ----------------------------------------------------------------------------


def test_method_specs() -> None:
    assert parse_method("pld").label == "pld" and parse_method("pld").options == {}
    spec = parse_method("pld:num_draft=6:max_ngram=4")
    assert (spec.label, spec.name, dict(spec.options)) == ("pld:num_draft=6:max_ngram=4", "pld",
                                                           {"num_draft": 6, "max_ngram": 4})
    spec = parse_method("short=rest:datastore=/tmp/x.rest")
    assert (spec.label, spec.name, dict(spec.options)) == ("short", "rest", {"datastore": "/tmp/x.rest"})
    assert parse_method("hf-pld:num_tokens=5").is_peer
    assert parse_method("none").is_greedy_baseline and not parse_method("pld").is_greedy_baseline
    assert [m.label for m in parse_methods(["none,pld", "p2=pld:num_draft=2"])] == ["none", "pld", "p2"]


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["=pld"], "has an empty label"),
        (["x="], "has an empty name"),
        (["pld:num_draft"], "option 'num_draft' is not key=value"),
        (["hf-pld:depth=3"], "hf-pld has no option 'depth'; valid options: num_tokens, max_ngram"),
        (["hf-generate:x=1"], "hf-generate has no option 'x'; valid options: none"),
        (["pld,pld"], "method label 'pld' appears twice"),
        ([",", ""], "no methods to benchmark"),
    ],
)
def test_bad_method_specs(specs: list[str], message: str) -> None:
    with pytest.raises(SpecDecError, match=message):
        parse_methods(specs)


def test_unknown_drafters_and_options_fail_before_any_run() -> None:
    model = tiny_model("llama")
    meter = ForwardMeter(model)
    try:
        with pytest.raises(SpecDecError, match=r"method 'nope': unknown drafter 'nope'.*\(or a peer: hf-generate"):
            build_methods(parse_methods(["nope"]), model, CharTokenizer(), meter)
        with pytest.raises(SpecDecError, match="method 'pld:depth=2': drafter 'pld' has no option 'depth'"):
            build_methods(parse_methods(["pld:depth=2"]), model, CharTokenizer(), meter)
    finally:
        meter.close()


def fake_datastore(path: Path, kind: str) -> Path:
    """A datastore file of ``kind`` (only its header matters to the runner)."""
    import numpy as np

    from specdec.cachefiles import TokenizerIdentity
    from specdec.datastores.format import write_datastore

    return write_datastore(path, kind=kind, kind_version=1, tokenizer=TokenizerIdentity("t", VOCAB),
                           arrays={"tokens": np.zeros(4, dtype=np.int64)})


def test_datastores_go_to_the_drafters_of_their_kind(tmp_path: Path) -> None:
    rest, sam = fake_datastore(tmp_path / "a.rest", "rest"), fake_datastore(tmp_path / "b", "sam")
    kinds = datastore_kinds([rest, sam])
    assert kinds == {"rest": str(rest), "sam": str(sam)}
    assert with_datastores("rest", {"budget": 8}, kinds) == {"budget": 8, "datastore": str(rest)}
    assert with_datastores("rest", {"datastore": "mine"}, kinds) == {"datastore": "mine"}  # explicit wins
    assert with_datastores("pld", {}, kinds) == {}
    assert with_datastores("sam+recycling", {"mode": "merge"}, kinds) == {"mode": "merge", "sam.datastore": str(sam)}
    assert with_datastores("sam+recycling", {"sam": {"l_bias": 2}}, kinds) == {"sam": {"l_bias": 2}}
    with pytest.raises(SpecDecError, match="two 'rest' datastores given"):
        datastore_kinds([rest, fake_datastore(tmp_path / "c.rest", "rest")])
    model = tiny_model("llama")
    meter = ForwardMeter(model)
    try:
        with pytest.raises(SpecDecError, match=r"no method in this run reads a 'sam' datastore \("):
            build_methods(parse_methods(["none", "hf-pld"]), model, CharTokenizer(), meter, datastores=[sam])
    finally:
        meter.close()


# -- end to end on a tiny model ----------------------------------------------------------------

METHODS = ["none", "hf-generate", "hf-pld", "pld", "p2=pld:num_draft=2"]


def make_run(tmp_path: Path, out: str = "run", turns: int = 1, resume: bool = False,
             methods: list[str] = METHODS, max_new_tokens: int = 24) -> BenchRun:
    settings = BenchSettings(model="tiny-llama", max_new_tokens=max_new_tokens, turns=turns, warmup_tokens=4)
    return BenchRun(tiny_model("llama"), CharTokenizer(), parse_methods(methods), settings, tmp_path / out,
                    questions_file=write_questions(tmp_path / "q.jsonl", QUESTIONS), command="test", resume=resume)


def test_run_records_what_the_hooks_and_stats_say(tmp_path: Path) -> None:
    # No generation times verifications of its own (a drift is followed online, never measured again: see
    # test_calibration_conditions), so the forward count is the decoding's alone, on a loaded machine too.
    questions = load_questions(write_questions(tmp_path / "q.jsonl", QUESTIONS))[1:4]
    run = make_run(tmp_path, max_new_tokens=12)
    results = run.run(questions, progress=False)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved == json.loads(json.dumps(results))  # the file is the run, finished
    assert saved["meta"]["finished"] and saved["meta"]["command"] == "test"
    assert saved["baseline"] == "none" and saved["reference"] == "none"
    assert [q["question_id"] for q in saved["questions"]] == [82, 161, 162]
    for question in saved["questions"]:
        runs = question["runs"]
        for label, record in runs.items():
            assert record["identical"], f"{label} on {question['question_id']}: fp64 output must equal plain's"
            assert record["new_tokens"] == 12 and record["steps"] == record["forwards"] - 1
            # The hooks counted exactly the decoding forwards (the stats' steps + the prefill):
            # one-time work such as a cost calibration was absorbed by the warm-up.
            assert record["extra_forwards"] == 0 and record["calibration_s"] in (0.0, None)
            assert record["emitted_by_steps"] == record["new_tokens"] - 1  # the prefill decides the first token
            assert record["mat"] == pytest.approx(record["emitted_by_steps"] / record["steps"], abs=1e-4)
            assert 0 < record["forward_s"] <= record["wall_s"]
        for label in ("none", "hf-generate"):
            assert runs[label]["mat"] == 1.0 and runs[label]["steps"] == 11
        assert runs["none"]["draft_s"] is not None and runs["hf-generate"]["draft_s"] is None
        assert runs["hf-generate"]["sources"] is None
        assert sum(runs["pld"]["sources"]["steps"].values()) == runs["pld"]["steps"]
        assert len({r["output_sha1"][0] for r in runs.values()}) == 1
    assert set(summarize(saved)) == {"mt_bench", "translation", OVERALL}


def test_two_turns_ask_the_second_after_each_methods_own_answer(tmp_path: Path) -> None:
    questions = load_questions(write_questions(tmp_path / "q.jsonl", QUESTIONS))[:3]
    results = make_run(tmp_path, turns=2, methods=["none", "hf-generate", "pld"], max_new_tokens=12).run(
        questions, progress=False
    )
    first, third = results["questions"][0], results["questions"][2]
    assert first["turns"] == 2 and third["turns"] == 1  # translation questions have one turn
    record = first["runs"]["pld"]
    assert len(record["prompt_tokens"]) == 2 and record["prompt_tokens"][1] > record["prompt_tokens"][0] + 12
    assert record["new_tokens"] == 24 and record["identical"]
    assert first["runs"]["hf-generate"]["output_sha1"] == record["output_sha1"]


def test_sampled_methods_are_judged_against_plain_sampling_with_their_options(tmp_path: Path) -> None:
    questions = load_questions(write_questions(tmp_path / "q.jsonl", QUESTIONS))[2:4]
    methods = ["none", "s=none:temperature=0.9:seed=5", "pld", "ps=pld:temperature=0.9:seed=5",
               "ps2=pld:temperature=0.9:seed=6", "s2=none:temperature=0.9:seed=6"]
    results = make_run(tmp_path, methods=methods, max_new_tokens=16).run(questions, progress=False)
    assert results["references"] == {"none": "none", "s": "s", "pld": "none", "ps": "s", "ps2": "s2", "s2": "s2"}
    for question in results["questions"]:
        runs = question["runs"]
        assert all(record["identical"] for record in runs.values())
        assert runs["ps"]["output_sha1"] == runs["s"]["output_sha1"] != runs["none"]["output_sha1"]
        assert runs["ps2"]["output_sha1"] == runs["s2"]["output_sha1"] != runs["s"]["output_sha1"]
    with pytest.raises(SpecDecError, match="add 'none:temperature=0.7:seed=1' to the methods"):
        make_run(tmp_path, out="missing", methods=["none", "pld:temperature=0.7:seed=1"])
    with pytest.raises(SpecDecError, match="samples without a seed: add seed=N"):
        make_run(tmp_path, out="seedless", methods=["none", "none:temperature=0.7", "pld:temperature=0.7"])


def test_an_interrupted_run_keeps_its_questions_and_resumes(tmp_path: Path) -> None:
    questions = load_questions(write_questions(tmp_path / "q.jsonl", QUESTIONS))
    run = make_run(tmp_path, methods=["none", "pld"], max_new_tokens=8)
    pld = run.methods[1]
    calls = 0
    original = pld.generate

    def failing(prompt: Any, max_new_tokens: int) -> Any:
        nonlocal calls
        calls += 1
        if calls == 5:  # two warm-ups, question 1, question 2, then question 3 fails
            raise KeyboardInterrupt
        return original(prompt, max_new_tokens)

    pld.generate = failing  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        run.run(questions, progress=False)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [q["question_id"] for q in saved["questions"]] == [81, 82] and saved["meta"]["finished"] is None

    with pytest.raises(SpecDecError, match="results.json exists: pass --resume"):
        make_run(tmp_path, methods=["none", "pld"], max_new_tokens=8)
    with pytest.raises(SpecDecError, match="its settings differ"):
        make_run(tmp_path, methods=["none", "pld"], max_new_tokens=9, resume=True)
    with pytest.raises(SpecDecError, match="its methods differ"):
        make_run(tmp_path, methods=["none", "pld:num_draft=3"], max_new_tokens=8, resume=True)
    resumed = make_run(tmp_path, methods=["none", "pld"], max_new_tokens=8, resume=True).run(questions, progress=False)
    assert [q["question_id"] for q in resumed["questions"]] == [81, 82, 161, 162, 163]
    assert resumed["questions"][:2] == saved["questions"]  # what was measured is kept, not redone
    assert len(resumed["meta"]["resumed"]) == 1 and resumed["meta"]["finished"]


def test_a_differing_output_is_reported_with_its_margin(tmp_path: Path) -> None:
    questions = load_questions(write_questions(tmp_path / "q.jsonl", QUESTIONS))[2:3]
    run = make_run(tmp_path, methods=["none", "pld"], max_new_tokens=8)
    pld = run.methods[1]
    original = pld.generate

    def wrong(prompt: Any, max_new_tokens: int) -> Any:
        measurement = original(prompt, max_new_tokens)
        measurement.tokens[3] = (measurement.tokens[3] + 1) % VOCAB
        return measurement

    pld.generate = wrong  # type: ignore[method-assign]
    record = run.run(questions, progress=False)["questions"][0]["runs"]["pld"]
    assert not record["identical"] and record["first_difference"] == 3 and record["difference_turn"] == 0
    # A token changed with the rest left as it was: not plain decoding of its branch, whatever the margin.
    assert record["margin"] > 0 and not record["near_tie"] and record["tokens"][0] == (record["tokens"][1] + 1) % VOCAB
    assert "NOT" in record["finding"] and summarize(run.results)[OVERALL]["pld"]["different"] == 1


def test_cli_runs_reports_and_compares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    questions = load_questions(write_questions(tmp_path / "q.jsonl", QUESTIONS))[:2]
    for out in ("a", "b"):
        make_run(tmp_path, out=out, methods=["none", "pld"], max_new_tokens=8).run(questions, progress=False)
    assert main(["bench", "--report", str(tmp_path / "a")]) == 0
    report = capsys.readouterr().out
    assert "Speedup" in report and "| pld" in report and "mt_bench (2)" in report
    assert main(["bench", "--report", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    comparison = capsys.readouterr().out
    assert "2 questions in common; outputs changed from A to B: none 0, pld 0" in comparison
    assert main(["bench", "--report", "x", "y", "z"]) == 2
    assert "--report takes one or two run directories, got 3" in capsys.readouterr().err
    assert main(["bench", "--report", str(tmp_path / "nowhere")]) == 2
    assert "no benchmark results at" in capsys.readouterr().err
    assert main(["bench", "--questions", str(tmp_path / "q.jsonl")]) == 2
    assert "--out DIR is required" in capsys.readouterr().err


def test_plot_is_a_png(tmp_path: Path) -> None:
    from specdec.bench.plot import plot_speedup

    questions = load_questions(write_questions(tmp_path / "q.jsonl", QUESTIONS))[1:3]
    results = make_run(tmp_path, methods=["none", "pld", "hf-pld"], max_new_tokens=8).run(questions, progress=False)
    path = plot_speedup(results, tmp_path / "plot" / "speedup.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert REPORT_FILE == "report.md"


# -- report figures against hand-computed ones --------------------------------------------------


def record(tokens_per_s: float, steps: int, emitted: int, identical: bool = True, near_tie: bool = False,
           sha: str = "s") -> dict[str, Any]:
    return {"tokens_per_s": tokens_per_s, "steps": steps, "emitted_by_steps": emitted, "forwards": steps + 1,
            "new_tokens": emitted + 1, "wall_s": (emitted + 1) / tokens_per_s, "forward_s": 0.5 * (emitted + 1)
            / tokens_per_s, "identical": identical, "near_tie": near_tie, "draft_s": None, "other_s": None,
            "output_sha1": [sha]}


def synthetic_results(second_pld_sha: str = "s") -> dict[str, Any]:
    questions = [
        {"question_id": 1, "category": "qa", "runs": {"none": record(10, 9, 9), "pld": record(20, 3, 9)}},
        {"question_id": 2, "category": "qa", "runs": {"none": record(30, 9, 9),
                                                      "pld": record(20, 6, 9, False, True, second_pld_sha)}},
        {"question_id": 3, "category": "rag", "runs": {"none": record(10, 4, 4), "pld": record(5, 1, 4, False)}},
    ]
    meta = {"command": "c", "started": "t", "machine": {"cpu": "cpu", "platform": "p"},
            "model": {"name": "m", "dtype": "float32", "device": "cpu"},
            "settings": {"max_new_tokens": 10, "turns": 1}}
    return {"format": "specdec-bench/1", "meta": meta, "baseline": "none", "reference": "none",
            "methods": [{"label": "none"}, {"label": "pld"}], "questions": questions}


def test_report_figures_follow_spec_bench_definitions() -> None:
    summary = summarize(synthetic_results())
    qa = summary["qa"]["pld"]
    assert qa["mat"] == pytest.approx(18 / 9)  # emitted over steps, summed over questions
    assert qa["tokens_per_s"] == 20 and qa["speedup"] == pytest.approx(20 / 20)  # mean tok/s over mean tok/s
    assert (qa["identical"], qa["near_tie"], qa["different"]) == (1, 1, 0)
    overall = summary[OVERALL]["pld"]
    assert overall["speedup"] == pytest.approx((45 / 3) / (50 / 3)) and overall["mat"] == pytest.approx(22 / 10)
    assert (overall["identical"], overall["near_tie"], overall["different"]) == (1, 1, 1)
    assert overall["host_ms_per_forward"] is not None and overall["draft_ms_per_step"] is None
    assert list(summary) == ["qa", "rag", OVERALL]
    text = format_report(synthetic_results())
    assert "| pld    | 1.00x" in text and "1/3" in text


def test_regression_check_reads_two_results_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved, worse = synthetic_results(), synthetic_results()
    worse["questions"][0]["runs"]["pld"] = record(20, 5, 9)  # MAT 22/10 -> 22/12 overall
    worse["questions"][1]["runs"]["pld"]["near_tie"] = False  # a near-tie became a real difference
    assert regressions(saved, saved) == []
    problems = regressions(saved, worse)
    assert problems == ["pld: MAT 1.833, saved 2.200 (tolerance 3%)",
                        "pld: 2 outputs differ from the reference beyond the judge's near-tie/near-boundary "
                        "verdicts, saved 1"]
    for name, results in (("saved", saved), ("worse", worse)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(results))
    assert main(["bench", "--report", str(tmp_path / "saved"), str(tmp_path / "saved"), "--check"]) == 0
    assert "no regression from A to B" in capsys.readouterr().out
    assert main(["bench", "--report", str(tmp_path / "saved"), str(tmp_path / "worse"), "--check"]) == 1
    assert "Regressions from A to B:\npld: MAT 1.833" in capsys.readouterr().out


def test_comparison_counts_changed_outputs() -> None:
    text = format_comparison(synthetic_results(), synthetic_results(second_pld_sha="other"))
    assert "3 questions in common; outputs changed from A to B: none 0, pld 1" in text
    disjoint = synthetic_results()
    disjoint["questions"] = [{**q, "question_id": q["question_id"] + 10} for q in disjoint["questions"]]
    with pytest.raises(SpecDecError, match="the two runs share no questions"):
        format_comparison(synthetic_results(), disjoint)


# -- replay -------------------------------------------------------------------------------------


def test_judge_walks_the_stream_and_reports_choices() -> None:
    stream = [5, 6, 7, 8, 9]
    # root 6 (pending at index 1); children 7 (right) and 3 (wrong); 7 -> 8 (right) -> 2 (wrong)
    tree = DraftTree((6, 3, 7, 8, 2), (-1, 0, 0, 2, 3))
    path, feedback = judge(tree, stream, 1, vocab_size=50, topk=3)
    assert path == [0, 2, 3]  # the bonus is stream[4] = 9, not the drafted 2
    assert feedback is not None and feedback.topk.shape == (5, 3)
    assert feedback.topk[:, 0].tolist() == [7, off_path_choice(3, 1, 50), 8, 9, off_path_choice(2, 3, 50)]
    assert feedback.topk[2].tolist() == [8, 9, 10]
    with pytest.raises(SpecDecError, match="the tree's root 5 is not the pending token 6"):
        judge(DraftTree.single(5), stream, 1, vocab_size=50, topk=0)


class StreamOracle:
    """Drafts the next ``depth`` tokens of the stream exactly."""

    name = "oracle"
    feedback_topk = 2

    def __init__(self, stream: list[int], depth: int) -> None:
        self.stream, self.depth, self.position = stream, depth, 0
        self.feedback_rows = 0

    def reset(self, prompt: Any, feedback: Feedback | None = None) -> None:
        self.position = len(prompt)

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        return DraftTree.chain(pending, self.stream[self.position + 1 : self.position + 1 + self.depth])

    def update(self, accepted: Any, feedback: Feedback | None) -> None:
        assert feedback is not None
        self.feedback_rows += len(feedback.tokens)
        self.position += len(accepted)


def test_replay_of_an_oracle_accepts_every_draft() -> None:
    rng = random.Random(0)
    stream = [rng.randrange(VOCAB) for _ in range(100)]
    oracle = StreamOracle(stream, depth=4)
    stats = replay(oracle, stream, 10, vocab_size=VOCAB).stats
    # 89 tokens after the prefill's: 17 full steps of 5, then a last step cut to the 4 left.
    assert (stats.steps, stats.emitted_by_steps) == (18, 89) and stats.mat == pytest.approx(89 / 18)
    assert oracle.feedback_rows == sum(r.tree_size for r in stats.records) == 17 * 5 + 4


def test_replay_of_pld_finds_a_repeated_text() -> None:
    phrase = list(range(10, 40))
    stream = [*phrase, 3, 4, *phrase]
    result = replay(make_factory("pld").create(), stream, 31, vocab_size=VOCAB)
    assert result.tokens == stream[31:] and result.stats.mat > 3
    with pytest.raises(SpecDecError, match="prompt_len must be in"):
        replay(make_factory("pld").create(), stream, 0, vocab_size=VOCAB)


def test_replay_verifier_prefill() -> None:
    verifier = ReplayVerifier([5, 6, 7, 8], vocab_size=10)
    state, pending, feedback = verifier.prefill([5, 6], prompt_topk=2)
    assert (state.committed_len, pending) == (2, 7)
    assert feedback is not None and feedback.topk.tolist() == [[6, 7], [7, 8]]
    with pytest.raises(SpecDecError, match="a replay's prompt must be the stream's first 1 to 3 tokens"):
        verifier.prefill([6])
    with pytest.raises(SpecDecError, match="at least 2 tokens, got 1"):
        ReplayVerifier([5], vocab_size=10)


# -- the sampling judge ---------------------------------------------------------------------------


def test_locate_draw_finds_the_bucket_and_its_boundaries() -> None:
    params = SamplingParams(temperature=1.0, seed=3)
    logits = torch.log(torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64))
    u = position_uniform(3, 11)
    draw = locate_draw(logits, params, 11)
    expected = 0 if u < 0.25 else (1 if u < 0.75 else 2)
    assert draw.token == expected and draw.target == pytest.approx(u)
    assert (draw.low, draw.high) == pytest.approx([(0.0, 0.25), (0.25, 0.75), (0.75, 1.0)][expected])
    assert draw.distance == pytest.approx(min(u - draw.low, draw.high - u))


class RowMethod:
    """Stands in for a sampled method whose redo gives a fixed logits row (or None: not reproduced)."""

    def __init__(self, row: torch.Tensor | None) -> None:
        self.row = row
        self.spec = parse_method("x=none:temperature=1.0:seed=7")

    def redo(self, prompt: Any, measurement: Any, max_new_tokens: int, position: int) -> torch.Tensor | None:
        return self.row


def near_half_position(seed: int) -> int:
    """A position whose draw lies within 1e-4 of 0.5 under ``seed``."""
    return next(p for p in range(10**6) if abs(position_uniform(seed, p) - 0.5) < 1e-4)


def test_sampled_verdicts_near_boundary_real_and_unreproduced() -> None:
    position = near_half_position(7)
    u = position_uniform(7, position)
    even = torch.zeros(2, dtype=torch.float64)  # buckets [0, 0.5) and [0.5, 1): the draw sits at the edge
    # A rounding-sized tilt moves the edge past the draw: the tokens differ, both draws ~1e-4 from the edge.
    tilt = torch.tensor([0.0, (-1 if u > 0.5 else 1) * 8e-4], dtype=torch.float64)
    near = judge_sampled(RowMethod(even), RowMethod(tilt), [0] * position, None, None, 8, 0)
    assert near.reference is not None and near.ours is not None
    assert near.reference.token != near.ours.token and near.near_boundary
    assert near.distance is not None and near.distance < 2e-4 and near.limit == pytest.approx(2e-3)
    assert "near-boundary draw" in near.describe()
    # A large change (a bug: other logits) puts the draw far from any edge under ours: a real difference.
    real = judge_sampled(RowMethod(even), RowMethod(torch.tensor([3.0, 0.0], dtype=torch.float64)), [0] * position,
                         None, None, 8, 0)
    assert not real.near_boundary and "REAL difference" in real.describe()
    lost = judge_sampled(RowMethod(even), RowMethod(None), [0] * position, None, None, 8, 0)
    assert not lost.near_boundary and lost.distance is None and "did not reproduce" in lost.describe()
    assert lost.to_json()["ours"] is None and near.to_json()["near_boundary"] is True


def test_a_redo_returns_the_row_that_decided_the_position(tmp_path: Path) -> None:
    model = tiny_model("llama")
    meter = ForwardMeter(model)
    try:
        plain, ours = build_methods(parse_methods(["s=none:temperature=0.9:seed=5",
                                                   "ps=pld:temperature=0.9:seed=5:budget=full"]),
                                    model, CharTokenizer(), meter)
        prompt = CharTokenizer().encode("one two one two one two one")
        runs = [method.generate(prompt, 20) for method in (plain, ours)]
        assert runs[0].tokens == runs[1].tokens and runs[1].trees and max(t.size for t in runs[1].trees) > 1
        for index in (0, 7, 19):
            with torch.inference_mode():
                direct = model(torch.tensor([prompt + runs[0].tokens[:index]])).logits[0, -1]
            for method, run in zip((plain, ours), runs, strict=True):
                row = method.redo(prompt, run, 20, len(prompt) + index)
                assert row is not None and torch.allclose(row, direct, atol=1e-10), (method.spec.label, index)
        stranger = runs[1].__class__(**{**runs[1].__dict__, "trees": runs[0].trees[:3]})
        assert ours.redo(prompt, stranger, 20, len(prompt) + 10) is None  # not the run's trees: no row
        greedy = build_methods(parse_methods(["pld"]), model, CharTokenizer(), meter)[0]
        with pytest.raises(SpecDecError, match="recorded no trees"):
            greedy.redo(prompt, greedy.generate(prompt, 4), 4, len(prompt))
    finally:
        meter.close()


def test_a_redo_runs_each_forward_with_the_kernels_the_run_used() -> None:
    """A recalibration in the middle of a run (steps far slower than calibrated: a busy machine) may switch
    the verifier's kernels, whose logits differ in the last bits: the redo runs every forward with the
    kernels that forward ran (seen in CI: a redo after such a switch did not reproduce its run)."""
    from specdec.backends.specdec_engine.forward import CPU_KERNEL, SpecdecForward
    from specdec.types import DEFAULT_KERNEL, KernelChoice

    model = tiny_model("llama")
    meter = ForwardMeter(model)
    try:
        (method,) = build_methods(parse_methods(["ps=pld:temperature=0.9:seed=5:budget=full"]), model,
                                  CharTokenizer(), meter)
        inner = method._trees._inner  # type: ignore[attr-defined]
        assert isinstance(inner.forward, SpecdecForward)
        prompt = CharTokenizer().encode("one two one two one two one")
        method.generate(prompt, 4)  # the calibration picks kernels once, here
        first, other = KernelChoice.uniform(DEFAULT_KERNEL), KernelChoice.uniform(CPU_KERNEL)
        inner.use_kernels(first)
        verify, seen = inner.verify, []

        def switching(state: Any, tree: Any, topk: int = 0, features: bool = False) -> Any:  # recalibrates at step 3
            seen.append(inner.kernels)
            if len(seen) == 3:
                inner.use_kernels(other)
            return verify(state, tree, topk, features)

        inner.verify = switching
        run = method.generate(prompt, 16)
        assert run.kernels == [first, *seen] and seen[:3] == [first] * 3 and seen[3:] and set(seen[3:]) == {other}
        seen.clear()
        inner.use_kernels(first)  # as a later recalibration might leave it
        assert method.redo(prompt, run, 16, len(prompt) + 15) is not None  # type: ignore[attr-defined]
        assert seen == run.kernels[1:] and inner.kernels == first  # the run's kernels, then the verifier's own
    finally:
        meter.close()


def test_a_planted_logits_bug_is_a_real_difference_in_the_run(tmp_path: Path) -> None:
    questions = load_questions(write_questions(tmp_path / "q.jsonl", QUESTIONS))[2:3]
    run = make_run(tmp_path, methods=["none", "s=none:temperature=0.9:seed=5", "ps=pld:temperature=0.9:seed=5"],
                   max_new_tokens=16)
    verifier = run.methods[2]._trees._inner  # type: ignore[attr-defined]
    accept = verifier.ops.accept

    def sharper(tree: Any, logits: Any, *args: Any) -> Any:  # a bug: the speculative path sees other logits
        return accept(tree, logits * 3, *args)

    verifier.ops.accept = sharper
    results = run.run(questions, progress=False)
    record = results["questions"][0]["runs"]["ps"]
    assert not record["identical"] and not record["near_boundary"] and record["boundary"]["distance"] > 2e-3 / 0.9
    assert summarize(results)[OVERALL]["ps"]["different"] == 1
    report = format_report(results)
    assert "| ps " in report and "Differences from the reference" in report and "| different" in report


# -- peers, options, selection, formats -----------------------------------------------------------


def test_peers_are_a_table_and_hf_static_runs_a_static_cache(tmp_path: Path) -> None:
    assert set(PEERS) >= {"hf-generate", "hf-pld", "hf-static"}
    with pytest.raises(SpecDecError, match="hf-static has no option 'num_tokens'; valid options: compile"):
        parse_methods(["hf-static:num_tokens=3"])
    model = tiny_model("llama")
    meter = ForwardMeter(model)
    try:
        compiled, static, plain = build_methods(parse_methods(["hf-static", "hf-static:compile=false", "none"]),
                                                model, CharTokenizer(), meter)
        config = compiled._kwargs["compile_config"]  # type: ignore[attr-defined]
        assert config._compile_all_devices and compiled._kwargs["cache_implementation"] == "static"  # type: ignore[attr-defined]
        assert static._kwargs["disable_compile"] and "compile_config" not in static._kwargs  # type: ignore[attr-defined]
        prompt = CharTokenizer().encode("abc abc abc")
        before = meter.forwards
        ours, theirs = static.generate(prompt, 12), plain.generate(prompt, 12)
        assert ours.tokens == theirs.tokens and ours.forwards == 12 and ours.forward_s is None
        assert meter.forwards == before + 12  # only plain decoding's forwards were hooked: the peer ran unhooked
    finally:
        meter.close()


def test_a_static_cache_method_is_metered_by_the_models_hooks() -> None:
    """A static cache's verifier has a ``runner`` method, not a native runner object: the meter must not
    wrap it (it did, and every static-cache Spec-Bench run on a GPU stopped at the method's construction)."""
    model = tiny_model("llama")
    meter = ForwardMeter(model)
    try:
        (method,) = build_methods(parse_methods(["pld:engine=buckets:budget=full"]), model, CharTokenizer(), meter)
        prompt = CharTokenizer().encode("abc abc abc abc")
        method.generate(prompt, 12)  # the first call also prepares the cache: every bucket's forward once
        before = meter.forwards
        result = method.generate(prompt, 12)
        hooked = meter.forwards - before
        assert hooked == result.forwards > 0 and result.extra_forwards == 0  # the prefill and each step, once
        assert result.tokens == hf_greedy(model, prompt, 12)
    finally:
        meter.close()


def test_generator_options_reach_the_generator_and_keep_keeps_one_drafter() -> None:
    model = tiny_model("llama")
    meter = ForwardMeter(model)
    try:
        torch_ops, kept, fresh = build_methods(
            parse_methods(["pld:tree_ops=torch:budget=full", "k=recycling:keep=true", "recycling"]), model,
            CharTokenizer(), meter)
        assert torch_ops._generator.verifier.name == "torch"  # type: ignore[attr-defined]
        assert torch_ops._generation == {"budget": "full"}  # type: ignore[attr-defined]
        generator = kept._generator  # type: ignore[attr-defined]
        first = generator.new_drafter()
        assert generator.new_drafter() is first and fresh._generator.new_drafter() is not fresh._generator.new_drafter()  # type: ignore[attr-defined]
        kept.after_warmup()  # type: ignore[attr-defined]
        assert generator.new_drafter() is not first
        with pytest.raises(SpecDecError, match="method 'pld:cache_size=3': drafter 'pld' has no option 'cache_size'"):
            build_methods(parse_methods(["pld:cache_size=3"]), model, CharTokenizer(), meter)
    finally:
        meter.close()


def test_selection_by_question_ids(tmp_path: Path) -> None:
    questions = load_questions(write_questions(tmp_path / "q.jsonl", QUESTIONS))
    assert [q.question_id for q in select_questions(questions, None, None, [162, 81])] == [81, 162]
    with pytest.raises(SpecDecError, match="question id 999 is not in the selection"):
        select_questions(questions, None, None, [999])


def test_results_of_the_first_format_are_read_and_unknown_ones_refused(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "results.json").write_text(json.dumps(synthetic_results()))
    assert summarize(load_results(tmp_path / "old"))[OVERALL]["pld"]["near_boundary"] == 0
    (tmp_path / "odd.json").write_text(json.dumps({"format": "other/9"}))
    with pytest.raises(SpecDecError, match="format 'other/9'; readable: specdec-bench/1, specdec-bench/2"):
        load_results(tmp_path / "odd.json")


# -- replay of recorded outputs, cost curves -----------------------------------------------------------


def test_replay_of_a_recorded_run_gives_the_runs_own_mat(tmp_path: Path) -> None:
    from specdec.drafters import DrafterContext

    questions = load_questions(write_questions(tmp_path / "q.jsonl", QUESTIONS))
    methods = ["none", "pf=pld:budget=full", "p2=pld:num_draft=2:budget=full"]
    settings = BenchSettings(model="tiny-llama", max_new_tokens=24, warmup_tokens=4, keep_outputs=True)
    results = BenchRun(tiny_model("llama"), CharTokenizer(), parse_methods(methods), settings, tmp_path / "run",
                       questions_file=tmp_path / "q.jsonl").run(questions, progress=False)
    streams = recorded_streams(load_results(tmp_path / "run"))
    assert len(streams) == 5 and streams[0].output == results["questions"][0]["runs"]["none"]["outputs"][0]
    context = DrafterContext(vocab_size=VOCAB, eos_token_ids=(1,))
    cost = cost_table("reference")
    for label in ("pf", "p2"):
        spec = next(s for s in parse_methods(methods) if s.label == label)
        rows = replay_spec(spec, streams, context, cost)
        measured = [q["runs"][label] for q in results["questions"]]
        assert [r["steps"] for r in rows] == [m["steps"] for m in measured]  # greedy, fp64: exactly the run's
        assert [r["emitted"] for r in rows] == [m["emitted_by_steps"] for m in measured]
    table = replay_table(replay_spec(parse_methods(["pld:budget=auto"])[0], streams, context, cost))
    assert "| pld:budget=auto |" in table and "overall" in table
    with pytest.raises(SpecDecError, match="learns from the model's predictions"):
        replay_spec(parse_methods(["recycling"])[0], streams, context, cost)
    with pytest.raises(SpecDecError, match="option 'temperature' needs the model; a replay has none"):
        replay_spec(parse_methods(["pld:temperature=0.7:seed=1"])[0], streams, context, cost)
    alone, shared = (replay_spec(parse_methods([f"sam:budget=full:store={s}"])[0], streams, context, cost)
                     for s in ("false", "true"))
    assert [r["emitted"] for r in alone] == [r["emitted"] for r in shared]
    with pytest.raises(SpecDecError, match="the run has no method 'x'"):
        recorded_streams(results, "x")
    with pytest.raises(SpecDecError, match="unknown cost table 'fast'"):
        cost_table("fast")
    kept_none = {**results, "questions": [{**q, "runs": {"none": {}}} for q in results["questions"]]}
    with pytest.raises(SpecDecError, match="kept no outputs"):
        recorded_streams(kept_none)


def test_stream_replay_shares_what_a_generator_shares_and_request_replay_does_not() -> None:
    from specdec.drafters import DrafterContext

    rng = random.Random(7)
    prompt, output = [rng.randrange(2, VOCAB) for _ in range(12)], [rng.randrange(2, VOCAB) for _ in range(40)]
    twice = [Stream(1, "a", prompt, output), Stream(2, "a", list(prompt), list(output))]  # the same answer again
    context, cost = DrafterContext(vocab_size=VOCAB), cost_table("reference")
    sam, pld = parse_methods(["sam:budget=full", "pld:budget=full"])
    request, stream = (replay_spec(sam, twice, context, cost, mode) for mode in ("request", "stream"))
    # per request, the second sequence is a stranger to the first: the same steps
    assert request[1]["steps"] == request[0]["steps"] == stream[0]["steps"]
    # one store across them (a Generator's): the second finds the first's output and drafts it
    assert stream[1]["steps"] < request[1]["steps"] // 3, (stream[1]["steps"], request[1]["steps"])
    # nothing shared unless the options share it: store=false in stream mode is request mode
    alone = replay_spec(parse_methods(["sam:budget=full:store=false"])[0], twice, context, cost, "stream")
    assert [r["steps"] for r in alone] == [r["steps"] for r in request]
    assert [r["steps"] for r in replay_spec(pld, twice, context, cost, "stream")] == [
        r["steps"] for r in replay_spec(pld, twice, context, cost, "request")]  # pld keeps nothing across them
    table = replay_table([*request, *stream])
    assert "| sam:budget=full | request |" in table and "| sam:budget=full | stream  |" in table
    with pytest.raises(SpecDecError, match="unknown replay mode 'batch'"):
        replay_spec(sam, twice, context, cost, "batch")


def test_cost_curves_of_verifier_variants(tmp_path: Path) -> None:
    from specdec.bench.curves import gemm_limits, make_variants, measure, ratio_table, write

    model = tiny_model("llama")
    report = measure(model, "plain=auto:tree_ops=torch,wide=specdec:tree_ops=torch:kernels=cpu", (1, 3), (8,), 1)
    assert set(report["ms"]) == {"plain", "wide"} and all(len(v["8"]) == 2 for v in report["ms"].values())
    table = write(report, str(tmp_path / "curves"))
    assert "| 8       | wide" in table and (tmp_path / "curves" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    megabytes = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
    assert report["weight_read_ms"] > 0 and report["weight_mb"] == round(megabytes, 1)
    assert f"Reading the model's {report['weight_mb']} MB of weights once" in table
    reads = report["weight_read_ms_per_round"]  # the floor read in every round (1 context x 2 rounds)
    assert len(reads) == 2 and report["weight_read_ms"] <= min(reads)
    assert f"read in every round: {min(reads):.1f}-{max(reads):.1f} ms" in table
    assert report["gemm_peak_gflops"] > 0 and report["gflop_per_node"] == round(
        2 * sum(p.numel() for p in model.parameters()) / 1e9, 4)
    floor_3 = max(report["weight_read_ms"], report["gflop_per_node"] * 3 / report["gemm_peak_gflops"] * 1e3)
    assert f"3: {floor_3:.1f} ms (arithmetic: {report['gflop_per_node']} GFLOP per node" in table
    config = model.config  # the attention's arithmetic at context 8: 2 matmuls of heads x head dim x 8 per layer
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention = round(4 * config.num_hidden_layers * config.num_attention_heads * head_dim * 8 / 1e9, 4)
    assert report["attention_gflop_per_node"] == {"8": attention}
    with_attention = max(report["weight_read_ms"],
                         (report["gflop_per_node"] + attention) * 3 / report["gemm_peak_gflops"] * 1e3)
    assert (f"With the attention's arithmetic at context 8 ({attention} GFLOP per node more): "
            f"1: ") in table and f", 3: {with_attention:.1f} ms." in table
    from specdec.backends.specdec_engine import cpu_kernels

    if cpu_kernels.available():  # the path kernels=cpu ran: SPECDEC_CPU_ISA's, or the best this CPU has
        assert report["kernel_path"]["isa"] == cpu_kernels.cpu_isa()
        assert f"CPU kernel path (kernels=cpu): {cpu_kernels.cpu_isa()} (" in table
        # The arithmetic floor's peak is limited to the instructions of the path that ran (AVX2 forced on an
        # AVX-512 CPU: MKL limited to AVX2), and the table says so.
        assert report["gemm_limits"] == gemm_limits(cpu_kernels.cpu_isa())
        limits = " ".join(f"{key}={value}" for key, value in report["gemm_limits"].items())
        assert (f"limited as the kernel path is: {limits})" in table) == bool(limits)
    with pytest.raises(SpecDecError, match="variant 'x': the verifier has no setting 'speed'"):
        make_variants(model, "x=auto:speed=2")
    bench = {"benchmarks": [{"extra_info": {"op": "step", "backend": b, "device": "cpu", "nodes": 64,
                                            "committed": 1024}, "stats": {"median": m}}
                            for b, m in (("torch", 2e-3), ("cuda_ext", 5e-4))]}
    assert "| step | cpu    | 64    | 1K | 2000       | 500           | 4.0x    |" in ratio_table(bench)
    with pytest.raises(SpecDecError, match="no tree-op benchmarks"):
        ratio_table({"benchmarks": []})


def test_linears_bench_times_every_kernel_path_streamed_and_resident(tmp_path: Path) -> None:
    from specdec.backends.specdec_engine import cpu_kernels
    from specdec.bench.linears import default_paths, measure, weight_runs, write

    if not cpu_kernels.available():
        pytest.skip("specdec's CPU kernels do not build here")
    model = tiny_model("llama")
    linears = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    runs = weight_runs(model)  # every linear weight once, in order, cut where the in-features change
    assert [w.data_ptr() for run in runs for w in run] == [w.data_ptr() for w in linears]
    assert all(len({w.shape[1] for w in run}) == 1 for run in runs)
    assert all(a[-1].shape[1] != b[0].shape[1] for a, b in itertools.pairwise(runs))
    report = measure(model, (1, 5), None, 1)
    supported = cpu_kernels.supported_isas()
    assert report["paths"] == [*default_paths(), "torch"] and set(default_paths()) <= set(supported)
    assert "portable" not in default_paths() or supported == ["portable"]
    assert report["modes"] == ["streamed", "resident"] and report["layers"] == model.config.num_hidden_layers
    first_layer = sum(m.weight.numel() * m.weight.element_size() for m in model.model.layers[0].modules()
                      if isinstance(m, torch.nn.Linear))
    assert report["resident_mb"] == round(first_layer / 1e6, 1)
    assert report["weight_mb"] == round(sum(w.numel() * w.element_size() for w in linears) / 1e6, 1)
    for path in report["paths"]:
        for mode in report["modes"]:
            assert len(report["ms"][path][mode]) == 2 and all(v > 0 for v in report["gflops_per_thread"][path][mode])
    table = write(report, str(tmp_path / "linears"))
    assert all(f"| {path}" in table for path in report["paths"]) and "GFLOP/s per thread" in table
    assert (tmp_path / "linears" / "linears.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "linears" / "linears.json").read_text())["rows"] == [1, 5]
    with pytest.raises(SpecDecError, match="kernel path 'avx1024': this CPU runs"):
        measure(model, (1,), ["avx1024"], 1)
    with pytest.raises(SpecDecError, match="row counts must be positive"):
        measure(model, (0,), None, 1)
    assert main(["bench", "linears", "--paths", "avx1024"]) == 2  # refused before any model loads


def test_linears_command_names_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "linears", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all(option in out for option in ("--rows", "--paths", "--repeats", "--out"))


def test_judge_command_refuses_what_it_cannot_judge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    questions = str(write_questions(tmp_path / "q.jsonl", QUESTIONS))
    assert main(["bench", "judge", "--questions", questions, "--ids", "81", "--drafters", "pld"]) == 2
    assert "'pld' does not sample" in capsys.readouterr().err
    assert main(["bench", "judge", "--questions", questions, "--drafters", "pld:temperature=0.7:seed=1"]) == 2
    assert "the judge takes one question (--ids N), got 5" in capsys.readouterr().err
    assert main(["bench", "judge", "--questions", questions, "--ids", "81", "--drafters", "pld:temperature=0.7"]) == 2
    assert "samples without a seed" in capsys.readouterr().err


@pytest.mark.slow
def test_judge_command_on_the_default_model(default_model: tuple[Any, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """Spec-Bench question 241 as in docs/benchmarks.md, short: the redo reproduces both runs on the real model."""
    from conftest import SHARED_DATA

    questions = SHARED_DATA / "spec_bench" / "question.jsonl"
    if not questions.is_file():
        pytest.skip(f"{questions} is absent (the team's ../shared/data)")
    code = main(["bench", "judge", "--questions", str(questions), "--ids", "241", "--max-new-tokens", "12",
                 "--drafters", "sam+recycling:temperature=0.7:seed=1", "--position", "5"])
    out = capsys.readouterr().out
    assert code == 0, out
    verdict = json.loads(out[out.index("{"):])
    assert verdict["question_id"] == 241 and verdict["reference"] is not None and verdict["ours"] is not None
    if verdict["identical"]:
        assert verdict["index"] == 5 and verdict["reference"]["token"] == verdict["ours"]["token"]
    assert verdict["near_boundary"] == (verdict["distance"] <= verdict["limit"])


def test_datastore_costs_on_a_small_corpus(tmp_path: Path) -> None:
    """The costs command's measurements (no model: documents of random ids), one in a fresh process."""
    import numpy as np

    from specdec.bench.corpora import build_datastore
    from specdec.bench.datastore_costs import distribution, in_child, rest_build_alone, sam_load
    from specdec.cachefiles import TokenizerIdentity

    assert distribution([0.001, 0.003], "ms") == {"mean_ms": 2.0, "p50_ms": 2.0, "p90_ms": 2.8, "p99_ms": 2.98,
                                                   "max_ms": 3.0, "steps": 2}
    rng = np.random.default_rng(0)
    documents = [rng.integers(2, VOCAB, size=200, dtype=np.int64) for _ in range(20)]
    identity = TokenizerIdentity("tiny", VOCAB)
    for kind in ("sam", "rest"):
        build_datastore(kind, documents, tmp_path / f"c.{kind}", identity)
    loaded = in_child(sam_load, str(tmp_path / "c.sam"), True)
    assert loaded["tokens"] == 4000 and loaded["documents"] == 20 and loaded["states_per_token"] > 1
    rebuilt = rest_build_alone(str(tmp_path / "c.rest"))
    assert rebuilt["tokens"] == 4000 and rebuilt["bytes_per_token"] > 0 and not (tmp_path / "c.rebuilt").exists()


def test_the_batch_bench_runs_hugging_faces_static_cache_as_a_peer() -> None:
    """``specdec bench batch --drafters ...,hf-static``: HF's batched generate on its static cache (here
    uncompiled) beside plain ``hf-generate``, both peers in the ratios; other peers are refused."""
    from specdec.bench import batched

    model = tiny_model("llama")
    texts = ["abc abc abc abc", "hello hello", "xyz xy xyz xy xyz"]  # ragged: left padding in the HF groups
    runs = batched.measure(model, CharTokenizer(), texts, "none,hf-generate,hfs=hf-static:compile=false", [2], 8,
                           progress=False)
    by_arm = {r.arm: r for r in runs}
    assert set(by_arm) == {"none", "hf-generate", "hfs"} and by_arm["hfs"].peer and not by_arm["none"].peer
    for r in runs:
        assert len(r.rows) == 3 and r.acceptable == 3, (r.arm, r.verdicts)
    summary = batched.summarize(runs)
    assert set(summary["ratios"][2]) == {"none / hf-generate", "none / hfs"}
    with pytest.raises(SpecDecError, match="the batch benchmark's peers are hf-generate, hf-static"):
        batched.Arms(model, CharTokenizer(), "none,hf-pld")


def test_the_batch_bench_streams_up_to_64_held_out_prompts(capsys: pytest.CaptureFixture[str]) -> None:
    """``specdec bench batch --prompts 64``: the 16 held-out prompts the one-off measurements time, then 48 more
    of their four kinds, 12 each, none repeated; more than there are is refused before a model loads."""
    from specdec.bench.oneoff import heldout_prompts

    first, every = heldout_prompts(), heldout_prompts(extra=True)
    assert len(first) == 16 and len(every) == 64 and every[:16] == first
    assert len({p.text for p in every}) == 64
    kinds = [p.kind for p in every[16:]]
    assert {kind: kinds.count(kind) for kind in kinds} == {"humaneval": 12, "mbpp": 12, "gsm8k": 12, "code edit": 12}
    for count in ("65", "0"):
        assert main(["bench", "batch", "--model", "no/such/model", "--prompts", count]) == 2
        assert f"--prompts takes 1 to 64 held-out prompts, got {count}" in capsys.readouterr().err


def test_batch_summary_reports_the_full_batch_pace_and_the_tail() -> None:
    """The batch bench's step figures: the tokens/s of the steps with every place busy (prefills excluded), the
    tail's seconds and share of the run, and the full-batch pace over ``none``'s within each repeat."""
    from specdec.bench.batched import ArmRun, format_summary
    from specdec.bench.batched import summarize as summarize_batch

    rows = [[1] * 10, [2] * 10]
    runs = [ArmRun("none", 4, rows, 2.0, split={"full_s": 1.0, "full_tokens": 18, "tail_s": 0.1, "tail_tokens": 2}),
            ArmRun("sam+recycling", 4, rows, 2.0,
                   split={"full_s": 0.6, "full_tokens": 15, "tail_s": 0.5, "tail_tokens": 5})]  # fmt: skip
    steps = summarize_batch(runs)["steps"][4]
    assert steps["none"] == {"full_tokens_per_s": 18.0, "tail_s": 0.1, "tail_share": 0.05}
    assert steps["sam+recycling"] == {"full_tokens_per_s": 25.0, "tail_s": 0.5, "tail_share": 0.25,
                                      "full_over_none": round(25 / 18, 3)}  # fmt: skip
    text = format_summary(summarize_batch(runs))
    assert "25.0, 1.39x none; tail 0.50 s (25%)" in text and "18.0; tail 0.10 s (5%)" in text


def test_batch_summary_takes_each_figures_median_over_repeats() -> None:
    """``specdec bench batch --repeats 3``: each (arm, B) figure is the median of its runs, a ratio the median
    of the ratios within each repeat (the arms of one repeat ran in the same minute), identity counted over
    every run."""
    from specdec.bench.batched import ArmRun, format_summary
    from specdec.bench.batched import summarize as summarize_batch

    rows = [[1] * 10, [2] * 10]  # 20 tokens a run
    runs = [ArmRun("none", 2, rows, seconds, identical=2, acceptable=2) for seconds in (1.0, 0.5, 2.0)]
    runs += [ArmRun("sam+recycling", 2, rows, seconds, identical=same, acceptable=2)
             for seconds, same in ((0.4, 2), (0.25, 1), (10.0, 2))]  # fmt: skip
    summary = summarize_batch(runs)
    assert summary["tokens_per_s"][2] == {"none": 20.0, "sam+recycling": 50.0}  # medians of 20/10/40 and 50/80/2
    # repeat by repeat 50/20, 80/40, 2/10: median 2.0 (the medians' ratio, 50/20 = 2.5, pairs runs minutes apart)
    assert summary["ratios"][2] == {"sam+recycling / none": 2.0}
    assert summary["identical"] == {"none@2": "6/6", "sam+recycling@2": "5/6"} and summary["repeats"] == 3
    assert "median of 3 run(s)" in format_summary(summary) and "ratios within each repeat" in format_summary(summary)


def _fresh_results(rates: list[tuple[float, float, float, float]]) -> list[Any]:
    """One-off results whose arms ``run:s``, ``hf``, ``warmed:s`` and ``hf:warmed`` ran at ``rates`` tokens/s."""
    from specdec.bench.oneoff import Prompt, PromptResult, Timing

    arms = ("run:s", "hf", "warmed:s", "hf:warmed")
    return [PromptResult(Prompt("k", f"p{i}"), [1], {arm: Timing([0] * 100, 100 / rate)
                                                      for arm, rate in zip(arms, row, strict=True)})
            for i, row in enumerate(rates)]  # fmt: skip


def test_fresh_ratio_interval_tells_within_below_and_undecided() -> None:
    """``specdec bench oneoff --fresh`` gives the fresh/warmed ratio of speedups with a bootstrap interval over
    prompts, and says whether the run tells it from 0.95: every prompt level -> [1, 1]; every prompt 20% slower
    fresh -> below; prompts split between 0.8 and 1.1 -> undecided. The point is the ratio of the mean speedups."""
    from specdec.bench.oneoff import fresh_against_warmed, fresh_ratio

    level = fresh_ratio(_fresh_results([(60.0, 15.0, 60.0, 15.0)] * 8), "s")
    assert level is not None and level.ratio == pytest.approx(1.0) and level.low == level.high == pytest.approx(1.0)
    assert level.verdict().startswith("at or above 0.95")

    slower = fresh_ratio(_fresh_results([(48.0 + i, 15.0, 60.0 + 1.25 * i, 15.0) for i in range(8)]), "s")
    assert slower is not None and slower.ratio == pytest.approx(0.8) and slower.high < 0.95
    assert slower.verdict().startswith("below 0.95")

    rows = [(48.0, 15.0, 60.0, 15.0), (66.0, 15.0, 60.0, 15.0)] * 6
    mixed = fresh_ratio(_fresh_results(rows), "s")
    fresh_mean, warmed_mean = (48.0 + 66.0) / 2, 60.0
    assert mixed is not None and mixed.ratio == pytest.approx(fresh_mean / warmed_mean)
    assert mixed.low < 0.95 <= mixed.high and mixed.low <= mixed.ratio <= mixed.high
    assert mixed.verdict().startswith("this run cannot tell")
    assert fresh_ratio(_fresh_results(rows), "s") == mixed  # seeded: the same results give the same interval

    line = fresh_against_warmed(_fresh_results(rows), "s")
    assert line is not None and f"90% interval over prompts {mixed.low:.3f}-{mixed.high:.3f}" in line, line
    alone = _fresh_results(rows)
    for result in alone:
        del result.arms["warmed:s"], result.arms["hf:warmed"]
    assert fresh_ratio(alone, "s") is None and fresh_against_warmed(alone, "s") is None


@pytest.mark.parametrize("prompts", [1, 2, 3])
def test_fresh_ratio_from_too_few_prompts_gives_no_verdict(prompts: int) -> None:
    """One prompt resamples to itself: a zero-width interval, which must not read as a firm verdict. Below
    MIN_INTERVAL_PROMPTS the verdict says the run is insufficient, whatever the ratio; at it, a verdict again."""
    from specdec.bench.oneoff import MIN_INTERVAL_PROMPTS, fresh_against_warmed, fresh_ratio

    assert prompts < MIN_INTERVAL_PROMPTS == 4
    slower = _fresh_results([(48.0, 15.0, 60.0, 15.0)] * prompts)  # 20% slower fresh: "below" from enough prompts
    interval = fresh_ratio(slower, "s")
    assert interval is not None and interval.prompts == prompts and interval.to_json()["prompts"] == prompts
    assert interval.verdict() == (f"insufficient: {prompts} prompt(s), an interval over prompts needs at least "
                                  f"{MIN_INTERVAL_PROMPTS}")  # fmt: skip
    line = fresh_against_warmed(slower, "s")
    assert line is not None and "insufficient" in line and "below" not in line, line
    enough = fresh_ratio(_fresh_results([(48.0, 15.0, 60.0, 15.0)] * MIN_INTERVAL_PROMPTS), "s")
    assert enough is not None and enough.verdict().startswith("below 0.95")


def test_oneoff_plot_from_a_saved_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``specdec bench oneoff --replot DIR`` draws DIR/oneoff.png from DIR/results.json (what ``--out`` writes
    beside it after a run); a missing or foreign results file is a clear error."""
    from specdec.bench.oneoff import summarize

    summary = summarize(_fresh_results([(60.0, 15.0, 62.0, 15.5), (40.0, 14.0, 41.0, 14.2)]))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(json.dumps({"command": "specdec bench oneoff", "summary": summary}))
    assert main(["bench", "oneoff", "--replot", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "oneoff.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.strip() == str(tmp_path / "run" / "oneoff.png")
    assert main(["bench", "oneoff", "--replot", str(tmp_path / "nowhere")]) == 2
    assert "no readable one-off results at" in capsys.readouterr().err
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    assert main(["bench", "oneoff", "--replot", str(tmp_path / "other.json")]) == 2
    assert "is not a `specdec bench oneoff` results file" in capsys.readouterr().err


def test_the_gemm_peak_of_a_forced_path_is_measured_with_its_instructions() -> None:
    from specdec.bench.curves import gemm_limits, limited_gemm_peak_gflops

    assert gemm_limits("avx512") == {} and gemm_limits("avx512-blocks") == {}
    assert gemm_limits("avx2") == gemm_limits("avx2-blocks") == gemm_limits("avx2-lanes16")
    assert gemm_limits("avx2")["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    assert gemm_limits("portable")["MKL_ENABLE_INSTRUCTIONS"] == "SSE4_2"
    assert limited_gemm_peak_gflops(gemm_limits("avx2")) > 0  # the child runs and reports a number
    with pytest.raises(SpecDecError, match="measuring the GEMM peak under"):
        limited_gemm_peak_gflops({"PYTHONPATH": "/nonexistent", "PYTHONNOUSERSITE": "1", "PYTHONHOME": "/nonexistent"})


def test_a_plain_step_against_its_forward() -> None:
    """``specdec bench step``: both clocks at a context, the ratio, and parts that add up to the timed step."""
    from specdec.bench.step import PARTS, markdown, measure

    report = measure(tiny_model("llama"), None, (8,), 2, engine="specdec")
    assert [(row["clock"], row["context"]) for row in report["rows"]] == [("cpu", 8), ("wall", 8)]
    for row in report["rows"]:
        # the ratio of the unrounded times: within the ms figures' rounding (0.0005 ms) of theirs
        assert row["forward_ms"] > 0 and row["ratio"] == pytest.approx(row["step_ms"] / row["forward_ms"], rel=1e-2)
        assert list(row["parts_ms"]) == list(PARTS) and row["parts_ms"]["forward"] > 0
        assert sum(row["parts_ms"].values()) == pytest.approx(row["wrapped_step_ms"], abs=0.02)
    assert report["rows"][0]["threads"] == 1 and "| step / forward |" in markdown(report).replace("  ", " ")
