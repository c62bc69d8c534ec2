"""Skinny linear layers: ``x @ W^T`` for a few rows of ``x``, every weight row read once.

Why: a verification forward over a draft tree of ``N`` nodes multiplies each weight
``W [out, in]`` of the model by ``N`` rows. For ``N`` up to a few dozen that product is bound
by reading the weights, not by arithmetic: the default model's 540 MB of fp32 weights stream
in ~11-15 ms on this project's 2-core CPU, while PyTorch's ``linear`` (MKL) streams them at
~18 GB/s for one row and repacks the weight for every call from two rows on, so a 16-node
verification used to cost ~2x a one-node step though the machine's floor is about the same
for both (docs/budget.md). The kernels of ``csrc/skinny_linear.cpp`` read every weight row
once in its stored layout (no copy, no repacking: the model's own tensors) and apply it to
all rows while it sits in registers; the calibration (:mod:`specdec.budget`) measures them
against ``linear`` per tree size and the verifier runs whichever was faster.

**Exact and batch-invariant.** Every kernel path (hand-written AVX-512, the portable code
compiled for AVX2, the portable code for any CPU) computes each output with one fixed
order of fused multiply-adds and one fixed summation tree (the contract in
``csrc/skinny_linear.h``). So the three paths give bitwise the same result, and a row's
result never depends on the other rows: a tree node's logits through these layers equal
the same token's logits verified alone, bit for bit, which is what makes speculative output
identical to plain decoding through the same kernels rather than "identical except at
near-ties". They are not bitwise equal to MKL's ``linear`` (another summation order: the
usual ~1e-7 relative in fp32).

dtypes: float32, bfloat16 (weights widened to float exactly, float accumulation, the sum
rounded to bfloat16 as ``linear`` rounds it) and float64 (the tests' tiny models; portable
code). The op is ``torch.ops.specdec_cpu.skinny_linear`` with a fake implementation, so it
traces into ``torch.compile`` graphs as one opaque call.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from specdec.native import NativeBuildError, load_extension

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = (CSRC / "skinny_linear.cpp",)
HEADERS = (CSRC / "skinny_linear.h", CSRC / "skinny_portable.inc")
SKINNY_DTYPES = (torch.float32, torch.bfloat16, torch.float64)
ISAS = ("auto", "avx512", "avx2", "portable")

_LOCK = threading.Lock()
_FAILURE: NativeBuildError | None = None
_FAKE_REGISTERED = False


def load() -> ModuleType:
    """The built extension (the op registered as ``torch.ops.specdec_cpu.skinny_linear``).

    Built once per machine (~25 s on 2 cores), then loaded from the cache in milliseconds. A
    failed build raises :class:`~specdec.native.NativeBuildError` with the compiler's output,
    and is remembered for the rest of the process.
    """
    global _FAILURE, _FAKE_REGISTERED
    with _LOCK:
        if _FAILURE is not None:
            raise _FAILURE
        try:
            module = load_extension("skinny_linear", SOURCES, depends=HEADERS, extra_cflags=("-O3",))
        except NativeBuildError as error:
            _FAILURE = error
            raise
        if not _FAKE_REGISTERED:
            torch.library.register_fake("specdec_cpu::skinny_linear", _skinny_linear_fake)
            _FAKE_REGISTERED = True
        return module


def available() -> bool:
    """Whether the extension builds (or is built) here; never raises."""
    try:
        load()
    except NativeBuildError:
        return False
    return True


def cpu_isa() -> str:
    """The instruction set ``isa="auto"`` runs on this CPU: ``"avx512"``, ``"avx2"`` or ``"portable"``."""
    return str(load().cpu_isa())


def _skinny_linear_fake(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, isa: str = "auto"
) -> torch.Tensor:
    del bias, isa
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, isa: str = "auto"
) -> torch.Tensor:
    """``torch.nn.functional.linear(x, weight, bias)`` by the skinny kernels. O(M * N * K), one pass over ``weight``.

    ``x`` ``[..., K]`` and ``weight`` ``[N, K]`` (contiguous) of one dtype in
    :data:`SKINNY_DTYPES`, on the CPU; ``bias`` ``[N]`` or None -> ``[..., N]``. ``isa`` forces a
    kernel path (:data:`ISAS`; all give the same bits); one the CPU lacks raises. Call
    :func:`load` first.
    """
    out: torch.Tensor = torch.ops.specdec_cpu.skinny_linear(x, weight, bias, isa)
    return out


def skinny_module_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` through :func:`skinny_linear`."""
    return skinny_linear(x, module.weight, module.bias)


def supports_skinny(model: Any) -> bool:
    """Whether the skinny kernels can serve ``model``: CPU parameters of a dtype in :data:`SKINNY_DTYPES`."""
    parameter = next(model.parameters(), None)
    return parameter is not None and parameter.device.type == "cpu" and parameter.dtype in SKINNY_DTYPES


class SkinnyLinears:
    """The plain ``torch.nn.Linear`` layers of a model, switchable to :func:`skinny_linear` per forward.

    Subclasses of ``Linear`` (quantized, LoRA), layers that already carry an instance
    ``forward`` (accelerate's hooks) and layers whose weight is not a contiguous 2-D tensor
    of a supported dtype are left alone. The switch is scoped to a block
    (:meth:`active`), as :class:`~specdec.backends.narrow.NarrowLinears` does it: the model is
    untouched outside it.
    """

    def __init__(self, model: Any) -> None:
        load()  # the op must exist before a forward calls it (raises NativeBuildError if it cannot)
        self.layers: list[torch.nn.Linear] = [
            module
            for module in model.modules()
            if type(module) is torch.nn.Linear
            and "forward" not in module.__dict__
            and module.weight.dim() == 2
            and module.weight.is_contiguous()
            and module.weight.dtype in SKINNY_DTYPES
            and module.weight.device.type == "cpu"
        ]
        # One bound forward per layer, made once: a compiled forward traced with them guards on
        # these objects, and a fresh partial per call would fail the guard and recompile.
        self._forwards = [partial(skinny_module_linear, layer) for layer in self.layers]

    @contextmanager
    def active(self) -> Iterator[None]:
        """Within the block, every collected layer computes :func:`skinny_linear`."""
        for layer, forward in zip(self.layers, self._forwards, strict=True):
            layer.__dict__["forward"] = forward  # the instance dict: Module.__setattr__ is ~10x slower
        try:
            yield
        finally:
            for layer in self.layers:
                layer.__dict__.pop("forward", None)
