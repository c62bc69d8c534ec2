"""The cost model: seconds one verification takes, as a function of tree size and context length.

``cost(N, C)`` is the wall time of :meth:`ModelVerifier.verify` for an ``N``-node tree
after ``C`` committed tokens (forward, acceptance, KV compaction: what ``StepRecord.verify_s``
measures). Its shape is what decides whether speculation pays: on this project's CPU a
16-node verification costs ~1.9x a one-node step, on a datacenter GPU ~1.0x.

**Calibration** (once per model, device and dtype, then cached): prefill ``max(contexts)``
random tokens, then time verifications of chains of every size in ``sizes`` at every
context in ``contexts`` (the cache is cropped back after each), rounds interleaved so a
drift of the machine's load hits all sizes alike; keep the fastest of ``repeats`` rounds
(other jobs on a shared machine only ever add time, so the minimum is the cost of the
model itself). Two physical bounds then remove what noise is left: costs are made
non-decreasing in ``N`` (a larger tree never costs less) and at most ``N * cost(1)`` (one
forward over ``N`` tokens never costs more than ``N`` one-token forwards). ~60
verifications in all: ~10 s on a 2-core CPU for a 135M model, ~1 s on a GPU.

**Kernel choice**: where the verifier offers narrow products (:mod:`specdec.backends.narrow`:
CPU, fp32/fp64), every size from 1 to ``NARROW_MAX_SIZE`` is also timed with them, in the
same rounds (one node: the padded product). ``narrow_rows`` is the largest size up to which
they were faster at every calibrated size from 2 on (summed over the contexts),
``narrow_single`` whether the padded product was faster for one node; the table keeps the
faster time of each size under those rules, and :func:`cost_model` sets the verifier's
switches from it, so the costs the planner plans with are those of the kernels the
verifier will run.

**Prediction**: linear interpolation in ``N`` between calibrated sizes (linear extrapolation
past the largest) and in ``C`` between the two calibrated contexts (attention grows with
``C``; extrapolated linearly, floored at half the smallest context's cost), times an
online **correction**.

**Online refinement**: every real step's measured ``verify_s`` is compared with the
prediction; the ratio updates a running mean for the nearest calibrated size (an
exponential moving average once a size has ``1 / MIN_RATE`` observations), and sizes not
seen lately are shrunk toward the ratio over all sizes. So the model follows the
machine's present load and corrects calibration noise, while the shape measured at
calibration stays in force where no step has been seen. Each step's ratio is clipped to
``[1/5, 5]`` times the present overall ratio: one preempted step must not rewrite the
model, but a calibration measured under another load (a busy machine: 10x off) is
corrected within a few steps.

**Cache**: ``<cache_dir>/calibration/<key>.json``, ``key`` a hash of the identity: the
model's architecture (its config, minus names and paths: two checkpoints of one
architecture cost the same), parameter dtype, device (CPU model or GPU name), attention
implementation, torch version and thread count.

**Busy machines.** A table measured while other jobs ran was once cached 10x too slow and
wrongly shaped (docs/budget.md). So calibration records two witnesses of interference:
the **spread** of its repeats (median over the timed cells of slowest / fastest - 1) and
the **others' share** of the machine's CPU time while it ran (from ``/proc/stat``: the
machine's busy time minus this process's own, over wall time times CPUs; the load average
where there is no ``/proc/stat``). Past :data:`BUSY_SPREAD` or :data:`BUSY_SHARE` the table
serves this process but is not cached, with a one-line warning; the next process measures
again (``specdec calibrate --recalibrate --force`` caches it anyway, for machines that are
never quiet).

**Drift.** When the online ratio over all sizes stays beyond :data:`DRIFT_RATIO` (either
way) for :data:`DRIFT_MIN_STEPS` steps, the table no longer describes the machine. If
other processes are busy right now the load explains it and online refinement already
follows it; otherwise the next generation measures the table again (with a warning), and
the steps required before another re-measurement double each time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import random
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from specdec.backends.verifier import ModelVerifier
from specdec.cachefiles import folder, write_atomically
from specdec.errors import SpecDecError
from specdec.types import DraftTree

FloatArray = npt.NDArray[np.float64]

# Bump when calibration changes what it measures, so stale cache files are re-measured.
CALIBRATION_VERSION = 7  # 6: static buckets compile narrow products; 7: they attend over a window of the cache
DEFAULT_SIZES = (1, 2, 3, 4, 6, 8, 16, 32, 64, 128)
NARROW_MAX_SIZE = 32  # narrow products are timed up to this size (past ~8 the usual GEMM wins)
DEFAULT_CONTEXTS = (64, 1024)
DEFAULT_REPEATS = 3
MIN_RATE = 0.05  # slowest online learning rate: ~20 recent steps weigh in
RATIO_CLIP = 5.0
SHRINK_STEPS = 1.0  # observations at which a size's own ratio weighs as much as the global one
BUSY_SPREAD = 0.25  # median spread of a calibration's repeats past which the machine was busy
BUSY_SHARE = 0.25  # share of the machine's CPU time other processes may use while calibrating
DRIFT_RATIO = 2.0  # measured / calibrated, over all sizes, past which the table has drifted
DRIFT_MIN_STEPS = 32  # online observations before drift counts (doubled after each re-measurement)


@dataclass(frozen=True)
class CostTable:
    """Calibrated verification seconds: ``seconds[c][j]`` for ``sizes[j]`` nodes after ``contexts[c]`` tokens."""

    sizes: tuple[int, ...]
    contexts: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]
    identity: dict[str, str]
    narrow_rows: int = 0  # verify trees of 2..narrow_rows nodes with narrow products (0: never)
    narrow_single: bool = False  # verify one-node trees with the padded narrow product
    bucketed: bool = False  # a size costs the next calibrated size's forward (a static cache's buckets)
    spread: float = 0.0  # median over timed cells of slowest / fastest repeat - 1 (module docstring)
    others_share: float = 0.0  # other processes' share of the machine's CPU time while calibrating

    def __post_init__(self) -> None:
        if not self.sizes or list(self.sizes) != sorted(set(self.sizes)) or self.sizes[0] < 1:
            raise SpecDecError(f"calibration sizes must be increasing positive ints, got {list(self.sizes)}")
        if not self.contexts or list(self.contexts) != sorted(set(self.contexts)) or self.contexts[0] < 0:
            raise SpecDecError(f"calibration contexts must be increasing non-negative ints, got {list(self.contexts)}")
        if len(self.seconds) != len(self.contexts) or any(len(row) != len(self.sizes) for row in self.seconds):
            raise SpecDecError(
                f"calibration table must be {len(self.contexts)} x {len(self.sizes)}, got "
                f"{[len(row) for row in self.seconds]}"
            )
        if any(not (s > 0.0 and np.isfinite(s)) for row in self.seconds for s in row):
            raise SpecDecError(f"calibration times must be positive and finite, got {self.seconds}")
        if isinstance(self.narrow_rows, bool) or not isinstance(self.narrow_rows, int) or self.narrow_rows < 0:
            raise SpecDecError(f"narrow_rows must be a non-negative int, got {self.narrow_rows!r}")
        if not isinstance(self.narrow_single, bool):
            raise SpecDecError(f"narrow_single must be a bool, got {self.narrow_single!r}")
        for name in ("spread", "others_share"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < float("inf"):
                raise SpecDecError(f"calibration {name} must be a finite number >= 0, got {value!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "version": CALIBRATION_VERSION,
            "identity": self.identity,
            "sizes": list(self.sizes),
            "contexts": list(self.contexts),
            "seconds": [list(row) for row in self.seconds],
            "narrow_rows": self.narrow_rows,
            "narrow_single": self.narrow_single,
            "bucketed": self.bucketed,
            "spread": self.spread,
            "others_share": self.others_share,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CostTable:
        if data.get("version") != CALIBRATION_VERSION:
            raise SpecDecError(f"calibration format version {data.get('version')!r}, expected {CALIBRATION_VERSION}")
        return cls(
            tuple(int(s) for s in data["sizes"]),
            tuple(int(c) for c in data["contexts"]),
            tuple(tuple(float(s) for s in row) for row in data["seconds"]),
            {str(k): str(v) for k, v in data["identity"].items()},
            data.get("narrow_rows", 0),
            data.get("narrow_single", False),
            bool(data.get("bucketed", False)),
            data.get("spread", 0.0),
            data.get("others_share", 0.0),
        )


class VerifyCostModel:
    """Predicted verification seconds from a :class:`CostTable`, refined online (module docstring).

    >>> table = CostTable((1, 2, 4), (0, 100), ((1.0, 1.5, 2.0), (2.0, 3.0, 4.0)), {})
    >>> model = VerifyCostModel(table)
    >>> [round(float(s), 3) for s in model.predict(np.array([1, 3, 8]), 50)]
    [1.5, 2.625, 4.5]
    """

    def __init__(self, table: CostTable, *, learn: bool = True) -> None:
        self.table = table
        self.learn = learn  # False: predictions stay the table's (reproducible budgets, tests)
        self._sizes = np.asarray(table.sizes, dtype=np.float64)  # [S]
        self._log_sizes = np.log(self._sizes)  # [S]
        self._seconds = np.asarray(table.seconds, dtype=np.float64)  # [Cn, S]
        self._ratio = np.ones(len(table.sizes), dtype=np.float64)  # [S] measured / calibrated, per size
        self._count = np.zeros(len(table.sizes), dtype=np.float64)  # [S] observations per size
        self._global_ratio = 1.0
        self._global_count = 0.0
        self.drift_steps = DRIFT_MIN_STEPS  # observations before :attr:`drifted` can hold (module docstring)

    @property
    def observations(self) -> int:
        """Real steps this model has learned from."""
        return int(self._global_count)

    @property
    def drift(self) -> float:
        """The online ratio measured / calibrated over all sizes, lately (1.0: as calibrated)."""
        return self._global_ratio

    @property
    def drifted(self) -> bool:
        """Whether the machine drifted from the table: beyond :data:`DRIFT_RATIO` after ``drift_steps`` steps."""
        far = not 1.0 / DRIFT_RATIO <= self._global_ratio <= DRIFT_RATIO
        return self.learn and self._global_count >= self.drift_steps and far

    def _along_sizes(self, row: FloatArray, sizes: FloatArray) -> FloatArray:
        """Linear interpolation of ``row[S]`` at ``sizes[K]``, extrapolated linearly past the ends."""
        out = np.interp(sizes, self._sizes, row)
        if len(self._sizes) > 1:
            slope = (row[-1] - row[-2]) / (self._sizes[-1] - self._sizes[-2])
            beyond = sizes > self._sizes[-1]
            out[beyond] = row[-1] + slope * (sizes[beyond] - self._sizes[-1])
        return out

    def _padded(self, sizes: npt.NDArray[np.int64]) -> FloatArray:
        """``sizes`` as float64; with a bucketed table, each raised to its bucket (the size it is verified at)."""
        x = np.asarray(sizes, dtype=np.float64)
        if self.table.bucketed:  # padded up to the next bucket: its cost, not an interpolation
            index = np.searchsorted(self._sizes, x)  # [K] first bucket >= size
            inside = index < len(self._sizes)
            x = np.where(inside, self._sizes[np.minimum(index, len(self._sizes) - 1)], x)
        return x

    def calibrated(self, sizes: npt.NDArray[np.int64], committed_len: int) -> FloatArray:
        """The calibration table's prediction for ``sizes`` int ``[K]`` after ``committed_len`` tokens, ``[K]``."""
        x = self._padded(sizes)
        rows = [self._along_sizes(row, x) for row in self._seconds]
        contexts = self.table.contexts
        if len(rows) == 1:
            return rows[0]
        lo, hi = rows[0], rows[-1]
        t = (committed_len - contexts[0]) / (contexts[-1] - contexts[0])
        return np.maximum(lo + t * (hi - lo), 0.5 * lo)

    def correction(self, sizes: npt.NDArray[np.int64]) -> FloatArray:
        """The online ratio measured / calibrated at ``sizes`` ``[K]``: per size, shrunk toward the global one."""
        shrunk = (self._count * self._ratio + SHRINK_STEPS * self._global_ratio) / (self._count + SHRINK_STEPS)
        return np.interp(np.log(self._padded(sizes)), self._log_sizes, shrunk)

    def predict(self, sizes: npt.NDArray[np.int64], committed_len: int) -> FloatArray:
        """Predicted seconds to verify trees of ``sizes`` ``[K]`` nodes after ``committed_len`` tokens. O(K log S)."""
        return self.calibrated(sizes, committed_len) * self.correction(sizes)

    def observe(self, size: int, committed_len: int, seconds: float) -> None:
        """Learn from one real verification of ``size`` nodes that took ``seconds``. O(S)."""
        if not self.learn or seconds <= 0.0 or size < 1:
            return
        base = float(self.calibrated(np.array([size]), committed_len)[0])
        # Clipped around the present level, not around 1: one preempted step moves the model by
        # at most RATIO_CLIP, but a calibration measured under another load (10x off) is
        # corrected within a few steps instead of staying off by its excess over the clip.
        level = self._global_ratio
        ratio = min(max(seconds / base, level / RATIO_CLIP), level * RATIO_CLIP)
        j = int(np.argmin(np.abs(self._log_sizes - np.log(self._padded(np.array([size]))[0]))))
        self._count[j] += 1.0
        self._ratio[j] += max(1.0 / self._count[j], MIN_RATE) * (ratio - self._ratio[j])
        self._global_count += 1.0
        self._global_ratio += max(1.0 / self._global_count, MIN_RATE) * (ratio - self._global_ratio)


