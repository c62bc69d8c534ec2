"""What the budget planners learn and keep from one generation to the next: one object a Generator holds.

A :class:`~specdec.budget.planner.BudgetPlanner` (one sequence) or a
:class:`~specdec.budget.batch_planner.BatchPlanner` (a batch) lives for one generation; what they
learn lives in a :class:`PlannerMemory`: the acceptance model (shared by both: a node's chance does
not depend on its neighbours in a batch), the lone sequence's throughput, the batch's throughput and
guard per number of rows, the two cost models (a batch refines its own, so what it learns never bends
a lone sequence's budgets) and the saved statistics of this identity (:mod:`specdec.budget.planner_stats`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specdec.budget import calibration_cache
from specdec.budget.acceptance import AcceptanceModel
from specdec.budget.batch_planner import BatchGuard, BatchPlanner, LoneGuard
from specdec.budget.cost_model import VerifyCostModel
from specdec.budget.machine_load import FOLLOWER
from specdec.budget.planner import Budget, BudgetPlanner, Throughput
from specdec.budget.planner_stats import PlannerStatsFile, open_planner_stats
from specdec.types import TunableVerifier


@dataclass
class PlannerMemory:
    """The planners' memory across generations (module docstring).

    ``cost``: the single-sequence cost model once loaded (the calibration's model, refined by lone
    steps); ``batch_cost``: the batch's own, from the same table; ``stats``: where this identity's
    statistics are saved and loaded (None: ``planner_cache=False``, or plain decoding).
    """

    acceptance: AcceptanceModel = field(default_factory=AcceptanceModel)
    throughput: Throughput = field(default_factory=Throughput)
    batch_throughputs: dict[int, Throughput] = field(default_factory=dict)  # by rows
    batch_guards: dict[int, BatchGuard] = field(default_factory=dict)  # by rows: whether drafting pays a batch
    cost: VerifyCostModel | None = None
    batch_cost: VerifyCostModel | None = None
    stats: PlannerStatsFile | None = None
    lone_guard: LoneGuard = field(default_factory=LoneGuard)  # whether a lone sequence's drafting pays, measured

    def open_stats(
        self, planner_cache: bool | None, verifier: TunableVerifier[Any], tokenizer: Any, drafter: Any,
        options: Mapping[str, Any],
    ) -> None:
        """Find this identity's saved statistics and load what earlier runs learned (a bad file: a warning)."""
        self.stats = open_planner_stats(planner_cache, verifier, tokenizer, drafter, options)
        if self.stats is not None:
            self.stats.load(self.acceptance, self.throughput)

    def load_cost(self, verifier: TunableVerifier[Any]) -> tuple[VerifyCostModel, float]:
        """The verifier's cost model and the seconds spent calibrating it (0.0: cached); the verifier then
        runs the kernels the calibration chose, and a model new to this process starts from the saved
        refinement."""
        model, spent = calibration_cache.cost_model(verifier)
        if model.table.measured:  # a prior's (or what runs learned from one) is the verifier's own choice already
            verifier.use_kernels(model.table.kernels)
        if self.stats is not None:
            self.stats.load_cost(model)
        self.cost = model
        return model, spent

    def load_batch_cost(self, verifier: TunableVerifier[Any]) -> tuple[VerifyCostModel, float]:
        """The batch's cost model (its own, from the calibration's table) and the seconds calibrating."""
        model, spent = self.load_cost(verifier)
        if self.batch_cost is None or self.batch_cost.table is not model.table:
            self.batch_cost = VerifyCostModel(model.table)
        return self.batch_cost, spent

    def planner(self, verifier: TunableVerifier[Any], budget: Budget) -> BudgetPlanner:
        """One sequence's planner for one generation, learning into this memory."""
        return BudgetPlanner(verifier, budget, self.acceptance, self.throughput,
                             load_cost=lambda: self.load_cost(verifier), guard=self.lone_guard)  # fmt: skip

    def batch_planner(self, verifier: TunableVerifier[Any], budget: Budget) -> BatchPlanner:
        """A batch's planner for one call, learning into this memory."""
        return BatchPlanner(budget, self.acceptance, self.batch_throughputs, lambda: self.load_batch_cost(verifier),
                            self.batch_guards)  # fmt: skip

    def save(self) -> None:
        """What the generations taught goes to the planner cache (nothing without one), and the cost model's
        refinement to the calibration cache where it began from a prior
        (:func:`~specdec.budget.calibration_cache.remember`)."""
        if self.stats is not None:
            self.stats.save(self.acceptance, self.throughput, self.cost)
        if self.cost is not None:
            calibration_cache.remember(self.cost, FOLLOWER.generation_share)
