"""A GGUF file's quantized blocks as the weights of specdec's skinny linear layers (``engine="specdec"``).

Why: the default model is a Q4_1 GGUF file (about 90 MB), which transformers dequantizes to a
float32 model (538 MB of linear weights). A plain step of a small model on a CPU is bound by reading
its weights, so reading the float32 copy costs six times the bytes the file holds. Here each linear
layer's weight is kept as the file's blocks (uint8 ``[out, blocks, block_bytes]``, one GGUF row per
weight row), which :func:`~specdec.backends.specdec_engine.cpu_kernels.skinny_linear` widens 16 rows at
a time to exactly the float32 values gguf-py's dequantizer gives (transformers' loader), then
multiplies as it multiplies the float32 weight: the logits are bitwise those of the widened model.

What is read: ``q/k/v/o``, ``gate/up/down`` of every layer and the output head (the embedding's
blocks where the head is tied to it), of the types in
:data:`~specdec.backends.specdec_engine.cpu_kernels.GGUF_BLOCK_TYPES` (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K).
Weights of other types keep the model's float32 tensor (one warning per file names them).

Checked at load, never later: the file and its blocks (:mod:`specdec.gguf_weights`: it parses, no tensor
is truncated, every scale is finite; the query and key rows in the model's order), and every weight
widened from its blocks must equal the model's tensor bit for bit (so a model edited after loading,
or a mapping that went wrong, is refused naming the weight, never run on the wrong numbers). After
that the blocks are what the forward reads: an in-place update of the model's float32 weights is
not seen (``SPECDEC_GGUF_WEIGHTS=dense`` reads the model's own tensors). A blocks-only model
(``load_model(..., weights="blocks")``) has no float32 copy to check against or fall back on.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specdec import gguf_weights
from specdec.backends.specdec_engine import cpu_kernels
from specdec.errors import SpecDecError
from specdec.gguf_weights import linear_tensors, read_tensors, tensor_blocks
from specdec.models import gguf_file

# What engine="specdec" reads for a model loaded from a GGUF file: "blocks" (the file's quantized blocks,
# widened on the way: the same bits) or "dense" (the model's float32 tensors).
WEIGHTS_ENV = "SPECDEC_GGUF_WEIGHTS"
WEIGHTS_CHOICES = ("blocks", "dense")

_WARNED: set[Path] = set()


def weights_choice() -> str:
    """What :data:`WEIGHTS_ENV` selects (``"blocks"`` unset); another value raises naming it."""
    value = os.environ.get(WEIGHTS_ENV, "blocks").strip() or "blocks"
    if value not in WEIGHTS_CHOICES:
        raise SpecDecError(f"{WEIGHTS_ENV}={value!r}: valid values are {', '.join(WEIGHTS_CHOICES)}")
    return value


@contextmanager
def weights_chosen(value: str | None) -> Iterator[None]:
    """:data:`WEIGHTS_ENV` set to ``value`` inside the block (None: left as it is), then as it was: what a
    verifier reads when it is made, so one made inside keeps that choice."""
    if value is None:
        yield
        return
    before = os.environ.get(WEIGHTS_ENV)
    os.environ[WEIGHTS_ENV] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(WEIGHTS_ENV, None)
        else:
            os.environ[WEIGHTS_ENV] = before


@dataclass(frozen=True)
class GgufWeights:
    """The blocks standing for a model's linear weights: ``blocks[name]`` uint8 ``[out, B, block_bytes]``
    by the weight's parameter name (``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``);
    ``types[name]`` the GGUF type; ``dense``: the linear weights left as the model's tensors (other types);
    ``only_copy``: the blocks are the only copy of those weights, the model's are placeholders (a blocks-only
    load: :mod:`specdec.gguf_weights`)."""

    path: Path
    blocks: Mapping[str, torch.Tensor]
    types: Mapping[str, str]
    dense: tuple[str, ...]
    only_copy: bool = False

    @property
    def nbytes(self) -> int:
        """The blocks' bytes (what a forward reads of these weights)."""
        return sum(int(t.numel()) for t in self.blocks.values())


_LOADED: weakref.WeakKeyDictionary[Any, GgufWeights] = weakref.WeakKeyDictionary()