# -- calibration ------------------------------------------------------------------------


def _device_name(verifier: ModelVerifier) -> str:
    device = verifier.device
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{device.type}:{cpu}"


def model_identity(verifier: ModelVerifier) -> dict[str, str]:
    """What the verification cost depends on (module docstring), as strings."""
    config = verifier.model.config.to_dict()
    architecture = {k: v for k, v in config.items() if not k.startswith("_") and k not in ("name_or_path",)}
    digest = hashlib.sha256(json.dumps(architecture, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {
        "model_type": str(config.get("model_type", type(verifier.model).__name__)),
        "config": digest,
        "dtype": str(verifier.dtype).removeprefix("torch."),
        "device": _device_name(verifier),
        "attention": str(getattr(verifier.model.config, "_attn_implementation", None) or "eager"),
        "backend": verifier.name,
        "cache": verifier.cache_kind,
        "torch": torch.__version__,
        "threads": str(torch.get_num_threads()) if verifier.device.type == "cpu" else "-",
        "version": str(CALIBRATION_VERSION),
    }


def identity_key(identity: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def calibration_plan(
    verifier: ModelVerifier, sizes: Sequence[int], contexts: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The sizes and contexts that fit the model's context length (a tiny model has a short one)."""
    sizes = tuple(sorted(set(int(s) for s in sizes)))
    contexts = tuple(sorted(set(int(c) for c in contexts)))
    if not sizes or sizes[0] < 1:
        raise SpecDecError(f"calibration sizes must be positive ints, got {list(sizes)}")
    if not contexts or contexts[0] < 1:
        raise SpecDecError(f"calibration contexts must be positive ints, got {list(contexts)}")
    limit = verifier.context_length
    if limit is None:
        return sizes, contexts
    # The largest tree after the largest context must fit; shrink the contexts first, then the sizes.
    sizes = tuple(s for s in sizes if s <= limit // 2) or (1,)
    room = limit - sizes[-1]
    fitted = tuple(sorted({min(c, room) for c in contexts} - {0}))
    if not fitted:
        raise SpecDecError(f"the model's context length {limit} leaves no room to calibrate")
    return sizes, fitted


def calibrate(
    verifier: ModelVerifier,
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    repeats: int = DEFAULT_REPEATS,
    seed: int = 0,
) -> CostTable:
    """Measure verification seconds for every size at every context (module docstring).

    Costs ``(len(contexts) * repeats + 1) * len(sizes)`` verifications (each size that
    narrow products are timed at counts twice) plus one prefill of ``max(contexts)``
    tokens. Random tokens stand in for text: the cost of a forward does not depend on
    which tokens it sees.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise SpecDecError(f"calibration repeats must be a positive int, got {repeats!r}")
    buckets = getattr(verifier, "buckets", None)
    if buckets is not None:  # a static cache costs its bucket's forward: time the buckets themselves
        sizes = tuple(b for b in buckets if b <= max(sizes))
    sizes, contexts = calibration_plan(verifier, sizes, contexts)
    watch = MachineWatch.start(verifier.device.type == "cpu")
    with verifier.preserving():  # a static cache keeps the sequence it serves
        table = _calibrate(verifier, sizes, contexts, repeats, seed)
    share = watch.others_share()
    return dataclasses.replace(table, bucketed=buckets is not None, others_share=0.0 if share is None else share)


def _calibrate(
    verifier: ModelVerifier, sizes: tuple[int, ...], contexts: tuple[int, ...], repeats: int, seed: int
) -> CostTable:
    rng = random.Random(seed)
    vocab = verifier.vocab_size
    narrow_sizes = {s for s in sizes if s <= NARROW_MAX_SIZE} if verifier.narrow is not None else set()
    prompt = [rng.randrange(vocab) for _ in range(contexts[-1])]
    state, pending, _ = verifier.prefill(prompt, reserve=sizes[-1])
    plain: list[list[float]] = []  # [C][S] fastest round, usual kernels
    narrow: list[list[float]] = []  # [C][S] fastest round, narrow products (inf where not timed)
    spreads: list[float] = []  # slowest / fastest - 1 of every timed cell's repeats
    kept_rows, kept_single = verifier.narrow_rows, verifier.narrow_single
    try:
        for context in reversed(contexts):  # crop the one prefilled cache down, context by context
            verifier.rewind(state, context)
            times: dict[tuple[int, bool], list[float]] = {}
            warmup = 1 if context == contexts[-1] else 0  # the first round warms up (allocator growth, kernel choice)
            for round_ in range(warmup + repeats):
                for size in sizes:
                    for use_narrow in (False, True) if size in narrow_sizes else (False,):
                        verifier.narrow_rows = size if use_narrow and size > 1 else 0
                        verifier.narrow_single = use_narrow and size == 1
                        tree = DraftTree.chain(pending, [rng.randrange(vocab) for _ in range(size - 1)])
                        started = time.perf_counter()
                        verifier.verify(state, tree)  # ends in a host sync: the walk needs the choices
                        elapsed = time.perf_counter() - started
                        verifier.rewind(state, context)
                        if round_ >= warmup:
                            times.setdefault((size, use_narrow), []).append(elapsed)
            plain.insert(0, [min(times[(s, False)]) for s in sizes])
            spreads.extend(max(t) / min(t) - 1.0 for t in times.values() if len(t) > 1)
            narrow.insert(0, [min(times.get((s, True), [np.inf])) for s in sizes])
    finally:
        verifier.narrow_rows, verifier.narrow_single = kept_rows, kept_single
    narrow_rows = _narrow_threshold(sizes, np.array(plain), np.array(narrow))
    narrow_single = _narrow_single(sizes, np.array(plain), np.array(narrow))
    seconds: list[tuple[float, ...]] = []
    for plain_row, narrow_row in zip(plain, narrow, strict=True):
        row = np.array(
            [
                n if 2 <= s <= narrow_rows or (s == 1 and narrow_single) else p
                for s, p, n in zip(sizes, plain_row, narrow_row, strict=True)
            ]
        )
        fastest = np.maximum.accumulate(row)  # [S] non-decreasing
        fastest = np.minimum(fastest, np.asarray(sizes, dtype=np.float64) * fastest[0])  # subadditive
        seconds.append(tuple(float(s) for s in fastest))
    spread = float(np.median(spreads)) if spreads else 0.0
    return CostTable(
        sizes, contexts, tuple(seconds), model_identity(verifier), narrow_rows, narrow_single, spread=spread
    )


def _narrow_threshold(sizes: Sequence[int], plain: FloatArray, narrow: FloatArray) -> int:
    """The largest size up to which narrow products were faster at every timed size (0: none).

    ``plain`` and ``narrow`` are ``[C, S]`` seconds (``inf`` where narrow was not timed);
    a size's verdict sums its contexts.
    """
    rows = 0
    for j, size in enumerate(sizes):
        if size < 2:
            continue
        if not float(narrow[:, j].sum()) < float(plain[:, j].sum()):
            break
        rows = size
    return rows


def _narrow_single(sizes: Sequence[int], plain: FloatArray, narrow: FloatArray) -> bool:
    """Whether the padded narrow product was faster for one-node trees (summed over the contexts)."""
    if 1 not in sizes:
        return False
    j = list(sizes).index(1)
    return bool(float(narrow[:, j].sum()) < float(plain[:, j].sum()))


# -- busy machines ------------------------------------------------------------------------


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


# -- cache ------------------------------------------------------------------------------

_MODELS: dict[str, VerifyCostModel] = {}
_REMEASURED: dict[str, int] = {}  # identity key -> re-measurements after drift in this process


def calibration_path(identity: dict[str, str]) -> Path:
    return folder("calibration") / f"{identity_key(identity)}.json"


def use_cached_kernels(verifier: ModelVerifier) -> bool:
    """Run the kernels a cached calibration chose for ``verifier``, without measuring anything.

    The calibration also decides which kernels pay on this machine (narrow products,
    docs/budget.md), and it is made at a speculative run's first draft. Plain decoding
    (``drafter="none"``) never drafts, so without this it would keep the default kernels
    even where a cached calibration says the narrow ones are faster. Returns whether a
    cached (or in-memory) calibration was found.
    """
    identity = model_identity(verifier)
    known = _MODELS.get(identity_key(identity))
    table = known.table if known is not None else None
    if table is None:
        try:
            table = _cached_table(identity)
        except OSError:
            table = None  # unreadable: cost_model() says so when a run needs the table
    if table is None:
        return False  # none, or a bad file: measured again by cost_model() when a run needs it
    _use_kernels(verifier, table)
    return True


def _cached_table(identity: dict[str, str]) -> CostTable | None:
    """The calibration cached on disk for ``identity``; None when there is none, or it is corrupt or another's."""
    path = calibration_path(identity)
    if not path.is_file():
        return None
    try:
        table = CostTable.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError):  # SpecDecError is a ValueError
        return None
    return table if table.identity == identity else None


def cost_model(
    verifier: ModelVerifier, *, recalibrate: bool = False, cache_busy: bool = False
) -> tuple[VerifyCostModel, float]:
    """The cost model for ``verifier``'s model, device and dtype, and the seconds spent calibrating.

    One model per identity and process (so online refinements are shared by every
    generator of that model); loaded from the cache file when there is one, else
    calibrated (and saved, unless the machine was busy: module docstring; ``cache_busy``
    saves it anyway). ``recalibrate`` measures again and overwrites the file. A corrupt or
    stale cache file is measured again, not trusted. A model in memory that has drifted far
    from its table is measured again while the machine is quiet (module docstring).
    """
    identity = model_identity(verifier)
    key = identity_key(identity)
    known = None if recalibrate else _MODELS.get(key)
    if known is not None and known.drifted:
        share = others_share_now()
        if share is not None and share > BUSY_SHARE:  # the load explains it; online refinement follows it
            known.drift_steps *= 2
        else:
            warnings.warn(
                f"specdec: verification has taken {known.drift:.2f}x the calibrated time over the last "
                f"{known.observations} steps: measuring the verification cost again",
                RuntimeWarning,
                stacklevel=3,
            )
            _REMEASURED[key] = _REMEASURED.get(key, 0) + 1
            known, recalibrate = None, True
    if known is not None:
        _use_kernels(verifier, known.table)
        return known, 0.0
    path = calibration_path(identity)
    table = None if recalibrate else _cached_table(identity)
    spent = 0.0
    if table is None:
        started = time.perf_counter()
        table = calibrate(verifier)
        spent = time.perf_counter() - started
        busy = busy_reason(table)
        if busy is None or cache_busy:
            write_atomically(path, json.dumps(table.to_json(), indent=1))
        else:
            warnings.warn(
                f"specdec: the verification cost was measured on a busy machine ({busy}): using it in this "
                "process only, not caching it (`specdec calibrate --recalibrate` on a quiet machine caches one)",
                RuntimeWarning,
                stacklevel=3,
            )
    model = _MODELS[key] = VerifyCostModel(table)
    model.drift_steps = DRIFT_MIN_STEPS * 2 ** _REMEASURED.get(key, 0)
    _use_kernels(verifier, table)
    return model, spent


def _use_kernels(verifier: ModelVerifier, table: CostTable) -> None:
    """Run the kernels the table's costs were measured with."""
    verifier.narrow_rows = table.narrow_rows if verifier.narrow is not None else 0
    verifier.narrow_single = table.narrow_single and verifier.narrow is not None


def forget_cost_models() -> None:
    """Drop the in-process cost models (tests; a changed cache directory)."""
    _MODELS.clear()
    _REMEASURED.clear()
