"""A GGUF file's tensors as blocks, and a model loaded with its linear weights held only as those blocks.

The format (read by gguf-py over a memory map of the file): :func:`read_tensors`, :func:`linear_tensors` (the
GGUF tensor of each linear weight of a Llama-family model) and :func:`tensor_blocks` (a tensor's blocks in the
model's row order, checked), for :data:`GGUF_BLOCK_TYPES`, the types specdec's CPU kernels read
(:mod:`~specdec.backends.specdec_engine.gguf_blocks` reads them for engine="specdec").

Rows: transformers reverses llama.cpp's permutation of the query and key rows of ``llama``
GGUF files (``LlamaTensorProcessor``: within each head, rows ``(j, a)`` of the file become rows
``(a, j)``); a GGUF row is an independent run of blocks, so the same permutation of whole rows of
blocks gives the model's layout. Checked, never later: the file must parse, every tensor must hold
the bytes its shape needs (a truncated file is refused), every block's scales must be finite float16.

**The blocks-only load** (``load_model(..., weights="blocks")``). Why: transformers loads a GGUF file
by dequantizing every tensor to float32 first
(``load_gguf_checkpoint``), so the peak and the resident memory are the float32 model's: an 8B Q4_K
file of about 5 GB needs about 32 GB. ``engine="specdec"`` reads the blocks anyway
(:mod:`~specdec.backends.specdec_engine.gguf_blocks`), so the float32 copy of those weights is never read.

:func:`load_blocks_model` builds the Hugging Face model from the file's config with its parameters on
the meta device (``accelerate.init_empty_weights``; buffers such as the rotary frequencies are made as
transformers makes them), then:

- each linear layer whose GGUF type the CPU kernels read (``q/k/v/o``, ``gate/up/down``, an untied
  output head) becomes a :class:`GgufBlocksLinear`: its blocks, uint8 ``[out, B, block_bytes]``, a view of
  the file's memory map (no copy; the ``llama`` query and key rows permuted as transformers permutes them,
  which copies those two), and a placeholder weight of the right shape that costs 4 bytes;
- an input embedding of a block type becomes a :class:`GgufBlocksEmbedding`: its blocks, each row it looks
  up widened by gguf-py's ``dequantize`` (a tied head reads the same blocks on engine="specdec");
- every other tensor (the norms, biases, linear weights of other types, an embedding of another type) is
  dequantized exactly as transformers does it: gguf-py's ``dequantize``, then transformers' tensor processor
  of the architecture, then float32: the same bits as ``from_pretrained(..., gguf_file=...)``.

Peak memory: the blocks (mapped) plus the dense tensors, about the file's size (a 1B shape's peak resident
set, dense against blocks-only: docs/bench/gguf-memory-2026-12-03/, made with :mod:`specdec.bench.random_gguf`).

Nothing else can run such a model: Hugging Face's forward (``generate``, engine="hf"), the bucket
engines and torch's linear would read the placeholders, so a :class:`GgufBlocksLinear`'s forward
raises, and :func:`refuse_other_engine` refuses every engine but specdec at entry, naming the way out.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specdec.errors import SpecDecError

# The GGUF types specdec's CPU kernels read as blocks (uint8 [N, B, block_bytes]): each type's elements per
# block and the block's size in bytes, which names the type (csrc/skinny_linear.h; gguf-py's GGML_QUANT_SIZES).
GGUF_BLOCK_TYPES = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q4_K": (256, 144), "Q6_K": (256, 210)}
# Each block type's float16 fields (byte offsets of the scales and minimums a block starts or ends with).
HALF_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q4_K": (0, 2), "Q6_K": (208,)}
# The GGUF tensor of each linear layer, by its name in a Llama-family Hugging Face model.
_LAYER_TENSORS = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}  # fmt: skip
# The engine a blocks-only model runs on, and the way to load it for any other.
_WAY_OUT = ("engine='specdec' runs it (on the CPU, float32); for Hugging Face's forward, generate() or another "
            "engine load the file dense: specdec.load_model(path, weights='dense')")  # fmt: skip
# GGUF architectures whose tensor processor the loader knows: llama's query/key row permutation, else none.
_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")


def _permutation(rows: int, heads: int) -> np.ndarray:
    """The file's row of each model row of a ``llama`` file's query or key weight: transformers'
    ``reverse_permute`` (rows ``[heads, dim, 2]`` of the file read as ``[heads, 2, dim]``)."""
    dim = rows // heads // 2
    order: np.ndarray = np.arange(rows).reshape(heads, dim, 2).swapaxes(2, 1).reshape(rows)
    return order


def _check_scales(name: str, kind: str, raw: np.ndarray) -> None:
    """Refuse blocks whose float16 scales are not finite (a damaged file), naming the tensor and block."""
    for offset in HALF_FIELDS[kind]:
        halves = np.ascontiguousarray(raw[..., offset : offset + 2]).view(np.float16)[..., 0]
        bad = ~np.isfinite(halves)
        if bad.any():
            row, block = (int(i) for i in np.argwhere(bad)[0])
            raise SpecDecError(f"GGUF tensor {name!r}: block {block} of row {row} has a non-finite scale "
                               f"({halves[row, block]!r}): the file is damaged")  # fmt: skip


def read_tensors(path: Path, mode: str = "r") -> tuple[str, dict[str, Any]]:
    """The GGUF file's architecture and its tensors by name (gguf-py's reader over a memory map of the file
    opened in ``mode``, numpy's: ``"c"`` gives writable copy-on-write views); a file that does not parse raises."""
    try:
        import gguf

        reader = gguf.GGUFReader(path, mode)  # type: ignore[arg-type]
    except (OSError, ValueError, IndexError, KeyError) as error:
        raise SpecDecError(f"the GGUF file {str(path)!r} does not parse ({type(error).__name__}: {error})") from error
    field = reader.fields.get("general.architecture")
    arch = bytes(field.parts[field.data[0]]).decode() if field is not None else ""
    return arch, {tensor.name: tensor for tensor in reader.tensors}


