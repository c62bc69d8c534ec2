"""The CPU kernels' linear layers alone: ms and GFLOP/s per kernel path and row count, with the weights
streamed from memory as a forward reads them and with them resident in the caches.

Why: a verification forward of N nodes is mostly its linear layers against N rows, and where a kernel
path's cost curve is steep (``specdec bench curves``) the question is where the time goes. If a path
is slow with its weights resident as well as streamed, its kernel is the limit (the arithmetic, or how
the kernel feeds it from L2); if only streamed, the memory is. The numbers are per thread, so CPUs
with different core counts compare.

Per kernel path (``avx512``, ``avx512-blocks``, ``avx2``, ``avx2-blocks``, ``avx2-lanes16``, ``portable``; default:
those this CPU runs but ``portable``, unless it is the only one) and per row count, two modes:

- ``streamed``: every linear weight of the model (the layers' and the LM head), once each, in the
  model's order; runs of weights with the same in-features go to one ``skinny_linears`` call (one fork
  and join per run, as the forward groups the query, key and value projections);
- ``resident``: the first decoder layer's weights, as many times as the model has layers: the same
  arithmetic as the layers' part of a forward, on one layer's weights (14 MB for the default model),
  which stay in a last-level cache of that size and come from it, not from memory.

``torch`` is ``torch.nn.functional.linear`` on the same weights, one call per weight, for reference.
All are timed in the same interleaved rounds (round 0 warms up; the fastest of ``repeats`` is kept).
GFLOP/s per thread: 2 x rows x parameters / seconds / torch's threads.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from tqdm import tqdm

from specdec.bench.plot import write_with_plot
from specdec.bench.report import markdown_table
from specdec.errors import SpecDecError

TORCH_PATH = "torch"


def weight_runs(module: torch.nn.Module) -> list[list[torch.Tensor]]:
    """The weights of ``module``'s linear layers in their order, cut into runs of equal in-features."""
    runs: list[list[torch.Tensor]] = []
    for child in module.modules():
        if isinstance(child, torch.nn.Linear):
            weight = child.weight.detach()
            if runs and runs[-1][0].shape[1] == weight.shape[1]:
                runs[-1].append(weight)
            else:
                runs.append([weight])
    return runs


def _layers(model: Any) -> Sequence[torch.nn.Module]:
    """The decoder layers (``model.model.layers``, as Hugging Face's causal LMs hold them), or none."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    return list(layers) if layers is not None else []


def default_paths() -> list[str]:
    """The kernel paths this CPU runs, best first, but ``portable`` unless it is the only one."""
    from specdec.backends.specdec_engine import cpu_kernels

    supported = cpu_kernels.supported_isas()
    return [path for path in supported if path != "portable"] or supported


def check_paths(paths: Sequence[str]) -> None:
    """Raise :class:`SpecDecError` for a kernel path this CPU does not run (before any model is loaded)."""
    from specdec.backends.specdec_engine import cpu_kernels

    supported = cpu_kernels.supported_isas()
    for path in paths:
        if path != TORCH_PATH and path not in supported:
            raise SpecDecError(f"kernel path {path!r}: this CPU runs {', '.join(supported)} (or {TORCH_PATH!r})")


def _one_pass(path: str, runs: list[list[torch.Tensor]], inputs: dict[int, torch.Tensor], repeat: int) -> None:
    """One timed pass: every run's weights against the rows, ``repeat`` times over."""
    from specdec.backends.specdec_engine import cpu_kernels

    for _ in range(repeat):
        for weights in runs:
            x = inputs[weights[0].shape[1]]
            if path == TORCH_PATH:
                for weight in weights:
                    torch.nn.functional.linear(x, weight)
            else:
                cpu_kernels.skinny_linears(x, [(weight, None) for weight in weights], isa=path)


