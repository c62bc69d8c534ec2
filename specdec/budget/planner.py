"""The decision rule: how many draft nodes each step verifies, and which.

Given a drafter's tree (up to its own cap, e.g. PLD's 10 tokens, SAM's 40, a Token
Recycling template's 80), the planner estimates every node's acceptance probability
``p_i`` (:mod:`specdec.budget.acceptance`) and the verification cost ``cost(k, C)`` of a
``k``-node tree after ``C`` committed tokens (:mod:`specdec.budget.cost_model`), and verifies
the ``k`` nodes of largest ``p`` (a prefix-closed subtree, since ``p`` never grows from a
parent to its child), with ``k`` chosen to maximize

    E(k) - rate * cost(k, C)          E(k) = 1 + (sum of the k - 1 largest p_i, i >= 1)

where ``E(k)`` is the expected number of tokens the step emits (accepted draft tokens plus
the bonus) and ``rate`` the throughput the run achieves, in tokens per second.

**Why not maximize** ``E(k) / cost(k)`` **per step.** What a user gets is the long-run rate
``sum E / sum time``. A step that maximizes its own ratio stops adding nodes when the next
one lowers *that step's* ratio, even when the node's expected tokens per extra second
(``p / delta cost``) beat the run's rate, so it leaves throughput on the table. By the
renewal-reward argument (Dinkelbach's method for ratio objectives), the long-run rate is
maximized by maximizing ``E - rate * time`` at each step with ``rate`` the optimal
long-run rate; we use the measured one, which the rule itself drives up to it.
A per-step overhead (drafting, the loop) adds the same time whatever ``k`` is, so it
changes the choice only through ``rate``.

**Never worse than plain decoding.** ``rate`` is floored at plain decoding's,
``1 / (cost(1, C) + overhead)``. Then a draft is verified only when
``E(k) - 1 > rate * (cost(k) - cost(1))``, which implies ``E(k) / (cost(k) + overhead) >
1 / (cost(1) + overhead)``: in expectation, every step that drafts beats a plain step.
When no draft pays, ``k = 1``: the step is a plain step.

**Probes, on a time budget.** Calibration on a busy machine can overstate what larger trees
cost, and a size the rule never picks is never measured again. So a step on which the rule cut
the tree sometimes verifies twice the chosen nodes instead (the next best by ``p``; one node
becomes two): a bounded exploration that keeps the cost model honest where the decision is
made, and gives the acceptance model trials of nodes just past the cut. Every cut step earns a
share of its own predicted time, :data:`CUT_PROBE_SHARE` (:data:`DECLINED_PROBE_SHARE` when it
declined every draft), and when the earnings cover what the probe adds, ``cost(2k) - cost(k)``,
the step probes (reason ``"probe"``). So probes take at most that share of the cut steps' time,
whatever the cost curve: where ``2k`` nodes cost little more than ``k`` they come often, where
they cost a second forward, rarely. They used to come every 16th cut step whatever they cost:
~1% of the time on a CPU whose cost grew smoothly with ``k``, but ~1.4% where verification is
flat up to 8 nodes and ``2k`` crosses the step after them, more than they taught
(docs/benchmarks.md, "The budget on a flat cost curve").

**Declined steps probe more.** A source whose first drafts failed (Token Recycling's tree while
its matrix is still cold) gets a low estimate; the rule then declines its drafts, so they are
never verified, and the estimate stays low after the drafter has become good: measured on six
held-out prompts from an empty state, the same sequence ended anywhere between 317 and 389
steps, by whether a rare probe happened to hit. So declined steps earn the larger share,
:data:`DECLINED_PROBE_SHARE` of their plain step's time, ``cost(1)``, toward verifying their
best node. Where a node costs little (a CPU's ~0.5 ms against a ~12 ms step) about two
declined steps in three probe; where it costs a whole step (dear verification) one in ~33.
Either way a draft that is really worthless costs that share and no more.

Budgets: ``"auto"`` (the rule above), ``"full"`` (the drafter's whole tree: the papers'
fixed budgets) or an int ``N`` (every tree cut to its first ``N`` nodes). Fixed budgets
still run the acceptance model, so their stats also show expected vs realised acceptance.

Cost per step: O(N log N) for an ``N``-node tree (sorting ``p``); ``plan`` + ``observe`` take a
small fraction of a millisecond (``benchmarks/test_budget_planner.py``), far below the
verification itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from specdec.budget.acceptance import AcceptanceModel, NodeKey, node_keys
from specdec.budget.calibration_cache import cost_model
from specdec.budget.cost_model import VerifyCostModel, finite_number
from specdec.errors import SpecDecError
from specdec.types import DraftTree, TunableVerifier

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

BUDGET_MODES = ("auto", "full")
# Why a step verified the nodes it did: the drafter offered only the root; the rule found
# that no draft pays; the rule's choice; a probe (module docstring); a fixed or full budget.
REASONS = ("no draft", "declined", "auto", "probe", "fixed", "full")
CUT_PROBE_SHARE = 0.01  # steps the rule cut spend at most this share of their time verifying 2k nodes
DECLINED_PROBE_SHARE = 0.03  # declined steps spend at most this share of their time verifying their best node


@dataclass(frozen=True)
class Budget:
    """How each step's node budget is decided: ``mode`` "auto", "full", or "fixed" with ``nodes``.

    >>> Budget.parse("auto"), Budget.parse(16).nodes, str(Budget.parse("full"))
    (Budget(mode='auto', nodes=None), 16, 'full')
    """

    mode: str
    nodes: int | None = None

    @classmethod
    def parse(cls, value: str | int | Budget) -> Budget:
        """``"auto"``, ``"full"``, a positive int (or its decimal string); anything else is an error naming it."""
        if isinstance(value, Budget):
            return value
        if isinstance(value, str):
            text = value.strip().lower()
            if text in BUDGET_MODES:
                return cls(text)
            if text.isdigit():
                value = int(text)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return cls("fixed", value)
        raise SpecDecError(f"budget must be 'auto', 'full' or a positive number of nodes, got {value!r}")

    def __str__(self) -> str:
        return str(self.nodes) if self.mode == "fixed" else self.mode


def best_nodes(accept_probs: FloatArray, k: int) -> IntArray:
    """The root and the ``k - 1`` non-root nodes of largest ``p``, in increasing order: int64 ``[k]``.

    ``accept_probs`` float ``[N]`` never grows from parent to child and ties go to the lower
    index, so every chosen node's parent is chosen before it: a prefix-closed subtree. O(N log N).
    """
    order = np.argsort(-accept_probs[1:], kind="stable")[: k - 1] + 1
    return np.sort(np.concatenate((np.zeros(1, dtype=np.int64), order.astype(np.int64))))


def choose_budget(accept_probs: FloatArray, costs: FloatArray, rate: float) -> tuple[int, IntArray]:
    """The node count ``k`` maximizing ``E(k) - rate * costs[k - 1]``, and the chosen nodes.

    ``accept_probs`` float ``[N]``: ``p_i`` per node, ``p_0 = 1`` (root), non-increasing from
    parent to child; ``costs`` float ``[N]``: seconds to verify ``k = 1..N`` nodes; ``rate``:
    tokens per second. Returns ``(k, nodes)`` with ``nodes`` from :func:`best_nodes`: the
    root and the ``k - 1`` nodes of largest ``p``, a prefix-closed subtree. Ties between
    values of ``k`` go to the smaller. O(N log N).

    >>> p = np.array([1.0, 0.9, 0.1, 0.8])          # node 3 is node 1's child
    >>> choose_budget(p, np.array([1.0, 1.1, 1.2, 1.3]), rate=1.0)
    (3, array([0, 1, 3]))
    >>> choose_budget(p, np.array([1.0, 2.0, 3.0, 4.0]), rate=1.0)[0]   # drafting cannot pay
    1
    """
    n = len(accept_probs)
    if len(costs) != n:
        raise SpecDecError(f"choose_budget: {n} probabilities but {len(costs)} costs")
    gains = np.empty(n, dtype=np.float64)  # [N] E(k) for k = 1..N
    gains[0] = 1.0
    np.cumsum(-np.sort(-accept_probs[1:]), out=gains[1:])
    gains[1:] += 1.0
    k = int(np.argmax(gains - rate * costs)) + 1  # argmax returns the first maximum: the smaller k
    return k, best_nodes(accept_probs, k)


@dataclass
class Throughput:
    """The run's rate (tokens per second) and per-step overhead, as decayed running sums.

    A step's time counts as the cost model's prediction for its verification (when there
    is one) plus the measured overhead: the cost model is refined from measured times, so
    this is the measured rate without the noise of single steps, and with a frozen cost
    model and a ``fixed_overhead_s`` the rule's decisions depend on no clock at all (replays,
    tests). ``memory`` per step: ~``1 / (1 - memory)`` recent steps weigh in.
    """

    memory: float = 0.95
    fixed_overhead_s: float | None = None
    tokens: float = 0.0
    seconds: float = 0.0
    overhead_s: float = 0.0
    steps: int = 0

    def __post_init__(self) -> None:
        if self.fixed_overhead_s is not None:
            self.overhead_s = self.fixed_overhead_s

    def observe(self, emitted: int, step_s: float, verify_s: float, predicted_verify_s: float | None) -> None:
        """One step: ``emitted`` tokens in ``step_s`` seconds, ``verify_s`` of them verifying."""
        if self.fixed_overhead_s is None:
            rate = max(1.0 / (self.steps + 1), 1.0 - self.memory)
            self.overhead_s += rate * (max(step_s - verify_s, 0.0) - self.overhead_s)
        verify = verify_s if predicted_verify_s is None else predicted_verify_s
        self.tokens = self.memory * self.tokens + emitted
        self.seconds = self.memory * self.seconds + verify + self.overhead_s
        self.steps += 1

    def rate(self, floor: float) -> float:
        """Tokens per second lately, never below ``floor`` (plain decoding's rate)."""
        measured = self.tokens / self.seconds if self.seconds > 0.0 else 0.0
        return max(measured, floor)

    def state(self) -> dict[str, float]:
        """What was measured, JSON-ready; :meth:`load_state` reads it back."""
        return {"tokens": self.tokens, "seconds": self.seconds, "overhead_s": self.overhead_s, "steps": self.steps}

    def load_state(self, state: Any) -> None:
        """Take another run's measurements (saved by :meth:`state`); a fixed overhead stays fixed.

        Every value is checked first (finite, non-negative numbers): a bad one raises
        :class:`SpecDecError` naming it and changes nothing.
        """
        values = {}
        for name in ("tokens", "seconds", "overhead_s", "steps"):
            value = state.get(name) if isinstance(state, dict) else None
            if not finite_number(value):
                raise SpecDecError(f"throughput state: {name} must be a finite number >= 0, got {value!r}")
            values[name] = float(value)
        self.tokens, self.seconds, self.steps = values["tokens"], values["seconds"], int(values["steps"])
        if self.fixed_overhead_s is None:
            self.overhead_s = values["overhead_s"]


@dataclass(frozen=True)
class Plan:
    """One step's decision: the tree to verify and why.

    ``keys``: the acceptance key of each node of ``tree``; ``offered``: nodes the drafter
    proposed (after depth pruning); ``expected``: expected accepted draft tokens of ``tree``;
    ``predicted_s``: predicted verification seconds (None without a cost model);
    ``calibration_s``: seconds spent calibrating the cost model in this call (first use only);
    ``reason``: why this size (:data:`REASONS`).
    """

    tree: DraftTree
    keys: Sequence[NodeKey]
    offered: int
    expected: float
    predicted_s: float | None = None
    calibration_s: float = 0.0
    reason: str = ""


class BudgetPlanner:
    """Decides each step's tree under a :class:`Budget` and learns from every verified step.

    ``acceptance`` and ``throughput`` carry what was learned; pass the same objects to the
    planners of later generations to keep it (a :class:`~specdec.api.Generator` does).
    The cost model is shared per model, device and dtype
    (:func:`~specdec.budget.calibration_cache.cost_model`), loaded or calibrated the first
    time a tree of more than one node is offered, under any budget; ``load_cost`` replaces
    that loading (the :class:`~specdec.api.Generator` passes one that also switches the
    verifier to the kernels the calibration chose). ``cost``: a model to use from the start.
    """

    def __init__(
        self,
        verifier: TunableVerifier[Any],
        budget: Budget | str | int = "auto",
        acceptance: AcceptanceModel | None = None,
        throughput: Throughput | None = None,
        cost: VerifyCostModel | None = None,
        *,
        load_cost: Callable[[], tuple[VerifyCostModel, float]] | None = None,
        guard: Any = None,
    ) -> None:
        self.verifier = verifier
        self.budget = Budget.parse(budget)
        self.acceptance = acceptance if acceptance is not None else AcceptanceModel()
        self.throughput = throughput if throughput is not None else Throughput()
        self._cost = cost
        self._load_cost = load_cost if load_cost is not None else lambda: cost_model(verifier)
        self._probe_credit = 0.0  # seconds cut steps earned toward their probes (module docstring)
        self.guard = guard  # the lone sequence's LoneGuard (specdec.budget.batch_planner), kept by its memory
        self._context = 0  # the committed length of the last plan

    @property
    def cost(self) -> VerifyCostModel | None:
        """The cost model, once loaded (None before the first decision that needed it)."""
        return self._cost

    def plan(self, tree: DraftTree, committed_len: int) -> Plan:
        """The tree to verify after ``committed_len`` committed tokens, cut from the drafter's ``tree``."""
        keys = node_keys(tree)
        offered = tree.size
        self._context = committed_len
        calibration_s = 0.0
        if self._cost is None and offered > 1:
            # Every budget loads it: the calibration also says which kernels the verifier runs.
            self._cost, calibration_s = self._load_cost()
        if offered == 1 or self.budget.mode != "auto":  # nothing to decide: say what is expected
            predicted = None
            if self._cost is not None:
                predicted = float(self._cost.predict(np.array([offered]), committed_len)[0])
            expected = 0.0 if offered == 1 else float(self.acceptance.estimate(tree, keys)[1][1:].sum())
            reason = "no draft" if offered == 1 else self.budget.mode
            return Plan(tree, keys, offered, expected, predicted, calibration_s, reason)
        assert self._cost is not None  # offered > 1: loaded above
        _, accept_probs = self.acceptance.estimate(tree, keys)
        costs = self._cost.predict(np.arange(1, offered + 1), committed_len)  # [N]
        rate = self.throughput.rate(1.0 / (costs[0] + self.throughput.overhead_s))
        k, nodes = choose_budget(accept_probs, costs, rate)
        reason = "declined" if k == 1 else "auto"
        if k < offered:
            probe = min(offered, 2 * k)
            extra = float(costs[probe - 1] - costs[k - 1])  # what verifying the probe's nodes adds to this step
            self._probe_credit += (DECLINED_PROBE_SHARE if k == 1 else CUT_PROBE_SHARE) * float(costs[k - 1])
            if self._probe_credit >= extra:
                self._probe_credit = min(self._probe_credit - extra, extra)  # no hoard for a burst later
                k, reason = probe, "probe"
                nodes = best_nodes(accept_probs, k)
            chosen = nodes.tolist()
            tree = tree.select(chosen)
            keys = [keys[i] for i in chosen]
        expected = float(accept_probs[nodes[1:]].sum())
        return Plan(tree, keys, offered, expected, float(costs[k - 1]), calibration_s, reason)

    def plain_rate(self) -> float | None:
        """Plain decoding's tokens per second by the cost model and the measured overhead (None before the model
        is loaded): what a :class:`~specdec.budget.batch_planner.LoneGuard` weighs drafting steps against."""
        if self._cost is None:
            return None
        return 1.0 / (float(self._cost.predict(np.array([1]), self._context)[0]) + self.throughput.overhead_s)

    def observe(
        self, plan: Plan, accepted_nodes: Sequence[int], committed_len: int, verify_s: float, step_s: float
    ) -> None:
        """Learn from the verified ``plan.tree``: acceptance, verification cost and throughput.

        ``committed_len`` is the committed length the tree was verified after; ``step_s``
        the whole step's wall time (drafting, planning, verification, the drafter's update).
        """
        self.acceptance.observe(plan.tree, plan.keys, accepted_nodes)
        if self._cost is not None:
            self._cost.observe(plan.tree.size, committed_len, verify_s)
        self.throughput.observe(len(accepted_nodes), step_s, verify_s, plan.predicted_s)

