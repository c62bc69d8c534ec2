"""Narrow products: a model's linear layers over a few rows, computed as ``(W @ x^T)^T``.

Why: a verification forward over a small tree multiplies every weight ``W [out, in]`` by a
few rows ``x [M, in]``. PyTorch's ``linear`` computes ``x @ W^T``; on a CPU with MKL that is
a matrix-vector product when ``M == 1`` (the weight is streamed once), but a general GEMM
from ``M == 2`` on, whose kernel repacks its right-hand operand, the weight, for every call.
For a model whose weights do not fit in the caches that repacking is memory traffic on the
scale of the product itself: on this project's 2-core CPU the default model's 2-token
forward costs 1.6x its 1-token forward (docs/budget.md), which is what made speculation
expensive there. Putting the weight on the left, ``W @ x^T``, lets the GEMM read it in its
stored layout, and 2- to 4-token forwards get cheaper by about a quarter (docs/budget.md has
the measured curves).

Whether it pays depends on the machine, the dtype and ``M`` (past ~8 rows the repacked GEMM
wins again), so nothing here decides: the narrow product is the ``"narrow"`` kernel variant
of :class:`~specdec.backends.verifier.ModelVerifier`, the budget calibration
(:func:`specdec.budget.calibration.calibrate`) times both at each tree size, and the
verifier runs it up to the largest size where it was faster (its
:class:`~specdec.types.KernelChoice`).

One row is a case of its own: ``linear`` runs a matrix-vector product there, which on
this CPU is slower than a two-column GEMM, so :func:`narrow_linear` pads one row to two;
calibration decides separately whether one-node steps use that (the choice for one row).

The switch is scoped to one verification forward: :meth:`NarrowLinears.active` puts an
instance-level ``forward`` on each plain ``torch.nn.Linear`` of the model and removes it
on exit, so the model is untouched outside it (prefill, ``model.generate``, and every
step of a run whose planner never calibrated, such as the ``none`` drafter's plain
decoding). The narrow product rounds differently from ``linear``, as any other GEMM
blocking does: outputs stay token-identical to plain decoding except where the top two
logits are within rounding of each other (the near-ties the identity tests report).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

# Devices and dtypes where the narrow product is offered to calibration (measured on CPUs
# with MKL; a GPU's GEMMs over a few rows already read the weight once).
NARROW_DTYPES = (torch.float32, torch.float64)


def narrow_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` as ``(W @ x^T)^T``: same math as ``torch.nn.functional.linear``, weight on the left.

    A single row is padded to two (the row twice) and the first column kept: a one-column
    product goes to the matrix-vector kernel, which on this project's CPU streams the
    default model's weights slower than the two-column GEMM does (all 211 linear layers:
    38.4 ms for one row as ``linear``, 32.2 ms padded, 30.1 ms for two real rows), so the
    wasted column is cheaper than the kernel it avoids. Calibration decides whether the
    padded product is used at all (the kernel choice for one row).
    """
    weight = module.weight
    rows = x.reshape(-1, x.shape[-1])  # [M, in]
    if rows.shape[0] == 1:
        # [out, 2] -> first column -> [1, out]. The right operand must be the transposed view
        # of a contiguous [2, in], the layout of the multi-row case: a contiguous [in, 2]
        # takes another MKL path, measured 2x slower than the matrix-vector product.
        y = torch.mm(weight, rows.expand(2, -1).contiguous().t())[:, :1].t().contiguous()
    else:
        # [M, out]; made contiguous (a copy of M * out values, small next to W) because a
        # transposed result would make later kernels refuse it: SDPA's CPU flash kernel
        # wants a unit stride in the head dimension and falls back to its math kernel.
        y = torch.mm(weight, rows.t()).t().contiguous()
    if module.bias is not None:
        y = y + module.bias
    return y.reshape(*x.shape[:-1], weight.shape[0])


def supports_narrow(model: Any) -> bool:
    """Whether the narrow product can be offered for ``model``: CPU parameters in fp32 or fp64."""
    parameter = next(model.parameters(), None)
    return parameter is not None and parameter.device.type == "cpu" and parameter.dtype in NARROW_DTYPES


class NarrowLinears:
    """The plain ``torch.nn.Linear`` layers of a model, switchable to :func:`narrow_linear` per forward.

    Subclasses of ``Linear`` (quantized, LoRA) and layers that already carry an instance
    ``forward`` (accelerate's hooks) are left alone: their forward is not ``linear``.
    """

    def __init__(self, model: Any) -> None:
        self.layers: list[torch.nn.Linear] = [
            module
            for module in model.modules()
            if type(module) is torch.nn.Linear and "forward" not in module.__dict__ and module.weight.dim() == 2
        ]
        # One bound forward per layer, made once: a compiled forward traced with them guards on
        # these objects, and a fresh partial per call would fail the guard and recompile.
        self._forwards = [partial(narrow_linear, layer) for layer in self.layers]

    @contextmanager
    def active(self) -> Iterator[None]:
        """Within the block, every collected layer computes :func:`narrow_linear`."""
        for layer, forward in zip(self.layers, self._forwards, strict=True):
            # The instance dict, not setattr: Module.__setattr__ is ~10x slower, and this
            # runs around every narrow verification.
            layer.__dict__["forward"] = forward
        try:
            yield
        finally:
            for layer in self.layers:
                layer.__dict__.pop("forward", None)