def measure(model: Any, rows: Sequence[int], paths: Sequence[str] | None, repeats: int) -> dict[str, Any]:
    """``{"ms": {path: {mode: [fastest ms per row count]}}, "gflops_per_thread": ..., ...}`` (module docstring)."""
    from specdec.backends.specdec_engine import cpu_kernels

    parameter = next(model.parameters())
    if parameter.device.type != "cpu" or parameter.dtype not in cpu_kernels.DTYPES:
        raise SpecDecError(f"bench linears: a CPU model of {', '.join(map(str, cpu_kernels.DTYPES))}, "
                           f"got {parameter.dtype} on {parameter.device}")
    if not rows or min(rows) < 1:
        raise SpecDecError(f"bench linears: row counts must be positive, got {list(rows)}")
    cpu_kernels.load()
    chosen = [*(paths or default_paths()), TORCH_PATH]
    check_paths(chosen)
    streamed = weight_runs(model)
    layers = _layers(model)
    resident = weight_runs(layers[0]) if layers else []
    modes = {"streamed": (streamed, 1)}
    if resident:
        modes["resident"] = (resident, len(layers))
    flop = {mode: 2 * sum(w.numel() for run in runs for w in run) * repeat for mode, (runs, repeat) in modes.items()}
    generator = torch.Generator().manual_seed(0)
    features = {w.shape[1] for run in streamed for w in run}
    best: dict[tuple[str, str, int], float] = {}
    bar = tqdm(total=(repeats + 1) * len(rows) * len(chosen) * len(modes), desc="linears", unit="pass")
    with torch.inference_mode():
        for round_ in range(repeats + 1):  # round 0 warms up
            for count in rows:
                inputs = {k: torch.randn(count, k, generator=generator).to(parameter.dtype) for k in features}
                for path in chosen:
                    for mode, (runs, repeat) in modes.items():
                        started = time.perf_counter()
                        _one_pass(path, runs, inputs, repeat)
                        elapsed = time.perf_counter() - started
                        if round_:
                            key = (path, mode, count)
                            best[key] = min(best.get(key, float("inf")), elapsed)
                        bar.update(1)
    bar.close()
    threads = torch.get_num_threads()
    return {
        "rows": list(rows), "paths": chosen, "modes": list(modes), "repeats": repeats, "threads": threads,
        "dtype": str(parameter.dtype), "layers": len(layers),
        "weight_mb": round(sum(w.numel() * w.element_size() for run in streamed for w in run) / 1e6, 1),
        "resident_mb": round(sum(w.numel() * w.element_size() for run in resident for w in run) / 1e6, 1),
        "best_isa": cpu_kernels.best_isa(),
        "ms": {path: {mode: [round(best[(path, mode, n)] * 1e3, 2) for n in rows] for mode in modes}
               for path in chosen},
        "gflops_per_thread": {
            path: {mode: [float(f"{flop[mode] * n / best[(path, mode, n)] / 1e9 / threads:.3g}") for n in rows]
                   for mode in modes} for path in chosen},
    }


def markdown(report: dict[str, Any]) -> str:
    """The table: per path and mode, ms (GFLOP/s per thread) at each row count, and what was measured."""
    rows = report["rows"]
    body = [[path, mode, *(f"{ms} ({gflops})" for ms, gflops in zip(
        report["ms"][path][mode], report["gflops_per_thread"][path][mode], strict=True))]
        for path in report["paths"] for mode in report["modes"]]
    table = markdown_table(["path", "mode", *(str(n) for n in rows)], body)
    resident = (f"; resident: the first layer's {report['resident_mb']} MB, {report['layers']} times"
                if "resident" in report["modes"] else "")
    return (f"{table}\n\nms per pass, fastest of {report['repeats']} rounds (GFLOP/s per thread, "
            f"{report['threads']} threads), {report['dtype']}. Streamed: all {report['weight_mb']} MB of the "
            f"model's linear weights once{resident}. This CPU's best kernel path: {report['best_isa']}.")


def write(report: dict[str, Any], out: str | None) -> str:
    """The markdown table; with ``out``, also ``linears.json``, ``linears.md`` and ``linears.png`` there."""
    return write_with_plot(report, markdown(report), out, "linears", lambda plt: _draw(plt, report))


def _draw(plt: Any, report: dict[str, Any]) -> Any:
    """GFLOP/s per thread by row count: a colour per path, a line style per mode."""
    figure, axis = plt.subplots(figsize=(6.0, 3.8))
    for index, path in enumerate(report["paths"]):
        for mode in report["modes"]:
            axis.plot(report["rows"], report["gflops_per_thread"][path][mode], marker="o", markersize=3,
                      color=f"C{index}", linestyle="-" if mode == "streamed" else "--", label=f"{path}, {mode}")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("rows")
    axis.set_ylabel("GFLOP/s per thread")
    axis.set_title(f"linear layers alone, {report['threads']} threads, {report['dtype']}", fontsize=8)
    axis.legend(fontsize=7)
    return figure
