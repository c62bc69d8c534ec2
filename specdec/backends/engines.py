"""The engines, one row each: what builds an engine's verifier, its cache kind, what it supports.

``engine=`` (:data:`ENGINES`) names what runs the model's forward; :data:`TABLE` is the one place
that maps a name to code. Each row says:

- ``build``: the verifier of a model, with the tree ops and token chooser given;
- ``cache_kind``: the forward's kind in calibration keys (``"dynamic"``, ``"native"``,
  ``"static-<mode>"``; the built verifier's ``cache_kind``);
- ``mode``: a bucket engine's mode (:data:`~specdec.backends.buckets.sizes.MODES`), else None;
- ``cuda_only``: whether it needs a model on a CUDA device;
- ``precompiles``: what ``specdec compile`` does for it: ``"kernels"`` (builds, loads and calibrates
  specdec's CPU kernels), ``"buckets"`` (compiles the buckets, where the mode is inductor's) or None;
- ``batch``: for the engines whose verifier holds one sequence, the verifier a batch of ``places``
  runs on (every row's tree in one forward), else None: the engine's own verifier serves a batch.

``engine="auto"`` is :func:`choose_engine`: the choice and the reason, from one function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from specdec.backends import sliding
from specdec.backends.buckets.forward import bucket_verifier
from specdec.backends.buckets.rows import rows_verifier
from specdec.backends.buckets.sizes import STATIC_ENGINES
from specdec.backends.forward import Target
from specdec.backends.hf.forward import HFForward
from specdec.backends.specdec_engine.forward import specdec_verifier
from specdec.backends.specdec_engine.model_runner import unsupported_reason
from specdec.backends.tree_ops import TreeOps
from specdec.backends.verifier import ModelVerifier
from specdec.errors import SpecDecError
from specdec.types import TokenChooser

Builder = Callable[[Any, TreeOps, "TokenChooser | None"], ModelVerifier]


@dataclass(frozen=True)
class Engine:
    """One engine's row of :data:`TABLE` (the module docstring says what each field means)."""

    name: str
    build: Builder
    cache_kind: str
    mode: str | None = None
    cuda_only: bool = False
    precompiles: str | None = None
    batch: Callable[[ModelVerifier, int], ModelVerifier] | None = None


def _hf(model: Any, ops: TreeOps, chooser: TokenChooser | None) -> ModelVerifier:
    return ModelVerifier(model, ops, chooser, forward=HFForward(Target.of(model), ops))  # it refuses what it cannot run


def _specdec(model: Any, ops: TreeOps, chooser: TokenChooser | None) -> ModelVerifier:
    sliding.engine_window(model, "specdec")  # refuses sliding-window layers: specdec's forward runs full attention
    return specdec_verifier(model, ops, chooser)


def _buckets(engine: str) -> Builder:
    """The builder of the fixed-shape engine ``engine`` (its forward checks the model's layers itself)."""

    def build(model: Any, ops: TreeOps, chooser: TokenChooser | None) -> ModelVerifier:
        return bucket_verifier(model, ops, chooser, engine=engine)

    return build


TABLE: dict[str, Engine] = {
    "hf": Engine("hf", _hf, "dynamic"),
    "specdec": Engine("specdec", _specdec, "native", precompiles="kernels"),
    **{name: Engine(name, _buckets(name), f"static-{mode}", mode=mode, cuda_only="cudagraphs" in mode,
                    precompiles="buckets", batch=rows_verifier)
       for name, mode in STATIC_ENGINES.items()},
}  # fmt: skip
ENGINES = ("auto", *TABLE)


def engine_row(name: str) -> Engine:
    """The row of the engine ``name`` (not ``"auto"``: :func:`choose_engine` picks one), or a clear error."""
    row = TABLE.get(name) if isinstance(name, str) else None
    if row is None:
        raise SpecDecError(f"unknown engine {name!r}; valid names: {', '.join(ENGINES)}")
    return row


def choose_engine(model: Any, device: torch.device) -> tuple[str, str]:
    """What ``engine="auto"`` runs for ``model`` on ``device``, and why in a few words (the demo prints it).

    ``"graphs"`` on CUDA; on a CPU ``"specdec"`` where specdec's own forward runs the model
    (:func:`~specdec.backends.specdec_engine.model_runner.unsupported_reason`), else ``"hf"``; a
    sliding-window model on a CPU runs Hugging Face's forward, or the eager buckets where this
    transformers' sliding layers cannot take back a rejected draft. Neither CPU choice compiles
    anything, so the first call is as fast as later ones; docs/static-cache.md measures them
    against the compiled buckets.
    """
    window = sliding.window_reason(model)
    if device.type == "cuda":
        if window is not None:
            return "graphs", (f"a CUDA device: fixed-shape forwards replayed from CUDA graphs, with window masks for "
                              f"the {window} (sliding layers in rings bounded by the window; not yet run on a GPU)")
        return "graphs", "a CUDA device: fixed-shape forwards replayed from CUDA graphs"
    if window is not None and not sliding.records_the_past():
        return "buckets", (f"a CPU and {window}: the eager buckets, sliding layers in rings (this transformers' "
                           "sliding layers cannot take back a rejected draft; specdec's forward runs full attention "
                           "only)")
    if window is not None:
        return "hf", (f"a CPU and {window}: Hugging Face's forward, its sliding layers' cache bounded by the window "
                      "(specdec's forward runs full attention only)")
    reason = unsupported_reason(model)
    if reason is None:
        return "specdec", "a CPU and a Llama-family model: specdec's own forward, nothing compiled"
    return "hf", f"a CPU, and specdec's own forward does not run this model ({reason}): Hugging Face's forward"


def row_of(verifier: Any) -> Engine | None:
    """The row of the engine ``verifier`` runs (its ``engine``), or None for a verifier of none of them."""
    return TABLE.get(getattr(verifier, "engine", None) or "")
