"""specdec's CPU kernels for verification forwards: skinny linear layers and tree attention.

**Skinny linear** (:func:`skinny_linear`): ``x @ W^T`` for a few rows of ``x``, every weight row read once.

Why: a verification forward over a draft tree of ``N`` nodes multiplies each weight
``W [out, in]`` of the model by ``N`` rows. For ``N`` up to a few dozen that product is bound
by reading the weights, not by arithmetic, while PyTorch's ``linear`` (MKL) repacks the
weight for every call from two rows on, so a 16-node verification used to cost about twice a
one-node step though the machine's floor is about the same for both (docs/budget.md).
The kernels of ``csrc/skinny_linear.cpp`` read every weight row
once in its stored layout (no copy, no repacking: the model's own tensors) and apply it to
all rows while it sits in registers; the calibration (:mod:`specdec.budget`) measures them
against ``linear`` per tree size and the verifier runs whichever was faster.

**Exact and batch-invariant.** Every kernel path computes each output with one fixed order of
fused multiply-adds in ``L`` lanes and one fixed summation tree (the contract in
``csrc/skinny_linear.h``), so a row's result never depends on the other rows: a tree node's
logits through these layers equal the same token's logits verified alone, bit for bit, which is
what makes speculative output identical to plain decoding through the same kernels rather than
"identical except at near-ties". The hand-written AVX-512 kernels, the portable code compiled for
AVX2 (``"avx2-lanes16"``) and the portable code for any CPU take 16 lanes and give bitwise the
same result. The AVX2 path a CPU without AVX-512 runs (``"avx2"``, hand-written) takes 8, one
AVX2 register per accumulator, which makes it 1.2-1.3x faster from 8 rows on than 16 lanes did;
its last bits differ from the others'. A process runs one path (``"auto"``: the best the CPU
has). None is bitwise equal to MKL's ``linear`` (another summation order: the usual ~1e-7
relative in fp32).

**Tree attention** (:func:`tree_attention`): the attention of a few query rows (a draft tree
or a plain step) over a KV cache, each row by one fixed sequence of operations over the slots
it sees (the committed ones, then its ancestors'), in the order plain decoding would have
them (the contract in ``csrc/tree_attention.h``). Together with the skinny kernels this
makes a tree node's logits bitwise the logits of the same token verified alone after its
ancestors were committed: speculative output through these kernels *is* plain decoding's
output through them, not "equal up to near-ties". It reads the grouped KV heads as they are
(no copy per query head).

dtypes: float32, bfloat16 (widened to float exactly, float accumulation, results rounded to
bfloat16 as torch rounds them) and float64 (the tests' tiny models; portable code). The ops
are ``torch.ops.specdec_cpu.*`` with fake implementations, so they trace into
``torch.compile`` graphs as opaque calls. ``isa=`` forces a kernel path (the tests check each
against the others, and the AVX2 path's skinny linear against an exact emulation of its 8-lane
contract).
``"avx512-blocks"`` and ``"avx2-blocks"`` are the AVX-512 and AVX2 paths with the skinny linear's
few-row products blocked as larger ones are, not streamed: equally exact, faster on some CPUs
(:data:`BLOCKS_ISAS`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from specdec.errors import SpecDecError
from specdec.gguf_weights import GGUF_BLOCK_TYPES as GGUF_BLOCK_TYPES
from specdec.native import NativeBuildError, extension_key, load_extension, register_meta

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = (
    CSRC / "cpu_kernels.cpp", CSRC / "skinny_linear.cpp", CSRC / "skinny_linear_avx2.cpp", CSRC / "tree_attention.cpp",
    CSRC / "tree_attention_avx2.cpp", CSRC / "tree_attention_baseline.cpp", CSRC / "decoder_layers.cpp",
)
HEADERS = (
    CSRC / "cpu_kernels.h", CSRC / "skinny_linear.h", CSRC / "skinny_portable.inc", CSRC / "tree_attention.h",
    CSRC / "tree_attention_portable.inc", CSRC / "tree_attention_rows.h", CSRC / "lane_sums_avx512.inc",
    CSRC / "portable_vectors.inc", CSRC / "gguf_widen.inc",
)
# A compiler that fused multiplies and adds on its own would break the kernels' one-order contracts.
# -fopenmp: at::parallel_for is a header whose OpenMP loop compiles to a serial one without it (the
# kernels then run on one thread: a 2-thread forward's linear layers cost what one thread's do); the
# extension then shares the libgomp torch itself loaded (same soname), one thread pool.
# -fno-gcse-after-reload: -O3's redundant-load pass after register allocation was ~40% of tree
# attention's compile time (its unrolled kernels), for no speed measured in the kernels; no FP effect.
CFLAGS = ("-O3", "-ffp-contract=off", "-fopenmp", "-fno-gcse-after-reload")
LDFLAGS = ("-fopenmp",)
DTYPES = (torch.float32, torch.bfloat16, torch.float64)
ISAS = ("auto", "avx512", "avx512-blocks", "avx2", "avx2-blocks", "avx2-lanes16", "portable")
# Per path, its kernels with register blocks at every row count: the skinny linear's other way with few
# rows (AVX-512: 1-3, ``csrc/skinny_linear.cpp``; AVX2: 1-2, ``csrc/skinny_linear_avx2.cpp``; the same
# bits as the path's own). Which is faster depends on the CPU's memory system (an AMD Zen 4 streams
# faster, an Intel Xeon blocks faster): the calibration times both (the ``"cpu-blocks"`` kernel variant of
# the native verifier).
BLOCKS_ISAS = {"avx512": "avx512-blocks", "avx2": "avx2-blocks"}
# The AVX2 kernels with the AVX-512 path's bits, which the calibration also times on CPUs with AVX-512
# (the ``"cpu-avx2"`` kernel variant of the native verifier): on some (an AMD Zen 4, whose AVX-512 units
# split each 512-bit operation in two) faster at few rows. Not ``"avx2"``, the path a CPU without AVX-512
# runs: its skinny linear keeps an 8-lane contract of its own (``csrc/skinny_linear.h``), faster from
# 4 rows on, whose last bits differ, so it may not mix with the AVX-512 kernels in one generation.
AVX2_ISA = "avx2-lanes16"
# The environment variable that forces one kernel path for the whole process: what ``isa="auto"``
# runs in every op, so ``run``, the demo, ``specdec bench`` and the tests all take that path.
ISA_ENV = "SPECDEC_CPU_ISA"

# GGUF blocks a weight of the skinny linear may be (uint8 [N, B, block_bytes]): the block's size in bytes
# names its type, and each type's elements per block (specdec.gguf_weights.GGUF_BLOCK_TYPES).
GGUF_BLOCK_ELEMENTS = {size: elements for elements, size in GGUF_BLOCK_TYPES.values()}

_LOCK = threading.Lock()
_FAILURE: NativeBuildError | None = None
_FAKES_REGISTERED = False
_BUILD_KEY: str | None = None


def load() -> ModuleType:
    """The built extension (the ops registered as ``torch.ops.specdec_cpu.*``).

    Built once per machine (about 70 s on 2 cores), then loaded from the cache in milliseconds. A
    failed build raises :class:`~specdec.native.NativeBuildError` with the compiler's output,
    and is remembered for the rest of the process.
    """
    global _FAILURE, _FAKES_REGISTERED
    with _LOCK:
        if _FAILURE is not None:
            raise _FAILURE
        try:
            module = load_extension(
                "cpu_kernels", SOURCES, depends=HEADERS, extra_cflags=CFLAGS, extra_ldflags=LDFLAGS
            )
        except NativeBuildError as error:
            _FAILURE = error
            raise
        _force_from_environment(module)
        if not _FAKES_REGISTERED:
            register_meta("specdec_cpu::skinny_linear", _skinny_linear_fake)
            register_meta("specdec_cpu::skinny_linears", _skinny_linears_fake)
            register_meta("specdec_cpu::gguf_widen", _gguf_widen_fake)
            register_meta("specdec_cpu::tree_attention", _tree_attention_fake)
            register_meta("specdec_cpu::tree_attention_segments", _tree_attention_segments_fake)
            register_meta("specdec_cpu::write_segments", _write_segments_fake)
            register_meta("specdec_cpu::decoder_layers", _decoder_layers_fake)
            _FAKES_REGISTERED = True
        return module


def build_key() -> str:
    """A hash of the kernels' sources and flags (the key their build is cached under, less the build
    environment): what a measurement of their speed is valid for (the calibration's identity)."""
    global _BUILD_KEY
    if _BUILD_KEY is None:
        _BUILD_KEY = extension_key([*SOURCES, *HEADERS], [*CFLAGS, *LDFLAGS], with_cuda=False)
    return _BUILD_KEY


def available() -> bool:
    """Whether the extension builds (or is built) here; never raises."""
    try:
        load()
    except NativeBuildError:
        return False
    return True


def cpu_isa() -> str:
    """The kernel path ``isa="auto"`` runs in this process: ``"avx512"``, ``"avx2"`` or ``"portable"``
    (the best this CPU has, or the one :data:`ISA_ENV` forced)."""
    return str(load().cpu_isa())


def best_isa() -> str:
    """The best kernel path this CPU runs, whatever :data:`ISA_ENV` forces."""
    return str(load().best_isa())


def supported_isas() -> list[str]:
    """The kernel paths this CPU runs, best first (``avx512``, ``avx512-blocks``, ``avx2``, ``avx2-blocks``,
    ``avx2-lanes16``, ``portable``)."""
    return [name.strip(" '") for name in str(load().supported_isas()).split(",")]


def _force_from_environment(module: ModuleType) -> None:
    """Make ``isa="auto"`` run the path :data:`ISA_ENV` names (unset or ``auto``: the best this CPU has).

    Read at every :func:`load`, so a process that changes the variable (a test) is followed. A name
    that is not a path, or one this CPU cannot run, raises :class:`~specdec.errors.SpecDecError`
    naming the value and the paths this CPU runs: a forced path never falls back silently.
    """
    value = os.environ.get(ISA_ENV, "auto").strip() or "auto"
    if value not in ISAS:
        raise SpecDecError(
            f"{ISA_ENV}={value!r} is not a kernel path; valid: {', '.join(ISAS)} (this CPU runs "
            f"{module.supported_isas()})"
        )
    try:
        module.set_auto_isa(value)
    except RuntimeError as error:
        raise SpecDecError(
            f"{ISA_ENV}={value!r}: this CPU cannot run that kernel path (it runs {module.supported_isas()})"
        ) from error



def _one_device(op: str, *tensors: Any) -> None:
    """The fake implementations' device check: a call that mixes devices (a CPU tensor beside a ``meta``
    one, which the dispatcher sends here rather than to the CPU kernel and its checks) raises naming
    them, instead of returning an uninitialized tensor."""
    found = []
    for item in tensors:
        for tensor in item if isinstance(item, list | tuple) else (item,):
            if isinstance(tensor, torch.Tensor) and tensor.device not in found:
                found.append(tensor.device)
    if len(found) > 1:
        raise RuntimeError(f"specdec_cpu::{op}: all tensors must be on one device, got {', '.join(map(str, found))}")


def _skinny_linear_fake(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, isa: str = "auto"
) -> torch.Tensor:
    _one_device("skinny_linear", x, weight, bias)
    del isa
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _skinny_linears_fake(
    x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor | None], isa: str = "auto"
) -> list[torch.Tensor]:
    _one_device("skinny_linears", x, weights, biases)
    del isa
    return [x.new_empty((*x.shape[:-1], weight.shape[0])) for weight in weights]


