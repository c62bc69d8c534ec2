"""The batch's decision rule: how many draft nodes each row verifies, from the cost of the whole forward.

A batched step verifies every row's tree in one forward (:mod:`specdec.batching`): ``B`` rows
with trees of ``k_b`` nodes cost ``cost(R, C)`` for ``R = sum_b k_b`` rows in all (on
``engine="specdec"`` there is no padding: the forward's linear layers see exactly ``R`` rows).
The rule of :mod:`specdec.budget.planner`, written for the batch, maximizes

    sum_b E_b(k_b) - rate * cost(sum_b k_b, C)          E_b(k) = 1 + (sum of row b's k - 1 largest p)

with ``p`` each node's acceptance probability (:mod:`specdec.budget.acceptance`, one model for
every row) and ``rate`` the batch's throughput in tokens per second.

**One sort for the whole batch.** The cost depends on the rows' total alone, so for ``B + j``
rows in all the best allocation verifies the ``j`` non-root nodes of largest ``p`` over all
rows; each row's share is then its own largest ones, a prefix-closed subtree (``p`` never grows
from a parent to its child), exactly the tree :func:`~specdec.budget.planner.best_nodes` cuts
for it. So the decision is :func:`~specdec.budget.planner.choose_budget` over the rows' pooled
nodes: sort, cumulate, subtract ``rate * cost(B + j, C)`` for every ``j``, keep the best ``j``.
O(M log M) for ``M`` offered non-root nodes.

**Never slower per token than plain batched decoding.** ``rate`` is floored at plain batched
decoding's, ``B / (cost(B, C) + overhead)``. A step then drafts only where ``E - B > rate *
(cost(B + j) - cost(B))``, which implies ``E / (cost(B + j) + overhead) > B / (cost(B) +
overhead)``: in expectation every drafting step beats a plain batched step. A large batch has
a high plain rate, and its forward is past the point where more rows cost little (the
CPU's forwards turn compute-bound at a few dozen rows), so it drafts little or nothing
(docs/budget.md, "Batches", has the measured curve).

**Costs.** The calibration's table (cost by rows: one chain after ``C`` tokens, kernels
chosen by rows) prices the forward; ``C`` is the rows' mean committed length. A batched step
also pays per row (attention per row over its own cache, acceptance, compaction), so the
batch has a cost model of its own, from the same table, refined online from batched steps
only: what it learns never bends a lone sequence's budgets. The rate is kept per number of
rows (:class:`~specdec.budget.planner.Throughput` each), since a batch of 2 and a batch of 8
run at different rates.

**Probes**: every :data:`PROBE_EVERY`-th step on
which the rule cut some tree verifies the next best nodes up to twice the rows (``R = 2(B +
j)``), so the sizes just past the decision keep being measured. (A lone sequence's probes are on
a time budget instead, :data:`~specdec.budget.planner.CUT_PROBE_SHARE`; the batch keeps its
cadence, which was measured with the row gates below and not measured again since.)

**Which rows draft at all.** The rule above weighs the forward's extra rows against the tokens
they are expected to bring; it cannot weigh what a row's drafting itself costs, since that is
spent before there is a tree to plan (a ``sam+recycling`` row drafts, is planned and learns in
far less than a forward, but drafting on every row of a large batch made it slower than plain
batched decoding: docs/budget.md). So under
``budget="auto"`` each row has a :class:`RowGate`: the row drafts while the tokens its drafts
gained lately, at the batch's seconds per token, are worth the seconds its drafting took;
a drafting step's gain is net of what its verification cost: the accepted draft tokens less
the row's share of the forward's extra seconds (:meth:`BatchPlan.extra_seconds`) in plain
tokens. The planner verifies a node when its expected acceptance beats the extra rows' price,
so its nodes gain little over that price where it is high (docs/budget.md, "Batches"); counting
gross tokens kept such rows drafting for nodes that paid for their rows and not for
their drafting (``specdec bench batch``; figures in docs/budget.md).
Otherwise it verifies its pending token alone (its drafter is not asked, but still learns the
committed tokens, so its next draft continues the text), and drafts again one step in
:data:`ROW_PROBE_EVERY` to see whether its text turned repetitive. Rows that copy from their
prompt keep drafting beside rows that do not. Lossless either way: a skipped draft is a
one-node tree. **The tail**: once no prompt is left to take a finished row's place, every shrink
of the batch gives its rows new gates (:func:`specdec.batching.decode_batch`), since what a gate
learned was priced at more rows (before that, the rows left at the end hardly drafted, though one
row alone gains from drafting).

**Whether the batch drafts at all** (:class:`BatchGuard`, measured). The rule and the gates decide
from models; what the models miss (the cost model's error at the sizes a batch meets, the
verification's feedback, the rows' learning, the machine's caches) shows only on the clock. So
under ``"auto"`` each number of rows also keeps a guard that times whole steps two ways: steps on
which the gates and the rule decide, and plain steps on which no row is asked to draft. The batch
runs the way whose rate leads and the other now and then (:class:`BatchGuard`; measured neutral
within the noise: docs/budget.md, "Whether the batch drafts at all"). What it adds is a bound: where
drafting leads it costs at most one plain step in 16; where a model's error makes drafting lose
it runs plain but for one drafting step in 4.

**What a row offers.** Under ``"auto"`` a row of a batch of two or more asks its drafter for at
most :data:`ROW_OFFER_NODES` nodes (root included; a merged tree larger than that keeps its best
nodes by the acceptance model). The drafters offer ~110 nodes when asked for more, and the rule
verifies few of them (a handful at the median, more than 16 rarely); a 16-node offer is cheaper to
draft, plan and learn than the whole trees, and the cheaper drafting keeps more rows'
:class:`RowGate` open (docs/budget.md, "Batches"). A lone row
(``batch_size=1``) offers what the single-sequence path does.

Budgets ``"full"`` and a node count cut each row's tree as for one sequence (the engine caps a
fixed budget's trees already); the plans still carry each row's expected acceptance and the
forward's predicted cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from specdec.budget.acceptance import AcceptanceModel, NodeKey, node_keys
from specdec.budget.cost_model import VerifyCostModel
from specdec.budget.planner import Budget, BudgetPlanner, Plan, Throughput, choose_budget
from specdec.types import DraftTree

PROBE_EVERY = 16  # one step in this many on which the rule cut some tree verifies twice the extra rows
ROW_PROBE_EVERY = 8  # a row whose drafting does not pay drafts again after this many steps without
ROW_OFFER_NODES = 16  # the most nodes a row of a batch asks its drafter for under budget="auto" (module docstring)
GUARD_MIN_STEPS = 8  # steps a BatchGuard measures each way before it compares them
GUARD_EXPLORE_EVERY = 16  # while drafting leads, a BatchGuard runs a plain step once in this many steps
GUARD_EXPLORE_DRAFTING = 4  # while plain steps lead, a drafting step once in this many (BatchGuard's docstring)


@dataclass
class StepRate:
    """Decayed sums of the tokens and seconds of one kind of batched step (drafting allowed, or not)."""

    memory: float = 0.95  # per step of this kind: ~20 recent ones weigh in (one step's time is noisy: +-20% here)
    tokens: float = 0.0
    seconds: float = 0.0
    steps: int = 0

    def observe(self, tokens: int, seconds: float) -> None:
        self.tokens = self.memory * self.tokens + tokens
        self.seconds = self.memory * self.seconds + seconds
        self.steps += 1

    @property
    def rate(self) -> float:
        """Tokens per second lately (0.0 before any step)."""
        return self.tokens / self.seconds if self.seconds > 0.0 else 0.0


@dataclass
class BatchGuard:
    """Whether a batch of ``B`` rows drafts at all: the measured rate of its drafting steps against plain ones.

    The planner and the :class:`RowGate` decide from models (the forward's cost by rows, each node's
    acceptance, each row's drafting seconds); what they leave out (a model's error, the drafters'
    learning, the machine's caches) shows only on the clock. So under ``budget="auto"`` every number of
    rows keeps a guard: ``drafting`` and ``plain`` are decayed sums of the tokens and the whole seconds
    of steps on which the rows' gates and the planner decided (``drafting``) and of steps on which no
    row was asked to draft (``plain``: batched plain decoding, its drafters learning the committed
    tokens and the model's feedback as ever). After :data:`GUARD_MIN_STEPS` steps each way (drafting
    first: the first draft loads the cost model), the batch runs the way whose rate leads and the other
    now and then, so a lead that turns is seen: while drafting leads, a plain step once in
    :data:`GUARD_EXPLORE_EVERY`; while plain steps lead, a drafting step once in
    :data:`GUARD_EXPLORE_DRAFTING`, since a drafting step's rate swings with the text (a stretch of
    prose, then code that repeats) and a figure measured in a bad stretch must not hold the batch plain
    for long. The decision depends on the observed figures only: tests and replays feed them.
    """

    drafting: StepRate = field(default_factory=StepRate)
    plain: StepRate = field(default_factory=StepRate)
    since_explored: int = 0

    def drafts(self) -> bool:
        """Whether this step's rows may draft (their gates and the planner decide which do)."""
        if self.drafting.steps < GUARD_MIN_STEPS:
            return True
        if self.plain.steps < GUARD_MIN_STEPS:
            return False
        leads = self.drafting.rate >= self.plain.rate
        self.since_explored += 1
        if self.since_explored >= (GUARD_EXPLORE_EVERY if leads else GUARD_EXPLORE_DRAFTING):
            self.since_explored = 0
            return not leads
        return leads

    def observe(self, drafted: bool, tokens: int, seconds: float) -> None:
        """A step of the batch: ``drafted`` (its rows were allowed to), ``tokens`` emitted in ``seconds``."""
        if seconds > 0.0:
            (self.drafting if drafted else self.plain).observe(tokens, seconds)


