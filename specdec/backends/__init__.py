"""What runs the model's forward: the ``engine`` a verifier is made with, and its tree operations.

``engine`` (:data:`ENGINES`) names what runs the forward, and with it the KV cache it needs:

- ``"hf"``: Hugging Face's own forward on a ``DynamicCache`` per sequence, eager
  (:class:`~specdec.backends.verifier.ModelVerifier`);
- ``"specdec"``: specdec's own forward of Llama-family decoders with its CPU kernels, a cache
  per sequence, nothing compiled (:func:`~specdec.backends.specdec_engine.forward.specdec_verifier`);
- fixed-shape forwards, one per tree-size bucket, on a static cache
  (:func:`~specdec.backends.buckets.forward.bucket_verifier`): ``"compiled"`` (inductor), ``"graphs"``
  (replayed from CUDA graphs), ``"compiled-graphs"`` (both) and ``"buckets"`` (eager: tests,
  debugging);
- ``"auto"``: :func:`~specdec.backends.engines.choose_engine`.

Each name's builder, cache kind and what it supports stand in one table,
:data:`specdec.backends.engines.TABLE`.

The tree operations (inputs, acceptance, compaction; :data:`TREE_OPS`) are an internal choice:
``"auto"`` takes the compiled ``cuda_ext`` ops (C++ on the CPU, CUDA on a GPU) when they build
and serve the device, else the ``"torch"`` reference, with one warning per process that says
why; ``tree_ops=`` of :func:`make_verifier` (and of :class:`~specdec.Generator`) overrides it
for tests and benchmarks.

The former spellings (``cache=`` names, ``backend=``) map through :func:`engine_for_cache`.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from specdec.backends.buckets.forward import bucket_verifier
from specdec.backends.buckets.sizes import STATIC_ENGINES
from specdec.backends.cuda_ext import BackendUnavailableError, ExtTreeOps
from specdec.backends.engines import ENGINES, TABLE, choose_engine, engine_row
from specdec.backends.forward import KVState, check_model
from specdec.backends.specdec_engine.forward import specdec_verifier
from specdec.backends.specdec_engine.model_runner import unsupported_reason
from specdec.backends.tree_ops import TorchTreeOps, TreeOps
from specdec.backends.verifier import ModelVerifier
from specdec.errors import SpecDecError, warn_deprecated
from specdec.gguf_weights import refuse_other_engine
from specdec.native import NativeBuildError
from specdec.types import TokenChooser

TREE_OPS = ("auto", "torch", "cuda_ext")
# The former ``cache=`` names and the engine each one is ("static": engine_for_cache).
CACHE_ENGINES = {"auto": "auto", "dynamic": "hf", "native": "specdec",
                 **{f"static-{mode}": engine for engine, mode in STATIC_ENGINES.items()}}  # fmt: skip
CACHES = (*CACHE_ENGINES, "static")

_warned_fallback = False


def make_tree_ops(tree_ops: str, device: torch.device) -> TreeOps:
    """The named tree operations (:data:`TREE_OPS`) for a model on ``device``."""
    global _warned_fallback
    if tree_ops not in TREE_OPS:
        raise SpecDecError(f"unknown tree ops {tree_ops!r}; valid names: {', '.join(TREE_OPS)}")
    if tree_ops == "torch":
        return TorchTreeOps()
    if tree_ops == "cuda_ext":
        return ExtTreeOps(device)
    try:
        return ExtTreeOps(device)
    except (NativeBuildError, BackendUnavailableError) as error:
        if not _warned_fallback:
            _warned_fallback = True
            reason = str(error).splitlines()[0]
            warnings.warn(
                f"tree ops 'auto' use the torch reference: the compiled cuda_ext ops are unavailable ({reason}); "
                "pass tree_ops='cuda_ext' to see the whole error",
                RuntimeWarning,
                stacklevel=3,
            )
        return TorchTreeOps()


def auto_engine(model: Any, device: torch.device) -> str:
    """What ``engine="auto"`` runs for ``model`` on ``device`` (:func:`~specdec.backends.engines.choose_engine`)."""
    return choose_engine(model, device)[0]


def auto_engine_reason(model: Any, device: torch.device) -> str:
    """Why ``engine="auto"`` picks what it picks (:func:`~specdec.backends.engines.choose_engine`)."""
    return choose_engine(model, device)[1]


def resolve_engine(engine: str, device: torch.device, model: Any = None) -> str:
    """The engine ``engine`` names on ``device`` (``"auto"`` asks
    :func:`~specdec.backends.engines.choose_engine` about ``model``), checked against the table.

    >>> resolve_engine("hf", torch.device("cpu")), resolve_engine("auto", torch.device("cuda"))
    ('hf', 'graphs')
    """
    if engine == "auto":
        return choose_engine(model, device)[0]
    return engine_row(engine).name


def engine_for_cache(cache: str, model: Any = None) -> str:
    """The engine a former ``cache=`` name (:data:`CACHES`) ran for ``model`` (None: a model on a CPU).

    ``"static"`` named no mode: on CUDA the graphs; on a CPU specdec's own forward for a model it
    runs (its own static cache, kernels built ahead of time), else the compiled buckets.

    >>> engine_for_cache("dynamic"), engine_for_cache("static"), engine_for_cache("static-eager")
    ('hf', 'compiled', 'buckets')
    """
    if not isinstance(cache, str) or cache not in CACHES:
        raise SpecDecError(f"unknown cache {cache!r}; valid names: {', '.join(CACHES)} (cache= is now engine=)")
    if cache != "static":
        return CACHE_ENGINES[cache]
    if model is None:
        return "compiled"
    check_model(model)
    if next(model.parameters()).device.type == "cuda":
        return "graphs"
    return "specdec" if unsupported_reason(model) is None else "compiled"


def former_spellings(
    model: Any, engine: str, tree_ops: str, cache: str | None, backend: str | None
) -> tuple[str, str]:
    """``(engine, tree_ops)`` with the former ``cache=`` and ``backend=`` spellings mapped, each with a
    :class:`DeprecationWarning` that names the new one (docs/usage.md)."""
    if cache is not None:
        if engine != "auto":
            raise SpecDecError(f"give engine= alone: cache= is its former name (got {engine!r} and {cache!r})")
        engine = engine_for_cache(cache, model)
        warn_deprecated(f"cache={cache!r} is deprecated: pass engine={engine!r} (what runs the model's forward)")
    if backend is not None:
        if tree_ops != "auto":
            raise SpecDecError(f"give tree_ops= alone: backend= is its former name (got {tree_ops!r}, {backend!r})")
        tree_ops = backend
        warn_deprecated(f"backend={backend!r} is deprecated: specdec chooses the tree operations; "
                        f"tree_ops={backend!r} overrides them for tests and benchmarks")  # fmt: skip
    return engine, tree_ops


def make_verifier(
    model: Any, engine: str = "auto", *, tree_ops: str = "auto", chooser: TokenChooser | None = None
) -> ModelVerifier:
    """A verifier for ``model`` whose forward ``engine`` runs (its row of
    :data:`~specdec.backends.engines.TABLE` builds it), with the named tree operations."""
    if tree_ops not in TREE_OPS:
        raise SpecDecError(f"unknown tree ops {tree_ops!r}; valid names: {', '.join(TREE_OPS)}")
    check_model(model)  # a model we cannot serve is the first thing to report
    device = next(model.parameters()).device
    row = TABLE[resolve_engine(engine, device, model)]  # the name, checked once
    refuse_other_engine(model, row.name)  # a model holding only GGUF blocks: specdec's forward alone reads them
    return row.build(model, make_tree_ops(tree_ops, device), chooser)


__all__ = [
    "CACHES",
    "ENGINES",
    "STATIC_ENGINES",
    "TREE_OPS",
    "KVState",
    "ModelVerifier",
    "TorchTreeOps",
    "TreeOps",
    "auto_engine",
    "auto_engine_reason",
    "bucket_verifier",
    "engine_for_cache",
    "former_spellings",
    "make_tree_ops",
    "make_verifier",
    "resolve_engine",
    "specdec_verifier",
]
