"""How far a verification forward's logits lie from a one-token forward's: the measure behind a near-tie margin.

:func:`specdec.testing.compare_outputs` accepts a first difference from plain decoding only
where the model's top two logits are within a margin (:func:`specdec.testing.near_tie_margin`).
That margin should come from what rounding can do, not be chosen wide. This module measures
it: for each prompt it decodes greedily with the model's own one-token forward (what
``generate`` does), keeping every position's logits row; then, at positions spread over the
output, it verifies the next ``k`` tokens of that output as one chain (``k`` in ``sizes``)
through specdec's verifiers (``caches``: the model's forward under a tree mask, specdec's own
forward with its default kernels, with its CPU kernels) and takes the largest
``|logit difference|`` between each verified row and the one-token row of the same position,
over the whole vocabulary. A greedy flip between two forwards needs the top two logits to
move toward each other, so it can only happen where their margin is under twice that
largest move: :func:`margin_from` is that bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm import tqdm

from specdec.backends import make_verifier
from specdec.backends.specdec_engine.forward import CPU_KERNEL, SpecdecForward
from specdec.errors import SpecDecError
from specdec.models import cache_keyword, returned_cache
from specdec.types import DEFAULT_KERNEL, DraftTree, KernelChoice

SIZES = (1, 2, 4, 8, 16, 32)


@dataclass
class MarginReport:
    """Largest ``|logit difference|`` per verifier variant and tree size, and how many rows each covers."""

    dtype: str
    worst: dict[str, dict[int, float]] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    prompts: int = 0

    def largest(self) -> float:
        return max((v for sizes in self.worst.values() for v in sizes.values()), default=0.0)

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "prompts": self.prompts, "rows": self.rows,
                "largest": self.largest(), "margin": margin_from(self.largest()),
                "worst": {name: {str(k): v for k, v in sizes.items()} for name, sizes in self.worst.items()}}


def margin_from(largest_difference: float) -> float:
    """The near-tie margin a measured largest ``|logit difference|`` justifies: twice it (module docstring)."""
    return 2.0 * largest_difference


def one_token_rows(model: Any, prompt: Sequence[int], count: int) -> tuple[list[int], torch.Tensor]:
    """Plain greedy decoding by the model's own one-token forward: ``count`` tokens, float32 logits ``[count, V]``."""
    device = next(model.parameters()).device
    tokens: list[int] = []
    rows = []
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([list(prompt)], device=device), use_cache=True, logits_to_keep=1)
        while True:
            row = out.logits[0, -1].float()
            rows.append(row)
            tokens.append(int(row.argmax()))
            if len(tokens) == count:
                return tokens, torch.stack(rows)
            out = model(input_ids=torch.tensor([[tokens[-1]]], device=device), use_cache=True,
                        **{cache_keyword(model): returned_cache(out)})


def verifiers(model: Any) -> dict[str, Any]:
    """The verifier variants measured: Hugging Face's forward (``hf``), specdec's own forward with the
    default kernels (``specdec``) and with its CPU kernels (``specdec+cpu``, where they serve the model)."""
    found: dict[str, Any] = {"hf": make_verifier(model, "hf", tree_ops="torch")}
    try:
        native = make_verifier(model, "specdec", tree_ops="torch")
    except SpecDecError:  # an architecture specdec's forward does not run: not measured
        return found
    native.use_kernels(KernelChoice.uniform(DEFAULT_KERNEL))
    found["specdec"] = native
    if isinstance(native.forward, SpecdecForward) and native.forward.kernels_available:
        with_kernels = make_verifier(model, "specdec", tree_ops="torch")
        with_kernels.use_kernels(KernelChoice.uniform(CPU_KERNEL))
        found["specdec+cpu"] = with_kernels
    return found


def measure(model: Any, prompts: Sequence[Sequence[int]], new_tokens: int = 64, sizes: Sequence[int] = SIZES,
            stride: int = 8, progress: bool = True) -> MarginReport:
    """The largest ``|logit difference|`` between verified rows and one-token rows (module docstring).

    Chains start every ``stride`` positions of each prompt's ``new_tokens``-token plain output;
    a chain of ``k`` nodes at output index ``i`` holds the output's tokens ``i .. i+k-1`` and its
    row ``j`` is compared with the one-token row that decided token ``i+j+1``.
    """
    report = MarginReport(str(next(model.parameters()).dtype).removeprefix("torch."))
    variants = verifiers(model)
    for name in variants:
        report.worst[name] = {k: 0.0 for k in sizes}
        report.rows[name] = 0
    for prompt in tqdm(prompts, desc="margins", disable=not progress):
        tokens, reference = one_token_rows(model, prompt, new_tokens)
        report.prompts += 1
        for name, verifier in variants.items():
            state, _, _ = verifier.prefill(list(prompt), reserve=new_tokens + max(sizes))
            committed = len(prompt)
            for start in range(0, new_tokens - 1, stride):
                # commit tokens[:start] (the pending token tokens[0] onwards) so the chain starts at tokens[start]
                while committed < len(prompt) + start:
                    step = min(max(sizes), len(prompt) + start - committed)
                    index = committed - len(prompt)
                    with torch.inference_mode():
                        verifier.forward.tree(state, DraftTree.chain(tokens[index], tokens[index + 1 : index + step]))
                    verifier.forward.compact(state, committed, list(range(step)))
                    committed += step
                    state.committed_len = committed
                for size in sizes:
                    k = min(size, new_tokens - 1 - start)  # node j's row decides token start + j + 1
                    chain = DraftTree.chain(tokens[start], tokens[start + 1 : start + k])
                    with torch.inference_mode():
                        logits, _ = verifier.forward.tree(state, chain)
                    verifier.forward.compact(state, committed, ())  # the chain's keys and values dropped
                    difference = float((logits.float() - reference[start + 1 : start + k + 1]).abs().max())
                    report.worst[name][size] = max(report.worst[name][size], difference)
                    report.rows[name] += k
            verifier.release(state)
    return report