def linear_tensors(config: Any, tensors: Mapping[str, Any]) -> dict[str, str]:
    """The GGUF tensor of each linear weight the kernels may read as blocks, by the weight's parameter name (the
    head's: ``output.weight``, or the embedding's where the file has none: a tied head)."""
    wanted = {
        f"model.layers.{i}.{hf}.weight": f"blk.{i}.{gg}.weight"
        for i in range(config.num_hidden_layers) for hf, gg in _LAYER_TENSORS.items()
    }  # fmt: skip
    wanted["lm_head.weight"] = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    for name, tensor_name in wanted.items():
        if tensor_name not in tensors:
            raise SpecDecError(f"the GGUF file has no tensor {tensor_name!r} for the model's {name!r}")
    return wanted


def tensor_blocks(arch: str, tensor: Any, out_features: int, in_features: int, config: Any) -> np.ndarray:
    """The blocks of GGUF ``tensor`` (of a type in ``GGUF_BLOCK_TYPES``) as uint8 ``[out, B, block_bytes]`` in
    the model's row order, checked (module docstring): a view of the file's map where no permutation applies."""
    name, kind = tensor.name, tensor.tensor_type.name
    elements, block_bytes = GGUF_BLOCK_TYPES[kind]
    shape = [int(n) for n in tensor.shape]  # GGUF order: [in, out]
    if shape != [in_features, out_features] or in_features % elements:
        raise SpecDecError(f"GGUF tensor {name!r} is {kind} of shape {shape}; the model's weight is "
                           f"[{out_features}, {in_features}] (in-features a multiple of {elements})")  # fmt: skip
    expected = out_features * (in_features // elements) * block_bytes
    data = np.asarray(tensor.data)
    if data.dtype != np.uint8 or data.size != expected:
        raise SpecDecError(f"GGUF tensor {name!r} ({kind}) holds {data.size * data.itemsize} bytes, its "
                           f"shape needs {expected}: the file is truncated or damaged")  # fmt: skip
    raw = data.reshape(out_features, in_features // elements, block_bytes)
    _check_scales(name, kind, raw)
    if arch == "llama" and name.endswith((".attn_q.weight", ".attn_k.weight")):
        heads = config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads
        raw = raw[_permutation(out_features, heads)]
    return raw


class GgufBlocksLinear(torch.nn.Linear):
    """A linear layer whose weight is held only as a GGUF file's blocks.

    ``blocks``: uint8 ``[out_features, B, block_bytes]`` (a non-persistent buffer: one GGUF row per weight
    row, in the model's row order), ``kind``: the GGUF type (``"Q4_K"``). ``weight`` is a placeholder of
    shape ``[out_features, in_features]``, float32, one NaN seen through a zero-stride view (4 bytes): any
    product with it is NaN, never plausible numbers. ``forward`` raises: only engine="specdec" reads the
    blocks (module docstring)."""

    blocks: torch.Tensor

    def __init__(self, blocks: torch.Tensor, kind: str, in_features: int, bias: torch.Tensor | None) -> None:
        torch.nn.Module.__init__(self)  # not Linear's: it would allocate the float32 weight
        self.in_features, self.out_features = in_features, int(blocks.shape[0])
        placeholder = torch.full((), float("nan"), dtype=torch.float32).expand(self.out_features, in_features)
        self.weight = torch.nn.Parameter(placeholder, requires_grad=False)
        self.register_parameter("bias", None if bias is None else torch.nn.Parameter(bias, requires_grad=False))
        self.register_buffer("blocks", blocks, persistent=False)
        self.kind = kind

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        raise SpecDecError(f"this linear layer ([{self.out_features}, {self.in_features}], {self.kind}) holds only "
                           f"its GGUF blocks (loaded with weights='blocks'): {_WAY_OUT}")  # fmt: skip

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, blocks={self.kind}"


class GgufBlocksEmbedding(torch.nn.Module):
    """An input embedding held only as its GGUF blocks (uint8 ``[vocab, B, block_bytes]``, a view of the file's
    map): each row a forward looks up is widened by gguf-py's ``dequantize``, the function transformers widens the
    whole table with, so the rows are the dense table's bits while the table itself is never in memory (an 8B
    shape's float32 table is 2.1 GB). Its ``weight`` is a placeholder of the table's shape (a tied head's too)."""

    blocks: torch.Tensor

    def __init__(self, blocks: torch.Tensor, kind: str, embedding_dim: int, padding_idx: int | None) -> None:
        torch.nn.Module.__init__(self)
        self.num_embeddings, self.embedding_dim, self.padding_idx = int(blocks.shape[0]), embedding_dim, padding_idx
        placeholder = torch.full((), float("nan"), dtype=torch.float32).expand(self.num_embeddings, embedding_dim)
        self.weight = torch.nn.Parameter(placeholder, requires_grad=False)
        self.register_buffer("blocks", blocks, persistent=False)
        self.kind = kind

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        import gguf

        ids = input.reshape(-1).to(device=self.blocks.device, dtype=torch.int64)
        if ids.numel() == 0:  # gguf-py's reshapes do not take an empty array
            return torch.zeros(*input.shape, self.embedding_dim)
        rows = self.blocks.index_select(0, ids).reshape(ids.numel(), -1).numpy()  # an id out of range: IndexError
        values = gguf.dequantize(rows, gguf.GGMLQuantizationType[self.kind])
        return torch.from_numpy(values).reshape(*input.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, blocks={self.kind}"


@dataclass(frozen=True)
class OnlyCopy:
    """A blocks-only model's blocks: ``blocks[name]`` uint8 ``[out, B, block_bytes]`` by weight name (with a
    tied head's, the embedding's blocks), ``types[name]`` the GGUF type, ``widened``: the linear weights of
    other types, loaded float32 (``"name (type)"``)."""

    blocks: Mapping[str, torch.Tensor]
    types: Mapping[str, str]
    widened: tuple[str, ...]


_ONLY_COPY: weakref.WeakKeyDictionary[Any, OnlyCopy] = weakref.WeakKeyDictionary()


def only_copy(model: Any) -> OnlyCopy:
    """The blocks of a blocks-only ``model``: those its load recorded, else (a copy of it) its layers'."""
    known = _ONLY_COPY.get(model)
    if known is None:
        layers = {f"{n}.weight": m for n, m in model.named_modules() if isinstance(m, GgufBlocksLinear)}
        known = OnlyCopy({n: m.blocks for n, m in layers.items()}, {n: m.kind for n, m in layers.items()}, ())
    return known


def blocks_only(model: Any) -> bool:
    """Whether some linear layer of ``model`` holds only GGUF blocks (:class:`GgufBlocksLinear`)."""
    modules = getattr(model, "modules", None)
    return modules is not None and any(isinstance(m, GgufBlocksLinear) for m in modules())


def refuse_other_engine(model: Any, engine: str) -> None:
    """Raise where ``model`` holds only GGUF blocks and ``engine`` is not specdec (the only one that reads them)."""
    if engine != "specdec" and blocks_only(model):
        raise SpecDecError(f"engine={engine!r} cannot run this model: its linear weights are GGUF blocks only "
                           f"(loaded with weights='blocks'); {_WAY_OUT}")  # fmt: skip


def dense_bytes(path: Path) -> int:
    """The bytes of the GGUF file's tensors dequantized to float32 (what a dense load holds), from its header."""
    _, tensors = read_tensors(path)
    return sum(4 * int(np.prod([int(n) for n in tensor.shape])) for tensor in tensors.values())


def resident_bytes(model: Any) -> int:
    """The bytes of the distinct storages behind ``model``'s parameters and buffers (a placeholder: 4)."""
    storages = {}
    for tensor in (*model.parameters(), *model.buffers()):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def load_blocks_model(path: Path, attn_implementation: str = "sdpa") -> Any:
    """The Hugging Face model of the GGUF file at ``path`` with its block-read linear weights as
    :class:`GgufBlocksLinear` (module docstring), float32 on the CPU, in eval mode, its blocks
    recorded for :func:`only_copy` (:func:`specdec.models.load_model` notes its file). Raises
    :class:`~specdec.errors.SpecDecError` naming the file and tensor at fault: a file that does not parse
    or is truncated, a damaged block, an architecture outside :data:`_ARCHITECTURES`, a missing tensor."""
    import gguf
    from accelerate import init_empty_weights  # type: ignore[import-untyped]
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    arch, tensors = read_tensors(path, mode="c")  # copy-on-write map: writable views, no copy
    if arch not in _ARCHITECTURES:
        raise SpecDecError(f"weights='blocks' loads GGUF architectures {', '.join(_ARCHITECTURES)}; {path.name} is "
                           f"{arch!r}: load it with weights='dense'")  # fmt: skip
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, attn_implementation=attn_implementation, dtype=torch.float32
        )
    processor: Any = TENSOR_PROCESSORS.get(arch, TensorProcessor)
    processor = processor(config=config.to_dict())
    gguf_names = {hf: name for name, hf in get_gguf_hf_weights_map(model, processor).items()}
    modules = dict(model.named_modules())
    blocks: dict[str, torch.Tensor] = {}
    types: dict[str, str] = {}
    widened: list[str] = []
    for name, tensor_name in linear_tensors(model.config, tensors).items():
        tensor = tensors[tensor_name]
        kind = tensor.tensor_type.name
        if kind not in GGUF_BLOCK_TYPES:
            widened.append(f"{name} ({kind})")
            continue
        module_name = name.removesuffix(".weight")
        linear = modules[module_name]
        raw = tensor_blocks(arch, tensor, linear.out_features, linear.in_features, model.config)
        blocks[name], types[name] = torch.from_numpy(raw), kind
        if name == "lm_head.weight" and tensor_name == "token_embd.weight":
            continue  # a tied head: the embedding's float32 weight, its blocks read on engine="specdec"
        bias = _dense(gguf, processor, tensors, gguf_names.get(f"{module_name}.bias"))
        parent, _, child = module_name.rpartition(".")
        setattr(modules[parent], child, GgufBlocksLinear(blocks[name], kind, linear.in_features, bias))
    _embedding_blocks(model, arch, tensors, gguf_names, blocks)
    for name, _ in model.named_parameters(remove_duplicate=False):
        owner, _, attr = name.rpartition(".")
        if isinstance(model.get_submodule(owner), (GgufBlocksLinear, GgufBlocksEmbedding)):
            continue  # its weight a placeholder, its bias read above
        value = _dense(gguf, processor, tensors, gguf_names.get(name))
        if value is None:
            if name == "lm_head.weight" and model.config.tie_word_embeddings:
                continue  # tied below
            raise SpecDecError(f"the GGUF file {str(path)!r} has no tensor for the model's {name!r}")
        setattr(model.get_submodule(owner), attr, torch.nn.Parameter(value))
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    left = [name for name, tensor in (*model.named_parameters(), *model.named_buffers()) if tensor.is_meta]
    if left:
        raise SpecDecError(f"the GGUF file {str(path)!r} has no tensor for the model's {left[0]!r}")
    if widened:
        warnings.warn(f"specdec: {len(widened)} linear weights of {path.name} are of GGUF types the CPU kernels do "
                      f"not read as blocks; they load widened: {', '.join(widened[:4])}"
                      f"{' ...' if len(widened) > 4 else ''}", RuntimeWarning, stacklevel=3)  # fmt: skip
    model.eval()
    _ONLY_COPY[model] = OnlyCopy(blocks, types, tuple(widened))
    return model


def _embedding_blocks(model: Any, arch: str, tensors: dict[str, Any], gguf_names: dict[str, str],
                      blocks: dict[str, torch.Tensor]) -> None:
    """Make ``model``'s input embedding a :class:`GgufBlocksEmbedding` where its GGUF type is a block type (a tied
    head's blocks are the same view); left dense otherwise. Every :data:`_ARCHITECTURES` tensor processor leaves
    ``token_embd`` as the file has it, so the rows gguf-py widens are the ones transformers loads."""
    embedding = model.get_input_embeddings()
    name = next(n for n, m in model.named_modules() if m is embedding)
    tensor = tensors.get(gguf_names.get(f"{name}.weight", ""))
    if tensor is None or tensor.tensor_type.name not in GGUF_BLOCK_TYPES:
        return
    raw = blocks.get("lm_head.weight") if "output.weight" not in tensors else None  # a tied head's: the same view
    if raw is None:
        raw = torch.from_numpy(tensor_blocks(arch, tensor, embedding.num_embeddings, embedding.embedding_dim,
                                             model.config))  # fmt: skip
    parent, _, child = name.rpartition(".")
    module = GgufBlocksEmbedding(raw, tensor.tensor_type.name, embedding.embedding_dim, embedding.padding_idx)
    setattr(model.get_submodule(parent), child, module)


def _dense(gguf: Any, processor: Any, tensors: dict[str, Any], tensor_name: str | None) -> torch.Tensor | None:
    """The GGUF tensor ``tensor_name`` as transformers loads it (``load_gguf_checkpoint``: gguf-py's
    ``dequantize``, the architecture's tensor processor, a float32 copy), or None where there is none."""
    tensor = tensors.get(tensor_name or "")
    if tensor is None:
        return None
    weights = gguf.dequantize(tensor.data, tensor.tensor_type)
    result = processor.process(weights=weights, name=tensor.name, tensor_key_mapping={}, parsed_parameters={})
    values = result.weights
    if np.may_share_memory(values, tensor.data):  # a view of the file's map (float32 tensors): a copy of its own
        values = np.copy(values)  # (a widened one is already its own array: no second copy of the embedding)
    return torch.from_numpy(np.ascontiguousarray(values)).to(torch.float32)
