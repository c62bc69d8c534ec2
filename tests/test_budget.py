"""Cost-aware draft budgets (specdec.budget): the decision rule, the acceptance and cost models,
calibration caching, and token identity under every budget.

Layers: hand cases of the rule (drafting cannot pay -> one node; verification nearly free
-> the whole tree), properties against brute force over every prefix-closed subtree,
the models' learning on synthetic data, calibration caching on a tiny model, and
differential runs (budget="auto" vs plain greedy decoding) on tiny fp64 models with
synthetic (frozen) cost models, so no test depends on how fast this machine is.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import IDENTITY_COUNTS
from hypothesis import given, settings
from hypothesis import strategies as st
from test_lossless import hf_greedy, random_prompt
from tiny_models import ARCHITECTURES, VOCAB, tiny_model

import specdec
from specdec.backends import make_verifier
from specdec.budget import (
    AcceptanceModel,
    Budget,
    BudgetPlanner,
    CostTable,
    Throughput,
    VerifyCostModel,
    choose_budget,
)
from specdec.budget.acceptance import MAX_DEPTH_KEY, MAX_RANK_KEY, node_keys
from specdec.budget.calibration import calibrate, calibration_identity
from specdec.budget.calibration_cache import calibration_path, cost_model, forget_cost_models
from specdec.budget.cost_model import PLATEAU_SPREAD_MAX
from specdec.budget.planner import CUT_PROBE_SHARE, DECLINED_PROBE_SHARE
from specdec.commands import main
from specdec.decoding import DecodingConfig, StopRules
from specdec.engine import decode
from specdec.errors import InvalidDraftTreeError, SpecDecError
from specdec.types import DraftTree, Feedback, KernelChoice

SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def frozen_costs(seconds_per_size: Sequence[float]) -> VerifyCostModel:
    """A cost model that predicts ``seconds_per_size`` (one per entry of SIZES) at every context, never learning."""
    row = tuple(float(s) for s in seconds_per_size)
    return VerifyCostModel(CostTable(SIZES, (1, 1000), (row, row), {}), learn=False)


FLAT = frozen_costs([1.0] * len(SIZES))  # verification nearly free: a GPU's small trees
STEEP = frozen_costs([float(s) for s in SIZES])  # k nodes cost k plain steps: drafting never pays


# -- the decision rule ------------------------------------------------------------------


def test_drafting_that_cannot_pay_is_a_plain_step() -> None:
    p = np.array([1.0, 0.9, 0.8, 0.7])
    k, nodes = choose_budget(p, np.array([1.0, 2.0, 3.0, 4.0]), rate=1.0)
    assert (k, nodes.tolist()) == (1, [0])


def test_nearly_free_verification_takes_the_whole_tree() -> None:
    p = np.array([1.0, 0.3, 0.2, 0.1, 0.05])
    k, nodes = choose_budget(p, np.array([1.0, 1.0, 1.0, 1.0, 1.0001]), rate=1.0)
    assert (k, nodes.tolist()) == (5, [0, 1, 2, 3, 4])


def test_the_best_nodes_are_chosen_not_the_first() -> None:
    # Root with children 1 (p 0.1) and 2 (p 0.9); node 3 under node 2 (p 0.8).
    p = np.array([1.0, 0.1, 0.9, 0.8])
    k, nodes = choose_budget(p, np.array([1.0, 1.2, 1.4, 1.6]), rate=1.0)
    assert (k, nodes.tolist()) == (3, [0, 2, 3])


def test_ties_go_to_the_smaller_budget() -> None:
    k, _ = choose_budget(np.array([1.0, 0.5]), np.array([1.0, 1.5]), rate=1.0)  # 1 - 1 == 1.5 - 1.5
    assert k == 1


def test_choose_budget_rejects_mismatched_lengths() -> None:
    with pytest.raises(SpecDecError, match="3 probabilities but 2 costs"):
        choose_budget(np.ones(3), np.ones(2), rate=1.0)


@st.composite
def tree_problems(draw: st.DrawFn) -> tuple[list[int], np.ndarray, np.ndarray, float, float]:
    """A random tree (parents), per-node p from random q, increasing costs, overhead and a rate >= the floor."""
    n = draw(st.integers(1, 7))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    q = [draw(st.floats(0.0, 1.0)) for _ in range(n)]
    p = np.ones(n)
    for i in range(1, n):
        p[i] = q[i] * p[parents[i]]
    steps = [draw(st.floats(0.0, 2.0)) for _ in range(n - 1)]
    costs = np.cumsum([draw(st.floats(0.1, 3.0)), *steps])
    overhead = draw(st.floats(0.0, 1.0))
    floor = 1.0 / (costs[0] + overhead)
    rate = floor * draw(st.floats(1.0, 4.0))
    return parents, p, costs, overhead, rate


@settings(max_examples=300, deadline=None)
@given(tree_problems())
def test_choice_is_optimal_prefix_closed_and_never_worse_than_plain(
    problem: tuple[list[int], np.ndarray, np.ndarray, float, float],
) -> None:
    parents, p, costs, overhead, rate = problem
    n = len(parents)
    k, nodes = choose_budget(p, costs, rate)
    chosen = nodes.tolist()
    assert len(chosen) == k and chosen[0] == 0 and chosen == sorted(set(chosen))
    assert all(parents[i] in chosen for i in chosen[1:]), f"not prefix-closed: {chosen} in {parents}"
    value = 1.0 + p[chosen[1:]].sum() - rate * costs[k - 1]
    # Brute force over every prefix-closed node set containing the root.
    best = -np.inf
    for mask in range(1 << (n - 1)):
        subset = [0] + [i for i in range(1, n) if mask >> (i - 1) & 1]
        if all(parents[i] in subset for i in subset[1:]):
            best = max(best, 1.0 + p[subset[1:]].sum() - rate * costs[len(subset) - 1])
    assert value >= best - 1e-9
    # Never worse than a plain step, in expectation.
    expected_rate = (1.0 + p[chosen[1:]].sum()) / (costs[k - 1] + overhead)
    assert expected_rate >= 1.0 / (costs[0] + overhead) - 1e-9


# -- budgets ------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "mode", "nodes"), [("auto", "auto", None), ("FULL", "full", None), (16, "fixed", 16),
                                                       (" 4 ", "fixed", 4), (1, "fixed", 1)])
def test_budget_parse(value: str | int, mode: str, nodes: int | None) -> None:
    budget = Budget.parse(value)
    assert (budget.mode, budget.nodes) == (mode, nodes)
    assert Budget.parse(str(budget)) == budget


@pytest.mark.parametrize("value", [0, -3, "fast", "", True, 2.5, None, "1e3"])
def test_bad_budget_is_an_error_naming_it(value: object) -> None:
    with pytest.raises(SpecDecError, match="budget must be") as error:
        Budget.parse(value)  # type: ignore[arg-type]
    assert repr(value) in str(error.value)


def test_bad_budget_fails_in_run_and_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SpecDecError, match="'fast'"):
        specdec.run(tiny_model("llama"), [1, 2, 3], "pld", max_new_tokens=4, budget="fast")
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "hello", "--budget", "0"])
    assert exit_info.value.code == 2
    assert "budget must be 'auto', 'full' or a positive number of nodes, got 0" in capsys.readouterr().err


# -- the acceptance model ---------------------------------------------------------------


def test_node_keys_carry_source_feature_depth_and_rank() -> None:
    # Root with 10 children (ranks 0..9), then a chain of 20 under child 1.
    tokens = [0, *range(1, 11), *range(11, 31)]
    parents = [-1, *([0] * 10), 1, *range(11, 30)]
    tree = DraftTree(tuple(tokens), tuple(parents), "t", None, tuple(range(31)))
    keys = node_keys(tree)
    assert keys[1] == ("t", 1, 1, 0) and keys[3] == ("t", 3, 1, 2)
    assert keys[10][3] == MAX_RANK_KEY  # rank 9 shares the last rank bucket
    assert keys[30][2] == MAX_DEPTH_KEY  # depth 21 shares the last depth bucket
    labelled = DraftTree((0, 1, 2), (-1, 0, 0), "mix", ("mix", "a", "b"))
    assert [k[:2] for k in node_keys(labelled)[1:]] == [("a", -1), ("b", -1)]


def test_unseen_sources_get_the_prior() -> None:
    model = AcceptanceModel(prior=0.4)
    tree = DraftTree.chain(0, [1, 2, 3], source="new")
    q, p = model.estimate(tree, node_keys(tree))
    assert np.allclose(q, [1.0, 0.4, 0.4, 0.4]) and np.allclose(p, [1.0, 0.4, 0.16, 0.064])


def test_sibling_estimates_sum_to_at_most_one() -> None:
    model = AcceptanceModel(prior=0.5)
    tree = DraftTree((0, 1, 2, 3, 4), (-1, 0, 0, 0, 0), "fan")
    q, _ = model.estimate(tree, node_keys(tree))
    assert q[1:].sum() == pytest.approx(1.0)


def test_acceptance_is_learned_per_feature() -> None:
    model = AcceptanceModel()
    good = DraftTree.chain(0, [1, 2], source="pld", feature=3)
    bad = DraftTree.chain(0, [1, 2], source="pld", feature=1)
    for _ in range(60):
        model.observe(good, node_keys(good), (0, 1, 2))
        model.observe(bad, node_keys(bad), (0,))
    assert model.conditional(("pld", 3, 1, 0)) > 0.9
    assert model.conditional(("pld", 1, 1, 0)) < 0.1
    # Node 2 of the bad chain never had an accepted parent: no trial at depth 2.
    assert model.trials(("pld", 1, 2)) == 0.0
    assert model.trials(("pld", 3, 2)) > 0.0
    rows = {(r["feature"], r["depth"]): r for r in model.table()}
    assert rows[(1, 1)]["hit_rate"] == 0.0 and rows[(3, 2)]["hit_rate"] == 1.0


def test_a_key_rejected_long_ago_drifts_back_to_its_neighbours() -> None:
    """Forgetting is the exploration: a key no longer verified regains its neighbours' rate."""
    model = AcceptanceModel(memory=0.95)
    bad = DraftTree.chain(0, [1], source="s", feature=1)
    good = DraftTree.chain(0, [1], source="s", feature=2)
    for _ in range(20):
        model.observe(bad, node_keys(bad), (0,))
    low = model.conditional(("s", 1, 1, 0))
    for _ in range(200):
        model.observe(good, node_keys(good), (0, 1))
    assert low < 0.1 < 0.8 < model.conditional(("s", 1, 1, 0))


