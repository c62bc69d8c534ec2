"""Verification backends: the model-running verifier with a choice of tree operations.

``backend="torch"`` uses :class:`~specdec.backends.verifier.TorchTreeOps`, the readable
reference; ``backend="cuda_ext"`` the compiled kernels of :mod:`specdec.backends.cuda_ext`
(C++ on the CPU, CUDA on a GPU), and raises when they cannot be built or serve the model's
device; ``backend="auto"`` takes ``cuda_ext`` when it can and otherwise the torch backend,
with one warning per process that says why.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from specdec.backends.verifier import KVState, ModelVerifier, TorchTreeOps, TreeOps, check_model
from specdec.errors import SpecDecError
from specdec.types import TokenChooser

BACKENDS = ("auto", "torch", "cuda_ext")

_warned_fallback = False


def make_tree_ops(backend: str, device: torch.device) -> TreeOps:
    """The named backend's tree operations for a model on ``device``."""
    global _warned_fallback
    if backend not in BACKENDS:
        raise SpecDecError(f"unknown backend {backend!r}; valid names: {', '.join(BACKENDS)}")
    if backend == "torch":
        return TorchTreeOps()
    from specdec.backends.cuda_ext import BackendUnavailableError, ExtTreeOps
    from specdec.native import NativeBuildError

    if backend == "cuda_ext":
        return ExtTreeOps(device)
    try:
        return ExtTreeOps(device)
    except (NativeBuildError, BackendUnavailableError) as error:
        if not _warned_fallback:
            _warned_fallback = True
            reason = str(error).splitlines()[0]
            warnings.warn(
                f"backend='auto' uses the torch backend: the cuda_ext backend is unavailable ({reason}); "
                "pass backend='cuda_ext' to see the whole error",
                RuntimeWarning,
                stacklevel=3,
            )
        return TorchTreeOps()


def make_verifier(model: Any, backend: str = "auto", chooser: TokenChooser | None = None) -> ModelVerifier:
    """A verifier for ``model`` with the named backend's tree operations."""
    if backend not in BACKENDS:
        raise SpecDecError(f"unknown backend {backend!r}; valid names: {', '.join(BACKENDS)}")
    check_model(model)  # a model we cannot serve is the first thing to report
    ops = make_tree_ops(backend, next(model.parameters()).device)
    return ModelVerifier(model, ops=ops, chooser=chooser)


__all__ = ["BACKENDS", "KVState", "ModelVerifier", "TorchTreeOps", "TreeOps", "make_tree_ops", "make_verifier"]