LONE_MIN_STEPS = 8  # drafting steps a LoneGuard measures before it judges them
LONE_MIN_PLAIN = 4  # plain steps before their own rate stands in for the cost model's estimate
LONE_LOSS = 0.9  # drafting steps that realize less than this share of the plain rate back off
LONE_BACKOFF = (8, 64)  # plain steps a back-off lasts: the first, and the most after doubling at each loss


@dataclass
class LoneGuard:
    """Whether a lone sequence's steps may draft: the rate its drafting steps realize against its plain steps.

    The rule (:mod:`specdec.budget.planner`) verifies a draft only where its model says it pays; the
    model can be wrong where the clock is not (a cost table far from this machine's present load, a
    drafter whose drafts are cheap to verify but dear to make). So the guard keeps decayed rates of
    what the steps really gave: tokens over whole step seconds, for steps whose drafter offered a
    draft (verified or declined by the planner: either way its drafting was paid) and for plain ones
    (nothing offered; where there are fewer than :data:`LONE_MIN_PLAIN` of those, ``estimate()``, the
    cost model's plain rate, stands in). When drafting steps realize less than :data:`LONE_LOSS` of
    the plain rate after :data:`LONE_MIN_STEPS` of them, the next ``wait`` steps run plain (the
    drafters still learn the committed tokens and the model's feedback), then drafting is measured
    afresh; each loss in a row doubles the wait, up to ``LONE_BACKOFF[1]``, and a drafting stretch
    that wins resets it. The decision depends on the
    observed figures only: tests feed them.
    """

    estimate: Callable[[], float | None] = lambda: None
    drafting: StepRate = field(default_factory=lambda: StepRate(memory=0.9))
    plain: StepRate = field(default_factory=lambda: StepRate(memory=0.9))
    backoff: int = 0  # plain steps left in the present back-off
    wait: int = LONE_BACKOFF[0]  # the next back-off's length
    backoffs: int = 0  # back-offs so far (stats, tests)
    last_drafted: bool = False  # whether the step being observed was offered a draft (set by LonePlanner.observe)

    def drafts(self) -> bool:
        """Whether this step may draft."""
        if self.backoff > 0:
            self.backoff -= 1
            return False
        return True

    def plain_rate(self) -> float | None:
        """Plain steps' tokens per second lately: measured, or the cost model's estimate."""
        if self.plain.steps >= LONE_MIN_PLAIN:
            return self.plain.rate
        return self.estimate()

    def observe(self, drafting: bool, tokens: int, seconds: float) -> None:
        """A step: ``drafting`` (it was allowed to draft), ``tokens`` emitted in ``seconds``."""
        if seconds <= 0.0:
            return
        drafted = drafting and self.last_drafted
        self.last_drafted = False
        (self.drafting if drafted else self.plain).observe(tokens, seconds)
        plain = self.plain_rate()
        if not drafted or self.drafting.steps < LONE_MIN_STEPS or plain is None:
            return
        if self.drafting.rate < LONE_LOSS * plain:
            self.backoff, self.backoffs = self.wait, self.backoffs + 1
            self.wait = min(2 * self.wait, LONE_BACKOFF[1])
            self.drafting = StepRate(memory=self.drafting.memory)  # measured afresh when drafting resumes
        elif self.drafting.rate >= plain:
            self.wait = LONE_BACKOFF[0]


