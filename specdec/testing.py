"""Tools for checking losslessness, used by the test suite and the benchmarks.

A batched tree forward and a one-token forward round differently (~1e-5 in fp32), so a
reference implementation (``model.generate``) may pick another token where the model's
top two logits nearly tie. :func:`compare_outputs` tells that case apart from a bug, and it
is strict about it:

1. **the first difference must be a tie of the model's top two**: the two outputs' tokens
   there are exactly the model's two best tokens after the common prefix (one plain forward
   of the model over it), and their logits are within the near-tie limit there
   (:func:`near_tie_limit`: the dtype's margin, and in half precision at least four rounding
   steps of the top logit). A token that is not one of the two, or a pair farther
   apart than the limit, is a real difference, however small the top-two margin is;
2. **after it, each output must be plain decoding of its own branch**: from the prefix plus
   each output's own token at the difference, plain greedy decoding is run again (the
   model's own forward, one token at a time: :func:`plain_continuation`) for as many tokens
   as that output has left, and the output's remaining tokens are compared with it, by the
   same rules (a later difference must again be a tie of the top two, checked the same way,
   up to :data:`MAX_NEAR_TIES` of them). An output that takes the runner-up at a near-tie and
   then goes on as if it had taken the top token is caught here.

Both outputs must have the same length unless one ends at an end-of-sequence token the other
has not reached; a prefix (a stop rule that differs) is not acceptable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specdec.models import cache_keyword, returned_cache

# The largest top-two logit margin at which a differing token still counts as a near-tie (fp32):
# ~100x the measured gap between a tree forward and one-token forwards of the default model (~1e-5).
NEAR_TIE_MARGIN = 1e-3
# Half precisions round logits far more coarsely: bf16 keeps 8 significant bits, so two forwards
# of different shapes differ by ~2e-2 in logits of magnitude ~10 on an H100 (design.md section 6),
# and a margin below a few of those steps is still a near-tie. On the CPU, bf16 forwards of the
# default model differ far more (largest |logit difference| 1.5 between a verification forward and
# a one-token forward, over 3 x 1,260 rows: `specdec bench margins --dtype bfloat16`,
# docs/benchmarks.md "Near-tie margins"), so there a bf16 comparison with `generate` can fail on
# rounding alone; no CPU test makes one. float16: 0.05, from bf16's 8 bits vs fp16's 11.
_MARGINS = {"float64": 1e-6, "float32": NEAR_TIE_MARGIN, "float16": 0.05, "bfloat16": 0.25}
# Significant bits of the half precisions, whose logits are rounded to steps that grow with their size.
_SIGNIFICANT_BITS = {"bfloat16": 8, "float16": 11}
# Rounding steps of the top logit a half-precision near-tie may span (near_tie_limit says why).
HALF_STEPS = 4
# Near-ties one comparison follows down its branches before it gives up (and fails).
MAX_NEAR_TIES = 4


def near_tie_margin(dtype: torch.dtype) -> float:
    """The near-tie margin for a model of ``dtype`` (fp32's for dtypes not listed).

    >>> near_tie_margin(torch.float32), near_tie_margin(torch.bfloat16)
    (0.001, 0.25)
    """
    return _MARGINS.get(str(dtype).removeprefix("torch."), NEAR_TIE_MARGIN)


def near_tie_limit(dtype: torch.dtype, top_logit: float) -> float:
    """The near-tie margin where the model's best logit is ``top_logit``.

    The dtype's margin (:func:`near_tie_margin`); in half precision at least
    :data:`HALF_STEPS` of the rounding steps of a logit that large. A bf16 model's logits are
    bf16 numbers, 0.125 apart between 16 and 32 and 0.25 apart between 32 and 64, and two
    forwards of different shapes differ by more than their last bit: every layer's output is
    rounded to 8 bits again. On a GPU in bf16, Hugging Face's own ``generate`` and the judge's
    one-token plain decoding, neither of them specdec, have chosen different tokens whose
    logits were two steps apart (docs/testing.md). Four steps, twice the largest gap seen
    between two plain decodings, is still ~2.5% of the logit: a real
    difference in the model's choice is far outside it.

    >>> near_tie_limit(torch.bfloat16, 40.0), near_tie_limit(torch.bfloat16, 20.0), near_tie_limit(torch.float32, 40.0)
    (1.0, 0.5, 0.001)
    """
    name = str(dtype).removeprefix("torch.")
    margin = _MARGINS.get(name, NEAR_TIE_MARGIN)
    bits = _SIGNIFICANT_BITS.get(name)
    if bits is None or not math.isfinite(top_logit) or top_logit == 0:
        return margin
    step = 2.0 ** (math.floor(math.log2(abs(top_logit))) - (bits - 1))
    return max(margin, HALF_STEPS * step)


@dataclass(frozen=True)
class Comparison:
    """How two outputs for the same prompt relate (module docstring: the rules).

    ``first_difference``: the index of the first differing token (None when identical, or
    when one output is a prefix of the other: ``prefix``). ``tokens``: (ours, theirs) there;
    ``top_two``: the model's two best tokens after the common prefix, best first; ``margin``:
    their logit gap; ``limit``: the near-tie limit there (:func:`near_tie_limit`). ``branches``: each output's
    remainder compared with plain decoding from its own token at the difference (ours,
    theirs); None when not followed (not a tie of the top two, or :data:`MAX_NEAR_TIES` spent).
    """

    identical: bool
    first_difference: int | None = None
    margin: float | None = None
    prefix: bool = False
    limit: float = NEAR_TIE_MARGIN
    tokens: tuple[int, int] | None = None
    top_two: tuple[int, int] | None = None
    branches: tuple[Comparison, Comparison] | None = None

    @property
    def tied_pair(self) -> bool:
        """The two differing tokens are the model's top two there."""
        return self.tokens is not None and self.top_two is not None and set(self.tokens) == set(self.top_two)

    @property
    def near_tie(self) -> bool:
        """The first difference is a tie of the model's top two within the margin."""
        return self.tied_pair and self.margin is not None and self.margin < self.limit

    @property
    def acceptable(self) -> bool:
        """Identical; or a near-tie at the first difference, after which each output is plain decoding of its branch."""
        if self.identical:
            return True
        return self.near_tie and self.branches is not None and all(b.acceptable for b in self.branches)

    @property
    def agreement(self) -> tuple[int, int] | None:
        """Tokens after the first difference that agree with plain decoding of their own branch (ours, theirs)."""
        if self.branches is None:
            return None
        return (self.branches[0].agreeing, self.branches[1].agreeing)

    @property
    def agreeing(self) -> int:
        """Leading tokens the two outputs share (all of them when identical)."""
        if self.first_difference is not None:
            return self.first_difference
        return self.length

    length: int = 0  # tokens compared (the shorter output's length)

    def describe(self) -> str:
        if self.identical:
            return "identical"
        if self.first_difference is None:
            return "one output is a prefix of the other (a stop rule differs)"
        assert self.tokens is not None and self.top_two is not None and self.margin is not None
        ours, theirs = self.tokens
        where = f"first difference at new token {self.first_difference} (ours {ours}, theirs {theirs})"
        if not self.tied_pair:
            return f"{where}: NOT the model's top two there ({self.top_two[0]}, {self.top_two[1]})"
        if not self.near_tie:
            return f"{where}: the model's top two, margin {self.margin:.3g}: NOT a near-tie (limit {self.limit:.3g})"
        head = f"{where}: a near-tie of the model's top two (margin {self.margin:.3g}, limit {self.limit:.3g})"
        if self.branches is None:
            return f"{head}; more than {MAX_NEAR_TIES} near-ties in a row: NOT followed further"
        parts = []
        for name, branch in zip(("ours", "theirs"), self.branches, strict=True):
            if branch.identical:
                parts.append(f"{name} then is plain decoding of its branch ({branch.length} tokens)")
            else:
                parts.append(f"{name} after it: {branch.describe()}")
        return f"{head}; " + "; ".join(parts)


def top_two(model: Any, ids: Sequence[int]) -> tuple[tuple[int, int], float]:
    """The model's two best next tokens after ``ids`` (best first, ties to the lower id) and their logit gap."""
    best, margin, _ = _top_two(model, ids)
    return best, margin


def _top_two(model: Any, ids: Sequence[int]) -> tuple[tuple[int, int], float, float]:
    """:func:`top_two` and the best logit itself."""
    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([list(ids)], device=device), logits_to_keep=1).logits[0, -1]
    values, indices = logits.float().topk(2)
    first, second = int(indices[0]), int(indices[1])
    if values[0] == values[1] and second < first:  # an exact tie: the lower id is greedy's choice
        first, second = second, first
    return (first, second), float(values[0] - values[1]), float(values[0])


