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

# The largest top-two logit margin at which a differing token still counts as a near-tie (fp32).
NEAR_TIE_MARGIN = 1e-3
# Half precisions round logits far more coarsely: bf16 keeps 8 significant bits, so two forwards
# of different shapes differ by ~2e-2 in logits of magnitude ~10 (measured on an H100,
# design.md section 6), and a margin below a few of those steps is still a near-tie.
_MARGINS = {"float64": 1e-6, "float32": NEAR_TIE_MARGIN, "float16": 0.05, "bfloat16": 0.25}


def near_tie_margin(dtype: torch.dtype) -> float:
    """The near-tie margin for a model of ``dtype`` (fp32's for dtypes not listed).

    >>> near_tie_margin(torch.float32), near_tie_margin(torch.bfloat16)
    (0.001, 0.25)
    """
    return _MARGINS.get(str(dtype).removeprefix("torch."), NEAR_TIE_MARGIN)


@dataclass(frozen=True)
class Comparison:
    """How two outputs for the same prompt relate.

    ``first_difference`` is the index of the first differing token (None when identical,
    or when one output is a prefix of the other, which is reported as ``prefix``).
    ``margin`` is the top-two logit margin the model gives at that position after the
    common prefix; ``near_tie`` says whether it is under ``limit``, the near-tie margin of
    the model's dtype (:func:`near_tie_margin`: :data:`NEAR_TIE_MARGIN` in fp32).
    """

    identical: bool
    first_difference: int | None = None
    margin: float | None = None
    prefix: bool = False
    limit: float = NEAR_TIE_MARGIN  # the near-tie margin for the model's dtype (near_tie_margin)

    @property
    def near_tie(self) -> bool:
        return self.margin is not None and self.margin < self.limit

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
    return Comparison(False, index, margin, limit=near_tie_margin(next(model.parameters()).dtype))