@dataclass
class RowGate:
    """Whether one row of a batch drafts: what its drafting gained lately against what it cost.

    ``gain``: decayed mean of the extra tokens per drafting step, net of what verifying them cost: the
    accepted draft nodes less the row's share of the forward's extra seconds in plain tokens (at
    ``B = 8`` here an extra row costs half a plain token, so a node accepted half the time gains
    nothing); ``cost_s``: decayed mean of the row's drafting seconds per drafting step (its drafter,
    its share of the planning, its learning). A row drafts first, then while ``gain *
    seconds_per_token >= cost_s``; otherwise one step in :data:`ROW_PROBE_EVERY`. The
    decision depends on the observed figures only: tests and replays feed them.
    """

    memory: float = 0.7
    gain: float = 0.0
    cost_s: float = 0.0
    drafted_steps: int = 0
    skipped: int = 0

    def drafts(self, seconds_per_token: float) -> bool:
        """Whether the row drafts this step, a plain step of the batch costing ``seconds_per_token`` per token."""
        if self.drafted_steps == 0 or self.gain * seconds_per_token >= self.cost_s:
            self.skipped = 0
            return True
        self.skipped += 1
        if self.skipped >= ROW_PROBE_EVERY:
            self.skipped = 0
            return True
        return False

    def observe(self, extra_tokens: float, cost_s: float) -> None:
        """A drafting step of the row: ``extra_tokens`` gained (draft tokens accepted, less what verifying them
        cost, in plain tokens), ``cost_s`` seconds spent drafting."""
        weight = 1.0 if self.drafted_steps == 0 else 1.0 - self.memory
        self.gain += weight * (extra_tokens - self.gain)
        self.cost_s += weight * (cost_s - self.cost_s)
        self.drafted_steps += 1


