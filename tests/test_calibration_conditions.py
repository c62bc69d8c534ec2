"""Calibration on a busy machine (not cached, said so) and drift from the table (measured again).

Hand cases of the busy verdict and of the machine watch (with a fake /proc/stat and load
average), the cache decision with synthetic tables standing in for measurements, and the
drift rule driven by synthetic observations: nothing here depends on this machine's load.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tiny_models import tiny_model

from specdec.backends import make_verifier
from specdec.budget import CostTable, VerifyCostModel
from specdec.budget import machine_load as machine_load
from specdec.budget.calibration import calibrate, calibration_identity
from specdec.budget.calibration_cache import calibration_path, cost_model, forget_cost_models
from specdec.budget.cost_model import DRIFT_MIN_STEPS
from specdec.budget.machine_load import BUSY_SHARE, BUSY_SPREAD, MachineWatch, busy_reason
from specdec.errors import SpecDecError

SIZES = (1, 2, 4, 8)
ROW = (1.0, 1.2, 1.5, 2.0)


def table(spread: float = 0.0, others_share: float = 0.0, identity: dict[str, str] | None = None) -> CostTable:
    return CostTable(SIZES, (1, 100), (ROW, ROW), identity or {}, spread=spread, others_share=others_share)


def test_busy_verdicts() -> None:
    assert busy_reason(table()) is None
    assert busy_reason(table(spread=BUSY_SPREAD, others_share=BUSY_SHARE)) is None  # at the bounds: quiet
    assert busy_reason(table(spread=0.31)) == "repeated timings spread by 31%"
    assert busy_reason(table(others_share=0.6)) == "other processes used 60% of its CPU time"
    assert busy_reason(table(spread=0.5, others_share=0.9)) == (
        "other processes used 90% of its CPU time; repeated timings spread by 50%"
    )


def test_conditions_round_trip_and_are_checked() -> None:
    busy = table(spread=0.4, others_share=0.7)
    assert CostTable.from_json(json.loads(json.dumps(busy.to_json()))) == busy
    legacy = {k: v for k, v in table().to_json().items() if k not in ("spread", "others_share")}
    assert CostTable.from_json(legacy) == table()  # a file from before: taken as measured quietly
    for bad in (-0.1, float("nan"), float("inf"), "0.2", True):
        with pytest.raises(SpecDecError, match="must be a finite number >= 0"):
            table(spread=bad)  # type: ignore[arg-type]


def test_machine_watch_counts_other_processes_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # One second ago the machine (2 CPUs) had 100 busy seconds; now 101.5, of which this process used none.
    watch = MachineWatch(wall=time.perf_counter() - 1.0, own=time.process_time(), machine=(100.0, 2), own_threads=2)
    monkeypatch.setattr(machine_load, "_machine_cpu_seconds", lambda: (101.5, 2))
    share = watch.others_share()
    assert share is not None and 0.6 < share <= 0.75
    monkeypatch.setattr(machine_load, "_machine_cpu_seconds", lambda: (99.0, 2))  # a clock that went back: 0
    assert watch.others_share() == 0.0


def test_machine_watch_falls_back_to_the_load_average(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_load, "_machine_cpu_seconds", lambda: None)
    monkeypatch.setattr(machine_load.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(machine_load.os, "getloadavg", lambda: (3.0, 1.0, 1.0))
    watch = MachineWatch.start(on_cpu=False)
    assert watch.others_share() == pytest.approx((3.0 - 1) / 4)  # this process's one thread left out
    monkeypatch.setattr(machine_load.os, "getloadavg", lambda: (40.0, 1.0, 1.0))
    assert watch.others_share() == 1.0


def test_the_real_watch_reads_this_machine() -> None:
    share = MachineWatch.start().others_share()
    assert share is None or 0.0 <= share <= 1.0


def test_calibration_records_its_conditions() -> None:
    verifier = make_verifier(tiny_model("llama"), tree_ops="torch")
    result = calibrate(verifier, sizes=(1, 2, 4), contexts=(8, 32), repeats=2)
    assert result.spread >= 0.0 and np.isfinite(result.spread)
    assert 0.0 <= result.others_share <= 1.0


@pytest.fixture
def private_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    forget_cost_models()
    yield tmp_path
    forget_cost_models()


def measuring(monkeypatch: pytest.MonkeyPatch, **conditions: float) -> list[int]:
    """Replace calibration by a synthetic table measured under ``conditions``; returns the call log."""
    calls: list[int] = []

    def fake(verifier: Any, **_: Any) -> CostTable:
        calls.append(1)
        return table(identity=calibration_identity(verifier), **conditions)

    monkeypatch.setattr("specdec.budget.calibration_cache.calibrate", fake)
    return calls


def test_a_busy_calibration_serves_the_process_but_is_not_cached(
    private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = measuring(monkeypatch, spread=0.6, others_share=0.5)
    verifier = make_verifier(tiny_model("llama"), tree_ops="torch")
    with pytest.warns(RuntimeWarning, match="measured on a busy machine \\(other processes used 50% of its CPU "
                      "time; repeated timings spread by 60%\\): using it in this process only, not caching") as got:
        model, spent = cost_model(verifier)
    assert len([w for w in got if "busy machine" in str(w.message)]) == 1 and "\n" not in str(got[0].message)
    assert spent > 0.0 and not calibration_path(calibration_identity(verifier)).exists()
    assert cost_model(verifier) == (model, 0.0) and len(calls) == 1  # in this process: measured once
    forget_cost_models()  # a new process: measured again
    with pytest.warns(RuntimeWarning, match="busy machine"):
        cost_model(verifier)
    assert len(calls) == 2
    forget_cost_models()
    cost_model(verifier, cache_busy=True)  # `specdec calibrate --force`
    assert calibration_path(calibration_identity(verifier)).is_file()


def test_a_quiet_calibration_is_cached(private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = measuring(monkeypatch, spread=0.05, others_share=0.1)
    verifier = make_verifier(tiny_model("llama"), tree_ops="torch")
    cost_model(verifier)
    assert calibration_path(calibration_identity(verifier)).is_file()
    forget_cost_models()
    assert cost_model(verifier)[1] == 0.0 and len(calls) == 1  # from the file


def drive(model: VerifyCostModel, ratio: float, steps: int) -> None:
    for _ in range(steps):
        model.observe(4, 50, ratio * float(model.calibrated(np.array([4]), 50)[0]))


def test_drift_needs_a_far_ratio_held_for_enough_steps() -> None:
    model = VerifyCostModel(table())
    drive(model, 3.0, DRIFT_MIN_STEPS - 1)
    assert not model.drifted
    drive(model, 3.0, 1)
    assert model.drifted and model.drift == pytest.approx(3.0, rel=0.01)
    slower = VerifyCostModel(table())
    drive(slower, 1.5, 4 * DRIFT_MIN_STEPS)  # within DRIFT_RATIO: online refinement is enough
    assert not slower.drifted
    faster = VerifyCostModel(table())
    drive(faster, 0.3, DRIFT_MIN_STEPS)  # the table was too slow (measured under load, or forced)
    assert faster.drifted
    frozen = VerifyCostModel(table(), learn=False)
    drive(frozen, 3.0, DRIFT_MIN_STEPS)
    assert not frozen.drifted


def drifted(monkeypatch: pytest.MonkeyPatch, others_share_now: float) -> tuple[list[int], Any, VerifyCostModel]:
    """A cost model (synthetic calibration) driven to 3x its table, with the machine's present load given."""
    calls = measuring(monkeypatch)
    monkeypatch.setattr("specdec.budget.calibration_cache.others_share_now", lambda seconds=0.25: others_share_now)
    verifier = make_verifier(tiny_model("llama"), tree_ops="torch")
    model, _ = cost_model(verifier)
    drive(model, 3.0, DRIFT_MIN_STEPS)
    return calls, verifier, model


def test_a_drifted_model_is_measured_again_on_a_quiet_machine(
    private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls, verifier, first = drifted(monkeypatch, others_share_now=0.05)
    with pytest.warns(RuntimeWarning, match="verification has taken 3.00x the calibrated time over the last 32 "
                      "steps: measuring the verification cost again"):
        second, spent = cost_model(verifier)
    assert second is not first and spent > 0.0 and len(calls) == 2
    assert second.drift_steps == 2 * DRIFT_MIN_STEPS  # the next re-measurement waits twice as long
    assert cost_model(verifier) == (second, 0.0)


def test_a_drift_on_a_busy_machine_is_left_to_online_refinement(
    private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls, verifier, first = drifted(monkeypatch, others_share_now=0.9)
    assert cost_model(verifier) == (first, 0.0) and len(calls) == 1  # the load explains it
    assert first.drift_steps == 2 * DRIFT_MIN_STEPS and not first.drifted  # asked again only after more steps
