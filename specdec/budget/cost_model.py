"""The cost model: seconds one verification takes, as a function of tree size and context length.

``cost(N, C)`` is the wall time of a verifier's ``verify`` for an ``N``-node tree
after ``C`` committed tokens (forward, acceptance, KV compaction: what ``StepRecord.verify_s``
measures). Its shape is what decides whether speculation pays: on a CPU a 16-node
verification can cost twice a one-node step, on a datacenter GPU about the same (docs/budget.md). A
:class:`CostTable` holds what calibration measured (:mod:`specdec.budget.calibration`);
a :class:`VerifyCostModel` predicts from it and learns from every real step.

**Prediction**: linear interpolation in ``N`` between calibrated sizes (linear extrapolation
past the largest) and in ``C`` between the two calibrated contexts (attention grows with
``C``; extrapolated linearly, floored at half the smallest context's cost), times an
online **correction**.

**Plateaus**: sizes whose calibrated costs at the step's context lie within the calibration's own
repeat spread of each other (:attr:`CostTable.spread`, capped at :data:`PLATEAU_SPREAD_MAX`) are
one plateau: the calibration cannot tell them apart. The model prices every size of a plateau
at its dearest, its largest calibrated size, and learns one correction for all of them (the
refinement below). Without it, on a CPU whose verification is flat from 3 to 8 nodes, each
size's correction learned its own noise: a size measured a few percent slow looked dear, the
decision rule cut its trees there, and where it settled (4, 6 or 8 nodes) changed from process
to process (docs/benchmarks.md, "The budget on a flat cost curve"). The plain step (one node)
is never part of a plateau: it is what every draft is weighed against. :meth:`~VerifyCostModel.calibrated`
stays the table's own figure for each size.

**Online refinement**: every real step's measured ``verify_s`` is compared with the
prediction; the ratio updates a running mean for the nearest calibrated size (an
exponential moving average once a size has ``1 / MIN_RATE`` observations), and sizes not
seen lately are shrunk toward the ratio over all sizes: each size's count of observations
fades by :data:`COUNT_MEMORY` per observation of any size, so a size the rule stopped
choosing (after a few slow steps at that size, say) weighs its own stale ratio less and less
(half-life ~35 steps), and the next probe of it counts for more. Without the fading, a size
once measured slow stayed slow in the model for the rest of the process: the rule avoided
it, so it was measured again only by a probe in 16 steps, each moving it by 1/count.
So the model follows the machine's present load and corrects calibration noise, while the shape measured at
calibration stays in force where no step has been seen. Each step's ratio is clipped to
``[1/5, 5]`` times the present overall ratio: one preempted step must not rewrite the
model, but a calibration measured under another load (a busy machine: 10x off) is
corrected within a few steps.

**Across processes**: the refinement (per-size ratios and counts, the overall ratio) is
saved with the planner statistics after every generation and taken by the next process's
model of the same table before its first step (:meth:`VerifyCostModel.state`,
:mod:`specdec.budget.planner_stats`), so a one-off ``run`` starts from what earlier
processes measured, not from the table alone.

**Drift** is followed, never measured: the online ratio over all sizes is the machine's present
level against the table's (a busy machine, a faster one), and the predictions follow it within a
few steps. No call ever stops to time verifications again (docs/budget.md, "No call waits on
measuring").

**What runs learn is kept**: :meth:`VerifyCostModel.learned` folds the refinement into a new
table (``source="learned"``, with the machine's load while it was learned), which
:mod:`specdec.budget.calibration_cache` keeps for the next process, so a table that began as a
prior (:mod:`specdec.budget.prior`) converges to this machine's costs over the runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np
import numpy.typing as npt

from specdec.errors import SpecDecError
from specdec.types import DEFAULT_KERNEL, KernelChoice

FloatArray = npt.NDArray[np.float64]

# Bump when calibration changes what it measures, so stale cache files are re-measured.
# 6: static buckets compile narrow products; 7: they attend over a window of the cache; 8: kernel choice as
# one value, the narrow products gone, specdec's CPU kernels ("cpu") on engine="specdec"
CALIBRATION_VERSION = 8
MIN_RATE = 0.05  # slowest online learning rate: ~20 recent steps weigh in
RATIO_CLIP = 5.0
PLATEAU_SPREAD_MAX = 0.1  # a plateau's widest relative cost step, whatever the calibration's spread
SHRINK_STEPS = 1.0  # observations at which a size's own ratio weighs as much as the global one
COUNT_MEMORY = 0.98  # per observation of any size: a size's count of its own observations fades
# "measured": timed by calibration (`specdec calibrate`); "prior": from the model's shape and a probe of the
# machine (specdec.budget.prior), nothing timed; "learned": a prior or learned table with what real steps taught
# folded in (VerifyCostModel.learned).
TABLE_SOURCES = ("measured", "prior", "learned")


@dataclass(frozen=True)
class CostTable:
    """Calibrated verification seconds: ``seconds[c][j]`` for ``sizes[j]`` nodes after ``contexts[c]`` tokens."""

    sizes: tuple[int, ...]
    contexts: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]
    identity: dict[str, str]
    kernels: KernelChoice = field(default_factory=KernelChoice)  # the variant each size was measured with (and runs)
    bucketed: bool = False  # a size costs the next calibrated size's forward (a static cache's buckets)
    spread: float = 0.0  # median over timed cells of slowest / fastest repeat - 1 (module docstring)
    others_share: float = 0.0  # other processes' share of the machine's CPU time while calibrating (or learning)
    source: str = "measured"  # how the table came to be: one of TABLE_SOURCES (module docstring)
    observations: int = 0  # real steps a learned table has folded in, over all the processes that learned it

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
        if not isinstance(self.kernels, KernelChoice):
            raise SpecDecError(f"calibration kernels must be a KernelChoice, got {self.kernels!r}")
        if self.source not in TABLE_SOURCES:
            raise SpecDecError(f"calibration source must be one of {TABLE_SOURCES}, got {self.source!r}")
        if isinstance(self.observations, bool) or not isinstance(self.observations, int) or self.observations < 0:
            raise SpecDecError(f"calibration observations must be an int >= 0, got {self.observations!r}")
        for name in ("spread", "others_share"):
            value = getattr(self, name)
            if not finite_number(value):
                raise SpecDecError(f"calibration {name} must be a finite number >= 0, got {value!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "version": CALIBRATION_VERSION,
            "identity": self.identity,
            "sizes": list(self.sizes),
            "contexts": list(self.contexts),
            "seconds": [list(row) for row in self.seconds],
            "kernels": {"ranges": [list(r) for r in self.kernels.ranges], "beyond": self.kernels.beyond},
            "bucketed": self.bucketed,
            "spread": self.spread,
            "others_share": self.others_share,
            "source": self.source,
            "observations": self.observations,
        }

    @property
    def measured(self) -> bool:
        """Whether calibration timed this table (its kernel choice was measured too), not a prior or what runs
        learned from one."""
        return self.source == "measured"

    def digest(self) -> str:
        """A short hash of the whole table: what a saved online refinement (:meth:`VerifyCostModel.state`) refines."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def from_json(cls, data: Any) -> CostTable:
        """The table ``data`` (:meth:`to_json`) holds; anything else (a list, a missing or mistyped entry, another
        version) raises :class:`SpecDecError` naming what is wrong."""
        if not isinstance(data, dict):
            raise SpecDecError(f"a calibration file holds a JSON object, got {type(data).__name__}")
        for name in ("sizes", "contexts", "seconds"):
            if not isinstance(data.get(name), list):
                raise SpecDecError(f"calibration {name} must be a list, got {data.get(name)!r}")
        if not isinstance(data.get("identity"), dict):
            raise SpecDecError(f"calibration identity must be an object, got {data.get('identity')!r}")
        if data.get("version") != CALIBRATION_VERSION:
            raise SpecDecError(f"calibration format version {data.get('version')!r}, expected {CALIBRATION_VERSION}")
        return cls(
            tuple(int(s) for s in data["sizes"]),
            tuple(int(c) for c in data["contexts"]),
            tuple(tuple(float(s) for s in row) for row in data["seconds"]),
            {str(k): str(v) for k, v in data["identity"].items()},
            _kernels_from_json(data),
            bool(data.get("bucketed", False)),
            data.get("spread", 0.0),
            data.get("others_share", 0.0),
            data.get("source", "measured"),
            data.get("observations", 0),
        )


