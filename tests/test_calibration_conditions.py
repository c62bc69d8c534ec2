"""The cost model's table on any machine: never measured inside a call, learned from steps, kept under any load.

Hand cases of the busy verdict and of the machine watch (with a fake /proc/stat and load
average); the cache's decisions with synthetic tables standing in for measurements and priors;
the online refinement driven by synthetic step timings (a machine whose cost doubles mid-run, a
noisy one, one where large trees are dear); the lone sequence's guard fed synthetic step rates;
the thread count following a given load; and generations counted by their forwards, not by
the clock: nothing here depends on this machine's speed or load.
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
from specdec.budget.calibration_cache import calibration_path, cost_model, forget_cost_models, remember
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
        model, spent = cost_model(verifier, measure=True)
    assert len([w for w in got if "busy machine" in str(w.message)]) == 1 and "\n" not in str(got[0].message)
    assert spent > 0.0 and not calibration_path(calibration_identity(verifier)).exists()
    assert cost_model(verifier, measure=True) == (model, 0.0) and len(calls) == 1  # in this process: measured once
    forget_cost_models()  # a new process: measured again when asked
    with pytest.warns(RuntimeWarning, match="busy machine"):
        cost_model(verifier, measure=True)
    assert len(calls) == 2
    forget_cost_models()
    cost_model(verifier, measure=True, cache_busy=True)  # `specdec calibrate --force`
    assert calibration_path(calibration_identity(verifier)).is_file()


def test_a_quiet_calibration_is_cached(private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = measuring(monkeypatch, spread=0.05, others_share=0.1)
    verifier = make_verifier(tiny_model("llama"), tree_ops="torch")
    cost_model(verifier, measure=True)
    assert calibration_path(calibration_identity(verifier)).is_file()
    forget_cost_models()
    assert cost_model(verifier, measure=True)[1] == 0.0 and len(calls) == 1  # from the file
    assert cost_model(verifier)[0].table.measured


def no_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(verifier: Any, **_: Any) -> CostTable:
        raise AssertionError("a cost model was measured where none was asked for")

    monkeypatch.setattr("specdec.budget.calibration_cache.calibrate", refuse)


def test_without_a_cached_table_the_model_starts_from_a_cached_prior(
    private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_measuring(monkeypatch)
    verifier = make_verifier(tiny_model("llama"), tree_ops="torch")
    model, _ = cost_model(verifier)
    assert model.table.source == "prior" and model.table.identity == calibration_identity(verifier)
    costs = model.predict(np.array([1, 2, 8, 64]), 10)
    assert np.all(np.diff(costs) > 0.0) and np.all(np.isfinite(costs))  # dearer with size, and finite
    path = calibration_path(calibration_identity(verifier))
    assert CostTable.from_json(json.loads(path.read_text())) == model.table  # cached at once
    forget_cost_models()
    assert cost_model(verifier)[0].table == model.table  # the next process reads it: the same prior
    with pytest.raises(AssertionError, match="measured where none"):
        cost_model(verifier, measure=True)  # `specdec calibrate` measures where no measured table is cached


def test_a_prior_counts_every_matrix_once() -> None:
    from specdec.budget.prior import model_shape

    model = tiny_model("llama")
    shape = model_shape(model)
    matrices = {id(p): p for p in model.parameters() if p.dim() >= 2}
    embedding = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is embedding
    expected = sum(p.numel() for p in matrices.values() if tied or p is not embedding)
    assert shape.flops_per_token == 2.0 * expected
    assert shape.weight_bytes == expected * embedding.element_size()
    assert shape.layers == model.config.num_hidden_layers and shape.kv_bytes > 0 and shape.attention_flops > 0


def test_a_bad_calibration_file_counts_as_none(private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_measuring(monkeypatch)
    verifier = make_verifier(tiny_model("llama"), tree_ops="torch")
    path = calibration_path(calibration_identity(verifier))
    path.parent.mkdir(parents=True, exist_ok=True)
    good = table(identity=calibration_identity(verifier)).to_json()
    unknown_kernel = {**good, "kernels": {"ranges": [[4, "sse9"]], "beyond": "default"}}
    for body in ("[1, 2]", "{", json.dumps({**good, "seconds": "fast"}), json.dumps({**good, "version": 1}),
                 json.dumps({**good, "identity": {"other": "1"}})):  # fmt: skip
        path.write_text(body)
        forget_cost_models()
        with pytest.warns(RuntimeWarning, match=f"ignoring the calibration file {path}"):
            model, _ = cost_model(verifier)
        assert model.table.source == "prior"  # and the prior replaced the bad file
        assert CostTable.from_json(json.loads(path.read_text())).source == "prior"
    path.write_text(json.dumps(unknown_kernel))  # a variant this verifier does not run: refused by use_kernels
    forget_cost_models()
    from specdec.budget.memory import PlannerMemory

    with pytest.raises(SpecDecError, match="unknown kernel variant 'sse9'"):
        verifier.use_kernels(CostTable.from_json(unknown_kernel).kernels)
    memory = PlannerMemory()
    with pytest.warns(RuntimeWarning, match="ignoring the calibration file"):
        model, _ = memory.load_cost(verifier)
    assert model.table.source == "prior"


def test_an_unwritable_cache_keeps_the_table_in_the_process(
    private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_measuring(monkeypatch)

    def refuse(path: Any, binary: bool = False) -> None:
        raise OSError(30, "Read-only file system", str(path))

    monkeypatch.setattr("specdec.cachefiles.atomic_file", refuse)
    verifier = make_verifier(tiny_model("llama"), tree_ops="torch")
    with pytest.warns(RuntimeWarning, match="could not save the verification cost table \\(using it in this process "
                      "only\\) to .*Read-only file system"):
        model, _ = cost_model(verifier)
    assert cost_model(verifier) == (model, 0.0)  # kept in the process, said once


def drive(model: VerifyCostModel, ratio: float, steps: int) -> None:
    for _ in range(steps):
        model.observe(4, 50, ratio * float(model.calibrated(np.array([4]), 50)[0]))


def learned_from(start: CostTable, share: float, steps: int = 20) -> CostTable | None:
    model = VerifyCostModel(start)
    drive(model, 1.0 + share, steps)
    return remember(model, share)


def test_a_table_learned_under_load_is_kept_and_replaced_by_a_quieter_one(
    private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_measuring(monkeypatch)
    verifier = make_verifier(tiny_model("llama"), tree_ops="torch")
    path = calibration_path(calibration_identity(verifier))
    start, _ = cost_model(verifier)  # a prior, cached
    assert remember(VerifyCostModel(start.table), 0.0) is None  # nothing learned: nothing saved
    busy = learned_from(start.table, 0.6)
    assert busy is not None and busy.source == "learned" and busy.others_share == pytest.approx(0.6)
    assert busy.observations == 20 and CostTable.from_json(json.loads(path.read_text())) == busy  # kept, with its load
    assert learned_from(busy, 0.9) is None  # a busier one does not replace it
    quiet = learned_from(busy, 0.05)
    assert quiet is not None and quiet.observations == 40  # a quieter run improves on it
    assert CostTable.from_json(json.loads(path.read_text())) == quiet
    assert learned_from(quiet, 0.6) is None and learned_from(quiet, 0.1) is not None  # within SHARE_SLACK: taken
    measured = table(identity=calibration_identity(verifier))
    assert learned_from(measured, 0.0) is None  # a measured table is replaced only by a measurement


def test_learning_follows_a_machine_whose_cost_doubles_mid_run() -> None:
    model = VerifyCostModel(table())
    drive(model, 1.0, 30)
    assert float(model.predict(np.array([4]), 50)[0]) == pytest.approx(float(model.calibrated(np.array([4]), 50)[0]))
    drive(model, 2.0, 60)
    assert model.drift == pytest.approx(2.0, rel=0.05)
    for size in (1, 2, 8):  # sizes not seen since move with the level too
        assert float(model.predict(np.array([size]), 50)[0] / model.calibrated(np.array([size]), 50)[0]) > 1.6
    learned = model.learned(0.0)
    assert learned.seconds[0][2] == pytest.approx(2.0 * ROW[2], rel=0.05)  # folded: the size seen, at its level


def test_learning_a_noisy_machine_settles_near_its_mean() -> None:
    rng = np.random.default_rng(0)
    model = VerifyCostModel(table())
    truth = 1.3
    for _ in range(400):
        size = int(rng.choice(SIZES))
        base = float(model.calibrated(np.array([size]), 50)[0])
        model.observe(size, 50, truth * base * float(rng.lognormal(0.0, 0.25)))
    for size in SIZES:
        ratio = float(model.predict(np.array([size]), 50)[0] / model.calibrated(np.array([size]), 50)[0])
        assert 1.1 < ratio < 1.55  # the noise's mean is 1.3 * exp(0.25**2 / 2) = 1.34


def test_learning_finds_large_trees_dear_where_the_prior_said_cheap() -> None:
    model = VerifyCostModel(table())  # 8 nodes: 2x one node, by the table
    for _ in range(10):
        model.observe(1, 50, ROW[0])
        model.observe(8, 50, 4.0 * ROW[3])  # on this machine 8 nodes cost 8x one node
    assert float(model.predict(np.array([8]), 50)[0]) == pytest.approx(8.0 * ROW[0], rel=0.1)
    assert float(model.predict(np.array([1]), 50)[0]) < 1.5 * ROW[0]  # the plain step stays near its own


def test_the_lone_guard_backs_off_when_drafts_lose_and_comes_back() -> None:
    from specdec.budget.batch_planner import LONE_BACKOFF, LONE_MIN_STEPS, LoneGuard

    guard = LoneGuard(estimate=lambda: 100.0)  # plain decoding: 100 tokens/s

    def drafting_step(tokens: int, seconds: float) -> bool:
        allowed = guard.drafts()
        guard.last_drafted = allowed  # the step verified a draft when it was allowed to
        guard.observe(allowed, tokens if allowed else 1, seconds if allowed else 0.01)
        return allowed

    allowed = [drafting_step(2, 0.025) for _ in range(LONE_MIN_STEPS + LONE_BACKOFF[0])]  # 80 tokens/s: a loss
    assert allowed == [True] * LONE_MIN_STEPS + [False] * LONE_BACKOFF[0] and guard.backoffs == 1
    allowed = [drafting_step(2, 0.025) for _ in range(LONE_MIN_STEPS + 2 * LONE_BACKOFF[0])]  # lost again: 2x as long
    assert allowed == [True] * LONE_MIN_STEPS + [False] * (2 * LONE_BACKOFF[0]) and guard.backoffs == 2
    allowed = [drafting_step(3, 0.02) for _ in range(3 * LONE_MIN_STEPS)]  # 150 tokens/s: drafting wins
    assert all(allowed) and guard.backoffs == 2 and guard.wait == LONE_BACKOFF[0]
    unknown = LoneGuard()  # no estimate and no plain steps yet: nothing to judge by
    for _ in range(3 * LONE_MIN_STEPS):
        unknown.last_drafted = True
        unknown.observe(True, 1, 1.0)
    assert unknown.drafts() and unknown.backoffs == 0


def test_a_draft_the_rule_declines_still_counts_as_a_drafting_step() -> None:
    """A drafter dear to run whose drafts the rule cuts to the root (an early exit that rarely agrees) must back
    off like one whose drafts lose: its drafting seconds belong to the drafting rate. Counted as plain steps they
    lowered the plain rate the drafting steps were judged against, and the guard never backed off."""
    from specdec.budget.batch_planner import LONE_MIN_STEPS, BatchPlan, LoneGuard, LonePlanner
    from specdec.budget.planner import Budget, Plan
    from specdec.types import DraftTree

    class Rule:  # the BudgetPlanner's face LonePlanner reads: it declines every draft
        budget = Budget.parse("auto")

        def plain_rate(self) -> float:
            return 100.0  # plain decoding: 100 tokens/s

        def observe(self, *args: Any) -> None:
            pass

    guard = LoneGuard()
    lone = LonePlanner(Rule(), guard)  # type: ignore[arg-type]
    declined = Plan(DraftTree.chain(5, []), (), offered=4, expected=0.5, reason="declined")
    for _ in range(LONE_MIN_STEPS):
        assert guard.drafts()
        lone.observe(BatchPlan((declined,), 1, 10, None, 0.0), [[0]], 0.01, 0.02)  # drafting made it 50 tokens/s
        guard.observe(True, 1, 0.02)
    assert guard.backoffs == 1 and not guard.drafts()  # backed off: the drafting cost counted against drafting
    plain = Plan(DraftTree.chain(5, []), (), offered=1, expected=0.0, reason="no draft")
    lone.observe(BatchPlan((plain,), 1, 10, None, 0.0), [[0]], 0.01, 0.01)
    guard.observe(True, 1, 0.01)  # nothing offered: a plain step
    assert guard.plain.steps == 1 and guard.drafting.steps == 0


def test_the_thread_count_follows_the_load_and_is_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from specdec.budget.machine_load import FOLLOW_LOAD_ENV, LoadFollower

    monkeypatch.setenv(FOLLOW_LOAD_ENV, "1")
    follower = LoadFollower()
    follower._cpus = 2
    shares = iter([0.5, 0.0])
    monkeypatch.setattr(MachineWatch, "others_share", lambda self: next(shares, 0.25))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        follower._watch = MachineWatch(0.0, 0.0, None, 1)  # read long ago: the next reading is due
        with follower.following(on_cpu=True):
            assert torch.get_num_threads() == 1  # one busy process of two CPUs: one thread
            follower._watch = MachineWatch(0.0, 0.0, None, 1)
            follower.tick()  # the other process ended
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 2 and list(follower.threads_set) == [1, 2]
        assert follower.generation_share == 0.25  # the load over the whole generation, for the learned table
        monkeypatch.setenv(FOLLOW_LOAD_ENV, "0")
        with follower.following(on_cpu=True):
            assert torch.get_num_threads() == 2  # switched off: left as it is
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("engine", ["hf", "specdec"])
def test_no_generation_times_verifications_of_its_own(
    private_cache: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """Counted by forwards, not by the clock: a generation with no table anywhere runs its prefill and its
    steps, nothing else (no calibration, no re-measurement after a drift however far)."""
    import specdec

    no_measuring(monkeypatch)
    monkeypatch.setenv("SPECDEC_FOLLOW_LOAD", "1")
    generator = specdec.Generator(tiny_model("llama"), drafter="pld", engine=engine, planner_cache=False)
    counts = {"prefill": 0, "verify": 0}
    verifier = generator.verifier
    for name in counts:
        original = getattr(verifier, name)

        def counted(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(verifier, name, counted)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    for slow in (1.0, 50.0):  # the second generation: every step 50x the table (a drift far past any ratio)
        model, _ = generator.cost_model()
        monkeypatch.setattr(model, "calibrated", lambda sizes, c, _m=model, _s=slow: VerifyCostModel.calibrated(
            _m, sizes, c) / _s)  # fmt: skip
        result = generator.generate(prompt, max_new_tokens=24)
        assert counts["prefill"] == 1 and counts["verify"] == result.stats.steps  # no forward of its own
        counts.update(prefill=0, verify=0)
