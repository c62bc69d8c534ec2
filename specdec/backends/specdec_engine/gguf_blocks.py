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

Rows: transformers reverses llama.cpp's permutation of the query and key rows of ``llama``
GGUF files (``LlamaTensorProcessor``: within each head, rows ``(j, a)`` of the file become rows
``(a, j)``); a GGUF row is an independent run of blocks, so the same permutation of whole rows of
blocks gives the model's layout.

Checked at load, never later: the file must parse, every tensor must hold the bytes its shape needs
(a truncated file is refused), every block's scales must be finite float16 values, and every weight
widened from its blocks must equal the model's tensor bit for bit (so a model edited after loading,
or a mapping that went wrong, is refused naming the weight, never run on the wrong numbers). After
that the blocks are what the forward reads: an in-place update of the model's float32 weights is
not seen (``SPECDEC_GGUF_WEIGHTS=dense`` reads the model's own tensors).
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specdec.backends.specdec_engine import cpu_kernels
from specdec.errors import SpecDecError
from specdec.models import gguf_file

# What engine="specdec" reads for a model loaded from a GGUF file: "blocks" (the file's quantized blocks,
# widened on the way: the same bits) or "dense" (the model's float32 tensors).
WEIGHTS_ENV = "SPECDEC_GGUF_WEIGHTS"
WEIGHTS_CHOICES = ("blocks", "dense")

# The GGUF tensor of each linear layer, by its name in a Llama-family Hugging Face model.
_LAYER_TENSORS = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}  # fmt: skip

# Each block type's float16 fields (byte offsets of the scales and minimums a block starts or ends with).
_HALF_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q4_K": (0, 2), "Q6_K": (208,)}

_WARNED: set[Path] = set()


def weights_choice() -> str:
    """What :data:`WEIGHTS_ENV` selects (``"blocks"`` unset); another value raises naming it."""
    value = os.environ.get(WEIGHTS_ENV, "blocks").strip() or "blocks"
    if value not in WEIGHTS_CHOICES:
        raise SpecDecError(f"{WEIGHTS_ENV}={value!r}: valid values are {', '.join(WEIGHTS_CHOICES)}")
    return value


@dataclass(frozen=True)
class GgufWeights:
    """The blocks standing for a model's linear weights: ``blocks[name]`` uint8 ``[out, B, block_bytes]``
    by the weight's parameter name (``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``);
    ``types[name]`` the GGUF type; ``dense``: the linear weights left as the model's tensors (other types)."""

    path: Path
    blocks: Mapping[str, torch.Tensor]
    types: Mapping[str, str]
    dense: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        """The blocks' bytes (what a forward reads of these weights)."""
        return sum(int(t.numel()) for t in self.blocks.values())


_LOADED: weakref.WeakKeyDictionary[Any, GgufWeights] = weakref.WeakKeyDictionary()


def model_blocks(model: Any) -> GgufWeights | None:
    """The GGUF blocks engine="specdec" reads for ``model``: None where the model was not loaded from a GGUF
    file (:func:`specdec.models.gguf_file`), is not float32 on the CPU, :data:`WEIGHTS_ENV` says ``dense``,
    or the CPU kernels are unavailable. Read and checked once per model (module docstring), then shared."""
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


def _permutation(rows: int, heads: int) -> np.ndarray:
    """The file's row of each model row of a ``llama`` file's query or key weight: transformers'
    ``reverse_permute`` (rows ``[heads, dim, 2]`` of the file read as ``[heads, 2, dim]``)."""
    dim = rows // heads // 2
    order: np.ndarray = np.arange(rows).reshape(heads, dim, 2).swapaxes(2, 1).reshape(rows)
    return order


def _check_scales(name: str, kind: str, raw: np.ndarray) -> None:
    """Refuse blocks whose float16 scales are not finite (a damaged file), naming the tensor and block."""
    for offset in _HALF_FIELDS[kind]:
        halves = np.ascontiguousarray(raw[..., offset : offset + 2]).view(np.float16)[..., 0]
        bad = ~np.isfinite(halves)
        if bad.any():
            row, block = (int(i) for i in np.argwhere(bad)[0])
            raise SpecDecError(f"GGUF tensor {name!r}: block {block} of row {row} has a non-finite scale "
                               f"({halves[row, block]!r}): the file is damaged")  # fmt: skip


def _read_tensors(path: Path) -> tuple[str, dict[str, Any]]:
    try:
        import gguf

        reader = gguf.GGUFReader(path)
    except (OSError, ValueError, IndexError, KeyError) as error:
        raise SpecDecError(f"the GGUF file {str(path)!r} does not parse ({type(error).__name__}: {error})") from error
    field = reader.fields.get("general.architecture")
    arch = bytes(field.parts[field.data[0]]).decode() if field is not None else ""
    return arch, {tensor.name: tensor for tensor in reader.tensors}


def read_blocks(path: Path, model: Any) -> GgufWeights:
    """Read the blocks of ``model``'s linear weights from the GGUF file at ``path`` and check them (module
    docstring); raises :class:`~specdec.errors.SpecDecError` naming the file, tensor or weight at fault."""
    arch, tensors = _read_tensors(path)
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    wanted = {
        f"model.layers.{i}.{hf}.weight": f"blk.{i}.{gg}.weight"
        for i in range(config.num_hidden_layers) for hf, gg in _LAYER_TENSORS.items()
    }  # fmt: skip
    wanted["lm_head.weight"] = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    params = dict(model.named_parameters(remove_duplicate=False))
    blocks: dict[str, torch.Tensor] = {}
    types: dict[str, str] = {}
    dense: list[str] = []
    for name, tensor_name in wanted.items():
        tensor = tensors.get(tensor_name)
        weight = params.get(name)
        if tensor is None or weight is None:
            raise SpecDecError(f"the GGUF file {str(path)!r} has no tensor {tensor_name!r} for the model's {name!r}")
        kind = tensor.tensor_type.name
        if kind not in cpu_kernels.GGUF_BLOCK_TYPES:
            dense.append(f"{name} ({kind})")
            continue
        elements, block_bytes = cpu_kernels.GGUF_BLOCK_TYPES[kind]
        out_features, in_features = (int(n) for n in weight.shape)
        shape = [int(n) for n in tensor.shape]  # GGUF order: [in, out]
        if shape != [in_features, out_features] or in_features % elements:
            raise SpecDecError(f"GGUF tensor {tensor_name!r} is {kind} of shape {shape}; the model's {name!r} is "
                               f"[{out_features}, {in_features}] (in-features a multiple of {elements})")  # fmt: skip
        expected = out_features * (in_features // elements) * block_bytes
        data = np.asarray(tensor.data)
        if data.dtype != np.uint8 or data.size != expected:
            raise SpecDecError(f"GGUF tensor {tensor_name!r} ({kind}) holds {data.size * data.itemsize} bytes, its "
                               f"shape needs {expected}: the file is truncated or damaged")  # fmt: skip
        raw = data.reshape(out_features, in_features // elements, block_bytes)
        _check_scales(tensor_name, kind, raw)
        if arch == "llama" and tensor_name.endswith((".attn_q.weight", ".attn_k.weight")):
            raw = raw[_permutation(out_features, heads if ".attn_q." in tensor_name else kv_heads)]
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
