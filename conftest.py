"""Repository-wide pytest options: ``pytest --benchmark`` runs the performance regression checks.

``pytest`` alone runs the test suite (``tests/``; benchmarks are skipped). ``pytest
--benchmark`` runs the pytest-benchmark suite instead (``benchmarks/``, docs/benchmarks.md
"What `pytest --benchmark` checks") and, with ``--benchmark-save``, saves the run under
``benchmarks/baselines/MACHINE``,
where ``MACHINE`` is pytest-benchmark's id plus this CPU's model and best kernel path
(:func:`machine_id`, e.g. ``Linux-CPython-3.11-64bit-AMD_EPYC-f25m17-avx512``): a baseline is only
ever compared with runs of its own machine kind.

**Ratios, not raw times.** A machine's speed drifts by 10-30% between minutes (memory
bandwidth, other jobs), so every benchmark is paired with a reference timing taken in the
same minute: a model forward with a read of the model's weights just before each round, any
other benchmark with a fixed GEMM and memory read just before and after it
(``benchmarks/conftest.py``). ``extra_info["ratio"]`` is the benchmark's fastest round over its
reference's; the check fails where a ratio is more than :data:`RATIO_TOLERANCE` times its
value in the newest saved baseline of this machine kind, and prints every ratio beside the
baseline's. Drift moves a benchmark and its reference together; a 2x slower kernel path (or
an ISA detection that falls back to a slower path) moves only the benchmark.

``pytest --benchmark --benchmark-save=cpu`` saves a new
baseline; run it on a quiet machine, under ``flock /tmp/specdec-bench.lock``. Explicit
``--benchmark-*`` options and paths still apply (``pytest --benchmark
benchmarks/test_loop_overhead.py``). CI runs the suite in smoke mode, every benchmark once
and untimed (``scripts/test.sh``: ``pytest benchmarks --benchmark-disable -o addopts=-ra``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent
BASELINES = ROOT / "benchmarks" / "baselines"
# A ratio may grow this much over its baseline before the check fails: above the spread of an
# unchanged rerun on a quiet machine, below the 2x of a kernel path that regressed or an ISA
# detection that fell back (docs/benchmarks.md, "What `pytest --benchmark` checks", has the runs).
# On a loaded machine the reference and the forward drift apart: run it quiet, under the lock.
RATIO_TOLERANCE = 1.6


def pytest_addoption(parser: Any) -> None:
    parser.addoption(
        "--benchmark",
        action="store_true",
        default=False,
        help="run the benchmarks (benchmarks/), save the run and compare every benchmark's ratio to its "
        "reference timing with the newest saved baseline of this machine kind in benchmarks/baselines, "
        f"failing where a ratio grew more than {RATIO_TOLERANCE}x",
    )


def cpu_model_slug() -> str:
    """This CPU's model name (``/proc/cpuinfo``) as a folder-name slug, with its family and model numbers
    where the file gives them: ``AMD EPYC``, family 25, model 17 -> ``AMD_EPYC-f25m17``. Cloud CPUs
    often share one name across generations (an ``AMD EPYC`` is a Zen 1 or a Zen 4); the numbers
    tell them apart."""
    import platform

    name, fields = platform.processor() or "unknown-cpu", {}
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            if not key.strip():
                break  # the first processor's block ends
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name", name)
    name = re.sub(r"\((R|TM|tm|r)\)|\bCPU\b|\bProcessor\b|@.*$", " ", name)
    slug = re.sub(r"[^A-Za-z0-9.-]+", "_", name.strip()).strip("_") or "unknown-cpu"
    if fields.get("cpu family", "").isdigit() and fields.get("model", "").isdigit():
        slug += f"-f{fields['cpu family']}m{fields['model']}"
    return slug


def best_isa_slug() -> str:
    """The best kernel path of specdec's CPU kernels here, or ``no-kernels`` where they do not build."""
    from specdec.backends.specdec_engine import cpu_kernels
    from specdec.native import NativeBuildError

    try:
        return cpu_kernels.best_isa()
    except NativeBuildError:
        return "no-kernels"


def machine_id() -> str:
    """pytest-benchmark's machine id (OS, Python, word size) plus the CPU model and its best kernel path."""
    from pytest_benchmark.utils import get_machine_id

    return f"{get_machine_id()}-{cpu_model_slug()}-{best_isa_slug()}"