def top_two_margin(model: Any, ids: Sequence[int]) -> float:
    """The gap between the two largest next-token logits after ``ids`` (one plain forward)."""
    return top_two(model, ids)[1]


def plain_continuation(model: Any, ids: Sequence[int], count: int) -> list[int]:
    """``count`` tokens of plain greedy decoding after ``ids``: the model's own forward, one token at a time.

    Argmax with ties to the lowest id, half-precision logits decided in float32 (as
    ``generate`` does); no stop rule (the caller compares as many tokens as it has).
    """
    if count <= 0:
        return []
    device = next(model.parameters()).device
    tokens: list[int] = []
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([list(ids)], device=device), use_cache=True, logits_to_keep=1)
        while True:
            tokens.append(int(out.logits[0, -1].float().argmax()))
            if len(tokens) == count:
                return tokens
            out = model(input_ids=torch.tensor([[tokens[-1]]], device=device), use_cache=True,
                        **{cache_keyword(model): returned_cache(out)})


def compare_outputs(model: Any, prompt: Sequence[int], ours: Sequence[int], theirs: Sequence[int], *,
                    near_ties: int = MAX_NEAR_TIES) -> Comparison:
    """Compare two greedy continuations of ``prompt`` by the rules of the module docstring.

    ``near_ties``: how many more near-ties may be followed down the branches (each one costs
    a forward over the prefix and plain decoding of both branches' remaining tokens).
    """
    ours, theirs = list(ours), list(theirs)
    length = min(len(ours), len(theirs))
    limit = near_tie_margin(next(model.parameters()).dtype)
    if ours == theirs:
        return Comparison(True, limit=limit, length=length)
    index = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    if index is None:
        return Comparison(False, prefix=True, limit=limit, length=length)
    prefix = list(prompt) + ours[:index]
    best, margin, top = _top_two(model, prefix)
    limit = near_tie_limit(next(model.parameters()).dtype, top)
    pair = (ours[index], theirs[index])
    comparison = Comparison(False, index, margin, limit=limit, tokens=pair, top_two=best, length=length)
    if not comparison.near_tie or near_ties <= 0:
        return comparison
    branches = []
    for output in (ours, theirs):
        branch = [*prefix, output[index]]
        rest = output[index + 1 :]
        plain = plain_continuation(model, branch, len(rest))
        branches.append(compare_outputs(model, branch, rest, plain, near_ties=near_ties - 1))
    return Comparison(False, index, margin, limit=limit, tokens=pair, top_two=best, length=length,
                      branches=(branches[0], branches[1]))
