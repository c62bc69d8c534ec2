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
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
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


def _cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return os.cpu_count() or 1


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
        return min(max((load - self.own_threads) / _cpus(), 0.0), 1.0)


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


# -- following the load: the CPU threads a generation runs on ------------------------------------
FOLLOW_LOAD_ENV = "SPECDEC_FOLLOW_LOAD"  # "0": every generation keeps torch's thread count as it is
RESAMPLE_S = 0.5  # a generation re-reads the others' share (and may change its threads) this often
ROUND_UP = 0.35  # free CPUs round up from this fraction: 1.7 free CPUs run 2 threads, 1.6 run 1


def threads_for(share: float, cpus: int, limit: int) -> int:
    """The threads a generation runs on when others use ``share`` of ``cpus`` CPUs: the CPUs left to it, rounded
    (:data:`ROUND_UP`), between 1 and ``limit`` (torch's thread count when the call began).

    Why not all of them: the CPU kernels split every layer's work evenly over torch's threads and wait at its
    end for the last, so a thread the OS descheduled for another process's time slice holds up the whole
    forward. Measured on a 2-vCPU AMD EPYC (Zen 4) beside one busy process, plain decoding ran at 0.27x its
    idle speed on 2 threads and 0.73x on 1 (docs/budget.md, "Sharing the CPU").

    >>> threads_for(0.0, 2, 2), threads_for(0.33, 2, 2), threads_for(0.5, 2, 2), threads_for(0.1, 16, 8)
    (2, 1, 1, 8)
    """
    free = cpus * (1.0 - min(max(share, 0.0), 1.0))
    return max(1, min(limit, int(free + ROUND_UP)))


class LoadFollower:
    """The process's generations on the CPU, each on the threads the machine's load leaves it (:func:`threads_for`).

    One per process (:data:`FOLLOWER`): torch's thread count is the process's. The others' share is
    read from ``/proc/stat`` over the time since the last reading (the first spans everything since
    specdec was imported, model loading included): no reading waits. A generation enters with
    :meth:`following`, which lowers torch's threads to what the load leaves (never raises them past
    the count it found), :meth:`tick` re-reads every :data:`RESAMPLE_S` seconds between steps, and
    the last generation to leave puts torch's count back. :attr:`generation_share`: the others'
    share over the last generation, what the cost model's learned table is stamped with.
    Bits: specdec's CPU kernels compute every output on one thread, so their results do not depend
    on the thread count; torch's own products may (as they do between any two thread counts).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watch = MachineWatch.start(on_cpu=False)
        self.share: float | None = None  # the others' share at the last reading
        self.generation_share: float | None = None
        self._depth = 0
        self._limit = 1
        self._cpus = _cpus()
        self._generation: MachineWatch | None = None
        self.threads_set: deque[int] = deque(maxlen=64)  # the last thread counts set, in order (tests)

    def _read(self, min_wall: float) -> float | None:
        if time.perf_counter() - self._watch.wall >= min_wall:
            share = self._watch.others_share()
            self._watch = MachineWatch.start(on_cpu=False)
            if share is not None:
                self.share = share
        return self.share

    def _apply(self) -> None:
        share = self.share
        wanted = self._limit if share is None else threads_for(share, self._cpus, self._limit)
        if wanted != torch.get_num_threads():
            torch.set_num_threads(wanted)
            self.threads_set.append(wanted)

    @contextmanager
    def following(self, on_cpu: bool) -> Iterator[None]:
        """One generation (module docstring); off the CPU, or with ``SPECDEC_FOLLOW_LOAD=0``, the threads stay as they
        are (the load over the generation is still read)."""
        if not on_cpu or os.environ.get(FOLLOW_LOAD_ENV, "1") == "0":
            watch = MachineWatch.start(on_cpu=False)
            yield
            self.generation_share = watch.others_share()
            return
        with self._lock:
            if self._depth == 0:
                self._limit = torch.get_num_threads()
                self._generation = MachineWatch.start(on_cpu=False)
            self._depth += 1
            self._read(0.05)
            self._apply()
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    if self._generation is not None:
                        self.generation_share = self._generation.others_share()
                    if torch.get_num_threads() != self._limit:
                        torch.set_num_threads(self._limit)

    def tick(self) -> None:
        """Between two steps: re-read the load every :data:`RESAMPLE_S` seconds and follow it."""
        if self._depth == 0 or time.perf_counter() - self._watch.wall < RESAMPLE_S:
            return
        with self._lock:
            if self._depth > 0:
                self._read(RESAMPLE_S)
                self._apply()


FOLLOWER = LoadFollower()
