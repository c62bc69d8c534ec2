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
learn, emit, finish) by a :class:`LiveSequence`, which :mod:`specdec.batching` runs many of
side by side.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from specdec.budget.planner import BudgetPlanner, Plan
from specdec.decoding import DecodingConfig
from specdec.errors import SpecDecError
from specdec.types import Drafter, DraftTree, GenerationResult, GenerationStats, StepRecord, Verification, Verifier

# The most nodes any step may verify when neither the user nor the drafter says less:
# far above every paper's budget, low enough that a runaway drafter cannot blow memory.
MAX_TREE_NODES = 512


class StepRecorder:
    """The loop's clock and statistics (:class:`~specdec.types.GenerationStats`), beside the loop.

    Wall times: the prefill; drafting (the drafter's reset, propose and update, and the
    planner's decision); verification; each step's whole time. A calibration that a
    planner's first decision pays for is kept apart (``calibration_s``), out of the step.
    """

    def __init__(self, prompt_tokens: int, planner: BudgetPlanner | None) -> None:
        self.stats = GenerationStats(prompt_tokens=prompt_tokens, budget="" if planner is None else str(planner.budget))
        self._started = self._mark = time.perf_counter()
        self._drafted = self._verified = self._mark
        self.step_s = 0.0  # the last step's wall time, calibration excluded

    def prefilled(self) -> None:
        """The prefill is over; what follows until :meth:`reset_done` is the drafter's reset."""
        self._mark = time.perf_counter()
        self.stats.prefill_s = self._mark - self._started

    def reset_done(self) -> None:
        self.stats.draft_s += time.perf_counter() - self._mark

    def step_starts(self) -> None:
        self._mark = time.perf_counter()

    def calibrated(self, seconds: float) -> None:
        """A one-time calibration inside this step's planning: counted apart, not as drafting."""
        self.stats.calibration_s += seconds
        self._mark += seconds

    def drafted(self) -> None:
        self._drafted = time.perf_counter()

    def verified(self) -> None:
        self._verified = time.perf_counter()

    def step_ends(self, tree: DraftTree, offered: int, plan: Plan | None, result: Verification) -> StepRecord:
        """The drafter's update is over: the step's record (also kept in the stats)."""
        updated = time.perf_counter()
        draft_s = (self._drafted - self._mark) + (updated - self._verified)
        verify_s = self._verified - self._drafted
        return self.add_step(tree, offered, plan, result, draft_s, verify_s, updated - self._mark)

    def add_step(
        self, tree: DraftTree, offered: int, plan: Plan | None, result: Verification, draft_s: float,
        verify_s: float, step_s: float, batch_rows: int = 1,
    ) -> StepRecord:
        """A step timed by the caller (a batch times its rows' steps together, ``batch_rows`` of them): its
        record, kept in the stats."""
        self.step_s = step_s
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
        planner: BudgetPlanner | None = None, *, budget: str | None = None,
    ) -> None:
        self.verifier, self.drafter, self.config = verifier, drafter, config
        self.prompt = list(prompt)
        self.cap = tree_cap(config, verifier)
        self.record = StepRecorder(len(prompt), planner)
        if budget is not None:  # a batch's planner decides this sequence's budget
            self.record.stats.budget = budget
        described = verifier.description
        self.record.stats.engine = described.engine
        self.context_length = described.context_length  # the verifier's, fixed: read once, not every step
        rules, decision = config.rules, config.decision
        self.state, self.pending, prompt_feedback = verifier.prefill(
            prompt, prompt_topk=drafter.feedback_topk if config.prompt_feedback else 0,
            chooser=config.chooser(len(prompt)), repetition_penalty=decision.repetition_penalty,
            reserve=rules.max_new_tokens,
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
        if getattr(self.verifier, "fallback_reason", None):  # a compiled or captured path gave way mid-run
            stats.engine = f"{stats.engine} (fell back to eager forwards)"
        return GenerationResult(tokens=self.output, stats=stats, prompt_tokens=self.prompt,
                                seed=self.config.decision.seed)


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
    emitted tokens as soon as the stop rules have cut it.
    """
    topk = drafter.feedback_topk
    sequence = LiveSequence(verifier, drafter, prompt, config, planner)
    record = sequence.record
    while sequence.stop is None:
        if on_tokens is not None:
            on_tokens(sequence.unseen())
        record.step_starts()
        tree = sequence.draft()
        if tree is None:
            break
        offered, plan, committed = tree.size, None, sequence.committed_len
        if planner is not None:
            plan = planner.plan(tree, committed)
            tree = plan.tree
            record.calibrated(plan.calibration_s)
        record.drafted()
        result = verifier.verify(sequence.state, tree, topk)
        record.verified()
        sequence.learn(result)
        step = record.step_ends(tree, offered, plan, result)
        if planner is not None and plan is not None:
            planner.observe(plan, result.accepted_nodes, committed, step.verify_s, record.step_s)
        sequence.emit(result)
    finished = sequence.finish()
    if on_tokens is not None:
        tokens = sequence.unseen()
        if tokens:
            on_tokens(tokens)
    return finished
