"""Busy machines: how much of the machine other processes used while something was measured.

A calibration table measured while other jobs ran was once cached 10x too slow and wrongly
shaped (docs/budget.md). So calibration records two witnesses of interference: the
**spread** of its repeats (median over the timed cells of slowest / fastest - 1) and the
**others' share** of the machine's CPU time while it ran (from ``/proc/stat``: the machine's
busy time minus this process's own, over wall time times CPUs; the load average where there
is no ``/proc/stat``). Past :data:`BUSY_SPREAD` or :data:`BUSY_SHARE` the table serves this
process but is not cached (:mod:`specdec.budget.calibration_cache`), with a one-line
warning; the next process measures again (``specdec calibrate --recalibrate --force``
caches it anyway, for machines that are never quiet).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from specdec.budget.cost_model import CostTable

BUSY_SPREAD = 0.25  # median spread of a calibration's repeats past which the machine was busy
BUSY_SHARE = 0.25  # share of the machine's CPU time other processes may use while calibrating


def _machine_cpu_seconds() -> tuple[float, int] | None:
    """``(busy CPU seconds of the whole machine since boot, CPUs)`` from ``/proc/stat``; None where there is none.

    Busy: user, nice, system, irq, softirq and steal (a VM's neighbours) time; not idle or iowait.
    """
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            total = handle.readline().split()
            cpus = sum(1 for line in handle if line.startswith("cpu"))
        ticks = os.sysconf("SC_CLK_TCK")
        busy = sum(int(total[i]) for i in (1, 2, 3, 6, 7, 8))
    except (OSError, ValueError, IndexError):
        return None
    return busy / ticks, max(cpus, 1)


@dataclass(frozen=True)
class MachineWatch:
    """Other processes' share of the machine's CPU time over an interval (module docstring).

    ``others_share()`` = (machine busy time - this process's CPU time) / (wall time * CPUs),
    in [0, 1]. Without ``/proc/stat``: the 1-minute load average minus this process's
    threads, over the CPUs (coarser: it lags by a minute). None where neither exists.
    """

    wall: float
    own: float
    machine: tuple[float, int] | None
    own_threads: int

    @classmethod
    def start(cls, on_cpu: bool = True) -> MachineWatch:
        threads = torch.get_num_threads() if on_cpu else 1
        return cls(time.perf_counter(), time.process_time(), _machine_cpu_seconds(), threads)

    def others_share(self) -> float | None:
        wall = time.perf_counter() - self.wall
        now = _machine_cpu_seconds()
        if self.machine is not None and now is not None and wall > 0.0:
            others = (now[0] - self.machine[0]) - (time.process_time() - self.own)
            return min(max(others / (wall * now[1]), 0.0), 1.0)
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            return None
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return min(max((load - self.own_threads) / cpus, 0.0), 1.0)


def others_share_now(seconds: float = 0.25) -> float | None:
    """Other processes' share of the machine's CPU time over the next ``seconds`` (this process idle)."""
    watch = MachineWatch.start(on_cpu=False)
    time.sleep(seconds)
    return watch.others_share()


def busy_reason(table: CostTable) -> str | None:
    """Why ``table`` was measured on a busy machine (one clause per witness), or None when it was quiet."""
    reasons = []
    if table.others_share > BUSY_SHARE:
        reasons.append(f"other processes used {table.others_share:.0%} of its CPU time")
    if table.spread > BUSY_SPREAD:
        reasons.append(f"repeated timings spread by {table.spread:.0%}")
    return "; ".join(reasons) or None