@pytest.mark.parametrize(("plain_s", "node_s"), [(0.012, 0.0005), (0.012, 0.004), (0.010, 0.010)])
def test_declined_steps_probe_their_best_node_on_a_share_of_their_time(plain_s: float, node_s: float) -> None:
    """A source that always fails is declined, but its declined steps verify their best node
    anyway whenever DECLINED_PROBE_SHARE of their plain steps' time has paid for the extra node:
    often where a node is cheap (a CPU's 0.5 ms against 12 ms), rarely where it is dear, and
    never more than that share of the time."""
    costs = frozen_costs([plain_s + node_s * (s - 1) for s in SIZES])
    planner = BudgetPlanner(make_verifier(tiny_model("llama")), "auto", AcceptanceModel(),
                            Throughput(fixed_overhead_s=0.0), cost=costs)
    tree = DraftTree.chain(0, [1, 2, 3], source="worthless")
    reasons = []
    for _ in range(400):
        plan = planner.plan(tree, 10)
        reasons.append(plan.reason)
        planner.observe(plan, (0,), 10, plain_s, plain_s)
    late = reasons[100:]  # once learned: every step declined or a probe of the best node
    assert set(late) <= {"declined", "probe"}
    bought = DECLINED_PROBE_SHARE * len(late) * plain_s / node_s  # probes the share pays for
    assert bought < len(late)
    # What the first 100 steps left over (at most one probe's price) and rounding: one either way.
    assert bought - 2 <= late.count("probe") <= bought + 1


