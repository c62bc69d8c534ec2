"""Planner statistics saved across runs (specdec.budget.planner_stats) and the `specdec cache` command.

Layers: the models' state round trips (hand cases and bad rows), what a generator loads
and saves on tiny fp64 models (identity, carry-over, the off switches, relocation), every
kind of bad file (truncated, a flipped byte, another version, another model, bad values,
not JSON, an unwritable directory: a warning and a correct run each), and the cache
command. Calibration is replaced by a synthetic table, so no test depends on this
machine's speed or load.
"""

from __future__ import annotations

import functools
import json
import random
import warnings
from pathlib import Path
from typing import Any

import pytest
from conftest import use_private_cache
from test_lossless import hf_greedy
from tiny_models import tiny_model

import specdec
from specdec.budget import AcceptanceModel, Throughput
from specdec.budget.acceptance import node_keys
from specdec.budget.planner_stats import VERSION, PlannerStatsFile, drafter_label, enabled, stats_dir
from specdec.cachefiles import checksum
from specdec.commands import main
from specdec.errors import SpecDecError
from specdec.types import DraftTree

PROMPT = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7]  # repeats: pld drafts, so acceptance is learned
NEW_TOKENS = 24
# The torch tree ops: a private cache directory would otherwise build the compiled ones again (a minute).
Generator = functools.partial(specdec.Generator, tree_ops="torch")


def learned_model(steps: int = 30) -> AcceptanceModel:
    model = AcceptanceModel()
    rng = random.Random(0)
    for _ in range(steps):
        tree = DraftTree.chain(1, [2, 3, 4], source="pld", feature=rng.randrange(1, 4))
        model.observe(tree, node_keys(tree), accepted_nodes=tuple(range(rng.randrange(1, 5))))
    return model


# -- state round trips ------------------------------------------------------------------


def test_acceptance_state_round_trips() -> None:
    model = learned_model()
    restored = AcceptanceModel()
    restored.load_state(json.loads(json.dumps(model.state(min_trials=0.0))))
    for key in {k for k in model._counts if len(k) == 4}:
        assert restored.conditional(key) == pytest.approx(model.conditional(key), rel=1e-12)  # type: ignore[arg-type]
    assert restored.trials(("pld",)) == pytest.approx(model.trials(("pld",)))


def test_acceptance_state_leaves_out_forgotten_keys() -> None:
    model = AcceptanceModel(memory=0.5)
    tree = DraftTree.chain(1, [2], source="old")
    model.observe(tree, node_keys(tree), accepted_nodes=(0, 1))
    for _ in range(20):  # 0.5 ** 20: forgotten
        other = DraftTree.chain(1, [2], source="new")
        model.observe(other, node_keys(other), accepted_nodes=(0,))
    assert {row[0] for row in model.state()} == {"new"}


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (["pld", 1.0], "a row must be"),
        ([3, 1.0, 0.5], "a key must be a source then ints"),
        (["pld", "2", 1.0, 0.5], "a key must be a source then ints"),
        (["pld", True, 1.0, 0.5], "a key must be a source then ints"),
        (["pld", 1.0, 2.0], "0 <= hits <= trials"),
        (["pld", -1.0, -1.0], "0 <= hits <= trials"),
        (["pld", float("nan"), 0.0], "0 <= hits <= trials"),
        (["pld", "1", 0.0], "counts must be numbers"),
        (None, "a row must be"),
    ],
)
def test_bad_acceptance_rows_are_refused_and_change_nothing(row: Any, message: str) -> None:
    model = learned_model()
    before = model.state(min_trials=0.0)
    with pytest.raises(SpecDecError, match=message):
        model.load_state([["pld", 1.0, 0.5], row])
    assert model.state(min_trials=0.0) == before


def test_throughput_state_round_trips_and_refuses_bad_values() -> None:
    measured = Throughput()
    for _ in range(5):
        measured.observe(3, 0.2, 0.15, 0.14)
    restored = Throughput()
    restored.load_state(json.loads(json.dumps(measured.state())))
    assert restored.rate(0.0) == pytest.approx(measured.rate(0.0)) and restored.overhead_s == measured.overhead_s
    fixed = Throughput(fixed_overhead_s=0.01)
    fixed.load_state(measured.state())
    assert fixed.overhead_s == 0.01  # a fixed overhead stays fixed
    for bad in ({**measured.state(), "seconds": -1.0}, {**measured.state(), "tokens": float("inf")},
                {"tokens": 1.0}, "not a dict"):
        with pytest.raises(SpecDecError, match="throughput state"):
            restored.load_state(bad)
    assert restored.rate(0.0) == pytest.approx(measured.rate(0.0))


