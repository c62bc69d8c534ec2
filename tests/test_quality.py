"""Regression guard: each drafter's MAT and steps on fixed prompts, against saved values.

Greedy decoding of fixed prompts is deterministic, so these figures do not move with the
machine's load: a change that makes a drafter draft worse (a lower MAT, more target
forwards) fails here, whatever the wall times do. The saved values are in
``tests/data/quality_baseline.json``; after a deliberate change, refresh them with::

    specdec bench quality --write tests/data/quality_baseline.json

(from the repository root, so that REST's datastore is built over ``../shared/data``'s
GSM8K, as here). The check itself (:func:`specdec.bench.quality.check`) is tested on hand
cases below, without the model.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from conftest import SHARED_DATA

from specdec.bench.quality import (
    BUDGET,
    MAX_NEW_TOKENS,
    build_datastores,
    check,
    improvements,
    load_saved,
    measure,
    not_measured,
    suite,
)

BASELINE = Path(__file__).parent / "data" / "quality_baseline.json"


def figures(*prompts: tuple[float, int]) -> dict[str, Any]:
    """Saved-style figures of one drafter: ``(mat, steps)`` per prompt p0, p1, ..."""
    per_prompt = {f"p{i}": {"mat": mat, "steps": steps} for i, (mat, steps) in enumerate(prompts)}
    steps = sum(p["steps"] for p in per_prompt.values())
    emitted = sum(p["mat"] * p["steps"] for p in per_prompt.values())
    return {"mat": emitted / steps, "steps": steps, "prompts": per_prompt}


def test_check_holds_each_prompt_and_each_drafter() -> None:
    saved = {"pld": figures((2.0, 50), (1.0, 10))}
    assert check({"pld": figures((1.99, 50), (1.0, 10))}, saved, tolerance=0.03) == []
    assert check({"pld": figures((1.95, 51), (1.0, 10))}, saved, tolerance=0.03) == []
    dropped = check({"pld": figures((1.90, 53), (1.0, 10))}, saved, tolerance=0.03)
    assert dropped == ["pld (tolerance 3% per prompt): p0 MAT 1.900 in 53 steps (saved 2.000 in 50)"]
    assert check({"pld": figures((2.0, 52), (1.0, 10))}, saved, tolerance=0.03)  # more steps alone is a regression
    # One prompt worse, another better: the totals would hide it; the prompt fails.
    hidden = check({"pld": figures((2.5, 40), (0.9, 11))}, saved, tolerance=0.03)
    assert len(hidden) == 1 and "p1 MAT 0.900 in 11 steps" in hidden[0] and "p0" not in hidden[0]
    unmeasured_prompt = check({"pld": {"mat": 2.0, "steps": 50, "prompts": {"p0": {"mat": 2.0, "steps": 50}}}}, saved)
    assert unmeasured_prompt == ["pld (tolerance 3% per prompt): p1 not measured"]
    missing = check({"sam": figures((3.0, 10))}, saved, left_out={"pld": "no corpus"})
    assert missing == ["sam: no saved figures; refresh them with `specdec bench quality --write "
                       "tests/data/quality_baseline.json`"]
    assert improvements({"pld": figures((2.2, 45))}, {"pld": figures((2.0, 50))}, tolerance=0.03) == [
        "pld: MAT 2.200, saved 2.000"]
    assert improvements({"pld": figures((2.05, 49))}, {"pld": figures((2.0, 50))}, tolerance=0.03) == []


def test_a_saved_drafter_not_measured_fails_unless_a_reason_is_given() -> None:
    saved = {"pld": figures((2.0, 50)), "rest": figures((1.5, 60))}
    measured = {"pld": figures((2.0, 50))}
    assert check(measured, saved) == ["rest: saved but not measured, and no reason given"]
    assert check(measured, saved, left_out={"rest": "no corpus for its datastore"}) == []
    assert not_measured(saved, measured, {"rest": "no corpus for its datastore"}) == [
        "rest: no corpus for its datastore"]


@pytest.mark.slow
def test_mat_and_steps_hold_their_saved_values(default_model: tuple[Any, Any],
                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    from specdec.bench.methods import drafter_context

    model, tokenizer = default_model
    saved = load_saved(BASELINE)
    assert (saved["max_new_tokens"], saved["budget"]) == (MAX_NEW_TOKENS, BUDGET), "saved with other settings"
    corpus = SHARED_DATA / "corpora" / "gsm8k_train.jsonl"
    datastores = build_datastores(tokenizer, corpus, tmp_path_factory.mktemp("quality")) if corpus.exists() else {}
    specs, left_out = suite(drafter_context(model, tokenizer), datastores)
    measured = measure(model, tokenizer, specs)  # every output checked against plain decoding's
    summary = ", ".join(f"{label} {f['mat']:.3f}/{f['steps']}" for label, f in measured.items())
    skipped = not_measured(saved["drafters"], measured, left_out)
    print(f"\nMAT/steps: {summary}; not measured: {'; '.join(skipped) or 'none'}")
    if skipped:
        warnings.warn("saved drafters not measured here: " + "; ".join(skipped), stacklevel=1)
    problems = check(measured, saved["drafters"], saved["tolerance"], left_out)
    assert not problems, "MAT regression:\n" + "\n".join(problems)
    better = improvements(measured, saved["drafters"], saved["tolerance"])
    if better:
        warnings.warn("MAT rose; refresh tests/data/quality_baseline.json to guard it: " + "; ".join(better),
                      stacklevel=1)
