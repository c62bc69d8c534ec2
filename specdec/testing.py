"""Tools for checking losslessness, used by the test suite and the benchmarks.

A batched tree forward and a one-token forward round differently (~1e-5 in fp32), so a
reference implementation (``model.generate``) may pick another token where the model's
top two logits nearly tie. :func:`compare_outputs` tells the two cases apart: identical
outputs, or a first difference sitting on such a near-tie, with the margin measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

# The largest top-two logit margin at which a differing token still counts as a near-tie.
NEAR_TIE_MARGIN = 1e-3


@dataclass(frozen=True)
class Comparison:
    """How two outputs for the same prompt relate.

    ``first_difference`` is the index of the first differing token (None when identical,
    or when one output is a prefix of the other, which is reported as ``prefix``).
    ``margin`` is the top-two logit margin the model gives at that position after the
    common prefix; ``near_tie`` says whether it is under :data:`NEAR_TIE_MARGIN`.
    """

    identical: bool
    first_difference: int | None = None
    margin: float | None = None
    prefix: bool = False

    @property
    def near_tie(self) -> bool:
        return self.margin is not None and self.margin < NEAR_TIE_MARGIN

    @property
    def acceptable(self) -> bool:
        """Identical, or differing first on a near-tie."""
        return self.identical or self.near_tie

    def describe(self) -> str:
        if self.identical:
            return "identical"
        if self.first_difference is None:
            return "one output is a prefix of the other (a stop rule differs)"
        return (
            f"first difference at new token {self.first_difference}, top-two logit margin there {self.margin:.3g} "
            f"({'a near-tie' if self.near_tie else 'NOT a near-tie'})"
        )


def top_two_margin(model: Any, ids: Sequence[int]) -> float:
    """The gap between the two largest next-token logits after ``ids`` (one plain forward)."""
    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([list(ids)], device=device), logits_to_keep=1).logits[0, -1]
    top = logits.float().topk(2).values
    return float(top[0] - top[1])


def compare_outputs(model: Any, prompt: Sequence[int], ours: Sequence[int], theirs: Sequence[int]) -> Comparison:
    """Compare two continuations of ``prompt``; measure the margin at the first difference."""
    ours, theirs = list(ours), list(theirs)
    if ours == theirs:
        return Comparison(True)
    index = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    if index is None:
        return Comparison(False, prefix=True)
    margin = top_two_margin(model, list(prompt) + ours[:index])
    return Comparison(False, index, margin)
