"""Verification cost curves: ms per verification by tree size and context, verifier variants side by side.

A **variant** is a verifier spec, ``label=engine[:key=value...]``: ``engine`` is a
:func:`~specdec.backends.make_verifier` engine (``auto``, ``hf``, ``specdec``, ``compiled``, ...);
a key that ``make_verifier`` takes is passed to it (``tree_ops``), any other key sets that
attribute of the verifier, but ``kernels=VARIANT``, which runs that kernel variant at every size
(:meth:`~specdec.types.TunableVerifier.use_kernels`; ``kernels=cpu``: specdec's CPU kernels on
``engine=specdec``), and ``gguf_weights=blocks|dense``, what ``engine=specdec`` reads of a model
loaded from a GGUF file (:data:`~specdec.backends.specdec_engine.gguf_blocks.WEIGHTS_ENV`), so the
file's blocks and the widened weights are timed in the same rounds. The default variants are the CPU
paths' comparison (docs/budget.md):

- ``hf``: Hugging Face's own forward on its ``DynamicCache``;
- ``specdec``: specdec's own forward (:mod:`specdec.backends.specdec_engine.model_runner`) with torch's kernels;
- ``specdec+cpu``: that, with specdec's CPU kernels (:mod:`specdec.backends.specdec_engine.cpu_kernels`:
  skinny linear layers and tree attention);
- ``specdec+cpu-attention``: torch's linear layers with specdec's tree attention.

All variants share one model and are timed in the same interleaved rounds (a drift of the
machine's load hits all alike); round 0 warms up and the fastest of ``repeats`` rounds is
kept (other jobs only ever add time). Chains of random tokens after a random prompt.

Beside the times the report gives the floors a forward cannot beat: reading every weight once
(:func:`weight_read_ms`, read in every round) and the arithmetic, ~2 flops per parameter per node at
the GEMM peak torch reaches on this machine (:func:`gemm_peak_gflops`, measured once, briefly; with MKL
and oneDNN limited to the instructions of the kernel path that ran, :func:`gemm_peak`), and
which CPU kernel path ``kernels=cpu`` ran (:func:`kernel_path`: ``SPECDEC_CPU_ISA`` or the best this
CPU has). A blocks-only GGUF model (:mod:`specdec.gguf_weights`) reads its blocks: they are its floor's bytes.

:func:`ratio_table` tabulates the ``cuda_ext`` vs ``torch`` tree-op microbenchmarks
(``benchmarks/test_bench_backend.py``) from a pytest-benchmark JSON.
"""

from __future__ import annotations

import inspect
import os
import random
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

import torch
from tqdm import tqdm

from specdec.backends import make_verifier
from specdec.backends.forward import attention_shape
from specdec.backends.specdec_engine import gguf_blocks
from specdec.bench.methods import parse_methods
from specdec.bench.plot import write_with_plot
from specdec.bench.report import markdown_table
from specdec.errors import SpecDecError
from specdec.gguf_weights import GgufBlocksEmbedding, GgufBlocksLinear, blocks_only
from specdec.types import DraftTree, KernelChoice

DEFAULT_VARIANTS = (
    "hf=hf,specdec=specdec:kernels=default,specdec+cpu=specdec:kernels=cpu,"
    "specdec+cpu-attention=specdec:kernels=cpu-attention"
)


def default_variants(model: Any) -> str:
    """:data:`DEFAULT_VARIANTS`, less ``hf`` for a model holding only GGUF blocks (which only specdec runs)."""
    return DEFAULT_VARIANTS.removeprefix("hf=hf,") if blocks_only(model) else DEFAULT_VARIANTS


def weight_tensors(model: Any) -> list[torch.Tensor]:
    """What a forward reads of ``model``'s weights: its parameters, a blocks-only module's blocks in place of
    its placeholder weight (:class:`~specdec.gguf_weights.GgufBlocksLinear`, ``GgufBlocksEmbedding``: a tied
    head's weight is the embedding's placeholder)."""
    blocks = {id(m.weight): m.blocks for m in model.modules() if isinstance(m, (GgufBlocksLinear, GgufBlocksEmbedding))}
    found: dict[int, torch.Tensor] = {}  # by the tensor's id: a tied head's weight once
    for parameter in model.parameters():
        tensor = blocks.get(id(parameter), parameter)
        found[id(tensor)] = tensor
    return [t.detach() for t in found.values()]


