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
    suite,
)

BASELINE = Path(__file__).parent / "data" / "quality_baseline.json"


def figures(mat: float, steps: int) -> dict[str, Any]:
    return {"mat": mat, "steps": steps, "prompts": {"p": {"mat": mat, "steps": steps}}}


def test_check_fails_on_a_drop_and_on_a_missing_drafter() -> None:
    saved = {"pld": figures(2.0, 50)}
    assert check({"pld": figures(1.99, 50)}, saved, tolerance=0.03) == []
    assert check({"pld": figures(1.95, 51)}, saved, tolerance=0.03) == []
    dropped = check({"pld": figures(1.90, 53)}, saved, tolerance=0.03)
    assert len(dropped) == 1 and dropped[0].startswith("pld: MAT 1.900 in 53 steps, saved 2.000 in 50 steps")
    assert check({"pld": figures(2.0, 52)}, saved, tolerance=0.03)  # more steps alone is a regression too
    missing = check({"sam": figures(3.0, 10)}, saved)
    assert len(missing) == 1 and "sam: no saved figures; refresh them" in missing[0]
    assert improvements({"pld": figures(2.2, 45)}, saved, tolerance=0.03) == ["pld: MAT 2.200, saved 2.000"]
    assert improvements({"pld": figures(2.05, 49)}, saved, tolerance=0.03) == []


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
    measured = measure(model, tokenizer, specs)
    summary = ", ".join(f"{label} {f['mat']:.3f}/{f['steps']}" for label, f in measured.items())
    print(f"\nMAT/steps: {summary}; left out for want of {corpus}: {left_out or 'none'}")
    problems = check(measured, saved["drafters"], saved["tolerance"])
    assert not problems, "MAT regression:\n" + "\n".join(problems)
    better = improvements(measured, saved["drafters"], saved["tolerance"])
    if better:
        warnings.warn("MAT rose; refresh tests/data/quality_baseline.json to guard it: " + "; ".join(better),
                      stacklevel=1)
