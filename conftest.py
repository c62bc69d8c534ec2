"""Repository-wide pytest options: ``pytest --benchmark`` runs the performance regression checks.

``pytest`` alone runs the test suite (``tests/``; benchmarks are skipped). ``pytest
--benchmark`` runs the pytest-benchmark suite instead (``benchmarks/``, see
docs/benchmarks.md) and, when a baseline for this machine kind is saved in
``benchmarks/baselines``, compares every benchmark with the newest one and fails where a
median is more than 25% slower. Wall times move with the machine's load: run it on a quiet
machine, under ``flock /tmp/specdec-bench.lock``. Explicit ``--benchmark-*`` options and
paths still apply (``pytest --benchmark benchmarks/test_loop_overhead.py``). CI runs the
suite in smoke mode, every benchmark once and untimed (``scripts/test.sh``:
``pytest benchmarks --benchmark-disable -o addopts=-ra``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent
BASELINES = ROOT / "benchmarks" / "baselines"
TOLERANCE = "median:25%"


def pytest_addoption(parser: Any) -> None:
    parser.addoption(
        "--benchmark",
        action="store_true",
        default=False,
        help="run the benchmarks (benchmarks/) and compare them with the newest saved baseline of this "
        f"machine kind in benchmarks/baselines, failing on a regression past {TOLERANCE}",
    )


def saved_baselines(machine_id: str) -> list[Path]:
    """The baselines saved for ``machine_id`` (pytest-benchmark's folder name), oldest first."""
    return sorted((BASELINES / machine_id).glob("[0-9][0-9][0-9][0-9]_*.json"))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: Any) -> None:
    if not config.getoption("benchmark"):
        return
    from pytest_benchmark.utils import get_machine_id, parse_compare_fail

    option = config.option
    option.benchmark_skip = False
    option.benchmark_only = True
    if option.benchmark_storage == "file://./.benchmarks":  # pytest-benchmark's default: use ours
        option.benchmark_storage = f"file://{BASELINES}"
    if not option.benchmark_compare and saved_baselines(get_machine_id()):
        option.benchmark_compare = True
        option.benchmark_compare_fail = option.benchmark_compare_fail or [parse_compare_fail(TOLERANCE)]
    if getattr(config, "args_source", None) == pytest.Config.ArgsSource.TESTPATHS:
        config.args[:] = [str(ROOT / "benchmarks")]