def _gguf_widen_fake(blocks: torch.Tensor, isa: str = "auto") -> torch.Tensor:
    del isa
    elements = GGUF_BLOCK_ELEMENTS.get(int(blocks.shape[-1]), 0)
    return blocks.new_empty((blocks.shape[0], blocks.shape[1] * elements), dtype=torch.float32)


def _tree_attention_fake(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    start: int,
    ancestors: torch.Tensor | None,
    scale: float,
    isa: str = "auto",
) -> torch.Tensor:
    _one_device("tree_attention", query, keys, values, ancestors)
    del start, scale, isa
    return query.new_empty((1, query.shape[2], query.shape[1] * query.shape[3]))


def _tree_attention_segments_fake(
    query: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    starts: list[int],
    counts: list[int],
    ancestors: list[torch.Tensor | None],
    scale: float,
    isa: str = "auto",
) -> torch.Tensor:
    _one_device("tree_attention_segments", query, keys, values, ancestors)
    del starts, counts, scale, isa
    return query.new_empty((1, query.shape[2], query.shape[1] * query.shape[3]))


def _write_segments_fake(
    key: torch.Tensor, value: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], starts: list[int],
    counts: list[int],
) -> None:
    _one_device("write_segments", key, value, keys, values)
    del starts, counts


def _decoder_layers_fake(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    _one_device("decoder_layers", hidden, *args, *kwargs.values())
    return hidden.new_empty(hidden.shape)


def decoder_layers(
    hidden: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layers: LayerWeights,
    heads: tuple[int, int],
    rotary_together: bool,
    scale: float,
    caches: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]],
    starts: Sequence[int],
    counts: Sequence[int],
    ancestors: Sequence[torch.Tensor | None],
    isa: str = "auto",
) -> torch.Tensor:
    """A Llama-family decoder's layer loop in one call: ``hidden`` ``[1, R, E]`` after every layer.

    What :meth:`specdec.backends.specdec_engine.model_runner.DecoderRunner.forward_rows` does per layer with
    :func:`skinny_linears`, :func:`skinny_linear`, :func:`write_segments` and
    :func:`tree_attention_segments`, and Hugging Face's RMSNorm, rotary and SiLU written out as
    the same ATen calls (``csrc/decoder_layers.cpp``), made from C++: the ~60 small operations a
    layer pays in Python (~3 ms a forward of the default model here) cost their dispatch only.
    ``cos``, ``sin`` ``[1, R, D]`` (the model's rotary embedding at the rows' positions);
    ``layers``: :class:`LayerWeights`; ``heads``: (query heads, KV heads); ``caches[l][s]``:
    segment ``s``'s (keys, values) of layer ``l``, whose slots ``starts[s] ..`` receive its
    ``counts[s]`` new rows; ``ancestors`` per segment as :func:`tree_attention` takes them.
    """
    keys = [keys for layer in caches for keys, _ in layer]
    values = [values for layer in caches for _, values in layer]
    out: torch.Tensor = torch.ops.specdec_cpu.decoder_layers(
        hidden, cos, sin, layers.norms, layers.weights, layers.biases, layers.eps, heads[0], heads[1],
        rotary_together, scale, keys, values, list(starts), list(counts), list(ancestors), isa,
    )  # fmt: skip
    return out