# -- what generators load and save ------------------------------------------------------


def generate(model: Any, **options: Any) -> specdec.GenerationResult:
    """What ``specdec.run`` does (a Generator per call), on the torch tree ops."""
    with Generator(model, drafter="pld", **options) as generator:
        return generator.generate(PROMPT, max_new_tokens=NEW_TOKENS)


def test_statistics_carry_over_to_the_next_generator(planner_cache: Path) -> None:
    model = tiny_model("llama")
    first = Generator(model, drafter="pld")
    assert first.planner_memory.stats is not None and first.planner_memory.stats.runs == 0  # nothing saved yet
    result = first.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    assert result.tokens == hf_greedy(model, PROMPT, NEW_TOKENS)
    assert first.planner_memory.stats.path.parent == planner_cache and first.planner_memory.stats.path.is_file()
    learned = first.planner_memory.acceptance.state()
    # regression guard: pld drafted and was verified
    assert learned and first.planner_memory.acceptance.trials(("pld",)) > 0.0
    second = Generator(model, drafter="pld")
    assert second.planner_memory.stats is not None and second.planner_memory.stats.runs == 1
    assert second.planner_memory.acceptance.state() == learned  # decayed to the save, then carried as they are
    assert second.planner_memory.throughput.state() == first.planner_memory.throughput.state()
    # run() is a Generator per call: it loads what was saved and adds its own run.
    assert generate(model).tokens == result.tokens
    assert Generator(model, drafter="pld").planner_memory.stats.runs == 2  # type: ignore[union-attr]


def test_the_cost_models_refinement_carries_over_to_the_next_process(planner_cache: Path) -> None:
    """What the online refinement measured is saved with the statistics; a new process's cost model
    (the table alone: the in-process models forgotten) starts from it, while a model this process
    already refined keeps its own, and a refinement of another table is not taken."""
    from specdec.budget.calibration_cache import forget_cost_models

    model = tiny_model("llama")
    first = Generator(model, drafter="pld")
    first.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    refined = first.planner_memory.cost
    assert refined is not None and refined.observations > 0  # regression guard: steps were verified and timed
    saved = json.loads(first.planner_memory.stats.path.read_text())["body"]["cost"]  # type: ignore[union-attr]
    assert saved == refined.state()
    # This process: the next generator shares the live model (nothing loaded over it).
    second = Generator(model, drafter="pld")
    second.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    assert second.planner_memory.cost is refined
    # A new process: the model comes from the table, then takes the saved refinement before its first step.
    forget_cost_models()
    third = Generator(model, drafter="pld")
    saved = json.loads(third.planner_memory.stats.path.read_text())["body"]["cost"]  # type: ignore[union-attr]
    loaded, _ = third.planner_memory.load_cost(third.verifier)
    assert loaded is not refined and loaded.state() == saved and loaded.observations > 0
    # A refinement of another table (the machine was measured again since) is skipped without a word.
    forget_cost_models()
    fourth = Generator(model, drafter="pld")
    fourth.planner_memory.stats.cost = dict(saved, table="0" * 16)  # type: ignore[union-attr]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh, _ = fourth.planner_memory.load_cost(fourth.verifier)
    assert fresh.observations == 0
    # A damaged one warns and changes nothing.
    forget_cost_models()
    fifth = Generator(model, drafter="pld")
    fifth.planner_memory.stats.cost = dict(saved, ratio=[-1.0] * len(saved["ratio"]))  # type: ignore[union-attr]
    with pytest.warns(RuntimeWarning, match="ignoring the saved cost-model refinement"):
        damaged, _ = fifth.planner_memory.load_cost(fifth.verifier)
    assert damaged.observations == 0


def test_identity_separates_models_drafters_options_and_devices(planner_cache: Path) -> None:
    llama = Generator(tiny_model("llama"), drafter="pld")
    assert llama.planner_memory.stats is not None
    identity = llama.planner_memory.stats.identity
    assert identity["model_type"] == "llama" and identity["dtype"] == "float64" and identity["tokenizer"] == "none"
    assert identity["device"].startswith("cpu:") and identity["drafter"] == 'pld {}'
    paths = {
        llama.planner_memory.stats.path,
        Generator(tiny_model("llama", seed=1), drafter="pld").planner_memory.stats.path,  # type: ignore[union-attr]
        Generator(tiny_model("qwen2"), drafter="pld").planner_memory.stats.path,  # type: ignore[union-attr]
        Generator(tiny_model("llama"), drafter="recycling").planner_memory.stats.path,  # type: ignore[union-attr]
        Generator(tiny_model("llama"), drafter="pld",  # type: ignore[union-attr]
                          drafter_options={"num_draft": 4}).planner_memory.stats.path,
    }
    assert len(paths) == 5
    assert Generator(tiny_model("llama"), drafter="pld").planner_memory.stats.path == llama.planner_memory.stats.path  # type: ignore[union-attr]


