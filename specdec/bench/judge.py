"""The judge: is an output the reference's, or where and why does it differ?

A lossless method's output equals plain decoding's, except where rounding decides. A tree
forward and one-token forwards round differently (~1e-5 in fp32), so a token can flip
only where the decision is on a knife's edge:

- **greedy**: the two differing tokens are the model's top two at the first difference,
  their logits within the near-tie margin of the model's dtype
  (:func:`specdec.testing.near_tie_margin`), and after it each output is plain decoding of
  its own branch (re-run from the divergence on both branches; a later difference is held to
  the same rules): a **near-tie** (:func:`specdec.testing.compare_outputs`);
- **sampling** (position-keyed, :mod:`specdec.sampling`): the token at position ``p`` is
  the inverse CDF at ``u(seed, p) * total``, so a flip needs the draw to lie within the
  rounding of a bucket boundary (a **near-boundary** draw). The judge redoes both runs'
  forwards (each method's own trees through its own verifier: the same shapes, kernels
  and inputs as in the run, :meth:`~specdec.bench.methods.SpecdecMethod.redo`), takes the
  row that decided position ``p`` in each, and measures how far the draw lay from the
  nearest boundary of the bucket it fell in under each forward's probabilities. Logits
  that differ by less than the greedy margin ``m`` move every CDF value by less than
  ``2 m / T`` (softmax at temperature ``T`` changes each probability by a factor within
  ``exp(+-2 m / T)``), so a draw farther than that from a boundary under both forwards
  cannot flip by rounding: that is a **real difference** (for a lossless method, a bug).

Anything else is *different*.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from specdec.sampling import PositionKeyedSampler, SamplingParams, position_uniform, process_logits, resolve_decision
from specdec.testing import NEAR_TIE_MARGIN, compare_outputs, near_tie_margin


def near_boundary_limit(temperature: float, margin: float = NEAR_TIE_MARGIN) -> float:
    """The largest CDF move logits within the greedy near-tie ``margin`` can cause at ``temperature``."""
    return 2 * margin / temperature


@dataclass(frozen=True)
class Draw:
    """Where a position's uniform draw fell under one forward's probabilities.

    ``target = u * total`` lies in ``token``'s bucket ``[low, high)`` of the cumulative
    distribution (float64, token-id order); ``distance`` is its distance to the nearer end.
    """

    token: int
    target: float
    low: float
    high: float

    @property
    def distance(self) -> float:
        return min(self.target - self.low, self.high - self.target)


def cumulative(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """float64 ``[V]``: the cumulative distribution the sampler inverts, from ``logits`` float ``[V]``."""
    return process_logits(logits.unsqueeze(0), params).softmax(dim=-1).double()[0].cumsum(dim=0)


def locate_draw(logits: torch.Tensor, params: SamplingParams, position: int) -> Draw:
    """The draw at ``position`` under ``logits`` float ``[V]``, as the position-keyed sampler makes it.

    >>> draw = locate_draw(torch.tensor([0.0, 0.0]), SamplingParams(seed=0), 3)
    >>> draw.token == (0 if draw.target < 0.5 else 1), draw.high - draw.low
    (True, 0.5)
    """
    cdf = cumulative(logits, params)  # [V]
    target = position_uniform(params.seed, position) * float(cdf[-1])
    token = min(int(torch.searchsorted(cdf, torch.tensor([target], dtype=cdf.dtype, device=cdf.device),
                                       right=True)[0]), cdf.shape[0] - 1)
    return Draw(token, target, float(cdf[token - 1]) if token else 0.0, float(cdf[token]))


@dataclass(frozen=True)
class Boundary:
    """The sampling judge's finding at one position: the draw under the reference's and our forward."""

    position: int  # absolute position (prompt included)
    index: int  # output index
    reference: Draw | None  # None: the reference run was not reproduced by its redo
    ours: Draw | None
    limit: float
    shift: float | None = None  # max |CDF difference| between the two forwards: how far rounding moved the edges

    @property
    def near_boundary(self) -> bool:
        return (self.reference is not None and self.ours is not None
                and max(self.reference.distance, self.ours.distance) <= self.limit)

    @property
    def distance(self) -> float | None:
        if self.reference is None or self.ours is None:
            return None
        return max(self.reference.distance, self.ours.distance)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "distance": self.distance, "near_boundary": self.near_boundary}

    def describe(self) -> str:
        if self.reference is None or self.ours is None:
            return f"output index {self.index}: a redo did not reproduce the run; no verdict"
        kind = "a near-boundary draw (rounding)" if self.near_boundary else "a REAL difference"
        return (f"output index {self.index} (position {self.position}): the reference chose {self.reference.token}, "
                f"ours {self.ours.token}; the draw lay {self.reference.distance:.2e} / {self.ours.distance:.2e} "
                f"from a bucket boundary under the reference's / our forward (limit {self.limit:.1e}; the two "
                f"forwards' CDFs differ by up to {self.shift:.1e}): {kind}")


def sampling_params(options: dict[str, Any]) -> SamplingParams:
    """The :class:`SamplingParams` a method spec's sampling options resolve to (as ``generate`` resolves them)."""
    chooser = resolve_decision(None, **options).chooser
    assert isinstance(chooser, PositionKeyedSampler), f"{options} do not sample"
    return chooser.params