def test_cut_steps_probe_twice_their_nodes_on_a_share_of_their_time() -> None:
    """The rule verifies 2 of a 6-node chain (only the first draft token is ever accepted, and
    each node past the second costs 0.225 s); CUT_PROBE_SHARE of those steps' time pays for
    probes of 4 nodes, each adding cost(4) - cost(2), and for nothing more. (Every 16th cut step
    probed before, whatever it cost: 18 probes here instead of ~7.)"""
    costs = frozen_costs([1.0, 1.05, 1.5, 2.5, 4.5, 8.5, 16.5, 32.5])  # seconds for SIZES
    planner = BudgetPlanner(make_verifier(tiny_model("llama")), "auto", AcceptanceModel(),
                            Throughput(fixed_overhead_s=0.0), cost=costs)
    tree = DraftTree.chain(0, [1, 2, 3, 4, 5], source="first-only")
    plans = []
    for _ in range(400):
        plan = planner.plan(tree, 10)
        plans.append(plan)
        planner.observe(plan, (0, 1), 10, plan.predicted_s or 0.0, plan.predicted_s or 0.0)
    late = plans[100:]  # once learned: two nodes a step, or a probe of four
    assert {(p.reason, p.tree.size) for p in late} == {("auto", 2), ("probe", 4)}
    bought = CUT_PROBE_SHARE * len(late) * 1.05 / (1.5 - 1.05)  # ~7 probes
    assert bought - 2 <= sum(p.reason == "probe" for p in late) <= bought + 1


@pytest.mark.parametrize(("option", "value"), [("prior", 0.0), ("prior", 1.0), ("prior_weight", 0.0),
                                               ("memory", 0.0), ("memory", 1.5)])
def test_bad_acceptance_options_are_errors(option: str, value: float) -> None:
    with pytest.raises(SpecDecError, match=f"{option} must be .* got {value}"):
        AcceptanceModel(**{option: value})


# -- the cost model ---------------------------------------------------------------------


def test_costs_interpolate_in_size_and_context() -> None:
    table = CostTable((1, 2, 4), (100, 300), ((1.0, 2.0, 3.0), (2.0, 3.0, 5.0)), {})
    model = VerifyCostModel(table)
    assert model.predict(np.array([1, 3, 6]), 100).tolist() == pytest.approx([1.0, 2.5, 4.0])
    assert model.predict(np.array([1, 3, 6]), 200).tolist() == pytest.approx([1.5, 3.25, 5.5])
    assert model.predict(np.array([1]), 500).tolist() == pytest.approx([3.0])  # extrapolated past 300
    assert model.predict(np.array([1]), 0).tolist() == pytest.approx([0.5])  # floored at half of context 100


def test_online_refinement_follows_the_machine() -> None:
    model = VerifyCostModel(CostTable((1, 8, 64), (1, 1000), ((1.0, 2.0, 4.0), (1.0, 2.0, 4.0)), {}))
    for _ in range(100):
        model.observe(1, 10, 2.0)  # the machine got twice as slow for plain steps
        model.observe(8, 10, 2.0)  # while 8-node trees cost what calibration said
    assert model.predict(np.array([1, 8]), 10).tolist() == pytest.approx([2.0, 2.0], rel=0.02)
    assert model.observations == 200
    model.observe(1, 10, 1000.0)  # one preempted step: its ratio is clipped
    assert model.predict(np.array([1]), 10)[0] < 2.0 * 1.25


def test_a_size_measured_slow_once_and_then_avoided_fades_back_to_the_overall_ratio() -> None:
    """Steps at 8 nodes measured twice their calibrated cost (a busy minute) make 8 look dear;
    the rule then picks 4 instead, so 8 is seen again only by probes. Its stale ratio fades
    toward what every size shows now, and one probe at its true cost puts it in line with 4.
    (Without the fading, 8 stayed ~1.9x as dear as 4 for the rest of the process.)"""
    # 8 nodes calibrated 10% dearer than 4: two sizes, not one plateau (spread 0).
    model = VerifyCostModel(CostTable((1, 4, 8), (1, 1000), ((1.0, 1.5, 1.65), (1.0, 1.5, 1.65)), {}))
    for _ in range(40):
        model.observe(1, 10, 1.0)
        model.observe(8, 10, 3.3)  # the busy minute, at 8 nodes only
    dear = model.predict(np.array([4, 8]), 10)
    assert dear[1] > 1.2 * 1.1 * dear[0]
    for _ in range(150):  # the rule avoids 8 now: only 1 and 4 are measured, at their calibrated cost
        model.observe(1, 10, 1.0)
        model.observe(4, 10, 1.5)
    faded = model.predict(np.array([4, 8]), 10)
    assert faded[1] < 1.1 * 1.1 * faded[0]
    model.observe(8, 10, 1.65)  # one probe at the true cost
    probed = model.predict(np.array([4, 8]), 10)
    assert probed[1] == pytest.approx(1.1 * probed[0], rel=0.05)