@dataclass(frozen=True)
class BatchPlan:
    """One batched step's decision: each row's :class:`~specdec.budget.planner.Plan` and the forward's figures.

    ``rows``: the forward's rows (the planned trees' nodes, all rows); ``context``: the mean committed
    length the cost was read at; ``predicted_s``: the forward's predicted seconds (None without a cost
    model); ``calibration_s``: seconds this decision spent calibrating (first use only); ``extra_s``:
    what the draft nodes add to the forward, predicted (``predicted_s`` less a plain step's; 0.0 without
    a cost model).
    """

    plans: tuple[Plan, ...]
    rows: int
    context: int
    predicted_s: float | None
    calibration_s: float = 0.0
    extra_s: float = 0.0

    def extra_seconds(self, row: int) -> float:
        """Row ``row``'s share of :attr:`extra_s`, by its draft nodes: what verifying its draft cost the batch."""
        drafted = self.rows - len(self.plans)
        return self.extra_s * (self.plans[row].tree.size - 1) / drafted if drafted > 0 else 0.0


class BatchPlanner:
    """Decides every row's tree of a batched step under a :class:`~specdec.budget.planner.Budget`, and learns.

    ``acceptance``: the per-node acceptance model (shared with single-sequence planners: a node's
    chance does not depend on its neighbours in a batch). ``throughputs``: the batch's rate per
    number of rows, kept by the caller across calls. ``load_cost``: returns the batch's cost model
    and the seconds spent calibrating (module docstring: its own model from the calibration's table).
    """

    def __init__(
        self,
        budget: Budget | str | int,
        acceptance: AcceptanceModel,
        throughputs: dict[int, Throughput],
        load_cost: Callable[[], tuple[VerifyCostModel, float]],
        guards: dict[int, BatchGuard] | None = None,
    ) -> None:
        self.budget = Budget.parse(budget)
        self.acceptance = acceptance
        self.throughputs = throughputs
        self.guards = {} if guards is None else guards
        self._load_cost = load_cost
        self._cost: VerifyCostModel | None = None
        self._since_probe = 0
        self._context = 0  # the mean committed length of the last plan

    def row_offer(self, places: int) -> int | None:
        """The most nodes a row of a batch of ``places`` rows asks its drafter for (module docstring, "What a
        row offers"); None: as its decoding config and the verifier allow."""
        return ROW_OFFER_NODES if self.budget.mode == "auto" and places > 1 else None

    def plain_seconds_per_token(self, rows: int) -> float | None:
        """What a token of a plain step of ``rows`` sequences costs, the price each row's :class:`RowGate`
        weighs its drafting against (module docstring); None: every row drafts (a budget other than
        ``"auto"``, or no cost model yet: the first drafts calibrate). Once per step, not per row."""
        if self.budget.mode != "auto" or self._cost is None:
            return None
        plain = self._cost.predict(np.array([rows]), self._context)[0] + self.throughput(rows).overhead_s
        return float(plain) / rows

    def guard(self, rows: int) -> BatchGuard | None:
        """Whether a step of ``rows`` rows drafts at all, measured (:class:`BatchGuard`, kept by the caller
        across calls); None: every step may (a budget other than ``"auto"``: the user asked for its trees)."""
        if self.budget.mode != "auto":
            return None
        guard = self.guards.get(rows)
        if guard is None:  # built on a miss only: this runs every step
            guard = self.guards[rows] = BatchGuard()
        return guard

    @property
    def cost(self) -> VerifyCostModel | None:
        return self._cost

    def throughput(self, rows: int) -> Throughput:
        """The batch's measured rate with ``rows`` sequences (a new one starts at plain decoding's floor)."""
        throughput = self.throughputs.get(rows)
        if throughput is None:
            throughput = self.throughputs[rows] = Throughput()
        return throughput

    def plan(self, trees: Sequence[DraftTree], committed: Sequence[int]) -> BatchPlan:
        """Every row's tree to verify (cut from its drafter's ``trees[b]``, after ``committed[b]`` tokens)."""
        keys = [node_keys(tree) for tree in trees]
        calibration_s = 0.0
        if self._cost is None and any(tree.size > 1 for tree in trees):
            self._cost, calibration_s = self._load_cost()  # also switches the verifier to the calibrated kernels
        context = self._context = round(sum(committed) / len(committed))
        if self.budget.mode != "auto" or all(tree.size == 1 for tree in trees):
            return self._as_drafted(trees, keys, context, calibration_s)
        assert self._cost is not None  # loaded above: some tree has a draft
        memo: dict[NodeKey, float] = {}  # q by key, shared by the rows: the model learns nothing until observe
        probs = [self.acceptance.estimate(tree, k, memo)[1] if tree.size > 1 else np.ones(1) for tree, k in zip(
            trees, keys, strict=True)]  # fmt: skip  # [N_b] each
        pooled = np.concatenate([p[1:] for p in probs])  # [M]: every row's non-root nodes, row after row
        owner = np.repeat(np.arange(len(trees)), [tree.size - 1 for tree in trees])  # [M]
        local = np.concatenate([np.arange(1, tree.size) for tree in trees])  # [M]: node index in its tree
        batch = len(trees)
        costs = self._cost.predict(batch + np.arange(len(pooled) + 1), context)  # [M + 1]: R = B .. B + M
        rate = self.throughput(batch).rate(batch / (costs[0] + self.throughput(batch).overhead_s))
        # choose_budget over a virtual root and the pooled nodes: its k - 1 is the extra rows j, and its
        # gains are E - (B - 1), a constant apart, so the argmax is the batch's.
        k, chosen = choose_budget(np.concatenate(([1.0], pooled)), costs, rate)
        extra, reason = k - 1, "auto"
        if extra < len(pooled):
            self._since_probe += 1
            if self._since_probe >= PROBE_EVERY:
                self._since_probe = 0
                extra, reason = min(len(pooled), batch + 2 * extra), "probe"
                order = np.argsort(-pooled, kind="stable")[:extra] + 1  # as best_nodes takes them
                chosen = np.sort(np.concatenate(([0], order)))
        picked = chosen[1:] - 1  # [extra]: indices into pooled
        plans = []
        for b, (tree, row_keys, p) in enumerate(zip(trees, keys, probs, strict=True)):
            nodes = [0, *sorted(int(i) for i in local[picked[owner[picked] == b]])]
            offered = tree.size
            why = "no draft" if offered == 1 else "declined" if len(nodes) == 1 else reason
            if len(nodes) < offered:
                tree, row_keys = tree.select(nodes), [row_keys[i] for i in nodes]
            expected = float(p[nodes[1:]].sum())
            plans.append(Plan(tree, row_keys, offered, expected, float(costs[extra]), calibration_s, why))
        return BatchPlan(tuple(plans), batch + extra, context, float(costs[extra]), calibration_s,
                         max(0.0, float(costs[extra] - costs[0])))  # fmt: skip

    def _as_drafted(
        self, trees: Sequence[DraftTree], keys: Sequence[Sequence[NodeKey]], context: int, calibration_s: float
    ) -> BatchPlan:
        """Every tree as it is (a fixed or full budget, or no drafts): what each row expects, what the forward costs."""
        rows = sum(tree.size for tree in trees)
        predicted = extra = None
        if self._cost is not None:
            predicted, plain = (float(x) for x in self._cost.predict(np.array([rows, len(trees)]), context))
            extra = max(0.0, predicted - plain)
        plans = []
        for tree, row_keys in zip(trees, keys, strict=True):
            expected = 0.0 if tree.size == 1 else float(self.acceptance.estimate(tree, row_keys)[1][1:].sum())
            reason = "no draft" if tree.size == 1 else self.budget.mode
            plans.append(Plan(tree, row_keys, tree.size, expected, predicted, calibration_s, reason))
        return BatchPlan(tuple(plans), rows, context, predicted, calibration_s, extra or 0.0)

    def observe(self, batch: BatchPlan, accepted: Sequence[Sequence[int]], verify_s: float, step_s: float) -> None:
        """Learn from a verified batch: each row's acceptance, the forward's cost, the batch's rate.

        ``accepted[b]``: row ``b``'s accepted node indices (root first); ``verify_s`` the batched
        verification's seconds, ``step_s`` the whole step's (every row's drafting and update too).
        The acceptance model observes the rows that verified a draft only: its clock (the decay of
        its counts) ticks once per observed tree, and at ``B = 8`` most rows verify their pending
        token alone, so counting them aged the statistics ~8x faster than a lone sequence's, to a
        window of a few dozen trials held mostly by the prior.
        """
        emitted = sum(len(nodes) for nodes in accepted)
        for plan, nodes in zip(batch.plans, accepted, strict=True):
            if plan.tree.size > 1:  # an undrafted row holds no trial: it must not age the others' (docstring)
                self.acceptance.observe(plan.tree, plan.keys, nodes)
        if self._cost is not None:
            self._cost.observe(batch.rows, batch.context, verify_s)
        self.throughput(len(batch.plans)).observe(emitted, step_s, verify_s, batch.predicted_s)