def judge_sampled(reference: Any, ours: Any, prompt: Sequence[int], reference_run: Any, our_run: Any,
                  max_new_tokens: int, index: int, margin: float = NEAR_TIE_MARGIN) -> Boundary:
    """Redo both sampled runs' forwards and locate the draw at output ``index`` under each.

    ``margin``: the greedy near-tie margin of the model's dtype, which bounds how far rounding
    moves a logit (:func:`near_boundary_limit`).
    """
    params = sampling_params(ours.spec.sampling)
    position = len(prompt) + index
    rows = [method.redo(prompt, run, max_new_tokens, position)
            for method, run in ((reference, reference_run), (ours, our_run))]
    draws = [None if row is None else locate_draw(row, params, position) for row in rows]
    shift = None
    if rows[0] is not None and rows[1] is not None:
        shift = float((cumulative(rows[0], params) - cumulative(rows[1], params)).abs().max())
    return Boundary(position, index, draws[0], draws[1], near_boundary_limit(params.temperature, margin), shift)


class Judge:
    """Decides whether an output equals its reference, or differs on a near-tie or a near-boundary draw."""

    def __init__(self, model: Any, max_new_tokens: int) -> None:
        self._model = model
        self._max_new_tokens = max_new_tokens

    def __call__(self, prompt: Sequence[int], ours: Any, reference: Any, our_method: Any,
                 reference_method: Any) -> dict[str, Any]:
        """A record's verdict fields for one turn (``ours``/``reference``: measurements)."""
        verdict: dict[str, Any] = {"identical": ours.tokens == reference.tokens, "near_tie": False,
                                   "near_boundary": False, "first_difference": None, "margin": None,
                                   "boundary": None}
        if verdict["identical"]:
            return verdict
        if not our_method.spec.sampling:
            comparison = compare_outputs(self._model, prompt, ours.tokens, reference.tokens)
            margin = None if comparison.margin is None else round(comparison.margin, 6)
            return {**verdict, "near_tie": comparison.acceptable, "first_difference": comparison.first_difference,
                    "margin": margin, "tokens": comparison.tokens, "top_two": comparison.top_two,
                    "agreement": comparison.agreement, "finding": comparison.describe()}
        index = next((i for i, (a, b) in enumerate(zip(ours.tokens, reference.tokens, strict=False)) if a != b), None)
        if index is None:  # one is a prefix of the other: a stop rule differs
            return verdict
        margin_limit = near_tie_margin(next(self._model.parameters()).dtype)
        boundary = judge_sampled(reference_method, our_method, prompt, reference, ours, self._max_new_tokens, index,
                                 margin_limit)
        return {**verdict, "near_boundary": boundary.near_boundary, "first_difference": index,
                "boundary": boundary.to_json()}
