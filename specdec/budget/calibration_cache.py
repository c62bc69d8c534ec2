"""The calibration cache: one cost model per verifier identity and process, saved per machine.

**Cache**: ``<cache_dir>/calibration/<key>.json``, ``key`` a hash of the identity
(:func:`~specdec.budget.calibration.calibration_identity`). A table measured on a busy machine
(:mod:`specdec.budget.machine_load`) serves this process but is not saved. Nothing here
changes the verifier: the table's kernel choice is the caller's to apply
(:meth:`specdec.Generator.cost_model` does).

**Drift.** When a cost model in memory has drifted from its table
(:attr:`~specdec.budget.cost_model.VerifyCostModel.drifted`): if other processes are busy
right now the load explains it and online refinement already follows it; otherwise the next
generation measures the table again (with a warning), and the steps required before
another re-measurement double each time.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from specdec.budget.calibration import calibrate, calibration_identity, identity_key
from specdec.budget.cost_model import DRIFT_MIN_STEPS, CostTable, VerifyCostModel
from specdec.budget.machine_load import BUSY_SHARE, busy_reason, others_share_now
from specdec.cachefiles import folder, write_atomically
from specdec.types import TunableVerifier

_MODELS: dict[str, VerifyCostModel] = {}
_REMEASURED: dict[str, int] = {}  # identity key -> re-measurements after drift in this process


def calibration_path(identity: dict[str, str]) -> Path:
    return folder("calibration") / f"{identity_key(identity)}.json"


def cached_table(verifier: TunableVerifier[Any]) -> CostTable | None:
    """The calibration known for ``verifier`` (in this process, or on disk) without measuring anything; None if none.

    What plain decoding (``drafter="none"``, which never drafts and so never needs the cost
    model) uses to run the kernels this machine's calibration chose. A corrupt, stale or
    unreadable file counts as none: :func:`cost_model` measures again when a run needs it.
    """
    identity = calibration_identity(verifier)
    known = _MODELS.get(identity_key(identity))
    if known is not None:
        return known.table
    try:
        return _cached_table(identity)
    except OSError:
        return None


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
    verifier: TunableVerifier[Any], *, recalibrate: bool = False, cache_busy: bool = False
) -> tuple[VerifyCostModel, float]:
    """The cost model for ``verifier``'s model, device and dtype, and the seconds spent calibrating.

    One model per identity and process (so online refinements are shared by every
    generator of that model); loaded from the cache file when there is one, else
    calibrated (and saved, unless the machine was busy: module docstring; ``cache_busy``
    saves it anyway). ``recalibrate`` measures again and overwrites the file. A corrupt or
    stale cache file is measured again, not trusted. A model in memory that has drifted far
    from its table is measured again while the machine is quiet (module docstring). The
    verifier's kernels are left as they are (the table's ``kernels`` say which to run).
    """
    identity = calibration_identity(verifier)
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
        return known, 0.0
    path = calibration_path(identity)
    table = None if recalibrate else _cached_table(identity)
    spent = 0.0
    if table is None:
        started = time.perf_counter()
        print(f"specdec: measuring the verification cost per draft size for budget='auto' (once per model, device "
              f"and dtype on this machine; later runs read it from {path}) ...", file=sys.stderr, flush=True)
        table = calibrate(verifier)
        spent = time.perf_counter() - started
        print(f"specdec: measured the verification cost in {spent:.1f} s", file=sys.stderr, flush=True)
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
    return model, spent


def forget_cost_models() -> None:
    """Drop the in-process cost models (tests; a changed cache directory)."""
    _MODELS.clear()
    _REMEASURED.clear()