def make_variants(model: Any, specs: str | None) -> dict[str, Any]:
    """``{label: verifier}`` for comma-separated variant specs (module docstring)."""
    takes = set(inspect.signature(make_verifier).parameters)
    variants = {}
    for spec in parse_methods([specs or default_variants(model)]):
        arguments = {k: v for k, v in spec.options.items() if k in takes}
        weights = spec.options.get("gguf_weights")
        with gguf_blocks.weights_chosen(None if weights is None else str(weights)):  # read when the verifier is made
            verifier = make_verifier(model, spec.name, **arguments)
        for key, value in spec.options.items():
            if key in arguments or key == "gguf_weights":
                continue
            if key == "kernels":
                verifier.use_kernels(KernelChoice.uniform(str(value)))
                continue
            if not hasattr(verifier, key):
                raise SpecDecError(f"variant {spec.label!r}: the verifier has no setting {key!r}")
            setattr(verifier, key, value)
        variants[spec.label] = verifier
    return variants


def weight_read_ms(model: Any, repeats: int = 5, tensors: list[torch.Tensor] | None = None) -> float:
    """The fastest of ``repeats`` passes that read every parameter byte once (a sum per tensor), or
    every byte of ``tensors`` (:func:`block_tensors`).

    A one-token forward must read all the weights, so this is the floor a memory-bound
    forward approaches: the curves' reference line.
    """
    parameters = [_as_words(t) for t in (weight_tensors(model) if tensors is None else tensors)]
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats + 1):
            started = time.perf_counter()
            for parameter in parameters:
                # bytes left as bytes: a max, which streams them (a sum widens each to int64, arithmetic-bound)
                parameter.amax() if parameter.dtype == torch.uint8 else parameter.sum()
            if parameters and parameters[0].device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - started)
    return round(best * 1e3, 2)


def block_tensors(model: Any) -> list[torch.Tensor] | None:
    """What a one-node forward on a GGUF file's blocks reads (``gguf_weights=blocks``): the blocks, viewed as
    float32 words where their bytes allow (a sum of bytes would time the arithmetic, not the read), and the
    parameters the blocks do not stand for but the input embedding (of which a forward reads one row a
    token); None for a model without blocks (:func:`~specdec.backends.specdec_engine.gguf_blocks.model_blocks`)."""
    weights = gguf_blocks.model_blocks(model)
    if weights is None:
        return None
    covered = {id(t) for name, t in model.named_parameters(remove_duplicate=False) if name in weights.blocks}
    covered.add(id(model.get_input_embeddings().weight))
    blocks = [b.reshape(-1) for b in weights.blocks.values()]
    return blocks + [p.detach() for p in model.parameters() if id(p) not in covered]


def _as_words(data: torch.Tensor) -> torch.Tensor:
    """uint8 ``data`` viewed as float32 words where its size and offset allow, else as it is."""
    if data.dtype != torch.uint8:
        return data
    try:
        return data.view(torch.float32) if data.numel() % 4 == 0 else data
    except RuntimeError:  # a view of a file's map at an offset not a multiple of 4
        return data


def gemm_peak_gflops(device: torch.device, dtype: torch.dtype = torch.float32, size: int = 1024,
                     seconds: float = 0.3) -> float:
    """This machine's GEMM peak as torch measures it: the fastest ``size`` x ``size`` matmul of ``dtype``
    on ``device`` (torch's threads, as the forwards run) in about ``seconds``, in GFLOP/s (2 n^3 flops).

    What the arithmetic floor of a large tree divides by: a forward of N nodes does about
    2 x parameters x N flops, which no kernel finishes faster than this peak allows.
    """
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    best = float("inf")
    with torch.inference_mode():
        torch.mm(a, b)  # warm up (threads, the library's first-call setup)
        deadline = time.perf_counter() + seconds
        while True:
            started = time.perf_counter()
            torch.mm(a, b)
            if device.type == "cuda":
                torch.cuda.synchronize()
            now = time.perf_counter()
            best = min(best, now - started)
            if now >= deadline:
                break
    return round(2 * size**3 / best / 1e9, 1)


