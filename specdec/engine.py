"""The speculative decoding loop, for one sequence.

A sequence has committed tokens (their KV is in the cache) and one pending token, already
decided but not yet run through the model. Each step::

    tree   = drafter.propose(pending, max_nodes)      # rooted at the pending token
    result = verifier.verify(state, tree)             # one forward, walk, compact KV
    emit(result.accepted_tokens[1:] + [result.bonus]) # the root was emitted when decided
    drafter.update(result.accepted_tokens, result.feedback)
    pending = result.bonus

Plain autoregressive decoding is the same loop with one-node trees, so both share every
line here. Stop rules cut the emitted tokens at the first EOS, the first token that
completes a stop string, or ``max_new_tokens``, whichever comes first, so speculative
output is exactly the prefix plain decoding would have produced.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specdec.backends.verifier import ModelVerifier
from specdec.budget.planner import BudgetPlanner
from specdec.errors import SpecDecError
from specdec.sampling import Decision, Greedy
from specdec.types import Drafter, GenerationResult, GenerationStats, StepRecord

# The most nodes any step may verify when neither the user nor the drafter says less:
# far above every paper's budget, low enough that a runaway drafter cannot blow memory.
MAX_TREE_NODES = 512


@dataclass(frozen=True)
class StopRules:
    """When generation ends. ``decode`` (token ids -> text) is needed only for stop strings."""

    max_new_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    decode: Callable[[list[int]], str] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise SpecDecError(f"max_new_tokens must be an int, got {self.max_new_tokens!r}")
        if self.max_new_tokens < 1:
            raise SpecDecError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise SpecDecError(f"stop strings must be non-empty strings, got {list(self.stop_strings)!r}")
        if self.stop_strings and self.decode is None:
            raise SpecDecError("stop strings need a tokenizer to decode the output")

    def cut(self, output: list[int], start: int) -> tuple[int, str] | None:
        """Where to end ``output`` given that ``output[start:]`` was just emitted.

        Returns ``(length, reason)`` for the earliest stop at or after ``start``, or None.
        A stop string stops at the first token whose text completes it (that token is kept).
        """
        best: tuple[int, str] | None = None
        for i in range(start, len(output)):
            if output[i] in self.eos_token_ids:
                best = (i + 1, "eos")
                break
        if len(output) >= self.max_new_tokens and (best is None or self.max_new_tokens < best[0]):
            best = (self.max_new_tokens, "max_new_tokens")
        if self.stop_strings and self.decode is not None:
            limit = best[0] if best else len(output)
            if any(s in self.decode(output[:limit]) for s in self.stop_strings):
                for i in range(start, limit):
                    if any(s in self.decode(output[: i + 1]) for s in self.stop_strings):
                        best = (i + 1, "stop_string")
                        break
        return best


def decode(
    verifier: ModelVerifier,
    drafter: Drafter,
    prompt: Sequence[int],
    rules: StopRules,
    *,
    max_nodes: int | None = None,
    prompt_feedback: bool = False,
    on_tokens: Callable[[list[int]], None] | None = None,
    planner: BudgetPlanner | None = None,
    decision: Decision | None = None,
) -> GenerationResult:
    """Generate from ``prompt`` (token ids) with ``drafter`` proposing and ``verifier`` checking.

    ``max_nodes`` caps every draft tree (root included); None lets the drafter decide, up
    to :data:`MAX_TREE_NODES`. ``prompt_feedback`` hands the drafter the model's top ids
    after every prompt token at reset (when it asks for feedback). ``on_tokens`` receives
    each batch of emitted tokens as soon as the stop rules have cut it. ``planner`` decides
    each step's draft budget from the drafter's tree (:mod:`specdec.budget`; None: verify
    the tree as the drafter and ``max_nodes`` leave it) and learns from every step. ``decision`` says
    how tokens are chosen (greedy by default; sampling and a repetition penalty apply to
    the plain and the speculative path alike).
    """
    if max_nodes is not None and max_nodes < 1:
        raise SpecDecError(f"max_nodes must be at least 1, got {max_nodes}")
    cap = min(max_nodes or MAX_TREE_NODES, MAX_TREE_NODES, verifier.max_tree_nodes or MAX_TREE_NODES)
    stats = GenerationStats(prompt_tokens=len(prompt), budget="" if planner is None else str(planner.budget))
    started = time.perf_counter()

    topk = drafter.feedback_topk
    decision = decision or Decision(Greedy())
    state, pending, prompt_fb = verifier.prefill(
        prompt,
        prompt_topk=topk if prompt_feedback else 0,
        chooser=decision.chooser,
        repetition_penalty=decision.repetition_penalty,
        reserve=rules.max_new_tokens,
    )
    stats.prefill_s = time.perf_counter() - started

    mark = time.perf_counter()
    drafter.reset(prompt, prompt_fb)
    stats.draft_s += time.perf_counter() - mark

    output = [pending]
    streamed = 0  # how many of output's tokens on_tokens has seen
    stop = rules.cut(output, 0)
    limit = verifier.context_length
    while stop is None:
        if on_tokens is not None:
            on_tokens(output[streamed:])
            streamed = len(output)
        # Deepest node allowed: its position stays inside the context, and the step's
        # tokens (accepted draft + bonus) never overshoot max_new_tokens.
        max_depth = rules.max_new_tokens - len(output) - 1
        if limit is not None:
            max_depth = min(max_depth, limit - 1 - state.committed_len)
            if max_depth < 0:
                stop = (len(output), "context_length")
                break

        mark = time.perf_counter()
        tree = drafter.propose(pending, cap).pruned(cap, max_depth)
        if tree.tokens[0] != pending:
            raise SpecDecError(
                f"drafter {drafter.name!r} rooted its tree at token {tree.tokens[0]}, not the pending {pending}"
            )
        offered, plan = tree.size, None
        if planner is not None:
            plan = planner.plan(tree, state.committed_len)
            tree = plan.tree
            stats.calibration_s += plan.calibration_s  # one-time; kept out of draft_s
            mark += plan.calibration_s
        committed = state.committed_len
        drafted = time.perf_counter()
        result = verifier.verify(state, tree, topk)
        verified = time.perf_counter()
        drafter.update(result.accepted_tokens, result.feedback)
        updated = time.perf_counter()
        if plan is not None and planner is not None:
            planner.observe(plan, result.accepted_nodes, committed, verified - drafted, updated - mark)

        draft_s = (drafted - mark) + (updated - verified)
        stats.steps += 1
        stats.emitted_by_steps += result.emitted
        stats.draft_s += draft_s
        stats.verify_s += verified - drafted
        sources = None if tree.node_sources is None else tuple(tree.node_sources[i] for i in result.accepted_nodes[1:])
        stats.records.append(
            StepRecord(tree.size, len(result.accepted_nodes) - 1, tree.source, draft_s, verified - drafted, sources)
        )
        record = stats.records[-1]
        record.offered = offered
        if plan is not None:
            record.reason, record.expected, record.predicted_s = plan.reason, plan.expected, plan.predicted_s
        start = len(output)
        output.extend(result.accepted_tokens[1:])
        output.append(result.bonus)
        pending = result.bonus
        stop = rules.cut(output, start)

    length, stats.stop_reason = stop
    del output[length:]
    if on_tokens is not None and len(output) > streamed:
        on_tokens(output[streamed:])
    stats.new_tokens = len(output)
    stats.total_s = time.perf_counter() - started
    return GenerationResult(tokens=output, stats=stats, prompt_tokens=list(prompt), seed=decision.seed)