def finite_number(value: Any, positive: bool = False) -> TypeGuard[int | float]:
    """A finite int or float (not a bool), > 0 when ``positive``, else >= 0: what a saved or
    calibrated figure must be (the cost table's, its refinement's, the planner's throughput)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        return False
    return value > 0.0 if positive else value >= 0.0


def _kernels_from_json(data: dict[str, Any]) -> KernelChoice:
    """A table's kernel choice, from its ``kernels`` entry."""
    entry = data.get("kernels")
    ranges = entry.get("ranges") if isinstance(entry, dict) else None
    if not isinstance(entry, dict) or not isinstance(ranges, list) or not all(
        isinstance(r, list) and len(r) == 2 for r in ranges
    ):
        raise SpecDecError(f"calibration kernels must be {{'ranges': [[rows, variant], ...]}}, got {entry!r}")
    return KernelChoice(tuple((r[0], r[1]) for r in ranges), entry.get("beyond", DEFAULT_KERNEL))


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
        self._grid = np.asarray(table.sizes, dtype=np.int64)  # [S]
        self._tops_at: tuple[int, npt.NDArray[np.int64]] | None = None  # the last context's plateau tops

    @property
    def observations(self) -> int:
        """Real steps this model has learned from."""
        return int(self._global_count)

    @property
    def drift(self) -> float:
        """The online ratio measured / calibrated over all sizes, lately (1.0: as calibrated)."""
        return self._global_ratio

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

    def plateau_sizes(self, sizes: npt.NDArray[np.int64], committed_len: int) -> npt.NDArray[np.int64]:
        """``sizes`` int ``[K]``, each raised to the largest calibrated size of its plateau at
        ``committed_len`` (module docstring); sizes outside every plateau stay. O(K log S + S)."""
        x = self._padded(sizes).astype(np.int64)  # a bucketed table's sizes are their buckets first
        tops = self._plateau_tops(committed_len)  # [S]
        grid = self._grid
        index = np.minimum(np.searchsorted(grid, x), len(grid) - 1)  # [K] first calibrated size >= x
        between = (index >= 1) & (tops[np.maximum(index - 1, 0)] == tops[index])  # both neighbours in one plateau
        lift = (x <= grid[-1]) & ((grid[index] == x) | between)
        return np.where(lift, grid[tops[index]], x)

    def _plateau_tops(self, committed_len: int) -> npt.NDArray[np.int64]:
        """``[S]``: for each calibrated size, the index of its plateau's largest size (its own index
        when it is alone). Greedy from the smallest size above one node: a plateau takes each next
        size while that size's calibrated cost is within the tolerance of the plateau's first."""
        if self._tops_at is not None and self._tops_at[0] == committed_len:
            return self._tops_at[1]  # a step plans and learns at one context: compute it once
        sizes = len(self.table.sizes)
        tops = np.arange(sizes, dtype=np.int64)
        tolerance = min(self.table.spread, PLATEAU_SPREAD_MAX)
        row = self.calibrated(self._grid, committed_len)  # [S]
        start = int(np.searchsorted(self._sizes, 2.0))
        while start < sizes:
            end = start
            while end + 1 < sizes and row[end + 1] <= row[start] * (1.0 + tolerance):
                end += 1
            tops[start : end + 1] = end
            start = end + 1
        self._tops_at = (committed_len, tops)
        return tops

    def correction(self, sizes: npt.NDArray[np.int64]) -> FloatArray:
        """The online ratio measured / calibrated at ``sizes`` ``[K]``: per size, shrunk toward the global one."""
        shrunk = (self._count * self._ratio + SHRINK_STEPS * self._global_ratio) / (self._count + SHRINK_STEPS)
        return np.interp(np.log(self._padded(sizes)), self._log_sizes, shrunk)

    def learned(self, others_share: float) -> CostTable:
        """The table with this model's refinement folded in: every calibrated size's seconds at every context
        times its correction (:meth:`correction`: its own ratio shrunk toward the global one, so a size
        never seen moves with the machine's level), kept non-decreasing in size and at most ``N * cost(1)``
        as calibration keeps its own, marked ``source="learned"`` with ``others_share`` (the machine's load
        while it learned) and the steps it folds in. The kernel choice, sizes and contexts stay."""
        sizes = np.asarray(self.table.sizes, dtype=np.float64)  # [S]
        rows = []
        for row in self._seconds * self.correction(self._grid)[None, :]:  # [Cn, S]
            row = np.minimum(np.maximum.accumulate(row), sizes * row[0])
            rows.append(tuple(float(v) for v in row))
        return dataclasses.replace(
            self.table, seconds=tuple(rows), source="learned", others_share=float(min(max(others_share, 0.0), 1.0)),
            observations=self.table.observations + self.observations,
        )

    def state(self) -> dict[str, Any]:
        """What the online refinement learned, JSON-ready, with the digest of the table it refines
        (:meth:`load_state` reads it back onto the same table only)."""
        return {
            "table": self.table.digest(),
            "ratio": [float(r) for r in self._ratio],
            "count": [float(c) for c in self._count],
            "global_ratio": float(self._global_ratio),
            "global_count": float(self._global_count),
        }

    def load_state(self, state: Any) -> None:
        """Take another process's refinement (:meth:`state`) of this same table.

        Every value is checked first: another table's state (its digest differs), lists of the
        wrong length, ratios that are not finite and positive, counts that are not finite and
        non-negative raise :class:`SpecDecError` naming it and change nothing.
        """
        if not isinstance(state, dict):
            raise SpecDecError(f"cost model state must be a dict, got {type(state).__name__}")
        if state.get("table") != self.table.digest():
            raise SpecDecError("cost model state refines another calibration table")
        sizes = len(self.table.sizes)
        values: dict[str, FloatArray] = {}
        for name, positive in (("ratio", True), ("count", False)):
            row = state.get(name)
            if not isinstance(row, list) or len(row) != sizes or not all(finite_number(v, positive) for v in row):
                raise SpecDecError(f"cost model state: {name} must be {sizes} finite numbers "
                                   f"{'> 0' if positive else '>= 0'}, got {row!r}")  # fmt: skip
            values[name] = np.asarray(row, dtype=np.float64)
        ratio: Any = state.get("global_ratio")
        count: Any = state.get("global_count")
        if not finite_number(ratio, True) or not finite_number(count, False):
            raise SpecDecError(f"cost model state: global_ratio > 0 and global_count >= 0, got {ratio!r}, {count!r}")
        self._ratio, self._count = values["ratio"], values["count"]
        self._global_ratio, self._global_count = float(ratio), float(count)

    def predict(self, sizes: npt.NDArray[np.int64], committed_len: int) -> FloatArray:
        """Predicted seconds to verify trees of ``sizes`` ``[K]`` nodes after ``committed_len`` tokens. O(K log S)."""
        priced = self.plateau_sizes(sizes, committed_len)
        return self.calibrated(priced, committed_len) * self.correction(priced)

    def observe(self, size: int, committed_len: int, seconds: float) -> None:
        """Learn from one real verification of ``size`` nodes that took ``seconds``. O(S)."""
        if not self.learn or seconds <= 0.0 or size < 1:
            return
        priced = self.plateau_sizes(np.array([size]), committed_len)  # [1] a plateau learns as one
        base = float(self.calibrated(priced, committed_len)[0])
        # Clipped around the present level, not around 1: one preempted step moves the model by
        # at most RATIO_CLIP, but a calibration measured under another load (10x off) is
        # corrected within a few steps instead of staying off by its excess over the clip.
        level = self._global_ratio
        ratio = min(max(seconds / base, level / RATIO_CLIP), level * RATIO_CLIP)
        j = int(np.argmin(np.abs(self._log_sizes - np.log(self._padded(priced)[0]))))
        self._count *= COUNT_MEMORY  # what a size has not shown lately fades (module docstring)
        self._count[j] += 1.0
        self._ratio[j] += max(1.0 / self._count[j], MIN_RATE) * (ratio - self._ratio[j])
        self._global_count += 1.0
        self._global_ratio += max(1.0 / self._global_count, MIN_RATE) * (ratio - self._global_ratio)
