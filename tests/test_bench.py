"""The benchmark runner, its reports and the replay simulator, on tiny fp64 models (fast).

Layers: hand cases of question loading, selection and method specs (with a clear error
for every bad input); an end-to-end run on a tiny model with the peers (``model.generate``
and its prompt lookup) that checks the recorded figures against what the hooks and the
stats must say, two-turn chats, the incremental save and ``--resume``; the report's
figures against hand-computed ones; the replay simulator's walk against hand cases and
an oracle drafter.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from tiny_models import VOCAB, tiny_model

from specdec.bench.cli import REPORT_FILE
from specdec.bench.methods import (
    ForwardMeter,
    build_methods,
    datastore_kinds,
    parse_method,
    parse_methods,
    with_datastores,
)
from specdec.bench.questions import load_questions, select_questions
from specdec.bench.replay import ReplayVerifier, judge, off_path_choice, replay
from specdec.bench.report import OVERALL, format_comparison, format_report, summarize
from specdec.bench.runner import BenchRun, BenchSettings
from specdec.cli import main
from specdec.drafters import make_factory
from specdec.errors import SpecDecError
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

    from specdec.datastores.format import TokenizerIdentity, write_datastore

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
    with pytest.raises(SpecDecError, match="add 'none:temperature=0.7' to the methods"):
        make_run(tmp_path, out="missing", methods=["none", "pld:temperature=0.7"])


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
    assert record["margin"] > 0 and record["near_tie"] == (record["margin"] < 1e-3)
    assert summarize(run.results)[OVERALL]["pld"]["different"] == (0 if record["near_tie"] else 1)


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