# This CPU's calibrated curve (ms, 2026-11-27): flat from 3 to 8 nodes, then a step; repeats spread by 14%.
CPU_SIZES = (1, 2, 3, 4, 6, 8, 16)
CPU_ROW = (18.6, 20.8, 21.3, 21.3, 21.9, 21.9, 36.1)


def cpu_costs(spread: float, learn: bool = True) -> VerifyCostModel:
    row = tuple(ms / 1000 for ms in CPU_ROW)
    return VerifyCostModel(CostTable(CPU_SIZES, (1, 1000), (row, row), {}, spread=spread), learn=learn)


def test_sizes_the_calibration_cannot_tell_apart_are_priced_as_one_plateau() -> None:
    """Sizes whose calibrated costs lie within the calibration's repeat spread are one plateau,
    priced at its dearest; one node is never part of one; the table's own figures stay."""
    model = cpu_costs(spread=0.14)
    sizes = np.arange(1, 17)
    assert model.plateau_sizes(sizes, 10).tolist() == [1, 8, 8, 8, 8, 8, 8, 8, *range(9, 17)]
    predicted = model.predict(sizes, 10)
    assert predicted[1:8].tolist() == pytest.approx([0.0219] * 7)  # 2..8 nodes: what 8 cost
    assert predicted[0] == pytest.approx(0.0186) and predicted[15] == pytest.approx(0.0361)
    assert model.calibrated(np.array([2, 5]), 10).tolist() == pytest.approx([0.0208, 0.0216])
    # Without a spread, only equal costs are one plateau: 3 and 4, 6 and 8 (5 lies between 4 and 6).
    exact = cpu_costs(spread=0.0)
    assert exact.plateau_sizes(sizes[:9], 10).tolist() == [1, 2, 4, 4, 5, 8, 8, 8, 9]
    # A spread past PLATEAU_SPREAD_MAX is capped: a noisy calibration does not flatten a real slope.
    noisy = VerifyCostModel(CostTable((1, 2, 3, 4), (1, 1000), ((1.0, 1.0, 1.09, 1.12),) * 2, {}, spread=0.5))
    assert PLATEAU_SPREAD_MAX < 0.12 and noisy.plateau_sizes(np.arange(1, 5), 10).tolist() == [1, 3, 3, 4]


def test_plateaus_follow_the_context() -> None:
    """Attention grows with the context, so a plateau at a short context can split at a long one."""
    short = (1.0, 1.5, 1.55, 1.6)
    long = (2.0, 2.5, 3.0, 3.1)
    model = VerifyCostModel(CostTable((1, 2, 4, 8), (10, 1000), (short, long), {}, spread=0.1))
    assert model.plateau_sizes(np.arange(1, 9), 10).tolist() == [1, 8, 8, 8, 8, 8, 8, 8]
    assert model.plateau_sizes(np.arange(1, 9), 1000).tolist() == [1, 2, 3, 8, 8, 8, 8, 8]


def test_a_plateau_learns_one_correction_so_noise_makes_no_step_in_it() -> None:
    """Steps of 4 nodes measured 15% fast and of 8 nodes 10% slow (noise: they cost the same)
    move one correction, so the plateau stays level and the rule still verifies 8 nodes where
    every node pays; with a correction per size (spread 0) the same noise made 4 look cheaper."""
    p = np.array([1.0, 0.5, 0.3, 0.2, 0.1, 0.05, 0.05, 0.05])  # a chain of 8: what each node adds
    for spread, level in ((0.14, True), (0.0, False)):
        model = cpu_costs(spread)
        for _ in range(30):
            model.observe(4, 10, 0.85 * 0.0213)
            model.observe(8, 10, 1.10 * 0.0219)
        costs = model.predict(np.arange(1, 9), 10)
        assert bool(np.ptp(costs[1:]) < 1e-12) == level  # 2..8 nodes priced alike, or not
        k, _ = choose_budget(p, costs, rate=80.0)
        assert k == (8 if level else 4)


def test_a_bucketed_table_prices_a_plateau_of_buckets_at_its_dearest() -> None:
    model = VerifyCostModel(CostTable((1, 4, 16, 64), (1, 1000), ((1.0, 1.02, 1.04, 2.0),) * 2, {},
                                      bucketed=True, spread=0.05))
    assert model.plateau_sizes(np.array([1, 2, 5, 16, 17, 64, 80]), 10).tolist() == [1, 16, 16, 16, 64, 64, 80]
    assert model.predict(np.array([2, 16]), 10).tolist() == pytest.approx([1.04, 1.04])