def model_blocks(model: Any) -> GgufWeights | None:
    """The GGUF blocks engine="specdec" reads for ``model``: None where the model was not loaded from a GGUF
    file (:func:`specdec.models.gguf_file`), is not float32 on the CPU, :data:`WEIGHTS_ENV` says ``dense``,
    or the CPU kernels are unavailable. Read and checked once per model (module docstring), then shared.
    A blocks-only model (:func:`~specdec.gguf_weights.blocks_only`) has no float32
    weights to fall back on: each of those conditions raises for it, naming the way out."""
    if gguf_weights.blocks_only(model):
        return _only_copy(model)
    path = gguf_file(model)
    if path is None or weights_choice() != "blocks" or not cpu_kernels.available():
        return None
    parameter = next(model.parameters(), None)
    if parameter is None or parameter.dtype != torch.float32 or parameter.device.type != "cpu":
        return None
    known = _LOADED.get(model)
    if known is None or known.path != path:
        known = read_blocks(path, model)
        _LOADED[model] = known
    return known


def _only_copy(model: Any) -> GgufWeights:
    """The blocks of a blocks-only model (:func:`specdec.gguf_weights.only_copy`), refused where none can run."""
    refusal = None
    if weights_choice() != "blocks":
        refusal = f"{WEIGHTS_ENV}=dense reads the model's float32 weights"
    elif not cpu_kernels.available():
        refusal = "specdec's CPU kernels, which read the blocks, are unavailable here"
    elif any(p.dtype != torch.float32 or p.device.type != "cpu" for p in model.parameters()):
        refusal = "the blocks are read on the CPU in float32 (the model was moved or cast)"
    if refusal is not None:
        raise SpecDecError(f"{refusal}, and this model holds only its GGUF blocks (loaded with weights='blocks'): "
                           "load the file with weights='dense'")  # fmt: skip
    known = _LOADED.get(model)
    if known is None:
        found = gguf_weights.only_copy(model)
        known = GgufWeights(gguf_file(model) or Path(), found.blocks, found.types, found.widened, only_copy=True)
        _LOADED[model] = known
    return known


def read_blocks(path: Path, model: Any) -> GgufWeights:
    """Read the blocks of ``model``'s linear weights from the GGUF file at ``path`` and check them (module
    docstring); raises :class:`~specdec.errors.SpecDecError` naming the file, tensor or weight at fault."""
    arch, tensors = read_tensors(path)
    params = dict(model.named_parameters(remove_duplicate=False))
    blocks: dict[str, torch.Tensor] = {}
    types: dict[str, str] = {}
    dense: list[str] = []
    for name, tensor_name in linear_tensors(model.config, tensors).items():
        tensor = tensors[tensor_name]
        weight = params.get(name)
        if weight is None:
            raise SpecDecError(f"the GGUF file {str(path)!r} has no tensor {tensor_name!r} for the model's {name!r}")
        kind = tensor.tensor_type.name
        if kind not in cpu_kernels.GGUF_BLOCK_TYPES:
            dense.append(f"{name} ({kind})")
            continue
        out_features, in_features = (int(n) for n in weight.shape)
        raw = tensor_blocks(arch, tensor, out_features, in_features, model.config)
        block_tensor = torch.from_numpy(np.array(raw, copy=True))  # off the file's memory map
        widened = cpu_kernels.gguf_widen(block_tensor)
        if not torch.equal(widened, weight.detach()):
            raise SpecDecError(f"the model's {name!r} is not what GGUF tensor {tensor_name!r} of {str(path)!r} "
                               f"dequantizes to (the weights were changed after loading?); {WEIGHTS_ENV}=dense "
                               "reads the model's own tensors")  # fmt: skip
        blocks[name] = block_tensor
        types[name] = kind
    if dense and path not in _WARNED:
        _WARNED.add(path)
        warnings.warn(f"specdec: {len(dense)} linear weights of {path.name} are of GGUF types the CPU kernels do not "
                      f"read as blocks; they run widened: {', '.join(dense[:4])}{' ...' if len(dense) > 4 else ''}",
                      RuntimeWarning, stacklevel=3)  # fmt: skip
    return GgufWeights(path, blocks, types, tuple(dense))