@dataclass(frozen=True)
class LayerWeights:
    """Every layer's tensors in :func:`decoder_layers`' order, flattened once: ``norms`` (input and
    post-attention norm weights per layer), ``weights`` and ``biases`` (q, k, v, o, gate, up, down per
    layer; a bias None where the layer has none) and the norms' ``eps``. References to the model's own
    tensors (no copies), so an in-place weight update is seen at the next call."""

    norms: list[torch.Tensor]
    weights: list[torch.Tensor]
    biases: list[torch.Tensor | None]
    eps: float


def write_segments(
    key: torch.Tensor,
    value: torch.Tensor,
    caches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    starts: Sequence[int],
    counts: Sequence[int],
) -> None:
    """Write several segments' new keys and values into their caches in one call.

    ``key``, ``value`` ``[1, Hkv, R, D]`` (any strides, ``D`` contiguous) hold the segments' rows
    one after another, ``counts[s]`` each; segment ``s``'s go to slots ``starts[s] ..`` of its
    cache layer ``caches[s]`` = (keys, values) ``[1, Hkv, S, D]`` (contiguous). The same bytes as
    ``keys[:, :, start : start + count] = key[:, :, rows]`` per segment, without a batch of
    ``B`` rows paying ``4 B`` slicing operations per layer in Python. Every segment is checked
    before the first write: a bad call raises and changes no cache.
    """
    torch.ops.specdec_cpu.write_segments(
        key, value, [keys for keys, _ in caches], [values for _, values in caches], list(starts), list(counts)
    )