def test_the_online_refinement_round_trips_and_bad_states_change_nothing() -> None:
    table = CostTable((1, 4, 8), (1, 1000), ((1.0, 1.5, 2.0), (1.0, 1.5, 2.0)), {})
    learned = VerifyCostModel(table)
    for size, seconds in ((1, 1.3), (4, 1.5), (8, 3.0), (1, 1.2)):
        learned.observe(size, 10, seconds)
    state = json.loads(json.dumps(learned.state()))  # through JSON, as the planner statistics save it
    restored = VerifyCostModel(table)
    restored.load_state(state)
    sizes = np.array([1, 2, 4, 6, 8, 20])
    assert restored.predict(sizes, 300).tolist() == learned.predict(sizes, 300).tolist()
    assert restored.observations == learned.observations == 4
    bad_states = [
        dict(state, table="another"),  # another table's refinement
        dict(state, ratio=state["ratio"][:2]),
        dict(state, ratio=[1.0, float("nan"), 1.0]),
        dict(state, ratio=[1.0, 0.0, 1.0]),
        dict(state, count=[1.0, -1.0, 1.0]),
        dict(state, global_ratio=True),
        dict(state, global_count=None),
        ["not", "a", "dict"],
    ]
    for bad in bad_states:
        untouched = VerifyCostModel(table)
        with pytest.raises(SpecDecError, match="cost model state"):
            untouched.load_state(bad)
        assert untouched.observations == 0 and untouched.predict(sizes, 300).tolist() == VerifyCostModel(
            table).predict(sizes, 300).tolist()


def test_a_calibration_from_a_busy_machine_is_corrected_within_a_few_steps() -> None:
    """Calibrated under 10x load (and with the load's shape): real steps put it right, the clip notwithstanding."""
    busy = CostTable((1, 2, 8), (1, 1000), ((0.6, 1.2, 3.0), (0.6, 1.2, 3.0)), {})
    model = VerifyCostModel(busy)
    real = {1: 0.06, 2: 0.07, 8: 0.10}
    for step in range(30):
        model.observe(1, 10, real[1])
        if step % 3 == 0:  # the planner's occasional probes of larger trees
            model.observe(2, 10, real[2])
            model.observe(8, 10, real[8])
    predicted = model.predict(np.array([1, 2, 8]), 10).tolist()
    assert predicted == pytest.approx([real[1], real[2], real[8]], rel=0.2)


def test_a_frozen_cost_model_does_not_learn() -> None:
    before = FLAT.predict(np.array([1, 5, 100]), 10).tolist()
    FLAT.observe(5, 10, 123.0)
    assert FLAT.predict(np.array([1, 5, 100]), 10).tolist() == before


@pytest.mark.parametrize(
    ("sizes", "contexts", "seconds", "message"),
    [
        ((2, 1), (1,), ((1.0, 1.0),), "sizes must be increasing"),
        ((1, 2), (5, 5), ((1.0, 1.0), (1.0, 1.0)), "contexts must be increasing"),
        ((1, 2), (1,), ((1.0,),), "table must be 1 x 2"),
        ((1, 2), (1,), ((1.0, 0.0),), "times must be positive"),
    ],
)
def test_bad_cost_tables_are_errors(
    sizes: tuple[int, ...], contexts: tuple[int, ...], seconds: tuple[tuple[float, ...], ...], message: str
) -> None:
    with pytest.raises(SpecDecError, match=message):
        CostTable(sizes, contexts, seconds, {})


def test_cost_table_json_round_trip_and_version_check() -> None:
    table = CostTable((1, 4), (8, 16), ((1.0, 2.0), (1.5, 2.5)), {"device": "x"})
    assert CostTable.from_json(json.loads(json.dumps(table.to_json()))) == table
    with pytest.raises(SpecDecError, match="calibration format version 0"):
        CostTable.from_json({**table.to_json(), "version": 0})


# -- calibration ------------------------------------------------------------------------


@pytest.fixture
def private_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> object:
    """A fresh cache directory, no cost model in memory, and a machine taken as quiet (tests of the busy
    checks are in test_calibration_conditions.py): a calibration here is cached whatever the load."""
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("specdec.budget.calibration_cache.busy_reason", lambda table: None)
    forget_cost_models()
    yield tmp_path
    forget_cost_models()


def test_calibration_is_cached_per_model_device_and_dtype(
    private_cache: object, capsys: pytest.CaptureFixture[str]
) -> None:
    verifier = make_verifier(tiny_model("llama"))
    model, spent = cost_model(verifier, measure=True)  # `specdec calibrate`: a generation never measures
    path = calibration_path(calibration_identity(verifier))
    assert spent > 0.0 and path.is_file()
    said = capsys.readouterr().err  # a first measurement says what it does, where it keeps it, and how long it took
    assert "measuring the verification cost" in said and str(path) in said
    assert "measured the verification cost in" in said
    table = model.table
    assert table.identity["dtype"] == "float64" and table.identity["model_type"] == "llama"
    # The tiny model has 256 positions: calibration fits its sizes and contexts inside them.
    assert max(table.sizes) + max(table.contexts) <= 256
    for row in table.seconds:
        assert list(row) == sorted(row)  # non-decreasing in size
        assert all(s <= size * row[0] + 1e-12 for s, size in zip(row, table.sizes, strict=True))  # subadditive
    assert cost_model(verifier) == (model, 0.0)  # in memory: the same object, shared online refinement
    forget_cost_models()
    reloaded, spent = cost_model(verifier, measure=True)
    assert spent == 0.0 and reloaded is not model and reloaded.table == table  # from the file
    assert "measuring" not in capsys.readouterr().err  # read from the file: nothing to say
    # Another architecture config or dtype is another identity, hence another file.
    other = make_verifier(copy.deepcopy(tiny_model("llama", seed=1)).to(torch.float32))  # the cached model untouched
    assert calibration_path(calibration_identity(other)) != path
    assert calibration_path(calibration_identity(make_verifier(tiny_model("qwen2")))) != path
    path.write_text("{not json")
    forget_cost_models()
    with pytest.warns(RuntimeWarning, match="ignoring the calibration file"):
        _, spent = cost_model(verifier, measure=True)  # a corrupt file is measured again, not trusted
    assert spent > 0.0 and CostTable.from_json(json.loads(path.read_text())).sizes == table.sizes


