"""Verification backends: the model-running verifier with a choice of tree operations.

``backend="torch"`` uses :class:`~specdec.backends.verifier.TorchTreeOps`, the readable
reference; ``backend="auto"`` picks the fastest backend that is available.
"""

from __future__ import annotations

from typing import Any

from specdec.backends.verifier import KVState, ModelVerifier, TorchTreeOps, TreeOps
from specdec.errors import SpecDecError
from specdec.types import TokenChooser

BACKENDS = ("auto", "torch")


def make_verifier(model: Any, backend: str = "auto", chooser: TokenChooser | None = None) -> ModelVerifier:
    """A verifier for ``model`` with the named backend's tree operations."""
    if backend not in BACKENDS:
        raise SpecDecError(f"unknown backend {backend!r}; valid names: {', '.join(BACKENDS)}")
    ops: TreeOps = TorchTreeOps()
    return ModelVerifier(model, ops=ops, chooser=chooser)


__all__ = ["BACKENDS", "KVState", "ModelVerifier", "TorchTreeOps", "TreeOps", "make_verifier"]
