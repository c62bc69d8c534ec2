"""The oracle (specdec.testing.compare_outputs) accepts a difference only on a tie of the model's top two,
followed by plain decoding of each branch, and refuses every other difference (issue 29).

A scripted model (its logits a function of the context, with near-ties placed by hand) makes
every case exact: plain decoding counts up by one; at the near-tie positions the next two
tokens are within 1e-4 of the best and a third within 2e-4 (all inside fp32's margin of 1e-3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specdec.testing import MAX_NEAR_TIES, compare_outputs, near_tie_limit, near_tie_margin, plain_continuation

V = 16
PROMPT = [0, 1, 2]
NEAR_TIES = {6: 1e-4}  # context length -> gap between the best and the runner-up there
WIDE = {8: 2e-3}  # the top two 2e-3 apart: a flip there is not rounding


@dataclass
class Out:
    logits: torch.Tensor
    past_key_values: list[int]


class Scripted(torch.nn.Module):
    """Logits after a context: best ``last + 1``, runner-up ``last + 2``, third ``last + 3`` (mod V)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def row(self, context: list[int]) -> torch.Tensor:
        gap = NEAR_TIES.get(len(context), WIDE.get(len(context), 2.0))
        logits = torch.zeros(V)
        last = context[-1]
        logits[(last + 1) % V] = 5.0
        logits[(last + 2) % V] = 5.0 - gap
        logits[(last + 3) % V] = 5.0 - 2 * gap
        return logits

    def forward(self, input_ids: torch.Tensor, past_key_values: list[int] | None = None, **_: Any) -> Out:
        context = [*(past_key_values or []), *input_ids[0].tolist()]
        start = len(context) - input_ids.shape[1]
        rows = [self.row(context[: i + 1]) for i in range(start, len(context))]
        return Out(torch.stack(rows)[None], context)


MODEL = Scripted()
N = 10
PLAIN = plain_continuation(MODEL, PROMPT, N)  # 3, 4, 5, ...: the near-tie decides new token 3 (context 6)


def taking(output: list[int], index: int, token: int, length: int = N) -> list[int]:
    """``output`` up to ``index``, then ``token``, then plain decoding from there, ``length`` tokens in all."""
    head = [*output[:index], token]
    return [*head, *plain_continuation(MODEL, PROMPT + head, length - len(head))]


def test_plain_decoding_and_identity() -> None:
    assert [(3 + i) % V for i in range(N)] == PLAIN
    assert compare_outputs(MODEL, PROMPT, PLAIN, PLAIN).acceptable
    assert near_tie_margin(torch.float32) == 1e-3


def test_the_runner_up_at_a_near_tie_then_plain_decoding_of_its_branch_is_accepted() -> None:
    flipped = taking(PLAIN, 3, 7)  # the runner-up at the near-tie
    comparison = compare_outputs(MODEL, PROMPT, flipped, PLAIN)
    assert comparison.acceptable and comparison.near_tie and comparison.tied_pair, comparison.describe()
    assert comparison.first_difference == 3 and comparison.tokens == (7, 6) and comparison.top_two == (6, 7)
    assert comparison.agreement == (N - 4, N - 4)
    assert "then is plain decoding of its branch" in comparison.describe()


def test_a_third_token_at_a_near_tie_is_refused() -> None:
    """Within the margin of the best, but not one of the top two: the old oracle took it, this one does not."""
    wrong = taking(PLAIN, 3, 8)  # the third
    comparison = compare_outputs(MODEL, PROMPT, wrong, PLAIN)
    assert comparison.margin is not None and comparison.margin < comparison.limit  # a near-tie margin there...
    assert not comparison.tied_pair and not comparison.acceptable  # ...but not the tied pair
    assert "NOT the model's top two there (6, 7)" in comparison.describe()


def test_the_runner_up_with_the_other_branch_continuation_is_refused() -> None:
    """The runner-up emitted, then tokens as if the best had been taken: not plain decoding of its branch."""
    spliced = [*PLAIN[:3], 7, *PLAIN[4:]]
    comparison = compare_outputs(MODEL, PROMPT, spliced, PLAIN)
    assert comparison.near_tie and not comparison.acceptable
    assert comparison.branches is not None and not comparison.branches[0].acceptable
    assert comparison.agreement == (0, N - 4)
    assert "ours after it: first difference at new token 0" in comparison.describe()


