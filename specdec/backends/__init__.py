"""Verification backends: the model-running verifier with a choice of tree operations.

``cache`` picks the KV cache and how the model's forward runs (:data:`CACHES`):
``"native"`` is specdec's own forward of Llama-family decoders
(:class:`~specdec.backends.runner_verifier.RunnerVerifier`: a cache per sequence, eager,
specdec's CPU kernels); ``"dynamic"`` is Hugging Face's ``DynamicCache`` with the model's
own forward (:class:`~specdec.backends.verifier.ModelVerifier`); ``"static"`` is specdec's
static cache with one fixed-shape forward per tree-size bucket
(:class:`~specdec.backends.static.StaticVerifier`), replayed from CUDA graphs on a GPU; on a
CPU ``"static"`` runs the fastest fixed-shape forward there is: specdec's native forward (its
own static cache, its ahead-of-time built C++ kernels) for the Llama family, measured 2x faster
than inductor's compiled buckets (docs/static-cache.md), the compiled buckets otherwise
(:func:`resolve_cache`); ``"static-<mode>"`` names the mode (``eager``, ``inductor``,
``cudagraphs``, ``inductor-cudagraphs``). ``"auto"``: :func:`auto_cache`.

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

from specdec.backends import sliding
from specdec.backends.cuda_ext import BackendUnavailableError, ExtTreeOps
from specdec.backends.runner import unsupported_reason
from specdec.backends.runner_verifier import RunnerVerifier
from specdec.backends.static import MODES as STATIC_MODES
from specdec.backends.static import StaticVerifier
from specdec.backends.verifier import KVState, ModelVerifier, TorchTreeOps, TreeOps, check_model
from specdec.errors import SpecDecError
from specdec.native import NativeBuildError
from specdec.types import TokenChooser

BACKENDS = ("auto", "torch", "cuda_ext")
CACHES = ("auto", "dynamic", "native", "static", *(f"static-{mode}" for mode in STATIC_MODES))

_warned_fallback = False


def make_tree_ops(backend: str, device: torch.device) -> TreeOps:
    """The named backend's tree operations for a model on ``device``."""
    global _warned_fallback
    if backend not in BACKENDS:
        raise SpecDecError(f"unknown backend {backend!r}; valid names: {', '.join(BACKENDS)}")
    if backend == "torch":
        return TorchTreeOps()
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


def auto_cache(model: Any, device: torch.device) -> str:
    """What ``cache="auto"`` runs: ``"static"`` on CUDA (CUDA graphs); on a CPU ``"native"`` where
    specdec's own forward runs the model (:func:`~specdec.backends.runner.unsupported_reason`),
    else ``"dynamic"``. Neither CPU choice compiles anything, so the first call is as fast as later
    ones; docs/static-cache.md measures them against the compiled static cache."""
    if sliding.window_reason(model) is not None:  # [sliding hook] sliding-window models run on the dynamic cache only
        return "dynamic"
    if device.type == "cuda":
        return "static"
    return "native" if unsupported_reason(model) is None else "dynamic"


def auto_cache_reason(model: Any, device: torch.device) -> str:
    """Why :func:`auto_cache` picks what it picks for ``model`` on ``device``, in a few words (the demo prints it)."""
    window = sliding.window_reason(model)  # [sliding hook]
    if window is not None:
        return f"{window}: Hugging Face's forward on the dynamic cache (the static cache holds full attention only)"
    if device.type == "cuda":
        return "a CUDA device: the static cache with CUDA graphs"
    reason = unsupported_reason(model)
    if reason is None:
        return "a CPU and a Llama-family model: specdec's own forward, nothing compiled"
    return f"a CPU, and specdec's own forward does not run this model ({reason}): Hugging Face's forward"


def resolve_cache(cache: str, device: torch.device, model: Any = None) -> tuple[str, str | None]:
    """``(kind, static mode)`` for a ``cache`` name on ``device``: ``("dynamic" | "native", None)`` or
    ``("static", mode)``; ``"auto"`` asks :func:`auto_cache` about ``model``.

    ``"static"`` without a mode, on a CPU, for a model specdec's own forward runs (the Llama
    family: :func:`~specdec.backends.runner.unsupported_reason`), is ``"native"``: a static
    cache too (specdec's ``StaticKVCache``, preallocated per sequence, no shape ever changes),
    with a forward whose kernels were compiled ahead of time (C++, built once per machine and
    cached), which verifies in about half the time of inductor's compiled buckets on this
    project's CPU (docs/static-cache.md) and compiles nothing per process. The compiled
    buckets stay one name away: ``"static-inductor"``.

    >>> resolve_cache("dynamic", torch.device("cpu")), resolve_cache("static-eager", torch.device("cpu"))
    (('dynamic', None), ('static', 'eager'))
    """
    if not isinstance(cache, str) or cache not in CACHES:
        raise SpecDecError(f"unknown cache {cache!r}; valid names: {', '.join(CACHES)}")
    if cache == "auto":
        cache = auto_cache(model, device)
    if cache == "static" and device.type != "cuda" and model is not None and unsupported_reason(model) is None:
        cache = "native"
    if cache in ("dynamic", "native"):
        return cache, None
    _, _, mode = cache.partition("-")
    return "static", mode or None


def make_verifier(
    model: Any, backend: str = "auto", chooser: TokenChooser | None = None, cache: str = "auto"
) -> ModelVerifier:
    """A verifier for ``model`` with the named backend's tree operations and the named ``cache``."""
    if backend not in BACKENDS:
        raise SpecDecError(f"unknown backend {backend!r}; valid names: {', '.join(BACKENDS)}")
    check_model(model)  # a model we cannot serve is the first thing to report
    device = next(model.parameters()).device
    kind, mode = resolve_cache(cache, device, model)
    sliding.check_cache_kind(model, kind)  # [sliding hook] sliding-window models: dynamic only; hybrids: refused
    ops = make_tree_ops(backend, device)
    if kind == "static":
        return StaticVerifier(model, ops=ops, chooser=chooser, mode=mode)
    if kind == "native":
        return RunnerVerifier(model, ops=ops, chooser=chooser)
    return ModelVerifier(model, ops=ops, chooser=chooser)


__all__ = [
    "BACKENDS",
    "CACHES",
    "KVState",
    "ModelVerifier",
    "RunnerVerifier",
    "StaticVerifier",
    "TorchTreeOps",
    "TreeOps",
    "auto_cache",
    "auto_cache_reason",
    "make_tree_ops",
    "make_verifier",
    "resolve_cache",
]
