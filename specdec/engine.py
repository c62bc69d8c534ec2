"""The speculative decoding loop, for one sequence.

A sequence has committed tokens (their KV is in the cache) and one pending token, already
decided but not yet run through the model. Each step::

    tree   = drafter.propose(pending, max_nodes)      # rooted at the pending token
    result = verifier.verify(state, tree)             # one forward, walk, compact KV
    emit(result.accepted_tokens[1:] + [result.bonus]) # the root was emitted when decided
    drafter.update(result.accepted_tokens, result.feedback)
    pending = result.bonus

Plain autoregressive decoding is the same loop with one-node trees, so both share every
line here. The stop rules (:class:`~specdec.decoding.StopRules`) cut the emitted tokens at
the first EOS, the first token that completes a stop string, or ``max_new_tokens``,
whichever comes first, so speculative output is exactly the prefix plain decoding would
have produced. A budget planner, when there is one, cuts each tree before it is verified
and learns from every step (:mod:`specdec.budget`). Timing and statistics are kept by a
:class:`StepRecorder` beside the loop, and one sequence's pieces of a step (prefill, draft,
learn, emit, finish) by a :class:`LiveSequence`.

**One step for one sequence and for many.** :func:`step` is the step of a batch of rows
(:class:`Row`: a live sequence with its gate); :func:`decode` runs one sequence as a batch of
one through it, and :mod:`specdec.batching` many, refilled as rows finish. What a step asks of
its planner (:class:`StepPlanner`: whether the rows draft at all, each row's tree, what it
learns) is one interface: a batch's :class:`~specdec.budget.batch_planner.BatchPlanner`, or a
lone sequence's :class:`~specdec.budget.planner.BudgetPlanner` seen as the planner of a batch
of one (:class:`~specdec.budget.batch_planner.LonePlanner`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from specdec.budget.batch_planner import BatchGuard, BatchPlan, LoneGuard, LonePlanner, RowGate
from specdec.budget.machine_load import FOLLOWER
from specdec.budget.planner import BudgetPlanner, Plan
from specdec.decoding import DecodingConfig
from specdec.errors import SpecDecError
from specdec.types import (
    BatchVerifier,
    Drafter,
    DraftTree,
    GenerationResult,
    GenerationStats,
    StepRecord,
    Verification,
    Verifier,
)

# The most nodes any step may verify when neither the user nor the drafter says less:
# far above every paper's budget, low enough that a runaway drafter cannot blow memory.
MAX_TREE_NODES = 512


class StepRecorder:
    """One sequence's clock and statistics (:class:`~specdec.types.GenerationStats`), beside the loop.

    Wall times: the prefill; drafting (the drafter's reset, propose and update, and the
    planner's decision); verification; each step's whole time (:func:`step` times them). A
    calibration that a planner's first decision pays for is kept apart (``calibration_s``), out of the step.
    """

    def __init__(self, prompt_tokens: int, budget: str) -> None:
        self.stats = GenerationStats(prompt_tokens=prompt_tokens, budget=budget)
        self._started = self._mark = time.perf_counter()

    def prefilled(self) -> None:
        """The prefill is over; what follows until :meth:`reset_done` is the drafter's reset."""
        self._mark = time.perf_counter()
        self.stats.prefill_s = self._mark - self._started

    def reset_done(self) -> None:
        self.stats.draft_s += time.perf_counter() - self._mark

    def add_step(
        self, tree: DraftTree, offered: int, plan: Plan | None, result: Verification, draft_s: float,
        verify_s: float, step_s: float, batch_rows: int = 1,
    ) -> StepRecord:
        """A step timed by :func:`step` (which times a batch's rows' steps together, ``batch_rows`` of them):
        its record, kept in the stats."""
        accepted = result.accepted_nodes[1:]
        sources = None if tree.node_sources is None else tuple(tree.node_sources[i] for i in accepted)
        record = StepRecord(tree.size, len(accepted), tree.source, draft_s, verify_s, sources, offered,
                            step_s=step_s, batch_rows=batch_rows)  # fmt: skip
        if plan is not None:
            record.reason, record.expected, record.predicted_s = plan.reason, plan.expected, plan.predicted_s
        stats = self.stats
        stats.steps += 1
        stats.emitted_by_steps += result.emitted
        stats.draft_s += draft_s
        stats.verify_s += verify_s
        stats.records.append(record)
        return record

    def finish(self, new_tokens: int, stop_reason: str) -> GenerationStats:
        self.stats.new_tokens, self.stats.stop_reason = new_tokens, stop_reason
        self.stats.total_s = time.perf_counter() - self._started
        return self.stats


def tree_cap(config: DecodingConfig, verifier: Verifier[Any]) -> int:
    """The most nodes any tree of this generation may have: ``max_nodes``, :data:`MAX_TREE_NODES`,
    the verifier's limit."""
    limit = verifier.description.max_tree_nodes
    return min(config.max_nodes or MAX_TREE_NODES, MAX_TREE_NODES, limit or MAX_TREE_NODES)


def reachable(config: DecodingConfig, verifier: Verifier[Any], prompt_len: int) -> int:
    """How many tokens past a prompt of ``prompt_len`` this generation can add: ``max_new_tokens``, capped
    by the model's context length (the loop stops there, ``"context_length"``).

    What a verifier's cache is sized by (``prefill``'s ``reserve``) and a batch's memory check counts:
    ``max_new_tokens`` is accepted at any size (10**12 too), and a cache sized by it alone held
    1 GB for a 256-position model at 2_000_000 (10**12 failed to allocate).
    """
    context = verifier.description.context_length
    wanted = config.rules.max_new_tokens
    return wanted if context is None else max(0, min(wanted, context - prompt_len))


class LiveSequence:
    """One sequence being decoded: its verifier state, pending token, output and stats, and the loop's
    per-sequence pieces (:func:`decode` runs one; :mod:`specdec.batching` runs many side by side).

    Construction is the prefill and the drafter's reset; then each step is :meth:`draft` (the
    drafter's tree, pruned to what the stop rules and the context allow), a verification by
    the caller, :meth:`learn` (the drafter's update) and :meth:`emit` (the tokens, cut by the stop rules);
    :meth:`finish` releases the verifier's state and returns the result. ``stop`` is None while
    the sequence runs, then ``(length, reason)``.
    """

    def __init__(
        self, verifier: Verifier[Any], drafter: Drafter, prompt: Sequence[int], config: DecodingConfig,
        *, budget: str = "",
    ) -> None:
        self.verifier, self.drafter, self.config = verifier, drafter, config
        self.prompt = list(prompt)
        self.cap = tree_cap(config, verifier)
        self.record = StepRecorder(len(prompt), budget)  # budget: the planner's, "" without one
        described = verifier.description
        self.record.stats.engine = described.engine
        self.context_length = described.context_length  # the verifier's, fixed: read once, not every step
        rules, decision = config.rules, config.decision
        self.state, self.pending, prompt_feedback = verifier.prefill(
            prompt, prompt_topk=drafter.feedback_topk if config.prompt_feedback else 0,
            chooser=config.chooser(len(prompt)), repetition_penalty=decision.repetition_penalty,
            reserve=reachable(config, verifier, len(prompt)), features=wants_features(drafter),
        )  # fmt: skip
        self.record.prefilled()
        drafter.reset(prompt, prompt_feedback)
        self.record.reset_done()
        self.output = [self.pending]
        self.streamed = 0  # how many of output's tokens the caller has seen (on_tokens)
        self.stop = rules.cut(self.output, 0)
        self.finished = False  # finish() ran: the verifier's state is released

    @property
    def committed_len(self) -> int:
        return int(self.state.committed_len)

    def unseen(self) -> list[int]:
        """The output tokens not handed out yet (streaming); they count as seen from now on."""
        tokens = self.output[self.streamed :]
        self.streamed = len(self.output)
        return tokens

    def draft(self, drafting: bool = True) -> DraftTree | None:
        """The drafter's tree rooted at the pending token, pruned; None when the context is full
        (the sequence stops). ``drafting=False``: the one-node tree, the drafter not asked (a
        batch's row whose drafting does not pay, :class:`~specdec.budget.batch_planner.RowGate`)."""
        # Deepest node allowed: the step's tokens (accepted draft + bonus) never overshoot
        # max_new_tokens, and its positions stay inside the context.
        max_depth = self.config.rules.max_new_tokens - len(self.output) - 1
        context_length = self.context_length
        if context_length is not None:
            max_depth = min(max_depth, context_length - 1 - self.committed_len)
            if max_depth < 0:
                self.stop = (len(self.output), "context_length")
                return None
        if not drafting:
            return DraftTree.single(self.pending, source=self.drafter.name)
        tree = self.drafter.propose(self.pending, self.cap).pruned(self.cap, max_depth)
        if tree.tokens[0] != self.pending:
            raise SpecDecError(
                f"drafter {self.drafter.name!r} rooted its tree at token {tree.tokens[0]}, "
                f"not the pending {self.pending}"
            )
        return tree

    def learn(self, result: Verification) -> None:
        """The drafter learns the verified step (its time counts as drafting)."""
        self.drafter.update(result.accepted_tokens, result.feedback)

    def emit(self, result: Verification) -> None:
        """The verified step's tokens are emitted and the stop rules cut them."""
        start = len(self.output)
        self.output.extend(result.accepted_tokens[1:])
        self.output.append(result.bonus)
        self.pending = result.bonus
        self.stop = self.config.rules.cut(self.output, start)

    def finish(self) -> GenerationResult:
        """The sequence is over: its verifier state is released and its output cut where the stop rules said."""
        assert self.stop is not None and not self.finished, "finish() before the sequence stopped, or twice"
        self.verifier.release(self.state)
        self.finished = True
        length, reason = self.stop
        del self.output[length:]
        self.streamed = min(self.streamed, length)
        stats = self.record.finish(len(self.output), reason)
        # A compiled or captured path of a ModelVerifier's forward gave way mid-run.
        if getattr(getattr(self.verifier, "forward", None), "fallback_reason", None):
            stats.engine = f"{stats.engine} (fell back to eager forwards)"
        return GenerationResult(tokens=self.output, stats=stats, prompt_tokens=self.prompt,
                                seed=self.config.decision.seed)


@dataclass(frozen=True)
class BatchRequest:
    """One prompt of a batch: its place in the caller's list, its token ids and its decoding config."""

    index: int
    prompt: list[int]
    config: DecodingConfig


@dataclass(frozen=True)
class FinishedRow:
    """A row that completed: its request's index, its result, and the drafter that served it."""

    index: int
    result: GenerationResult
    drafter: Drafter


@dataclass
class Row:
    """A live row of a step: its request, its sequence, and its gate (whether its drafting pays)."""

    request: BatchRequest
    sequence: LiveSequence
    gate: RowGate


@dataclass(frozen=True)
class Drafted:
    """A row's part of one step: its tree, the seconds its drafting took, and whether its drafter was asked."""

    row: Row
    tree: DraftTree
    draft_s: float
    asked: bool


class StepPlanner(Protocol):
    """What :func:`step` asks of a planner, for a batch of any number of rows (one: a lone sequence).

    :class:`~specdec.budget.batch_planner.BatchPlanner` is one; a lone sequence's
    :class:`~specdec.budget.planner.BudgetPlanner` is one as a batch of one
    (:class:`~specdec.budget.batch_planner.LonePlanner`: its own guard, no row gates).
    """

    def guard(self, rows: int) -> BatchGuard | LoneGuard | None:
        """Whether a step of ``rows`` rows drafts at all, measured; None: every step may."""
        ...

    def plain_seconds_per_token(self, rows: int) -> float | None:
        """The price each row's gate weighs its drafting against; None: every row drafts."""
        ...

    def plan(self, trees: Sequence[DraftTree], committed: Sequence[int]) -> BatchPlan:
        """Every row's tree to verify, cut from its drafter's."""
        ...

    def observe(self, plan: BatchPlan, accepted: Sequence[Sequence[int]], verify_s: float, step_s: float) -> None:
        """Learn from the verified step."""
        ...


def wants_features(drafter: Drafter) -> bool:
    """Whether ``drafter`` reads the model's features (its optional ``feedback_features``; :class:`Drafter`)."""
    return bool(getattr(drafter, "feedback_features", False))


def verify_rows(
    verifier: Verifier[Any], states: Sequence[Any], trees: Sequence[DraftTree], topk: int, features: bool = False
) -> list[Verification]:
    """Every row's verification: one batched call where the verifier has one, else row after row."""
    if isinstance(verifier, BatchVerifier):
        return verifier.verify_batch(states, trees, topk, features)
    return [verifier.verify(state, tree, topk, features) for state, tree in zip(states, trees, strict=True)]


def step(
    verifier: Verifier[Any], rows: list[Row], planner: StepPlanner | None, *, batch: bool = True
) -> Iterator[FinishedRow]:
    """One step of every row (module docstring; :mod:`specdec.batching` has the batch's step in pseudocode):
    finished rows leave ``rows`` and are yielded. ``batch=False``: a lone sequence (:func:`decode`), verified by
    the verifier's ``verify`` (a batch verifier's one call is for a batch's rows, even one left at its tail)."""
    FOLLOWER.tick()  # a lone generation's threads follow the machine's load (specdec.budget.machine_load)
    started = time.perf_counter()
    guard = None if planner is None else planner.guard(len(rows))
    drafting = guard is None or guard.drafts()  # measured: whether drafting pays this batch at all
    price = None if planner is None or not drafting else planner.plain_seconds_per_token(len(rows))
    drafted: list[Drafted] = []
    for row in rows:
        mark = time.perf_counter()
        asked = drafting and (price is None or row.gate.drafts(price))
        tree = row.sequence.draft(asked)
        if tree is None:  # the context is full: the row stops here
            yield FinishedRow(row.request.index, row.sequence.finish(), row.sequence.drafter)
            continue
        drafted.append(Drafted(row, tree, time.perf_counter() - mark, asked))
    rows[:] = [d.row for d in drafted]
    if not drafted:
        return
    trees = [d.tree for d in drafted]
    offered = [tree.size for tree in trees]
    plan: BatchPlan | None = None
    planned = time.perf_counter()
    if planner is not None:
        plan = planner.plan(trees, [d.row.sequence.committed_len for d in drafted])
        trees = [row_plan.tree for row_plan in plan.plans]
    calibration_s = 0.0 if plan is None else plan.calibration_s
    planning_s = time.perf_counter() - planned - calibration_s
    # Feedback (the top ids after each node) for the drafters that were asked; none when the gates asked no row.
    # A step the guard keeps plain feeds every row's drafter as a drafting step would: what Token Recycling
    # learns there is what its next drafts are made of (docs/budget.md, "Whether the batch drafts at all").
    topk = max((d.row.sequence.drafter.feedback_topk for d in drafted if d.asked or not drafting), default=0)
    verify_started = time.perf_counter()
    states = [d.row.sequence.state for d in drafted]
    # Features for drafters that read them, on every step (the head's state is the features of every committed token).
    features = any(wants_features(d.row.sequence.drafter) for d in drafted)
    results = (verify_rows(verifier, states, trees, topk, features) if batch
               else [verifier.verify(states[0], trees[0], topk, features)])  # fmt: skip
    verify_s = time.perf_counter() - verify_started
    learned = []
    for d, result in zip(drafted, results, strict=True):
        mark = time.perf_counter()
        d.row.sequence.learn(result)
        learned.append(time.perf_counter() - mark)
    step_s = time.perf_counter() - started - calibration_s
    askers = sum(d.asked for d in drafted)
    for b, (d, result) in enumerate(zip(drafted, results, strict=True)):
        row_plan = None if plan is None else plan.plans[b]
        record = d.row.sequence.record
        record.stats.calibration_s += calibration_s
        record.add_step(trees[b], offered[b], row_plan, result, d.draft_s + planning_s + learned[b], verify_s, step_s,
                        len(drafted))  # fmt: skip
        if d.asked:  # what drafting gained this row net of its verification, against what drafting cost
            gained = float(len(result.accepted_nodes) - 1)
            if plan is not None and price:  # the forward's extra seconds for this row's nodes, in plain tokens
                gained -= plan.extra_seconds(b) / price
            d.row.gate.observe(gained, d.draft_s + learned[b] + planning_s / askers)
    if planner is not None and plan is not None:
        planner.observe(plan, [result.accepted_nodes for result in results], verify_s, step_s)
    if guard is not None:
        guard.observe(drafting, sum(len(result.accepted_nodes) for result in results), step_s)
    staying = []
    for d, result in zip(drafted, results, strict=True):
        sequence = d.row.sequence
        sequence.emit(result)
        if sequence.stop is None:
            staying.append(d.row)
        else:
            yield FinishedRow(d.row.request.index, sequence.finish(), sequence.drafter)
    rows[:] = staying


def decode(
    verifier: Verifier[Any],
    drafter: Drafter,
    prompt: Sequence[int],
    config: DecodingConfig,
    *,
    planner: BudgetPlanner | None = None,
    on_tokens: Callable[[list[int]], None] | None = None,
) -> GenerationResult:
    """Generate from ``prompt`` (token ids) with ``drafter`` proposing and ``verifier`` checking.

    ``config`` holds the stop rules, how tokens are chosen (greedy or seeded sampling, the
    repetition penalty: the plain and speculative path alike), ``max_nodes`` (every tree's
    cap, root included; None lets the drafter decide, up to :data:`MAX_TREE_NODES` and the
    verifier's own limit) and ``prompt_feedback`` (hand the drafter the model's top ids after
    every prompt token at reset, when it asks for feedback). ``planner`` decides each step's
    draft budget from the drafter's tree (None: verify the tree as the drafter and
    ``max_nodes`` leave it) and learns from every step. ``on_tokens`` receives each batch of
    emitted tokens as soon as the stop rules have cut it. The sequence runs as a batch of one
    through :func:`step`.
    """
    sequence = LiveSequence(verifier, drafter, prompt, config, budget="" if planner is None else str(planner.budget))
    rows = [Row(BatchRequest(0, sequence.prompt, config), sequence, RowGate())]
    lone = None if planner is None else LonePlanner(planner, planner.guard)
    result = sequence.finish() if sequence.stop is not None else None  # the prefill's token may end it
    while result is None:
        if on_tokens is not None:
            on_tokens(sequence.unseen())
        for finished in step(verifier, rows, lone, batch=False):
            result = finished.result
    if on_tokens is not None:
        tokens = sequence.unseen()
        if tokens:
            on_tokens(tokens)
    return result
