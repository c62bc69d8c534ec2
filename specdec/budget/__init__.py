"""Cost-aware draft budgets: how many draft nodes each step verifies.

A step that verifies ``k`` nodes costs ``cost(k, C)`` seconds after ``C`` committed tokens
and emits ``1 + sum of the accepted nodes' p_i`` tokens on average. On a GPU ``cost`` is
flat for small ``k`` and long drafts are nearly free; on a CPU a 16-node verification
costs ~1.9x a plain step, and a fixed budget tuned for the GPU loses to plain decoding.
``budget="auto"`` measures both sides and picks ``k`` per step:

- :mod:`specdec.budget.cost_model`: verification seconds vs tree size and context length,
  refined online from real steps; :mod:`specdec.budget.calibration` measures them (and which
  kernels run) once per model, device and dtype, :mod:`specdec.budget.calibration_cache`
  keeps them (unless the machine was busy: :mod:`specdec.budget.machine_load`);
- :mod:`specdec.budget.acceptance`: per-node acceptance learned per drafter source, the
  drafter's per-node feature (match length), depth and sibling rank;
- :mod:`specdec.budget.planner`: the decision rule (maximize expected tokens minus the
  run's rate times the cost), which never drafts when plain decoding is expected to win.

docs/budget.md has the derivations and the measured numbers.
"""

from __future__ import annotations

from specdec.budget.acceptance import AcceptanceModel, length_feature, node_keys
from specdec.budget.calibration import calibrate
from specdec.budget.calibration_cache import cost_model
from specdec.budget.cost_model import CostTable, VerifyCostModel
from specdec.budget.planner import Budget, BudgetPlanner, Plan, Throughput, choose_budget

__all__ = [
    "AcceptanceModel",
    "Budget",
    "BudgetPlanner",
    "CostTable",
    "Plan",
    "Throughput",
    "VerifyCostModel",
    "calibrate",
    "choose_budget",
    "cost_model",
    "length_feature",
    "node_keys",
]