def test_drafter_label_resolves_datastore_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert drafter_label("rest", {"datastore": "corpus.rest"}) == drafter_label(
        "rest", {"datastore": str(tmp_path / "corpus.rest")}
    )
    assert drafter_label(specdec.make_factory("pld").create()).endswith(":pld")


def test_drafter_label_names_a_draft_model_by_its_weights() -> None:
    llama, other = tiny_model("llama"), tiny_model("llama", seed=1)
    label = drafter_label("sam+model", {"model": {"draft_model": llama}})
    assert label == drafter_label("sam+model", {"model": {"draft_model": llama}})
    assert "LlamaForCausalLM weights " in label and "Linear" not in label  # not the module's repr
    assert label != drafter_label("sam+model", {"model": {"draft_model": other}})


def test_the_option_and_the_environment_turn_it_off(planner_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model("llama")
    off = Generator(model, drafter="pld", planner_cache=False)
    off.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    assert off.planner_memory.stats is None and not planner_cache.exists()
    assert Generator(model, drafter="none").planner_memory.stats is None  # plain decoding decides no budget
    for value in ("0", "false", "OFF", "no"):
        monkeypatch.setenv("SPECDEC_PLANNER_CACHE", value)
        assert not enabled() and Generator(model, drafter="pld").planner_memory.stats is None
    assert enabled(True)  # the option wins over the environment
    generate(model, planner_cache=True)
    assert planner_cache.is_dir()
    with pytest.raises(SpecDecError, match="planner_cache must be True, False or None"):
        Generator(model, drafter="pld", planner_cache="yes")  # type: ignore[arg-type]


def test_the_cache_directory_and_the_planner_directory_relocate_it(
    planner_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert stats_dir() == planner_cache  # <SPECDEC_CACHE_DIR>/planner
    monkeypatch.setenv("SPECDEC_PLANNER_DIR", str(tmp_path / "elsewhere"))
    generate(tiny_model("llama"))
    assert len(list((tmp_path / "elsewhere").glob("*.json"))) == 1 and not planner_cache.exists()


# -- bad files: a warning and a correct run ----------------------------------------------


def saved_file(model: Any) -> Path:
    generator = Generator(model, drafter="pld")
    generator.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    assert generator.planner_memory.stats is not None
    return generator.planner_memory.stats.path


def rewrite(path: Path, edit: Any) -> None:
    """Apply ``edit`` to the document's body and store it with a valid checksum (a crafted file)."""
    document = json.loads(path.read_text())
    edit(document["body"])
    document["checksum"] = checksum(document["body"])
    path.write_text(json.dumps(document))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def flip_a_byte(path: Path) -> None:
    """One digit becomes another: still JSON, and a value changes, so the checksum (over the parsed body) fails.

    The digit flipped is a number's units digit (the one before its point): that changes the value by one. A
    digit far down a float's mantissa may not (the 17th significant digit of a shortest repr can flip to a
    string naming the same double), which made this case pass or fail with the saved timings."""
    data = bytearray(path.read_bytes())
    index = data.index(b'"hits"') if b'"hits"' in data else 0
    units = [i for i in range(len(data) - 1) if chr(data[i]).isdigit() and data[i + 1] == ord(".")]
    digits = [i for i in units if i >= index] or units
    assert digits, "the statistics file holds no number with a point to damage"
    data[digits[len(digits) // 2]] ^= 0x01
    path.write_bytes(bytes(data))


def other_version(path: Path) -> None:
    document = json.loads(path.read_text())
    document["version"] = VERSION + 1
    path.write_text(json.dumps(document))


def other_model(path: Path) -> None:
    other = saved_file(tiny_model("llama", seed=1))
    path.write_bytes(other.read_bytes())  # the other model's file, copied under this model's name


BAD_FILES = {
    "truncated": (truncate, "is not JSON"),
    "a flipped byte": (flip_a_byte, "fails its checksum"),
    "another version": (other_version, "was saved by another specdec \\(format version 2"),
    "another model": (other_model, "belongs to another model.*differs in: weights"),
    "not JSON at all": (lambda p: p.write_bytes(b"\x00\xff garbage"), "is not JSON|cannot be read"),
    "not our format": (lambda p: p.write_text('{"format": "x"}'), "is not a specdec planner-statistics file"),
    "negative counts": (lambda p: rewrite(p, lambda b: b["acceptance"].append(["pld", -2.0, -3.0])),
                        "has bad values \\(acceptance state: counts must be finite with 0 <= hits <= trials"),
    "a bad throughput": (lambda p: rewrite(p, lambda b: b["throughput"].update(seconds="soon")),
                         "has bad values \\(throughput state: seconds must be"),
    "a bad run count": (lambda p: rewrite(p, lambda b: b.update(runs=-4)), "has a bad run count -4"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_file_warns_once_and_the_run_is_correct(planner_cache: Path, case: str) -> None:
    model = tiny_model("llama")
    path = saved_file(model)
    damage, message = BAD_FILES[case]
    damage(path)
    with pytest.warns(RuntimeWarning, match=f"ignoring the saved planner statistics .*: it ({message})") as caught:
        generator = Generator(model, drafter="pld")
    ours = [w for w in caught if "planner statistics" in str(w.message)]
    assert len(ours) == 1 and "\n" not in str(ours[0].message)  # one line
    assert generator.planner_memory.stats is not None and generator.planner_memory.stats.runs == 0  # a fresh start
    assert generator.planner_memory.acceptance.state() == []
    assert generator.generate(PROMPT, max_new_tokens=NEW_TOKENS).tokens == hf_greedy(model, PROMPT, NEW_TOKENS)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # replaced by a good file: no warning any more
        assert Generator(model, drafter="pld").planner_memory.stats.runs == 1  # type: ignore[union-attr]


def test_an_unwritable_directory_warns_and_the_run_is_correct(
    planner_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("SPECDEC_PLANNER_DIR", str(blocker))
    model = tiny_model("llama")
    with pytest.warns(RuntimeWarning, match="could not save the planner statistics"):
        result = generate(model)
    assert result.tokens == hf_greedy(model, PROMPT, NEW_TOKENS)


def test_store_read_names_what_is_wrong(tmp_path: Path) -> None:
    store = PlannerStatsFile(tmp_path / "x.json", {"model_type": "llama"})
    assert store.read() is None  # no file: nothing to load, no warning
    store.save(AcceptanceModel(), Throughput())
    assert store.read() is not None and store.runs == 1
    other = PlannerStatsFile(store.path, {"model_type": "qwen2"})
    with pytest.raises(SpecDecError, match="differs in: model_type"):
        other.read()


# -- specdec cache info | clear ----------------------------------------------------------


def test_cache_info_and_clear(planner_cache: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    saved_file(tiny_model("llama"))
    use_private_cache(monkeypatch, planner_cache.parent)  # `clear` below clears every kind: none of the user's
    user_file = planner_cache / "notes.txt"  # not specdec's: clear leaves it
    user_file.write_text("mine")
    (planner_cache.parent / "calibration").mkdir(exist_ok=True)
    assert main(["cache", "info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    kinds = {row["kind"]: row for row in report["kinds"]}
    assert report["cache_dir"] == str(planner_cache.parent) and report["planner_statistics"] == "on"
    assert kinds["planner"]["entries"] == 1 and kinds["planner"]["bytes"] > 0
    assert kinds["calibration"]["entries"] == 1  # the synthetic table was cached (a quiet "machine")
    (described,) = report["planner"]
    assert described["ok"] and described["runs"] == 1 and described["drafter"] == "pld {}"
    assert described["trials"] > 0
    assert main(["cache", "info"]) == 0
    text = capsys.readouterr().out
    assert "planner" in text and "pld {}" in text and "1 runs" in text
    assert main(["cache", "clear", "planner"]) == 0
    assert "planner      removed 1 entries" in capsys.readouterr().out
    assert list(planner_cache.iterdir()) == [user_file]
    assert kinds["calibration"]["entries"] == 1 and any((planner_cache.parent / "calibration").iterdir())
    assert main(["cache", "clear"]) == 0
    assert not any((planner_cache.parent / "calibration").iterdir()) and user_file.is_file()
    assert main(["cache", "clear", "everything"]) == 2
    assert "unknown cache kind 'everything'" in capsys.readouterr().err


def test_cache_info_reports_a_broken_file(planner_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = saved_file(tiny_model("llama"))
    truncate(path)
    assert main(["cache", "info"]) == 0
    assert "unreadable or stale" in capsys.readouterr().out
