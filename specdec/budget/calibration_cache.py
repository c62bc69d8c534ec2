"""The calibration cache: one cost model per verifier identity and process, saved per machine, never waited for.

**Cache**: ``<cache_dir>/calibration/<key>.json``, ``key`` a hash of the identity
(:func:`~specdec.budget.calibration.calibration_identity`). It holds one
:class:`~specdec.budget.cost_model.CostTable`: ``"measured"`` (``specdec calibrate`` timed it),
``"prior"`` (:mod:`specdec.budget.prior`: the model's shape and a sub-second probe) or ``"learned"``
(a prior or learned table with what real steps taught folded in), with the others' share of the
machine while it was measured or learned.

**No call waits on measuring.** A generation's first draft takes the table known in this process,
else the cached one, else a prior, made in well under a second and cached at once; from then on the
online refinement learns the real costs from the run's own steps. Only :func:`cost_model` with
``measure=True`` (``specdec calibrate``) times verifications, and only when asked. A drift from the
table is followed online (:mod:`specdec.budget.cost_model`), never measured again inside a call.

**What runs learn is kept, under any load.** After each generation :func:`remember` folds the cost
model's refinement into a ``"learned"`` table (:meth:`~specdec.budget.cost_model.VerifyCostModel.learned`)
and caches it in place of a prior or of a learned table learned under as much load or more (within
:data:`SHARE_SLACK`); a quieter learned table is kept over a busier one (the busy run's level is what
the next quiet process would have to unlearn, and its online refinement finds a busy level within a
few steps anyway). A measured table is replaced only by another
measurement: what runs learn about it lives in the planner statistics (:mod:`specdec.budget.planner_stats`).

**A bad file costs the cache entry only.** A damaged, foreign or unreadable file counts as none (one
warning), and a cache that cannot be written (read-only, full) leaves the table in this process (one
warning per folder): the generation goes on either way.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from specdec.budget import prior
from specdec.budget.calibration import calibrate, calibration_identity, identity_key
from specdec.budget.cost_model import CostTable, VerifyCostModel
from specdec.budget.machine_load import busy_reason
from specdec.cachefiles import folder, forget_warnings, save_cache_entry, warn_once
from specdec.errors import SpecDecError
from specdec.types import TunableVerifier

# A learned table replaces a cached learned one learned at most this much busier (the others' share).
SHARE_SLACK = 0.1

_MODELS: dict[str, VerifyCostModel] = {}


def calibration_path(identity: dict[str, str]) -> Path:
    return folder("calibration") / f"{identity_key(identity)}.json"


def _warn_once(key: str, what: str, message: str) -> None:
    warn_once(("calibration", key, what), message, stacklevel=4)


def cached_table(verifier: TunableVerifier[Any]) -> CostTable | None:
    """The table known for ``verifier`` (in this process, or on disk) without measuring anything; None if none.

    What a :class:`~specdec.Generator` reads at construction to run the kernels this machine's
    calibration chose (plain decoding never needs the cost model). A bad file counts as none.
    """
    identity = calibration_identity(verifier)
    known = _MODELS.get(identity_key(identity))
    if known is not None:
        return known.table
    return _cached_table(identity, verifier)


def use_cached_kernels(verifier: TunableVerifier[Any]) -> None:
    """Switch ``verifier`` to the kernels this machine's calibration chose, where a measured table is
    known (:func:`cached_table`: nothing is measured here), so that plain steps too run them."""
    table = cached_table(verifier)
    if table is not None and table.measured:
        verifier.use_kernels(table.kernels)


def _cached_table(identity: dict[str, str], verifier: TunableVerifier[Any] | None = None) -> CostTable | None:
    """The table cached on disk for ``identity``; None when there is none, or it is unreadable, corrupt,
    another's or names a kernel variant ``verifier`` does not run (one warning: the file is replaced when a
    table is next saved)."""
    path = calibration_path(identity)
    key = identity_key(identity)
    known_kernels = getattr(getattr(verifier, "forward", None), "KERNELS", None)  # a ModelVerifier's forward
    try:
        if not path.is_file():
            return None
        table = CostTable.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:  # SpecDecError is a ValueError
        _warn_once(key, "read", f"specdec: ignoring the calibration file {path}: {error}")
        return None
    if table.identity != identity:
        _warn_once(key, "read", f"specdec: ignoring the calibration file {path}: it was made for another identity")
        return None
    unknown = [v for v in table.kernels.variants() if known_kernels is not None and v not in known_kernels]
    if unknown:
        _warn_once(key, "read", f"specdec: ignoring the calibration file {path}: unknown kernel variant {unknown[0]!r}")
        return None
    return table


def _save(table: CostTable) -> bool:
    """Cache ``table``; False, with one warning per folder (:func:`~specdec.cachefiles.save_cache_entry`), when the
    cache cannot be written: the table then serves this process only."""
    return save_cache_entry(calibration_path(table.identity), json.dumps(table.to_json(), indent=1),
                            "the verification cost table (using it in this process only)")  # fmt: skip


def _measure(verifier: TunableVerifier[Any], cache_busy: bool) -> tuple[CostTable, float]:
    """Time the table (:func:`~specdec.budget.calibration.calibrate`) and cache it unless the machine was busy."""
    path = calibration_path(calibration_identity(verifier))
    started = time.perf_counter()
    print(f"specdec: measuring the verification cost per draft size ({path}) ...", file=sys.stderr, flush=True)
    table = calibrate(verifier)
    spent = time.perf_counter() - started
    print(f"specdec: measured the verification cost in {spent:.1f} s", file=sys.stderr, flush=True)
    busy = busy_reason(table)
    if busy is None or cache_busy:
        _save(table)
    else:
        warnings.warn(
            f"specdec: the verification cost was measured on a busy machine ({busy}): using it in this process "
            "only, not caching it (`specdec calibrate --recalibrate --force` caches it anyway)",
            RuntimeWarning,
            stacklevel=3,
        )
    return table, spent


def cost_model(
    verifier: TunableVerifier[Any], *, measure: bool = False, recalibrate: bool = False, cache_busy: bool = False
) -> tuple[VerifyCostModel, float]:
    """The cost model for ``verifier``'s model, device and dtype, and the seconds spent making its table.

    One model per identity and process (so online refinements are shared by every generator of
    that model): this process's, else the cached table's, else a prior (module docstring), cached
    at once; the seconds are then the prior's probe (well under one), or 0.0. ``measure``
    (``specdec calibrate``) times the table where the cache holds no measured one; ``recalibrate``
    times it whatever the cache holds. A measured table taken on a busy machine is cached only with
    ``cache_busy``. The verifier's kernels are left as they are.
    """
    identity = calibration_identity(verifier)
    key = identity_key(identity)
    known = None if recalibrate else _MODELS.get(key)
    if known is not None and (known.table.measured or not measure):
        return known, 0.0
    table = None if recalibrate else _cached_table(identity, verifier)
    spent = 0.0
    if recalibrate or (measure and (table is None or not table.measured)):
        table, spent = _measure(verifier, cache_busy)
    elif table is None:
        started = time.perf_counter()
        try:
            table = prior.prior_table(verifier)
        except (TypeError, SpecDecError, RuntimeError) as error:  # no model to read: measure, as before priors
            warnings.warn(f"specdec: no prior cost for {type(verifier).__name__} ({error}): measuring it",
                          RuntimeWarning, stacklevel=2)  # fmt: skip
            table, spent = _measure(verifier, cache_busy)
        else:
            spent = time.perf_counter() - started
            _save(table)
    model = _MODELS[key] = VerifyCostModel(table)
    return model, spent


def remember(model: VerifyCostModel, others_share: float | None) -> CostTable | None:
    """Fold what ``model`` learned into a ``"learned"`` table and cache it where it improves on the cached one
    (module docstring); the table saved, or None (nothing learned, a measured table, or a better one cached).
    ``others_share``: the others' share of the machine while it learned (None: unknown, taken as busy)."""
    if model.observations == 0 or model.table.measured or not model.learn:
        return None
    share = 1.0 if others_share is None else others_share
    learned = model.learned(share)
    cached = _cached_table(learned.identity)
    if cached is not None and not _improves(learned, cached):
        return None
    return learned if _save(learned) else None


def _improves(new: CostTable, old: CostTable) -> bool:
    """Whether learned table ``new`` should replace the cached ``old`` (module docstring)."""
    if old.measured:
        return False
    if old.source == "prior":
        return True
    return new.others_share <= old.others_share + SHARE_SLACK


def forget_cost_models() -> None:
    """Drop the in-process cost models and the warnings said (tests; a changed cache directory)."""
    _MODELS.clear()
    forget_warnings("calibration")