def test_differences_off_a_near_tie_are_refused() -> None:
    late = taking(PLAIN, 5, 9)
    wide = compare_outputs(MODEL, PROMPT, late, PLAIN)  # context 8: the top two 2e-3 apart
    assert wide.tied_pair and not wide.near_tie and not wide.acceptable and "NOT a near-tie" in wide.describe()
    anywhere = compare_outputs(MODEL, PROMPT, [*PLAIN[:1], 9, *PLAIN[2:]], PLAIN)
    assert not anywhere.acceptable and anywhere.margin == 2.0
    short = compare_outputs(MODEL, PROMPT, PLAIN[:-2], PLAIN)
    assert short.prefix and not short.acceptable and "prefix" in short.describe()


def test_near_ties_are_followed_down_the_branches_up_to_a_limit() -> None:
    """A second near-tie inside a branch is held to the same rules; past the limit, no verdict but a failure."""
    NEAR_TIES[9] = 1e-4
    try:
        first = taking(PLAIN, 3, 7)  # 7 at context 6, then 8, 9 (context 9 decides new token 6: 10 or 11)
        twice = taking(first, 6, 11)
        plain = plain_continuation(MODEL, PROMPT, N)
        comparison = compare_outputs(MODEL, PROMPT, twice, plain)
        assert comparison.acceptable, comparison.describe()
        assert comparison.branches is not None and comparison.branches[0].near_tie  # the second, inside ours
        assert not compare_outputs(MODEL, PROMPT, twice, plain, near_ties=1).acceptable
        assert MAX_NEAR_TIES >= 2
    finally:
        del NEAR_TIES[9]


class ScriptedBF16(Scripted):
    """The scripted model as a bf16 model whose logits are ~40: bf16 rounds them to steps of 0.25 there."""

    def __init__(self, gap: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, dtype=torch.bfloat16))
        self.gap = gap

    def row(self, context: list[int]) -> torch.Tensor:
        logits = torch.zeros(V)
        last = context[-1]
        logits[(last + 1) % V] = 40.0
        logits[(last + 2) % V] = 40.0 - (self.gap if len(context) == 6 else 8.0)
        return logits


def test_half_precision_near_ties_are_measured_in_the_logits_own_rounding_steps() -> None:
    """Flips one and two bf16 steps apart at logits of ~40 (gaps of 0.25 and 0.5: the default model on an
    H200 showed one step between specdec and ``generate``, two between ``generate`` and one-token plain
    decoding) are near-ties; four steps (1.0) are not. Where steps are finer the dtype's margin rules."""
    assert near_tie_limit(torch.bfloat16, 40.0) == 1.0 and near_tie_limit(torch.bfloat16, -100.0) == 2.0
    assert near_tie_limit(torch.bfloat16, 3.0) == near_tie_margin(torch.bfloat16) == 0.25
    assert near_tie_limit(torch.float16, 40.0) == 4 * 2.0**-5 and near_tie_limit(torch.float32, 40.0) == 1e-3
    for gap, acceptable in ((0.25, True), (0.5, True), (1.0, False)):
        model = ScriptedBF16(gap)
        plain = plain_continuation(model, PROMPT, N)
        head = [*plain[:3], 7]  # the runner-up at context 6
        flipped = [*head, *plain_continuation(model, PROMPT + head, N - 4)]
        comparison = compare_outputs(model, PROMPT, flipped, plain)
        assert comparison.tied_pair and comparison.limit == 1.0 and comparison.margin == gap
        assert comparison.acceptable is acceptable, comparison.describe()


def test_the_margin_measurement_covers_every_verifier_and_size() -> None:
    """specdec.bench.margins on a tiny fp64 model: every verifier variant and tree size measured, the rows
    counted, and the differences at fp64's rounding (far under fp64's margin), so its bound is a bound."""
    from tiny_models import tiny_model

    from specdec.bench.margins import margin_from, measure

    model = tiny_model("llama")
    report = measure(model, [[1, 2, 3, 4, 5, 1, 2, 3]], new_tokens=12, sizes=(1, 4), stride=4, progress=False)
    assert report.prompts == 1 and set(report.worst) >= {"hf", "specdec"}
    assert all(set(sizes) == {1, 4} for sizes in report.worst.values())
    assert all(rows > 0 for rows in report.rows.values())
    assert 0.0 <= report.largest() < 1e-9 and margin_from(report.largest()) < near_tie_margin(torch.float64)
    assert report.to_json()["margin"] == 2 * report.largest()
