"""A random-weight llama of a chosen shape written as a GGUF file, and the peak memory of loading it.

Why: the memory of a GGUF load (dense, transformers' float32 dequantization, against blocks-only:
:mod:`specdec.gguf_weights`) and the kernels' speed on quantized weights are properties of a shape and
a block type, not of trained weights, so a random file of a 1B shape stands in for a real one that is
not on the machine. Every linear weight (and the embedding; the head is tied) is random valid blocks of
one type: random bytes with finite float16 scales sized so each weight's spread is about 0.02; norms
are ones. The tokenizer is the default model's (its vocabulary of 49,152 is the default ``vocab``), so
``specdec.run``, ``specdec bench curves --model FILE`` and the rest take the file like any other.

The file is written tensor by tensor (gguf's writer, streamed): the process holds one tensor at a time.

Write one, then measure a load in a fresh process (peak resident set, ``ru_maxrss``) and one greedy
generation on engine="specdec", whose tokens the dense and blocks-only loads must share::

    python -m specdec.bench.random_gguf write /tmp/llama-1b.Q4_K.gguf --type Q4_K
    python -m specdec.bench.random_gguf measure /tmp/llama-1b.Q4_K.gguf --weights blocks
    python -m specdec.bench.random_gguf measure /tmp/llama-1b.Q4_K.gguf --weights dense
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specdec.errors import SpecDecError
from specdec.gguf_weights import GGUF_BLOCK_TYPES, HALF_FIELDS

# Each block type's float16 scale (and minimum) for a weight spread of about 0.02 (random bytes elsewhere).
_SCALES = {"Q8_0": 3e-4, "Q4_0": 3e-3, "Q4_1": 3e-3, "Q4_K": 1e-4, "Q6_K": 2e-5}


@dataclass(frozen=True)
class Shape:
    """A llama's shape; the default is a 1B one (about 1.07 billion weights, the embedding included)."""

    hidden: int = 2048
    layers: int = 16
    heads: int = 32
    kv_heads: int = 8
    ffn: int = 8192
    vocab: int = 49152
    context: int = 4096


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random valid blocks of ``kind`` for a ``[rows, cols]`` weight: uint8 ``[rows, cols // elements * bytes]``."""
    elements, size = GGUF_BLOCK_TYPES[kind]
    raw = rng.integers(0, 256, (rows, cols // elements, size), dtype=np.uint8)
    for offset in HALF_FIELDS[kind]:
        halves = (np.abs(rng.standard_normal((rows, cols // elements))) * _SCALES[kind]).astype(np.float16)
        raw[..., offset : offset + 2] = halves.view(np.uint8).reshape(rows, cols // elements, 2)
    return raw.reshape(rows, -1)


def _tensors(shape: Shape) -> list[tuple[str, int, int]]:
    """(name, rows, cols) of every tensor, in the file's order; cols 0: a norm of ``rows`` ones."""
    head_dim = shape.hidden // shape.heads
    found = [("token_embd.weight", shape.vocab, shape.hidden)]
    for i in range(shape.layers):
        found += [(f"blk.{i}.attn_norm.weight", shape.hidden, 0), (f"blk.{i}.ffn_norm.weight", shape.hidden, 0),
                  (f"blk.{i}.attn_q.weight", shape.hidden, shape.hidden),
                  (f"blk.{i}.attn_k.weight", head_dim * shape.kv_heads, shape.hidden),
                  (f"blk.{i}.attn_v.weight", head_dim * shape.kv_heads, shape.hidden),
                  (f"blk.{i}.attn_output.weight", shape.hidden, shape.hidden),
                  (f"blk.{i}.ffn_gate.weight", shape.ffn, shape.hidden),
                  (f"blk.{i}.ffn_up.weight", shape.ffn, shape.hidden),
                  (f"blk.{i}.ffn_down.weight", shape.hidden, shape.ffn)]  # fmt: skip
    return [*found, ("output_norm.weight", shape.hidden, 0)]


def _copy_tokenizer(writer: Any, source: Path) -> None:
    """The ``tokenizer.*`` fields of the GGUF file ``source`` into ``writer``."""
    import gguf

    reader = gguf.GGUFReader(source)
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            kinds = field.types
            writer.add_key_value(key, field.contents(), kinds[0], kinds[-1] if len(kinds) > 1 else None)


def write_random_llama(path: Path, kind: str = "Q8_0", shape: Shape | None = None, seed: int = 0,
                       tokenizer_from: Path | None = None) -> Path:  # fmt: skip
    """Write a random llama of ``shape`` (default :class:`Shape`), every weight of GGUF type ``kind``, to
    ``path``; the tokenizer fields of ``tokenizer_from`` (default: the default model's file, where installed;
    none where that is no file)."""
    import gguf

    from specdec.models import default_gguf_path

    if kind not in GGUF_BLOCK_TYPES:
        raise ValueError(f"type {kind!r}: this writer makes {', '.join(GGUF_BLOCK_TYPES)}")
    shape = shape or Shape()
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"random llama {kind}")
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(shape.vocab)
    writer.add_rope_dimension_count(shape.hidden // shape.heads)
    try:
        source = tokenizer_from or default_gguf_path()
    except SpecDecError:  # the default model is not installed: a file without a tokenizer (token ids only)
        source = None
    if source is not None and source.is_file():
        _copy_tokenizer(writer, source)
    tensors = _tensors(shape)
    elements_of = GGUF_BLOCK_TYPES[kind]
    for name, rows, cols in tensors:
        if cols == 0:
            writer.add_tensor_info(name, [rows], np.dtype(np.float32), rows * 4)
        else:
            nbytes = rows * cols // elements_of[0] * elements_of[1]
            writer.add_tensor_info(name, [rows, nbytes // rows], np.dtype(np.uint8), nbytes,
                                   raw_dtype=gguf.GGMLQuantizationType[kind])  # fmt: skip
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, rows, cols in tensors:  # one tensor in memory at a time
        writer.write_tensor_data(np.ones(rows, np.float32) if cols == 0 else random_blocks(kind, rows, cols, rng))
    writer.close()
    return path


def measure(path: Path, weights: str, new_tokens: int = 32) -> dict[str, Any]:
    """Load ``path`` with ``weights`` (``load_model``'s) in this process, then one greedy generation of
    ``new_tokens`` on engine="specdec": the peak resident set after each, the load's seconds, the tokens."""
    import torch

    import specdec
    from specdec.gguf_weights import resident_bytes

    started = time.perf_counter()
    model, _ = specdec.load_model(path, weights=weights)
    loaded = time.perf_counter() - started
    peak_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    prompt = [int(t) for t in torch.randint(100, 40000, (24,), generator=torch.Generator().manual_seed(0))]
    started = time.perf_counter()
    result = specdec.run(model, prompt, drafter="none", engine="specdec", max_new_tokens=new_tokens, ignore_eos=True)
    tokens = [int(t) for t in result.tokens]
    return {"file": str(path), "weights": weights, "load_s": round(loaded, 1),
            "tensor_bytes": resident_bytes(model), "peak_rss_after_load": peak_load,
            "peak_rss_after_generation": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "generation_s": round(time.perf_counter() - started, 1), "tokens": len(tokens),
            "tokens_sha1": hashlib.sha1(json.dumps(tokens).encode()).hexdigest()[:12]}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specdec.bench.random_gguf", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write", help="a random llama as a GGUF file (keep it out of git: /tmp)")
    write.add_argument("path", type=Path)
    write.add_argument("--type", default="Q8_0", choices=tuple(GGUF_BLOCK_TYPES))
    for field in ("hidden", "layers", "heads", "kv_heads", "ffn", "vocab"):
        write.add_argument(f"--{field.replace('_', '-')}", type=int, default=getattr(Shape(), field))
    write.add_argument("--seed", type=int, default=0)
    one = commands.add_parser("measure", help="peak RSS of one load and a greedy generation, in this process")
    one.add_argument("path", type=Path)
    one.add_argument("--weights", default="blocks", choices=("dense", "blocks"))
    one.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    if args.command == "write":
        shape = Shape(args.hidden, args.layers, args.heads, args.kv_heads, args.ffn, args.vocab)
        write_random_llama(args.path, args.type, shape, args.seed)
        print(f"{args.path}: {args.path.stat().st_size / 2**20:.0f} MiB")
    else:
        print(json.dumps(measure(args.path, args.weights, args.new_tokens)))


if __name__ == "__main__":
    main(sys.argv[1:])