def test_changed_kernels_are_calibrated_again(
    private_cache: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A table measured the CPU kernels of one build: a specdec whose kernel sources changed (another
    build key) must not plan with those costs, so it is another identity (another file)."""
    from specdec.backends.specdec_engine import cpu_kernels
    from specdec.backends.specdec_engine.forward import SpecdecForward

    verifier = make_verifier(tiny_model("llama"))
    assert isinstance(verifier.forward, SpecdecForward) and verifier.forward.kernels_available
    identity = calibration_identity(verifier)
    # The build's key and the kernel path "auto" runs: costs measured on one path never plan another's.
    assert identity["kernels_build"] == f"{cpu_kernels.build_key()}/{cpu_kernels.cpu_isa()}"
    assert len(cpu_kernels.build_key()) == 12
    # The key is the sources' hash: one changed byte of one header gives another key.
    changed = tmp_path / cpu_kernels.HEADERS[0].name
    changed.write_bytes(cpu_kernels.HEADERS[0].read_bytes() + b"\n")
    monkeypatch.setattr(cpu_kernels, "HEADERS", (changed, *cpu_kernels.HEADERS[1:]))
    monkeypatch.setattr(cpu_kernels, "_BUILD_KEY", None)
    isa = identity["kernels_build"].split("/")[1]
    monkeypatch.setattr(cpu_kernels, "cpu_isa", lambda: isa)  # the loaded build's path: the changed one is not built
    assert cpu_kernels.build_key() != identity["kernels_build"].split("/")[0]
    assert calibration_path(calibration_identity(verifier)) != calibration_path(identity)
    # A verifier without the kernels (the model's own forward) has none in its identity.
    verifier.forward.kernels_available = False
    assert calibration_identity(verifier)["kernels_build"] == "-"


def test_the_spread_is_the_median_of_each_cells_slowest_over_fastest_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calibration on a scripted clock: every cell's repeats take ``ms * (1, 1 + a, 1 + 2a)`` in turn,
    ``a`` by size, so each cell's slowest / fastest - 1 is ``2a``; the table keeps the fastest repeat
    and ``spread`` is the median of those ``2a`` over every cell (both contexts)."""
    from types import SimpleNamespace

    from specdec.budget import calibration

    verifier = make_verifier(tiny_model("llama"))
    base_ms = {1: 10.0, 2: 12.0, 4: 20.0}
    amplitude = {1: 0.05, 2: 0.15, 4: 0.45}  # cell spreads 0.1, 0.3, 0.9 at each context: median 0.3 (mean 0.43)
    now = [0.0]
    seen: dict[tuple[int, str], int] = {}
    verify = verifier.verify

    def scripted(state: object, tree: DraftTree) -> object:
        key = (tree.size, repr(verifier.kernels))
        turn = seen.get(key, 0)
        seen[key] = turn + 1
        now[0] += base_ms[tree.size] / 1000.0 * (1.0 + amplitude[tree.size] * (turn % 3))
        return verify(state, tree)

    monkeypatch.setattr(verifier, "verify", scripted)
    monkeypatch.setattr(calibration, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    table = calibrate(verifier, sizes=(1, 2, 4), contexts=(8, 32), repeats=3)
    assert table.spread == pytest.approx(0.3)
    for row in table.seconds:  # the fastest repeat of each cell, whatever kernels won
        assert row == pytest.approx(tuple(base_ms[s] / 1000.0 for s in table.sizes))
    # Equal repeats: no spread (a calibration that cannot tell sizes apart by noise makes no plateaus).
    monkeypatch.setattr(calibration, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    amplitude.update({1: 0.0, 2: 0.0, 4: 0.0})
    assert calibrate(verifier, sizes=(1, 2, 4), contexts=(8, 32), repeats=3).spread == 0.0


def test_calibrate_rejects_bad_arguments() -> None:
    verifier = make_verifier(tiny_model("llama"))
    with pytest.raises(SpecDecError, match="repeats must be a positive int, got 0"):
        calibrate(verifier, repeats=0)
    with pytest.raises(SpecDecError, match="sizes must be positive ints, got \\[0, 2\\]"):
        calibrate(verifier, sizes=(0, 2))
    with pytest.raises(SpecDecError, match="contexts must be positive ints, got \\[0\\]"):
        calibrate(verifier, contexts=(0,))


def test_first_use_calibrates_once_and_says_so(private_cache: object) -> None:
    model = tiny_model("gpt2")
    generator = specdec.Generator(model, drafter=ChainOracle.factory(model, [5, 6, 7, 5, 6], 30))
    first = generator.generate([5, 6, 7, 5, 6], max_new_tokens=30)
    second = generator.generate([5, 6, 7, 5, 6], max_new_tokens=30)
    assert first.stats.calibration_s > 0.0 and second.stats.calibration_s == 0.0
    assert first.stats.summary()["calibration_s"] == round(first.stats.calibration_s, 3)
    assert first.tokens == second.tokens


# -- token identity and behaviour under every budget -------------------------------------


class ChainOracle:
    """Drafts chains of the known plain-decoding output, half of them broken at their first token.

    ``feature`` says which (2: intact, 1: broken), as a drafter's match length would say
    how much to trust it; ``log`` keeps the feature of every proposal.
    """

    name = "chain-oracle"
    feedback_topk = 0

    def __init__(self, truth: Sequence[int], length: int = 8, seed: int = 0) -> None:
        self.truth = list(truth)
        self.length = length
        self.rng = random.Random(seed)
        self.position = 0
        self.log: list[int] = []

    @classmethod
    def factory(cls, model: torch.nn.Module, prompt: list[int], max_new: int) -> ChainOracle:
        return cls(hf_greedy(model, prompt, max_new))

    def reset(self, prompt: Sequence[int], feedback: Feedback | None = None) -> None:
        self.position = 0

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        draft = self.truth[self.position + 1 : self.position + 1 + min(self.length, max_nodes - 1)]
        feature = 2
        if draft and self.rng.random() < 0.5:
            draft = [(draft[0] + 1) % VOCAB, *draft[1:]]
            feature = 1
        self.log.append(feature)
        return DraftTree.chain(pending, draft, source=self.name, feature=feature)

    def update(self, accepted: Sequence[int], feedback: Feedback | None) -> None:
        assert list(accepted) == self.truth[self.position : self.position + len(accepted)]
        self.position += len(accepted)


def run_with_costs(arch: str, costs: VerifyCostModel, max_new: int = 60, seed: int = 0) -> tuple[
    specdec.GenerationResult, list[int], ChainOracle
]:
    model = tiny_model(arch)
    prompt = random_prompt(random.Random(f"budget-{arch}-{seed}"))
    truth = hf_greedy(model, prompt, max_new)
    verifier = make_verifier(model)
    drafter = ChainOracle(truth, seed=seed)
    planner = BudgetPlanner(verifier, "auto", cost=costs)
    result = decode(verifier, drafter, prompt, DecodingConfig(StopRules(max_new)), planner=planner)
    return result, truth, drafter


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_auto_is_lossless_and_drafts_when_verification_is_nearly_free(arch: str) -> None:
    result, truth, _ = run_with_costs(arch, FLAT)
    assert result.tokens == truth
    IDENTITY_COUNTS[f"{arch}/chain-oracle/auto-flat"] += 1
    records = result.stats.records
    assert all(r.tree_size == r.offered for r in records)  # every node is worth verifying when it is free
    assert result.stats.mat > 2.0  # regression guard: the intact chains were verified and accepted
    assert all(r.expected is not None and r.predicted_s == pytest.approx(1.0) for r in records)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_auto_never_drafts_when_drafting_cannot_pay(arch: str) -> None:
    result, truth, _ = run_with_costs(arch, STEEP, max_new=120)
    assert result.tokens == truth
    IDENTITY_COUNTS[f"{arch}/chain-oracle/auto-steep"] += 1
    stats = result.stats
    assert stats.mat == 1.0 + sum(r.accepted for r in stats.records) / stats.steps
    offered = sum(1 for r in stats.records if r.offered > 1)
    reasons = stats.budget_summary()["steps_by_reason"]
    # Declined, but for the probes: the declined steps' earnings (DECLINED_PROBE_SHARE of a plain
    # step, 1 s here, per step) pay for one probe of two nodes each time they cover the extra
    # node (1 s here), and for nothing more.
    assert reasons.get("declined", 0) + reasons.get("probe", 0) == offered > 0
    earned = DECLINED_PROBE_SHARE * offered * 1.0 / 1.0
    assert earned >= 2  # enough steps that the share buys some probes
    assert int(earned) - 1 <= reasons.get("probe", 0) <= int(earned)
    assert all(r.tree_size == (2 if r.reason == "probe" else 1) for r in stats.records)


def test_features_steer_the_budget() -> None:
    """Once learned, broken drafts (feature 1) are declined and intact ones (feature 2) verified."""
    costs = frozen_costs([1.0 + 0.1 * (s - 1) for s in SIZES])
    result, truth, drafter = run_with_costs("llama", costs, max_new=150, seed=1)
    assert result.tokens == truth
    records = result.stats.records
    late = [(feature, record) for feature, record in zip(drafter.log, records, strict=True)][len(records) // 2 :]
    broken = [r for f, r in late if f == 1 and r.offered > 1]
    intact = [r for f, r in late if f == 2 and r.offered > 1]
    assert broken and intact
    assert all(r.tree_size > 1 for r in intact)
    # Broken drafts are declined, but for the probes of their best node (a share of the
    # declined steps' time) and the rare retry when their key's count has decayed.
    assert sum(r.tree_size == 1 or r.reason == "probe" for r in broken) >= 0.75 * len(broken)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt_neox"])
def test_every_budget_matches_plain_greedy(arch: str) -> None:
    model = tiny_model(arch)
    rng = random.Random(f"budgets-{arch}")
    generator = specdec.Generator(model, drafter="pld")
    for budget in ("auto", "full", 3, 1):
        prompt = random_prompt(rng)
        expected = hf_greedy(model, prompt, 40)
        result = generator.generate(prompt, max_new_tokens=40, budget=budget)
        assert result.tokens == expected, f"{arch}, budget {budget!r}"
        IDENTITY_COUNTS[f"{arch}/pld/budget-{budget}"] += 1
        stats = result.stats
        assert stats.budget == str(Budget.parse(budget))
        if budget == "full":
            assert all(r.tree_size == r.offered for r in stats.records)
        if isinstance(budget, int):
            assert max(r.tree_size for r in stats.records) <= budget
        summary = stats.summary()
        assert {"budget", "mean_offered", "steps_by_reason", "expected_accepted", "realised_accepted"} <= set(summary)
    assert generator.planner_memory.acceptance.steps > 0  # what the planner learned stays with the generator


def test_the_generator_default_budget_and_its_override() -> None:
    model = tiny_model("llama")
    generator = specdec.Generator(model, drafter="pld", budget=2)
    assert generator.generate([4, 5, 6, 4, 5], max_new_tokens=12).stats.budget == "2"
    assert generator.generate([4, 5, 6, 4, 5], max_new_tokens=12, budget="full").stats.budget == "full"
    assert specdec.run(model, [4, 5, 6, 4, 5], "pld", max_new_tokens=12).stats.budget == "auto"


def test_draft_tree_features_and_select() -> None:
    tree = DraftTree((5, 6, 7, 8), (-1, 0, 0, 1), "t", ("t", "a", "b", "a"), (0, 1, 2, 3))
    cut = tree.select([0, 1, 3])
    assert (cut.tokens, cut.parents, cut.node_sources, cut.node_features) == (
        (5, 6, 8), (-1, 0, 1), ("t", "a", "a"), (0, 1, 3)
    )
    assert tree.prefix(2).node_features == (0, 1)
    assert tree.pruned(4, 1).node_features == (0, 1, 2)
    assert DraftTree.chain(1, [2, 3], feature=4).node_features == (4, 4, 4)
    with pytest.raises(InvalidDraftTreeError, match="node_features has 2 entries for 3 nodes"):
        DraftTree((1, 2, 3), (-1, 0, 1), node_features=(1, 2))
    with pytest.raises(InvalidDraftTreeError, match="node_features must be >= 0, got -1"):
        DraftTree((1, 2), (-1, 0), node_features=(0, -1))
    with pytest.raises(InvalidDraftTreeError, match="keeps node 3 without its parent 1"):
        tree.select([0, 2, 3])
    with pytest.raises(InvalidDraftTreeError, match="increasing node indices from the root 0"):
        tree.select([0, 2, 1])
    for subset in itertools.combinations(range(1, 4), 2):
        nodes = [0, *subset]
        if all(tree.parents[i] in nodes for i in subset):
            assert tree.select(nodes).size == 3


def test_calibrate_examples_follow_the_cost_table() -> None:
    """`specdec calibrate`'s budget table: the whole chain when verification is free, nothing when it never pays."""
    from specdec.commands.calibrate import EXAMPLE_ACCEPTANCE, EXAMPLE_CHAIN, budget_examples

    flat = [row["nodes"] for row in budget_examples(FLAT)]
    # Every node while its p adds anything at float64 resolution (0.3**30 ~ 2e-16 does not).
    assert flat[-1] == EXAMPLE_CHAIN and min(flat) > 30
    assert [row["nodes"] for row in budget_examples(STEEP)] == [1] * len(EXAMPLE_ACCEPTANCE)
    middle = budget_examples(frozen_costs([1.0 + 0.05 * (s - 1) for s in SIZES]))
    nodes = [row["nodes"] for row in middle]
    assert nodes == sorted(nodes) and nodes[0] < nodes[-1]  # more acceptance buys more nodes
    # Each row's speedup is its expected tokens over its cost in plain steps; a row that drafts beats plain
    # decoding strictly (at plain decoding's rate, k > 1 is chosen only when E(k) > cost(k) / cost(1)).
    for row in middle:
        k = row["nodes"]
        cost_k = 1.0 + 0.05 * (k - 1)  # the table is linear in size, so interpolation is exact
        assert row["expected_tokens"] == pytest.approx((1 - row["q"] ** k) / (1 - row["q"]), abs=1e-3)
        assert row["expected_speedup"] == pytest.approx(row["expected_tokens"] / cost_k, abs=2e-3)
        assert (row["expected_speedup"] > 1.0) if k > 1 else (row["expected_speedup"] == 1.0)
    assert middle[-1]["expected_speedup"] > 3.0  # q = 0.95 on a gentle slope: long drafts pay several-fold


def test_throughput_prices_steps_with_the_cost_model_and_floors_at_plain() -> None:
    measured = Throughput(memory=0.5)
    assert measured.rate(floor=2.0) == 2.0  # nothing seen yet: plain decoding's rate
    measured.observe(emitted=4, step_s=1.5, verify_s=1.0, predicted_verify_s=None)
    assert measured.overhead_s == pytest.approx(0.5) and measured.rate(floor=0.1) == pytest.approx(4 / 1.5)
    assert measured.rate(floor=10.0) == 10.0
    fixed = Throughput(fixed_overhead_s=0.25)  # a clock-free rate: replays and tests
    fixed.observe(emitted=3, step_s=10.0, verify_s=9.0, predicted_verify_s=0.75)
    assert fixed.overhead_s == 0.25 and fixed.rate(floor=0.1) == pytest.approx(3.0)


def test_plain_decoding_runs_the_kernels_a_cached_calibration_chose(private_cache: Path) -> None:
    """`none` never drafts, so never calibrates: a Generator still takes the cached table's kernel choice."""
    model = copy.deepcopy(tiny_model("llama")).to(torch.float32)
    verifier = make_verifier(model, engine="specdec")
    own = verifier.kernels  # nothing cached: the verifier's own choice
    assert specdec.Generator(model, drafter="none", engine="specdec").verifier.kernels == own
    table = dataclasses.replace(calibrate(verifier, sizes=(1, 2), contexts=(8,), repeats=1),
                                kernels=KernelChoice(((1, "default"), (2, "cpu"))))
    assert table.kernels != own
    calibration_path(calibration_identity(verifier)).parent.mkdir(parents=True, exist_ok=True)
    calibration_path(calibration_identity(verifier)).write_text(json.dumps(table.to_json()))
    forget_cost_models()
    plain = specdec.Generator(model, drafter="none", engine="specdec")
    assert plain.verifier.kernels == table.kernels
    assert plain.generate([5, 6, 7, 5, 6], max_new_tokens=12).tokens == hf_greedy(model, [5, 6, 7, 5, 6], 12)
