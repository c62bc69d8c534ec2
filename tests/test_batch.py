"""Batched speculative decoding (``specdec.batching``): every row is its own single-sequence plain decoding.

Checked, on tiny fp64 models of every architecture (``engine="specdec"`` for the Llama family: one
forward per step for all rows; the model's own forward elsewhere: rows one after another):
every row's tokens equal ``run(prompt, "none")`` alone, greedy and sampled with the row's seed,
with random trees around the truth, real drafters, ragged prompts, rows ending at different
steps (an EOS id) and rows joining mid-batch (more prompts than places); the batch verifier
gives each row bitwise what verifying it alone gives; the batched ``cuda_ext`` acceptance equals
the reference ops'; the batch planner's one sort is the best allocation (brute force) and
never plans a step slower per token than a plain batched one; bad input is refused before any
work (naming the prompt), a batch too large for memory too; rows feed a shared store.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch
from conftest import IDENTITY_COUNTS, native_or_skip
from oracle_drafter import OracleTreeFactory, random_tree
from test_lossless import random_prompt
from tiny_models import ARCHITECTURES, VOCAB, own_tiny_model, tiny_model

import specdec
from specdec import api, batching, engine
from specdec.backends.specdec_engine.model_runner import ARCHITECTURES as NATIVE
from specdec.backends.verifier import TorchTreeOps
from specdec.batching import check_memory
from specdec.budget.acceptance import AcceptanceModel
from specdec.budget.batch_planner import (
    GUARD_EXPLORE_DRAFTING,
    GUARD_EXPLORE_EVERY,
    GUARD_MIN_STEPS,
    ROW_OFFER_NODES,
    ROW_PROBE_EVERY,
    BatchGuard,
    BatchPlanner,
    RowGate,
)
from specdec.budget.cost_model import CostTable, VerifyCostModel
from specdec.budget.memory import PlannerMemory
from specdec.budget.planner import Throughput, best_nodes
from specdec.engine import BatchRequest
from specdec.errors import SpecDecError
from specdec.sampling import Greedy, PositionKeyedSampler, SamplingParams
from specdec.types import BatchVerifier, DraftTree

MAX_NEW = 30


def engine_for(arch: str) -> str:
    return "specdec" if arch in NATIVE else "hf"


def ragged_prompts(seed: str, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [random_prompt(rng) for _ in range(count)]


def alone(model: Any, prompts: Sequence[Sequence[int]], engine: str, **options: Any) -> list[list[int]]:
    """Each prompt's single-sequence plain decoding (``drafter="none"``), with row i's seed when sampling."""
    seed = options.pop("seed", None)
    return [
        specdec.run(model, list(prompt), "none", engine=engine, **options,
                    **({} if seed is None else {"seed": seed + i})).tokens
        for i, prompt in enumerate(prompts)
    ]  # fmt: skip


def frequent_token(outputs: Sequence[Sequence[int]]) -> int:
    """A token that ends some outputs early: rows then stop at different steps."""
    counts = np.bincount([t for out in outputs for t in out[1:]], minlength=VOCAB)
    return int(np.argmax(counts))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_rows_equal_their_lone_plain_decoding(arch: str) -> None:
    model = tiny_model(arch)
    chosen = engine_for(arch)
    prompts = ragged_prompts(f"batch-{arch}", 7)
    eos = frequent_token(alone(model, prompts, chosen, max_new_tokens=MAX_NEW))
    truth = alone(model, prompts, chosen, max_new_tokens=MAX_NEW, eos_token_id=eos)
    assert len({len(t) for t in truth}) > 1  # rows end at different steps
    oracle = OracleTreeFactory({tuple(p): t for p, t in zip(prompts, truth, strict=True)}, VOCAB, size=20, depth=7)
    accepted = 0
    for drafter in (oracle, "none", "pld", "sam+recycling"):
        generator = specdec.Generator(model, drafter=drafter, engine=chosen, budget="full")
        results = generator.generate_batch(prompts, batch_size=3, max_new_tokens=MAX_NEW, eos_token_id=eos)
        for result, expected, prompt in zip(results, truth, prompts, strict=True):
            assert result.tokens == expected, f"{arch}/{drafter}: prompt {prompt}"
            assert result.stats.new_tokens == len(expected) and result.prompt_tokens == prompt
            IDENTITY_COUNTS[f"{arch}/batch/{getattr(drafter, 'name', drafter)}"] += 1
        if drafter is oracle:
            accepted = sum(r.stats.emitted_by_steps - r.stats.steps for r in results)
    assert accepted > 20  # the oracle's trees were accepted: deep paths and scattered slots were verified


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt2"])
def test_sampled_rows_equal_lone_sampling_with_the_rows_seed(arch: str) -> None:
    model = tiny_model(arch)
    chosen = engine_for(arch)
    prompts = ragged_prompts(f"sampled-{arch}", 5)
    options: dict[str, Any] = {"max_new_tokens": MAX_NEW, "do_sample": True, "temperature": 0.9, "top_k": 40}
    truth = alone(model, prompts, chosen, seed=11, **options)
    generator = specdec.Generator(model, drafter="sam+recycling", engine=chosen, budget="full")
    results = generator.generate_batch(prompts, batch_size=2, seed=11, **options)
    assert [r.tokens for r in results] == truth
    assert [r.seed for r in results] == [11 + i for i in range(len(prompts))]
    seeds = [5, 99, 5, 1234, 7]
    explicit = generator.generate_batch(prompts, batch_size=4, seeds=seeds, **options)
    for result, prompt, seed in zip(explicit, prompts, seeds, strict=True):
        assert result.tokens == specdec.run(model, prompt, "none", engine=chosen, seed=seed, **options).tokens
        assert result.seed == seed


def test_rows_join_as_others_finish_and_results_come_as_they_complete() -> None:
    model = tiny_model("llama")
    prompts = ragged_prompts("join", 6)
    lengths = [3, 25, 5, 2, 18, 9]  # stop at different steps: a stop id per row is not an option, so the
    # test cuts max_new_tokens per call and checks each row against its own truth at its own length
    generator = specdec.Generator(model, drafter="pld", engine="specdec")
    live: list[int] = []
    verify_batch = generator.verifier.verify_batch  # type: ignore[attr-defined]

    def watched(states: Sequence[Any], trees: Sequence[DraftTree], topk: int = 0, features: bool = False) -> Any:
        live.append(len(states))
        return verify_batch(states, trees, topk, features)

    generator.verifier.verify_batch = watched  # type: ignore[attr-defined]
    order = []
    for max_new in sorted(set(lengths)):
        chosen = [p for p, n in zip(prompts, lengths, strict=True) if n == max_new]
        for index, result in generator.iter_batch(chosen, batch_size=2, max_new_tokens=max_new):
            assert result.tokens == alone(model, [chosen[index]], "specdec", max_new_tokens=max_new)[0]
    live.clear()
    eos = frequent_token(alone(model, prompts, "specdec", max_new_tokens=MAX_NEW))
    truth = alone(model, prompts, "specdec", max_new_tokens=MAX_NEW, eos_token_id=eos)
    for index, result in generator.iter_batch(prompts, batch_size=2, max_new_tokens=MAX_NEW, eos_token_id=eos):
        order.append(index)
        assert result.tokens == truth[index]
    assert sorted(order) == list(range(len(prompts)))
    assert max(live) == 2 and min(live) >= 1  # never more rows than places
    by_steps = sorted(range(len(prompts)), key=lambda i: (len(truth[i]), i))
    assert order != list(range(len(prompts))) or by_steps == order  # completion order, not prompt order


def test_a_static_cache_batches_its_rows_on_one_cache() -> None:
    """Its own verifier holds one sequence; a batch runs on a rows verifier of as many places (test_static_rows)."""
    from specdec.backends.buckets.rows import RowsForward

    model = tiny_model("llama")
    prompts = ragged_prompts("static", 3)
    generator = specdec.Generator(model, drafter="pld", engine="buckets")
    assert isinstance(generator.verifier, BatchVerifier) and generator.verifier.live_limit == 1
    results = generator.generate_batch(prompts, batch_size=4, max_new_tokens=12)
    assert [r.tokens for r in results] == alone(model, prompts, "buckets", max_new_tokens=12)
    rows = generator._rows.get(4)
    assert isinstance(rows.forward, RowsForward) and rows.live_limit == 4 and generator._rows.get(4) is rows
    assert rows.buckets[-1] == 512 and rows.forward.max_tree_nodes == generator.verifier.forward.max_tree_nodes == 128
    assert generator._rows.get(1) is generator.verifier
    generator.close()
    with pytest.raises(SpecDecError, match="closed"):
        rows.prefill([1, 2, 3])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_verify_batch_gives_each_row_its_lone_verification_bit_for_bit(dtype: torch.dtype) -> None:
    native_or_skip("cpu_kernels", specdec.backends.specdec_engine.cpu_kernels.load)
    model = own_tiny_model("qwen2").to(dtype)
    generator = specdec.Generator(model, drafter="none", engine="specdec")
    verifier = generator.verifier
    assert isinstance(verifier, BatchVerifier)
    rng = random.Random(3)
    prompts = ragged_prompts("verify-batch", 4)

    def states() -> list[Any]:
        return [verifier.prefill(p, reserve=40)[0] for p in prompts]

    trees = [random_tree(rng, rng.randrange(VOCAB), VOCAB, size) for size in (1, 9, 4, 13)]
    for topk in (0, 3):
        together = verifier.verify_batch(states(), trees, topk)
        lone = [verifier.verify(state, tree, topk) for state, tree in zip(states(), trees, strict=True)]
        for a, b in zip(together, lone, strict=True):
            assert (a.accepted_nodes, a.accepted_tokens, a.bonus) == (b.accepted_nodes, b.accepted_tokens, b.bonus)
            assert (a.feedback is None) == (b.feedback is None)
            if a.feedback is not None and b.feedback is not None:
                assert np.array_equal(a.feedback.topk, b.feedback.topk)


def test_verify_batch_refuses_what_it_cannot_verify() -> None:
    generator = specdec.Generator(tiny_model("llama"), drafter="none", engine="specdec")
    verifier: Any = generator.verifier
    state = verifier.prefill([3, 4, 5])[0]
    tree = DraftTree.single(6)
    with pytest.raises(SpecDecError, match="2 states but 1 trees"):
        verifier.verify_batch([state, state], [tree])
    with pytest.raises(SpecDecError, match="appears twice"):
        verifier.verify_batch([state, state], [tree, tree])
    verifier.release(state)
    with pytest.raises(SpecDecError, match="released"):
        verifier.verify_batch([state], [tree])


@pytest.mark.parametrize("chooser", ["greedy", "sampled"])
@pytest.mark.parametrize("topk", [0, 4])
def test_batched_cuda_ext_acceptance_equals_the_reference(chooser: str, topk: int) -> None:
    from specdec.backends.cuda_ext import ExtTreeOps, build

    native_or_skip("cuda_ext", build.load)
    ext, reference = ExtTreeOps("cpu"), TorchTreeOps()
    rng = random.Random(f"{chooser}-{topk}")
    for case in range(12):
        batch, size = rng.randrange(2, 6), rng.randrange(1, 12)
        trees = [random_tree(rng, rng.randrange(VOCAB), VOCAB, size) for _ in range(batch)]
        trees = [t.prefix(size) if t.size > size else t for t in trees]
        sizes = {t.size for t in trees}
        if len(sizes) != 1:  # random_tree may stop short of size: keep the batched path's case (one size)
            trees = [t.prefix(min(sizes)) for t in trees]
        rows = sum(t.size for t in trees)
        logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(case))
        logits[:, 7] = logits[:, 3] = logits.max() + 1.0  # ties: the lower id wins everywhere
        if case % 2:
            logits = logits.round()  # many ties
        positions = torch.tensor([20 + d for t in trees for d in t.depths])
        choosers: list[Any] = [
            Greedy() if chooser == "greedy" else PositionKeyedSampler(SamplingParams(0.8, 0, 1.0, seed=b))
            for b in range(batch)
        ]
        ours = ext.accept_rows(trees, logits.contiguous(), positions, choosers, topk)
        theirs = reference.accept_rows(trees, logits, positions, choosers, topk)
        for a, b in zip(ours, theirs, strict=True):
            assert (a.path, a.bonus) == (b.path, b.bonus)
            assert (a.topk is None and b.topk is None) or np.array_equal(a.topk, b.topk)  # type: ignore[arg-type]


# -- the batch planner ---------------------------------------------------------------------------------------


def flat_costs(base: float, per_row: float, sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64)) -> VerifyCostModel:
    table = CostTable(tuple(sizes), (64,), (tuple(base + per_row * s for s in sizes),), {})
    return VerifyCostModel(table, learn=False)


def planner_with(cost: VerifyCostModel, overhead: float = 0.001) -> BatchPlanner:
    throughputs: dict[int, Throughput] = {}

    def load() -> tuple[VerifyCostModel, float]:
        return cost, 0.0

    planner = BatchPlanner("auto", AcceptanceModel(), throughputs, load)
    for rows in range(1, 9):
        throughputs[rows] = Throughput(fixed_overhead_s=overhead)
    return planner


def labelled_trees(rng: random.Random, count: int) -> list[DraftTree]:
    trees = []
    for _ in range(count):
        tree = random_tree(rng, rng.randrange(VOCAB), VOCAB, rng.randrange(1, 9))
        features = tuple(rng.randrange(0, 6) for _ in range(tree.size))
        trees.append(DraftTree(tree.tokens, tree.parents, "pld", node_features=features))
    return trees


def test_the_batch_planners_one_sort_is_the_best_allocation() -> None:
    """Brute force over every row's node count: no allocation beats the planner's objective."""
    rng = random.Random(0)
    cost = flat_costs(0.02, 0.004)
    for _ in range(25):
        planner = planner_with(cost)
        trees = labelled_trees(rng, rng.randrange(1, 4))
        committed = [rng.randrange(10, 200) for _ in trees]
        plan = planner.plan(trees, committed)
        if any(p.reason == "probe" for p in plan.plans):
            continue
        probs = [planner.acceptance.estimate(t, specdec.budget.acceptance.node_keys(t))[1] for t in trees]
        context = plan.context
        rate = planner.throughput(len(trees)).rate(
            len(trees) / (float(cost.predict(np.array([len(trees)]), context)[0]) + 0.001))

        def objective(
            counts: Sequence[int], probs: list[Any] = probs, rate: float = rate, context: int = context
        ) -> float:
            gain = sum(1.0 + float(p[best_nodes(p, k)[1:]].sum()) for p, k in zip(probs, counts, strict=True))
            return gain - rate * float(cost.predict(np.array([sum(counts)]), context)[0])

        best = max(objective(c) for c in itertools.product(*(range(1, t.size + 1) for t in trees)))
        chosen = [p.tree.size for p in plan.plans]
        assert objective(chosen) >= best - 1e-9, (chosen, best)
        for row_plan, tree, p in zip(plan.plans, trees, probs, strict=True):  # each row's cut is its own best nodes
            assert row_plan.tree.tokens == tree.select(best_nodes(p, row_plan.tree.size).tolist()).tokens


def test_a_large_batch_on_a_compute_bound_forward_drafts_nothing() -> None:
    """Costs that grow with every row (past the memory-bound knee): no draft can beat the plain batched rate."""
    rng = random.Random(1)
    cheap = planner_with(flat_costs(0.02, 0.0001))  # rows nearly free: drafts pay
    dear = planner_with(flat_costs(0.001, 0.01))  # every row costs as much as the weights' pass: none pays
    trees = labelled_trees(rng, 8)
    assert cheap.plan(trees, [100] * 8).rows > 8
    plan = dear.plan(trees, [100] * 8)
    assert plan.rows == 8 and {p.reason for p in plan.plans} <= {"declined", "no draft"}


def test_the_batch_planner_never_expects_a_step_slower_per_token_than_plain_batched_decoding() -> None:
    rng = random.Random(2)
    for per_row in (0.0002, 0.002, 0.02):
        cost = flat_costs(0.02, per_row)
        planner = planner_with(cost)
        for _ in range(30):
            trees = labelled_trees(rng, rng.randrange(1, 9))
            plan = planner.plan(trees, [64] * len(trees))
            if any(p.reason == "probe" for p in plan.plans):
                continue
            batch = len(trees)
            expected = batch + sum(p.expected for p in plan.plans)
            plain = batch / (float(cost.predict(np.array([batch]), 64)[0]) + 0.001)
            assert expected / (float(plan.predicted_s or 0.0) + 0.001) >= plain * (1 - 1e-9)


def test_the_batch_planner_probes_twice_the_rows_now_and_then() -> None:
    planner = planner_with(flat_costs(0.001, 0.01))
    rng = random.Random(4)
    reasons = []
    for _ in range(40):
        trees = labelled_trees(rng, 4)
        plan = planner.plan(trees, [64] * 4)
        probed = any(p.reason == "probe" for p in plan.plans)
        reasons.append("probe" if probed else "plan")
        if probed:
            assert plan.rows == min(8, sum(t.size for t in trees))
    assert 1 <= reasons.count("probe") <= 3


def test_a_row_drafts_while_its_gain_pays_for_its_drafting_and_probes_otherwise() -> None:
    """RowGate: clock-free, from the gains and costs fed to it (batch_planner's module docstring)."""
    gate = RowGate()
    assert gate.drafts(0.004)  # nothing measured yet: draft
    gate.observe(0, 0.001)  # drafting gained nothing and cost a millisecond
    decisions = [gate.drafts(0.004) for _ in range(3 * ROW_PROBE_EVERY)]
    assert decisions.count(True) == 3 and decisions[ROW_PROBE_EVERY - 1]  # one probe in ROW_PROBE_EVERY steps
    for _ in range(5):
        gate.observe(2, 0.001)  # the text turned repetitive: two extra tokens a step
    assert all(gate.drafts(0.004) for _ in range(3 * ROW_PROBE_EVERY))  # 2 x 4 ms >> 1 ms: always
    assert not gate.drafts(0.0001)  # at a tenth of a millisecond per token, 2 tokens do not pay 1 ms


def test_a_batch_guard_runs_the_faster_way_and_the_other_once_in_a_while() -> None:
    """BatchGuard: clock-free, from the steps fed to it. Drafting is measured first (its first draft loads
    the cost model), then plain steps; then the way whose rate leads runs, the other now and then (a
    drafting step once in GUARD_EXPLORE_DRAFTING while plain leads, a plain one once in GUARD_EXPLORE_EVERY
    while drafting leads), and a lead that turns is followed."""
    guard = BatchGuard()
    for _ in range(GUARD_MIN_STEPS):
        assert guard.drafts()
        guard.observe(True, 10, 0.040)  # drafting: 250 tokens/s
    for _ in range(GUARD_MIN_STEPS):
        assert not guard.drafts()
        guard.observe(False, 8, 0.030)  # plain: 267 tokens/s, faster
    decisions = [guard.drafts() for _ in range(3 * GUARD_EXPLORE_DRAFTING)]
    assert decisions.count(True) == 3 and decisions[GUARD_EXPLORE_DRAFTING - 1]  # plain leads; drafting explored
    for _ in range(10):
        guard.observe(True, 14, 0.040)  # the text turned repetitive: drafting 350 tokens/s
    decisions = [guard.drafts() for _ in range(3 * GUARD_EXPLORE_EVERY)]
    assert decisions.count(False) == 3 and not decisions[-1]  # drafting leads; plain explored once in 16
    guard.observe(False, 8, 0.0)  # a step that took no measurable time is not a rate
    assert guard.plain.steps == GUARD_MIN_STEPS


def test_the_batch_planner_keeps_a_guard_per_number_of_rows_under_the_auto_budget_only() -> None:
    cost = flat_costs(0.02, 0.004)
    guards: dict[int, BatchGuard] = {}
    auto = BatchPlanner("auto", AcceptanceModel(), {}, lambda: (cost, 0.0), guards)
    four = auto.guard(4)
    assert four is not None and auto.guard(4) is four and auto.guard(2) is not four
    assert set(guards) == {2, 4}  # the caller's dict: a Generator keeps its guards across calls
    assert BatchPlanner("full", AcceptanceModel(), {}, lambda: (cost, 0.0)).guard(4) is None
    assert BatchPlanner(6, AcceptanceModel(), {}, lambda: (cost, 0.0)).guard(4) is None


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_steps_the_guard_keeps_plain_draft_nowhere_and_stay_lossless(arch: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Under budget="auto", a step the batch's guard keeps plain asks no row's drafter (every row verifies
    its pending token alone, its drafter still learning the committed tokens), a step it lets draft
    leaves the choice to the rows' gates and the planner; the guard is fed each step's kind and tokens.
    A scripted guard (random, seeded) mixes both kinds: every row equals its lone plain decoding."""
    model = tiny_model(arch)
    chosen = engine_for(arch)
    prompts = ragged_prompts(f"guarded-{arch}", 6)
    truth = alone(model, prompts, chosen, max_new_tokens=MAX_NEW)
    rng = random.Random(f"guard-{arch}")
    decisions: list[bool] = []
    fed: list[tuple[bool, int]] = []
    proposals: list[int] = []  # per step: the rows whose drafter was asked

    def scripted(self: BatchGuard) -> bool:
        decisions.append(rng.random() < 0.5)
        proposals.append(0)
        return decisions[-1]

    def recording(self: BatchGuard, drafted: bool, tokens: int, seconds: float) -> None:
        fed.append((drafted, tokens))

    monkeypatch.setattr(BatchGuard, "drafts", scripted)
    monkeypatch.setattr(BatchGuard, "observe", recording)
    oracle = OracleTreeFactory({tuple(p): t for p, t in zip(prompts, truth, strict=True)}, VOCAB, size=12, depth=5)
    draft = engine.LiveSequence.draft

    def counted(self: Any, drafting: bool = True) -> Any:
        proposals[-1] += drafting
        return draft(self, drafting)

    monkeypatch.setattr(engine.LiveSequence, "draft", counted)
    generator = specdec.Generator(model, drafter=oracle, engine=chosen, budget="auto")
    results = generator.generate_batch(prompts, batch_size=4, max_new_tokens=MAX_NEW)
    assert [r.tokens for r in results] == truth
    IDENTITY_COUNTS[f"{arch}/batch-guarded/oracle"] += len(results)
    assert decisions.count(True) > 5 and decisions.count(False) > 5
    assert [drafted for drafted, _ in fed] == decisions  # every step fed back as the kind it was
    assert all(asked == 0 for asked, allowed in zip(proposals, decisions, strict=True) if not allowed)
    assert sum(asked for asked, allowed in zip(proposals, decisions, strict=True) if allowed) > 5
    assert sum(tokens for _, tokens in fed) == sum(r.stats.emitted_by_steps for r in results)


def test_the_batch_planner_gates_rows_only_under_the_auto_budget() -> None:
    cost = flat_costs(0.02, 0.004)
    auto = planner_with(cost)
    auto.plan(labelled_trees(random.Random(5), 4), [64] * 4)  # loads the cost model
    gate = RowGate()
    gate.observe(0, 1.0)  # a second of drafting for nothing
    price = auto.plain_seconds_per_token(4)
    assert price is not None and not gate.drafts(price)
    full = BatchPlanner("full", AcceptanceModel(), {}, lambda: (cost, 0.0))
    assert full.plain_seconds_per_token(4) is None  # a fixed budget drafts every row: the user asked for its trees


def test_a_batch_plan_prices_what_each_rows_draft_added_to_the_forward() -> None:
    """BatchPlan.extra_s: the predicted forward less a plain step's; each row's share by its draft nodes (the
    rows' gates weigh their accepted tokens net of it)."""
    cost = flat_costs(0.02, 0.004)
    planner = planner_with(cost)
    rng = random.Random(8)
    drafted = 0
    for _ in range(30):
        trees = labelled_trees(rng, 4)
        plan = planner.plan(trees, [64] * 4)
        plain = float(cost.predict(np.array([4]), 64)[0])
        assert plan.predicted_s is not None
        assert plan.extra_s == pytest.approx(plan.predicted_s - plain)
        shares = [plan.extra_seconds(b) for b in range(4)]
        assert sum(shares) == pytest.approx(plan.extra_s)
        for b, row_plan in enumerate(plan.plans):
            assert shares[b] == pytest.approx(0.004 * (row_plan.tree.size - 1))  # the flat curve: 4 ms a node
        drafted += plan.rows > 4
    assert drafted > 5
    full = BatchPlanner("full", AcceptanceModel(), {}, lambda: (cost, 0.0))
    full.plan(labelled_trees(rng, 4), [64] * 4)  # loads the cost model
    trees = labelled_trees(rng, 4)
    plan = full.plan(trees, [64] * 4)
    assert plan.extra_s == pytest.approx(0.004 * (sum(t.size for t in trees) - 4))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_rows_gate_weighs_its_accepted_tokens_net_of_the_rows_they_cost(arch: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Under budget="auto" each drafting row's gate is fed its accepted draft tokens less its share of the
    forward's extra seconds in plain tokens: never more than it accepted, less whenever its draft added rows.
    The batch's cost model is a fixed curve (1 ms a row over 20 ms), so what a node is charged does not
    depend on this machine's timings: ~0.15 plain tokens at four rows (an earlier version read the
    calibrated curve, on which a loaded machine's extra rows came out nearly free)."""
    model = tiny_model(arch)
    cost = flat_costs(0.02, 0.001)
    monkeypatch.setattr(PlannerMemory, "load_batch_cost", lambda self, verifier: (cost, 0.0))
    chosen = engine_for(arch)
    prompts = ragged_prompts(f"net-{arch}", 6)
    truth = alone(model, prompts, chosen, max_new_tokens=MAX_NEW)
    fed: list[float] = []
    observe = RowGate.observe

    def recording(self: RowGate, extra_tokens: float, cost_s: float) -> None:
        fed.append(extra_tokens)
        observe(self, extra_tokens, cost_s)

    monkeypatch.setattr(RowGate, "observe", recording)
    oracle = OracleTreeFactory({tuple(p): t for p, t in zip(prompts, truth, strict=True)}, VOCAB, size=12, depth=5)
    generator = specdec.Generator(model, drafter=oracle, engine=chosen, budget="auto")
    results = generator.generate_batch(prompts, batch_size=4, max_new_tokens=MAX_NEW)
    assert [r.tokens for r in results] == truth
    IDENTITY_COUNTS[f"{arch}/batch-net-gate/oracle"] += len(results)
    accepted = sum(r.accepted for result in results for r in result.stats.records)  # undrafted rows: 0
    assert len(fed) > 20 and any(gain != int(gain) for gain in fed)  # fractions: rows' seconds were charged
    assert accepted > 20 and sum(fed) < 0.95 * accepted, (sum(fed), accepted)  # every accepted node was charged


def test_the_rows_gates_start_afresh_when_the_batch_shrinks_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once no prompt is left to take a finished row's place, every shrink of the batch gives its rows new
    gates: what their drafting gained was learned at more rows, where an extra row cost more of a plain
    token's time (measured at B = 8 on this CPU: the last rows drafted in 20 of 162 row-steps, one lone
    row in none of its 9). While prompts wait, a finished row's place is taken and the others keep theirs.
    The last row offers its drafter's whole tree, as a lone sequence does, not a batch row's offer."""
    model = tiny_model("llama")
    monkeypatch.setattr(PlannerMemory, "load_batch_cost", lambda self, verifier: (flat_costs(0.02, 0.001), 0.0))
    prompts = ragged_prompts("tail-gates", 5)  # the fifth joins late and ends alone
    truth = alone(model, prompts, "specdec", max_new_tokens=MAX_NEW)
    steps: list[list[int]] = []  # per step, each row's gate's drafted steps when it was asked
    drafts = RowGate.drafts

    def recording(self: RowGate, seconds_per_token: float) -> bool:
        steps[-1].append(self.drafted_steps)
        return drafts(self, seconds_per_token)

    step = batching.step

    def marked(*args: Any) -> Any:
        steps.append([])
        return step(*args)

    monkeypatch.setattr(RowGate, "drafts", recording)
    monkeypatch.setattr(batching, "step", marked)
    monkeypatch.setattr(BatchGuard, "drafts", lambda self: True)  # the gates alone decide (the guard: apart)
    oracle = OracleTreeFactory({tuple(p): t for p, t in zip(prompts, truth, strict=True)}, VOCAB, size=40, depth=8)
    generator = specdec.Generator(model, drafter=oracle, engine="specdec", budget="auto")
    results = generator.generate_batch(prompts, batch_size=4, max_new_tokens=MAX_NEW)
    assert [r.tokens for r in results] == truth
    IDENTITY_COUNTS["llama/batch-tail-gates/oracle"] += len(results)
    records = [r for result in results for r in result.stats.records if r.reason != "no draft"]
    assert max(r.offered for r in records if r.batch_rows > 1) == ROW_OFFER_NODES
    assert max(r.offered for r in records if r.batch_rows == 1) > ROW_OFFER_NODES  # the last row, alone
    assert steps[0] == []  # the first step drafts everywhere: its plan loads the cost model the gates price with
    steps = steps[1:]
    sizes = [len(asked) for asked in steps]
    tail = sizes.index(next(size for size in sizes if size < 4))  # the first step with a place left empty
    shrinks = [i for i in range(tail, len(sizes)) if sizes[i] < sizes[i - 1]]
    assert shrinks and shrinks[0] == tail
    for i in shrinks:  # every row starts afresh: its gate has seen no drafting step
        assert steps[i] == [0] * sizes[i], (i, steps[i])
    full = [asked for asked in steps[:tail] if len(asked) == 4]
    assert any(max(asked) > 0 for asked in full)  # before the tail, gates keep what they learned


def test_only_the_rows_that_verified_a_draft_age_the_acceptance_statistics() -> None:
    """BatchPlanner.observe: a row that verified its pending token alone holds no trial, so the acceptance
    model's clock (the decay of its counts) ticks once per drafted row, not once per row of the batch."""
    planner = planner_with(flat_costs(0.02, 0.0001))  # rows nearly free: the drafted row keeps its nodes
    drafted = labelled_trees(random.Random(9), 1)[0]
    trees = [DraftTree.single(7), drafted, DraftTree.single(8), DraftTree.single(9)]
    plan = planner.plan(trees, [64] * 4)
    assert [p.tree.size > 1 for p in plan.plans] == [False, True, False, False]
    planner.observe(plan, [(0,), (0, 1), (0,), (0,)], 0.03, 0.031)
    assert planner.acceptance.steps == 1
    planner.observe(plan, [(0,), (0,), (0,), (0,)], 0.03, 0.031)
    assert planner.acceptance.steps == 2


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_batch_row_asks_its_drafter_for_at_most_the_row_offer_under_auto(arch: str) -> None:
    """Under budget="auto" a row of a batch of two or more offers at most ROW_OFFER_NODES nodes (the planner
    verifies few of them); a lone row, and every row under a full budget, offers its drafter's whole tree.
    (So does the last row of a drained batch, once alone: test_the_rows_gates_start_afresh_...)"""
    model = tiny_model(arch)
    chosen = engine_for(arch)
    prompts = ragged_prompts(f"offer-{arch}", 5)
    truth = alone(model, prompts, chosen, max_new_tokens=MAX_NEW)
    oracle = OracleTreeFactory({tuple(p): t for p, t in zip(prompts, truth, strict=True)}, VOCAB, size=40, depth=8)

    def offers(batch_size: int, budget: str) -> list[int]:
        generator = specdec.Generator(model, drafter=oracle, engine=chosen, budget=budget)
        results = generator.generate_batch(prompts, batch_size=batch_size, max_new_tokens=MAX_NEW)
        assert [r.tokens for r in results] == truth, f"{arch}/{budget}/{batch_size}"
        IDENTITY_COUNTS[f"{arch}/batch-offer/{budget}"] += len(results)
        return [r.offered for result in results for r in result.stats.records
                if r.reason != "no draft" and (r.batch_rows > 1 or batch_size == 1)]  # fmt: skip

    capped = offers(3, "auto")
    assert capped and max(capped) == ROW_OFFER_NODES
    assert max(offers(1, "auto")) > ROW_OFFER_NODES
    assert max(offers(3, "full")) > ROW_OFFER_NODES


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_rows_whose_drafting_is_skipped_stay_lossless(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under budget="auto", rows the gate keeps from drafting verify their pending token alone while
    others draft in the same forward; the drafters still learn every committed token. A scripted gate
    (random decisions, seeded) makes both kinds of row meet in many steps: every row equals its lone
    plain decoding."""
    model = tiny_model(arch)
    chosen = engine_for(arch)
    prompts = ragged_prompts(f"gated-{arch}", 6)
    truth = alone(model, prompts, chosen, max_new_tokens=MAX_NEW)
    rng = random.Random(arch)
    decisions: list[bool] = []

    def scripted(self: RowGate, seconds_per_token: float) -> bool:
        decisions.append(rng.random() < 0.5)
        return decisions[-1]

    monkeypatch.setattr(RowGate, "drafts", scripted)
    oracle = OracleTreeFactory({tuple(p): t for p, t in zip(prompts, truth, strict=True)}, VOCAB, size=12, depth=5)
    for drafter in (oracle, "sam+recycling"):
        decisions.clear()
        generator = specdec.Generator(model, drafter=drafter, engine=chosen, budget="auto")
        results = generator.generate_batch(prompts, batch_size=4, max_new_tokens=MAX_NEW)
        assert [r.tokens for r in results] == truth, f"{arch}/{drafter}"
        assert decisions.count(True) > 10 and decisions.count(False) > 10
        IDENTITY_COUNTS[f"{arch}/batch-gated/{getattr(drafter, 'name', drafter)}"] += len(results)


# -- the API: options, bad input, memory ---------------------------------------------------------------------


def test_bad_input_is_refused_before_any_work() -> None:
    model = tiny_model("llama")
    generator = specdec.Generator(model, drafter="pld", engine="specdec")
    prefills: list[int] = []
    prefill = generator.verifier.prefill

    def counted(*args: Any, **kwargs: Any) -> Any:
        prefills.append(1)
        return prefill(*args, **kwargs)

    generator.verifier.prefill = counted  # type: ignore[method-assign]
    good = [3, 4, 5]
    with pytest.raises(SpecDecError, match="prompt 2: the prompt is empty"):
        generator.generate_batch([good, good, []], max_new_tokens=4)
    with pytest.raises(SpecDecError, match="prompt 1 has 300 tokens, past the model's context length of 256"):
        generator.generate_batch([good, [3] * 300], max_new_tokens=4)
    with pytest.raises(SpecDecError, match="prompt 0: token id 96 is outside"):
        generator.generate_batch([[96]], max_new_tokens=4)
    with pytest.raises(SpecDecError, match="batch_size must be a positive int"):
        generator.generate_batch([good], batch_size=0)
    with pytest.raises(SpecDecError, match="a list of prompts"):
        generator.generate_batch("one string", max_new_tokens=4)  # type: ignore[arg-type]
    with pytest.raises(SpecDecError, match="seeds must be a list of 2 ints"):
        generator.generate_batch([good, good], seeds=[1], do_sample=True)
    with pytest.raises(SpecDecError, match="not both"):
        generator.generate_batch([good, good], seeds=[1, 2], seed=3, do_sample=True)
    with pytest.raises(SpecDecError, match="max_new_tokens must be at least 1"):
        generator.generate_batch([good], max_new_tokens=0)
    with pytest.raises(SpecDecError, match="does not stream"):
        specdec.run_batch(model, [good], "pld", on_tokens=print)
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        specdec.run_batch(model, [good], "pld", colour=1)  # type: ignore[call-arg]
    own = specdec.make_factory("pld").create()
    with pytest.raises(SpecDecError, match="its own drafter"):
        specdec.Generator(model, drafter=own, engine="specdec").generate_batch([good, good], batch_size=2)
    assert not prefills  # nothing ran
    assert generator.generate_batch([], max_new_tokens=4) == []


def test_a_batch_too_large_for_memory_is_refused_naming_the_batch_size_that_fits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = tiny_model("llama")
    generator = specdec.Generator(model, drafter="none", engine="specdec")
    verifier: Any = generator.verifier
    prompts = ragged_prompts("memory", 6)
    row = verifier.row_bytes(max(len(p) for p in prompts) + 8 + 512)
    monkeypatch.setattr(api, "available_memory", lambda device: int(3.5 * row / 0.8))
    with pytest.raises(SpecDecError, match=r"a batch of 6 rows needs .* pass batch_size=3 or less"):
        generator.generate_batch(prompts, batch_size=6, max_new_tokens=8)
    results = generator.generate_batch(prompts, batch_size=3, max_new_tokens=8)
    assert [r.tokens for r in results] == alone(model, prompts, "specdec", max_new_tokens=8)
    requests = [BatchRequest(i, p, generator.decoding_config(max_new_tokens=8)) for i, p in enumerate(prompts)]
    assert check_memory(verifier, requests, 2, None) == 2 * row


def test_row_bytes_bound_a_rows_cache() -> None:
    model = tiny_model("llama")
    generator = specdec.Generator(model, drafter="pld", engine="specdec", budget="full")
    verifier: Any = generator.verifier
    seen: list[int] = []
    verify = verifier.verify_batch

    def watched(states: Sequence[Any], trees: Sequence[DraftTree], topk: int = 0, features: bool = False) -> Any:
        seen.extend(state.cache.nbytes for state in states)
        return verify(states, trees, topk, features)

    verifier.verify_batch = watched
    prompt = [3, 4, 5, 6] * 30
    generator.generate_batch([prompt], max_new_tokens=100, max_nodes=16)
    assert 0 < max(seen) <= verifier.row_bytes(len(prompt) + 100 + 16)


def test_every_finished_row_feeds_the_shared_store() -> None:
    model = tiny_model("llama")
    store = specdec.SharedStore()
    generator = specdec.Generator(model, drafter="sam", engine="specdec", store=store)
    prompts = ragged_prompts("store", 5)
    generator.generate_batch(prompts, batch_size=2, max_new_tokens=12)
    assert store.num_sequences == len(prompts)


def test_each_rows_step_records_say_how_many_rows_shared_the_step() -> None:
    """A batched step's records carry its seconds and its row count (``StepRecord.step_s``, ``batch_rows``), so
    what a step cost is counted once however many rows it advanced: ``specdec bench batch`` splits a run
    into its full-batch steps and its tail (:func:`specdec.bench.batched.step_split`) from these alone."""
    from specdec.bench.batched import step_split

    model = tiny_model("llama")
    prompts = ragged_prompts("shared steps", 5)
    for drafter in ("none", "pld"):
        generator = specdec.Generator(model, drafter=drafter, engine="specdec")
        live: list[int] = []

        def watched(states: Sequence[Any], trees: Sequence[DraftTree], topk: int = 0, features: bool = False, *,
                    original: Any = generator.verifier.verify_batch,  # type: ignore[attr-defined]
                    live: list[int] = live) -> Any:  # fmt: skip
            live.append(len(states))
            return original(states, trees, topk, features)

        generator.verifier.verify_batch = watched  # type: ignore[attr-defined]
        results = generator.generate_batch(prompts, batch_size=2, max_new_tokens=10)
        records = [record for result in results for record in result.stats.records]
        assert all(record.step_s > 0 and 1 <= record.batch_rows <= 2 for record in records)
        # every step counted once: its r rows' records each carry 1 / r of it
        assert sum(1 / record.batch_rows for record in records) == pytest.approx(len(live))
        assert sorted(record.batch_rows for record in records) == sorted(r for r in live for _ in range(r))
        split = step_split(results)
        assert split["full_tokens"] + split["tail_tokens"] == sum(r.stats.emitted_by_steps for r in results)
        assert split["full_s"] + split["tail_s"] == pytest.approx(sum(r.step_s / r.batch_rows for r in records),
                                                                  abs=1e-3)  # fmt: skip
        if drafter == "none":  # one token a step: rows 0-1 and 2-3 finish together, row 4 runs alone
            pairs = [(results[a].stats.records, results[a + 1].stats.records) for a in (0, 2)]
            assert all(x.step_s == y.step_s and x.batch_rows == y.batch_rows == 2 for a, b in pairs
                       for x, y in zip(a, b, strict=True))  # fmt: skip
            assert {record.batch_rows for record in results[4].stats.records} == {1}
            assert split["full_tokens"] == 4 * 9 and split["tail_tokens"] == 9  # the prefill gives each its first


def test_per_row_stats() -> None:
    model = tiny_model("llama")
    prompts = ragged_prompts("stats", 4)
    results = specdec.run_batch(model, prompts, "pld", batch_size=2, max_new_tokens=20, engine="specdec")
    for result, prompt in zip(results, prompts, strict=True):
        stats = result.stats
        assert stats.prompt_tokens == len(prompt) and stats.new_tokens == len(result.tokens) == 20
        assert stats.steps == len(stats.records) and stats.budget == "auto" and stats.engine == "specdec"
        assert stats.total_s >= stats.prefill_s + stats.verify_s and stats.mat >= 1.0


def test_a_recycling_snapshot_puts_the_shared_matrix_back() -> None:
    """``specdec bench batch`` starts every timed run from one matrix: what a run learned is undone."""
    from specdec.drafters import recycling_state

    shared = recycling_state.SharedMatrices("snapshot-test", VOCAB, persist=False)
    matrix = shared.get(4)
    matrix.array[3] = [5, 6, 7, 8]
    saved = recycling_state.snapshot_shared()
    matrix.array[3] = [9, 9, 9, 9]
    matrix.grow(4 * VOCAB)  # a run may grow it: the holder gets a new array
    recycling_state.restore_shared(saved)
    assert matrix.array.shape[0] == VOCAB + 1 and list(matrix.array[3]) == [5, 6, 7, 8]
    assert shared.get(4) is matrix