# The instructions torch's CPU GEMM may use, per specdec kernel path: a path that uses less than this CPU has
# (SPECDEC_CPU_ISA=avx2 on an AVX-512 CPU) is held to the peak of GEMMs limited alike, which is what a CPU
# that lacks the rest would reach. The portable path's baseline target is SSE2; MKL's lowest is SSE4.2.
GEMM_LIMITS = {
    "avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "portable": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}


def gemm_limits(isa: str) -> dict[str, str]:
    """The environment that limits torch's CPU GEMM to kernel path ``isa``'s instructions (``{}``: none)."""
    return GEMM_LIMITS.get("avx2" if isa.startswith("avx2") else isa, {})


def limited_gemm_peak_gflops(limits: dict[str, str], dtype: torch.dtype = torch.float32) -> float:
    """:func:`gemm_peak_gflops` on the CPU in a child process whose environment sets ``limits`` (MKL and
    oneDNN read them once, at load, so the parent cannot apply them), with this process's thread count."""
    code = ("import sys, torch; torch.set_num_threads(int(sys.argv[1])); "
            "from specdec.bench.curves import gemm_peak_gflops; "
            "print(gemm_peak_gflops(torch.device('cpu'), getattr(torch, sys.argv[2])))")
    done = subprocess.run([sys.executable, "-c", code, str(torch.get_num_threads()), str(dtype).removeprefix("torch.")],
                          env={**os.environ, **limits}, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SpecDecError(f"measuring the GEMM peak under {limits} failed: {done.stderr.strip()[-500:]}")
    return float(done.stdout.split()[-1])


def kernel_path() -> dict[str, str]:
    """Which of specdec's CPU kernel paths ``kernels=cpu`` runs in this process (``SPECDEC_CPU_ISA`` or the
    best this CPU has), and how its skinny linear blocks the rows: ``{"isa": ..., "blocking": ...}``;
    ``{"isa": "unavailable", ...}`` where the extension does not build here."""
    from specdec.backends.specdec_engine import cpu_kernels

    if not cpu_kernels.available():
        return {"isa": "unavailable", "blocking": "specdec's CPU kernels do not build here"}
    isa = cpu_kernels.cpu_isa()
    blocking = {
        "avx512": "hand-written AVX-512: 1-3 rows stream 8 weight rows each, more rows take 4x4 register blocks",
        "avx512-blocks": "hand-written AVX-512: 4 weight rows x 4 rows register blocks at every row count",
        "avx2": "hand-written AVX2+FMA, 8-lane contract: 1-2 rows stream one weight row each (the next rows "
                "prefetched), more rows take 4 "
                "weight rows x 3 rows register blocks over all of k, the next block prefetched into L1 and the "
                "one three ahead into L2",
        "avx2-blocks": "hand-written AVX2+FMA, 8-lane contract: 4 weight rows x up to 3 rows register blocks at every "
                       "row count, the next block prefetched into L1 and the one three ahead into L2",
    }.get(isa, f"portable kernels compiled for {'AVX2+FMA' if isa == 'avx2-lanes16' else 'the baseline target'}: "
          "1-4 rows (1-2 past 1024 in-features) stream one weight row each, more rows take 4 weight rows x 3 "
          "rows register blocks over tiles of k, the weight prefetched two blocks ahead into L2 and a tile ahead "
          "into L1")
    return {"isa": isa, "blocking": blocking}


def measure(model: Any, specs: str | None, sizes: tuple[int, ...], contexts: tuple[int, ...],
            repeats: int, cpu_time: bool = False) -> dict[str, Any]:
    """``{"ms": {variant: {context: [fastest ms per size]}}, ...}`` (module docstring). ``cpu_time``: one
    thread, each verification timed by the thread's CPU time (``time.thread_time``), which a busy machine's
    other jobs do not inflate as they inflate wall clock (a descheduled thread accrues none); the floors
    are then one thread's too."""
    threads = torch.get_num_threads()
    if cpu_time:
        torch.set_num_threads(1)
    try:
        return _measure(model, specs, sizes, contexts, repeats, cpu_time)
    finally:
        torch.set_num_threads(threads)


def _measure(model: Any, specs: str | None, sizes: tuple[int, ...], contexts: tuple[int, ...], repeats: int,
             cpu_time: bool) -> dict[str, Any]:
    clock = time.thread_time if cpu_time else time.perf_counter
    variants = make_variants(model, specs)
    rng = random.Random(0)
    vocab = next(iter(variants.values())).vocab_size
    prompt = [rng.randrange(vocab) for _ in range(max(contexts))]
    states = {name: verifier.prefill(prompt, reserve=max(sizes)) for name, verifier in variants.items()}
    best: dict[str, dict[int, dict[int, float]]] = {name: {c: {} for c in contexts} for name in variants}
    first: dict[str, dict[str, float]] = {name: {} for name in variants}
    bar = tqdm(total=len(contexts) * (repeats + 1) * len(sizes), desc="curves", unit="size")
    # The floor is read in every round too: this machine's memory bandwidth drifts by a third between
    # minutes (a weight read of 8.6 to 11.9 ms measured on one day), so a floor read only at the end
    # could come from another minute than the forwards it is compared with.
    reads: list[float] = []
    blocks, block_reads = block_tensors(model), []
    for context in sorted(contexts, reverse=True):  # rewind the prefilled caches, context by context
        for round_ in range(repeats + 1):  # round 0 warms up
            reads.append(weight_read_ms(model, 1))
            if blocks is not None:
                block_reads.append(weight_read_ms(model, 1, blocks))
            for size in sizes:
                tokens = [rng.randrange(vocab) for _ in range(size - 1)]
                for name, verifier in variants.items():
                    state, pending, _ = states[name]
                    verifier.rewind(state, context)
                    started = clock()
                    verifier.verify(state, DraftTree.chain(pending, tokens))
                    elapsed = clock() - started
                    if round_:
                        best[name][context][size] = min(best[name][context].get(size, float("inf")), elapsed)
                    else:  # the first call of a size: compiling or capturing, where the variant does
                        first[name][f"{context}/{size}"] = round(elapsed, 3)
                bar.update(1)
    bar.close()
    parameter = next(model.parameters())
    parameters = sum(p.numel() for p in model.parameters())
    return {
        "variants": specs or default_variants(model), "sizes": list(sizes), "contexts": list(contexts),
        "repeats": repeats,
        "threads": torch.get_num_threads(), "device": str(parameter.device),
        "clock": "thread CPU time" if cpu_time else "wall",
        "ms": {name: {str(c): [round(best[name][c][s] * 1e3, 2) for s in sizes] for c in contexts} for name in best},
        "first_call_s": first,
        "weight_read_ms": min([*reads, weight_read_ms(model, repeats)]),
        "weight_read_ms_per_round": reads,
        **({} if blocks is None else {
            "block_read_ms": min([*block_reads, weight_read_ms(model, repeats, blocks)]),
            "block_read_ms_per_round": block_reads,
            "block_bytes": (read := sum(t.numel() * t.element_size() for t in blocks)),
            "block_mb": round(read / 1e6, 1)}),
        "weight_mb": round(sum(t.numel() * t.element_size() for t in weight_tensors(model)) / 1e6, 1),
        "kernel_path": kernel_path() if parameter.device.type == "cpu" else None,
        # The arithmetic floor: ~2 flops per parameter per node, at the GEMM peak torch reaches here with the
        # instructions of the kernel path that ran.
        "gflop_per_node": round(2 * parameters / 1e9, 4),
        **gemm_peak(parameter),
        "attention_gflop_per_node": {str(c): gflop for c in contexts
                                     if (gflop := attention_gflop(model, c)) is not None},
    }


def gemm_peak(parameter: torch.Tensor) -> dict[str, Any]:
    """``{"gemm_peak_gflops": ..., "gemm_limits": ...}``: the peak on the parameter's device, on the CPU
    limited to the instructions of the kernel path ``kernels=cpu`` runs (:data:`GEMM_LIMITS`)."""
    limits = {}
    if parameter.device.type == "cpu":
        isa = kernel_path()["isa"]
        limits = gemm_limits(isa) if isa != "unavailable" else {}
    if not limits:
        return {"gemm_peak_gflops": gemm_peak_gflops(parameter.device, parameter.dtype), "gemm_limits": {}}
    return {"gemm_peak_gflops": limited_gemm_peak_gflops(limits, parameter.dtype), "gemm_limits": limits}


def attention_gflop(model: Any, context: int) -> float | None:
    """The attention's arithmetic per node at ``context`` committed tokens, in GFLOP: every layer's query
    heads score ``context`` keys and weigh as many values of ``head_dim`` each (2 flops per multiply-add,
    twice). The weight floor leaves it out; at a context of 1,024 it adds a quarter to the default
    model's 0.27 GFLOP per node. None where the config does not say the shapes."""
    shape = attention_shape(getattr(model, "config", None))
    if shape is None:
        return None
    layers, heads, _, head_dim = shape
    if not (layers and heads and head_dim):
        return None
    return round(float(4 * layers * heads * head_dim * context) / 1e9, 4)


def first_call_line(report: dict[str, Any]) -> str:
    """What the first call of each size cost beyond the fastest later call, summed over the sizes.

    The excess, not the first calls' sum: that sum is mostly the forwards themselves (1.7 s of
    it a 32-node forward on a slow path), which a later call pays as well. What is left is the
    one-time work: compiling or capturing, where a variant does; allocations and page faults.
    """
    largest = max(report["contexts"])
    parts = []
    for name, calls in report["first_call_s"].items():
        best = report["ms"][name][str(largest)]
        firsts = [calls[f"{largest}/{size}"] * 1e3 for size in report["sizes"]]
        excess = sum(first - fastest for first, fastest in zip(firsts, best, strict=True))
        parts.append(f"{name} {excess / 1e3:+.2f} s (of {sum(firsts) / 1e3:.2f} s)")
    return (f"First call of every size at context {largest}, beyond the fastest later call of that size "
            f"(one-time work: compiling or capturing where a variant does, allocations): " + ", ".join(parts) + ".")


def limited_line(limits: dict[str, str]) -> str:
    """How the GEMM peak was limited, for the floor's line ("" where it was not)."""
    if not limits:
        return ""
    return ", limited as the kernel path is: " + " ".join(f"{key}={value}" for key, value in limits.items())


def floor_ms(report: dict[str, Any]) -> list[float]:
    """The floor of each size's verification in ``report``: the weights read once or the arithmetic at the
    GEMM peak (2 flops per parameter per node), whichever is longer, in ms."""
    peak, per_node = report["gemm_peak_gflops"], report["gflop_per_node"]
    return [max(report["weight_read_ms"], per_node * size / peak * 1e3) for size in report["sizes"]]


def markdown(report: dict[str, Any]) -> str:
    """ms per verification, and the ratio to the first variant's 1-node step at that context."""
    sizes, rows = report["sizes"], []
    for context in report["contexts"]:
        one = next(iter(report["ms"].values()))[str(context)][0]
        for name, by_context in report["ms"].items():
            rows.append([context, name, *[f"{ms:.1f} ({ms / one:.2f}x)" for ms in by_context[str(context)]]])
    table = markdown_table(["context", "variant", *map(str, sizes)], rows)
    if report.get("clock", "wall") != "wall":
        table += f"\n\nms of {report['clock']}, {report['threads']} thread(s); the floors below are wall clock."
    if report.get("first_call_s"):
        table += "\n\n" + first_call_line(report)
    if report.get("gemm_peak_gflops") and "weight_read_ms" in report:
        peak, per_node = report["gemm_peak_gflops"], report["gflop_per_node"]
        floors = floor_ms(report)
        table += ("\n\nFloor, max(weight read, arithmetic): "
                  + ", ".join(f"{size}: {ms:.1f} ms" for size, ms in zip(sizes, floors, strict=True))
                  + f" (arithmetic: {per_node} GFLOP per node at torch's measured GEMM peak of {peak} GFLOP/s,"
                  f" {report['threads']} threads{limited_line(report.get('gemm_limits') or {})}).")
        for context, attention in (report.get("attention_gflop_per_node") or {}).items():
            floors = [max(report["weight_read_ms"], (per_node + attention) * size / peak * 1e3) for size in sizes]
            table += (f"\nWith the attention's arithmetic at context {context} ({attention} GFLOP per node more): "
                      + ", ".join(f"{size}: {ms:.1f} ms" for size, ms in zip(sizes, floors, strict=True)) + ".")
    if report.get("kernel_path"):
        path = report["kernel_path"]
        table += f"\n\nCPU kernel path (kernels=cpu): {path['isa']} ({path['blocking']})."
    if "weight_read_ms" in report:
        table += (f"\n\nReading the model's {report['weight_mb']} MB of weights once: "
                  f"{report['weight_read_ms']:.1f} ms (the floor of a memory-bound one-token forward)")
        reads = report.get("weight_read_ms_per_round") or []
        if reads:
            table += f"; read in every round: {min(reads):.1f}-{max(reads):.1f} ms"
        table += "."
    if "block_read_ms" in report:
        reads = report.get("block_read_ms_per_round") or [report["block_read_ms"]]
        table += (f"\nReading the GGUF file's blocks and the other weights a forward reads ({report['block_mb']} MB)"
                  f" once: {report['block_read_ms']:.1f} ms (the floor on gguf_weights=blocks); in every round: "
                  f"{min(reads):.1f}-{max(reads):.1f} ms.")
    return table


def write(report: dict[str, Any], out: str | None) -> str:
    """The markdown table; with ``out``, also ``curves.json``, ``curves.md`` and ``curves.png`` there."""
    return write_with_plot(report, markdown(report), out, "curves", lambda plt: _draw(plt, report))


def _draw(plt: Any, report: dict[str, Any]) -> Any:
    """The curves' figure: ms by tree size per variant, one panel per context, with the floors."""
    contexts = report["contexts"]
    figure, axes = plt.subplots(1, len(contexts), figsize=(5.0 * len(contexts), 3.8), squeeze=False)
    for axis, context in zip(axes[0], contexts, strict=True):
        for name, by_context in report["ms"].items():
            axis.plot(report["sizes"], by_context[str(context)], marker="o", markersize=3, label=name)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("tree nodes")
        axis.set_ylabel("ms per verification")
        if "weight_read_ms" in report:
            axis.axhline(report["weight_read_ms"], color="grey", linestyle=":", label="weight read")
        if report.get("gemm_peak_gflops"):
            axis.plot(report["sizes"], [report["gflop_per_node"] * n / report["gemm_peak_gflops"] * 1e3
                                        for n in report["sizes"]], color="grey", linestyle="--",
                      label=f"arithmetic at {report['gemm_peak_gflops']} GFLOP/s")
        axis.set_title(f"context {context}, {report['device']}, {report['threads']} threads", fontsize=8)
        axis.legend(fontsize=7)
    return figure


def ratio_table(results: dict[str, Any]) -> str:
    """Per op, device, tree size and KV length: each backend's median (us) and torch / cuda_ext."""
    medians: dict[tuple[str, str, int, int | None], dict[str, float]] = defaultdict(dict)
    for bench in results.get("benchmarks", []):
        info = bench["extra_info"]
        if "op" in info:  # a saved run of the whole suite: keep the backend benchmarks
            medians[(info["op"], info["device"], info["nodes"], info["committed"])][info["backend"]] = \
                bench["stats"]["median"]
    if not medians:
        raise SpecDecError("no tree-op benchmarks in that JSON: run benchmarks/test_bench_backend.py with "
                           "--benchmark-json=PATH")
    rows = []
    for key in sorted(medians, key=lambda k: (k[0], k[1], k[2], k[3] or 0)):
        op, device, nodes, committed = key
        torch_s, ext_s = medians[key].get("torch"), medians[key].get("cuda_ext")
        rows.append([op, device, nodes, "-" if committed is None else f"{committed // 1024}K",
                     *[f"{s * 1e6:.0f}" if s else "-" for s in (torch_s, ext_s)],
                     f"{torch_s / ext_s:.1f}x" if torch_s and ext_s else "-"])
    return markdown_table(["op", "device", "nodes", "KV", "torch (us)", "cuda_ext (us)", "speedup"], rows)