def saved_baselines(machine: str) -> list[Path]:
    """The baselines saved for ``machine`` (:func:`machine_id`), oldest first."""
    return sorted((BASELINES / machine).glob("[0-9][0-9][0-9][0-9]_*.json"))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: Any) -> None:
    if not config.getoption("benchmark"):
        return
    import pytest_benchmark.session

    machine = machine_id()
    # The storage folder is named by the session's machine id, read when the session is built
    # (after this hook): ours carries the CPU model and kernel path.
    pytest_benchmark.session.get_machine_id = lambda: machine  # type: ignore[attr-defined]
    option = config.option
    option.benchmark_skip = False
    option.benchmark_only = True
    if option.benchmark_storage == "file://./.benchmarks":  # pytest-benchmark's default: use ours
        option.benchmark_storage = f"file://{BASELINES}"
    config._specdec_machine = machine
    if getattr(config, "args_source", None) == pytest.Config.ArgsSource.TESTPATHS:
        config.args[:] = [str(ROOT / "benchmarks")]


def ratio_of(bench: Any) -> float | None:
    """A finished benchmark's fastest round over its reference timing (``extra_info["reference_s"]``).

    The fastest, as the reference is its fastest pass: noise (another job, an interrupt, a page
    fault) only ever adds time, so the minima of both sides are the steadiest pair to divide; a
    median over a handful of rounds moved by up to 2x between two unchanged runs.
    """
    reference = bench.extra_info.get("reference_s")
    if not reference or bench.stats is None:
        return None
    return float(bench.stats.min) / float(reference)


def compare_ratios(ratios: dict[str, float], baseline: dict[str, float], tolerance: float) -> tuple[list[list[str]],
                                                                                                      list[str]]:
    """Rows ``[name, baseline ratio, ratio, change, verdict]`` and the names past ``tolerance``."""
    rows, failed = [], []
    for name in sorted(ratios):
        ratio, before = ratios[name], baseline.get(name)
        if before is None:
            rows.append([name, "-", f"{ratio:.4g}", "-", "new"])
            continue
        change = ratio / before
        verdict = "REGRESSED" if change > tolerance else "ok"
        if verdict != "ok":
            failed.append(name)
        rows.append([name, f"{before:.4g}", f"{ratio:.4g}", f"{change:.2f}x", verdict])
    return rows, failed


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session: Any, exitstatus: int) -> Any:
    """Store every benchmark's ratio (before pytest-benchmark saves the run), then compare the ratios
    with the newest saved baseline of this machine kind."""
    config = session.config
    bench_session = getattr(config, "_benchmarksession", None)
    machine = getattr(config, "_specdec_machine", None)
    if bench_session is None or machine is None or bench_session.disabled:
        yield
        return
    baselines = saved_baselines(machine)  # listed before this run is saved
    ratios = {}
    for bench in bench_session.benchmarks:
        ratio = ratio_of(bench)
        if ratio is not None:
            bench.extra_info["ratio"] = round(ratio, 6)
            ratios[bench.fullname] = ratio
    if baselines:
        saved = json.loads(baselines[-1].read_text(encoding="utf-8"))
        before = {b["fullname"]: b["extra_info"]["ratio"] for b in saved.get("benchmarks", [])
                  if "ratio" in b.get("extra_info", {})}  # fmt: skip
        rows, failed = compare_ratios(ratios, before, RATIO_TOLERANCE)
        config._specdec_ratio_check = (baselines[-1], rows, failed)
        if failed:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    yield


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    check = getattr(config, "_specdec_ratio_check", None)
    machine = getattr(config, "_specdec_machine", None)
    if machine is None or getattr(config, "_benchmarksession", None) is None:
        return
    write = terminalreporter.write_line
    if check is None:
        write(f"specdec: no baseline saved for {machine} yet (pytest --benchmark --benchmark-save=cpu saves one); "
              "nothing compared")
        return
    path, rows, failed = check
    write(f"specdec: ratios (fastest round / reference) against {path.relative_to(ROOT)}, tolerance {RATIO_TOLERANCE}x")
    width = max((len(r[0]) for r in rows), default=10)
    write(f"{'benchmark':<{width}}  {'baseline':>10}  {'now':>10}  {'change':>7}  verdict")
    for name, before, now, change, verdict in rows:
        write(f"{name:<{width}}  {before:>10}  {now:>10}  {change:>7}  {verdict}")
    if failed:
        write(f"specdec: FAILED: {len(failed)} benchmark(s) past {RATIO_TOLERANCE}x their baseline ratio: "
              + ", ".join(failed), red=True)
    else:
        write(f"specdec: every ratio within {RATIO_TOLERANCE}x of its baseline", green=True)