class LonePlanner:
    """A lone sequence's :class:`~specdec.budget.planner.BudgetPlanner` as the planner of a batch of one row.

    The step (:func:`specdec.engine.step`) asks every planner the same questions; a lone sequence's answers:
    under ``budget="auto"`` its :class:`LoneGuard` (the clock's check on the rule), no row gate (its rule
    weighs each node against the run's own rate, so drafting never has to pay a batch), and each step's plan
    is the :class:`~specdec.budget.planner.BudgetPlanner`'s own (its probes on a time budget, its own
    throughput and cost model).
    """

    def __init__(self, planner: BudgetPlanner, guard: LoneGuard | None = None) -> None:
        self.planner = planner
        self.budget = planner.budget
        self._guard = guard if planner.budget.mode == "auto" else None  # a fixed budget is the user's to keep
        if self._guard is not None:
            self._guard.estimate = planner.plain_rate

    def guard(self, rows: int) -> LoneGuard | None:
        return self._guard

    def plain_seconds_per_token(self, rows: int) -> float | None:
        return None

    def plan(self, trees: Sequence[DraftTree], committed: Sequence[int]) -> BatchPlan:
        """The lone row's plan (``trees`` and ``committed`` hold one row each)."""
        (tree,), (committed_len,) = trees, committed
        plan = self.planner.plan(tree, committed_len)
        return BatchPlan((plan,), plan.tree.size, committed_len, plan.predicted_s, plan.calibration_s)

    def observe(self, batch: BatchPlan, accepted: Sequence[Sequence[int]], verify_s: float, step_s: float) -> None:
        self.planner.observe(batch.plans[0], accepted[0], batch.context, verify_s, step_s)
        if self._guard is not None:
            # A step whose drafter offered a draft paid for drafting, whether the planner kept the draft or
            # cut it to the root: counted as plain, its drafting seconds would lower the plain rate the
            # drafting steps are judged against, and a drafter dearer than it gains would never back off.
            self._guard.last_drafted = batch.plans[0].offered > 1


__all__ = [
    "GUARD_EXPLORE_DRAFTING",
    "GUARD_EXPLORE_EVERY",
    "GUARD_MIN_STEPS",
    "LONE_BACKOFF",
    "LONE_LOSS",
    "LONE_MIN_PLAIN",
    "LONE_MIN_STEPS",
    "PROBE_EVERY",
    "ROW_OFFER_NODES",
    "ROW_PROBE_EVERY",
    "BatchGuard",
    "BatchPlan",
    "BatchPlanner",
    "LoneGuard",
    "LonePlanner",
    "RowGate",
    "StepRate",
]