# One segment of tree_attention_segments: (keys, values, start, rows, ancestors or None).
AttentionSegment = tuple[torch.Tensor, torch.Tensor, int, int, "torch.Tensor | None"]


def tree_attention_segments(
    query: torch.Tensor, segments: Sequence[AttentionSegment], scale: float, isa: str = "auto"
) -> torch.Tensor:
    """:func:`tree_attention` for several sequences' rows at once, each over its own cache; ``[1, R, Hq * D]``.

    ``query`` ``[1, Hq, R, D]`` holds the segments' rows one after another; segment ``s`` is
    ``(keys, values, start, rows, ancestors)`` as :func:`tree_attention` takes them. Each row is
    bitwise what :func:`tree_attention` gives its segment alone; what changes is that all the
    segments' tasks share one parallel pass (a batch of B rows meets its threads once per layer,
    not B times).
    """
    keys = [segment[0] for segment in segments]
    values = [segment[1] for segment in segments]
    starts = [segment[2] for segment in segments]
    counts = [segment[3] for segment in segments]
    ancestors = [segment[4] for segment in segments]
    out: torch.Tensor = torch.ops.specdec_cpu.tree_attention_segments(
        query, keys, values, starts, counts, ancestors, scale, isa
    )
    return out


def tree_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    start: int,
    ancestors: torch.Tensor | None,
    scale: float,
    isa: str = "auto",
) -> torch.Tensor:
    """Attention of ``T`` rows after ``start`` committed slots; ``[1, T, Hq * D]``. O(T * Hq * (start + T) * D).

    ``query`` ``[1, Hq, T, D]`` (any strides, ``D`` contiguous); ``keys``, ``values``
    ``[1, Hkv, S, D]`` contiguous (a cache layer holding the rows' own keys and values at slots
    ``start .. start+T-1``); ``ancestors`` bool ``[T, T]`` (row i sees node a when
    ``ancestors[i, a]``), or None for a causal pass (row i sees ``start .. start+i``); every row
    sees the committed slots ``[0, start)``. Call :func:`load` first.
    """
    out: torch.Tensor = torch.ops.specdec_cpu.tree_attention(query, keys, values, start, ancestors, scale, isa)
    return out


def skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, isa: str = "auto"
) -> torch.Tensor:
    """``torch.nn.functional.linear(x, weight, bias)`` by the skinny kernels. O(M * N * K), one pass over ``weight``.

    ``x`` ``[..., K]`` and ``weight`` ``[N, K]`` (contiguous) of one dtype in
    :data:`DTYPES`, on the CPU; ``bias`` ``[N]`` or None -> ``[..., N]``. ``weight`` may also be a GGUF
    file's blocks, uint8 ``[N, B, block_bytes]`` (:data:`GGUF_BLOCK_ELEMENTS`), with float32 ``x``: the
    result is then bitwise the float32 product with :func:`gguf_widen` of them, reading only the blocks.
    ``isa`` forces a kernel path (:data:`ISAS`; all but ``"avx2"`` give the same bits); one the CPU lacks raises.
    Call :func:`load` first.
    """
    out: torch.Tensor = torch.ops.specdec_cpu.skinny_linear(x, weight, bias, isa)
    return out


def gguf_widen(blocks: torch.Tensor, isa: str = "auto") -> torch.Tensor:
    """GGUF blocks uint8 ``[N, B, block_bytes]`` as the float32 weight ``[N, K]`` they stand for. O(N * K).

    Exactly the values gguf-py's ``gguf.quants.dequantize`` gives (``csrc/gguf_widen.inc``), which are
    the ones :func:`skinny_linear` widens a block weight to on its way through the registers: a
    product with the blocks is bitwise the product with this tensor. The block's size in bytes names
    its type (:data:`GGUF_BLOCK_ELEMENTS`).
    """
    out: torch.Tensor = torch.ops.specdec_cpu.gguf_widen(blocks, isa)
    return out


def skinny_linears(
    x: torch.Tensor, layers: Sequence[tuple[torch.Tensor, torch.Tensor | None]], isa: str = "auto"
) -> list[torch.Tensor]:
    """:func:`skinny_linear` of one ``x`` by each ``(weight, bias)`` of ``layers``, in one parallel pass.

    Bitwise each :func:`skinny_linear` alone (the same kernel per output row); what changes is
    that the threads split the rows of all the weights at once and meet once, not once per
    weight: a layer's query, key and value projections (or its gate and up projections) cost one
    fork and join, and the small key/value weights fill in beside the larger ones.
    """
    weights = [weight for weight, _ in layers]
    biases = [bias for _, bias in layers]
    out: list[torch.Tensor] = torch.ops.specdec_cpu.skinny_linears(x, weights, biases, isa)
    return out


def supports(model: Any) -> bool:
    """Whether the kernels can serve ``model``: CPU parameters of a dtype in :data:`DTYPES`."""
    parameter = next(model.parameters(), None)
    return parameter is not None and parameter.device.type == "cpu" and parameter.dtype in DTYPES
