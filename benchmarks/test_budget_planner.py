"""The budget planner's own cost per step: ``plan`` (estimate every node's ``p``, price every
size, choose) plus ``observe`` (learn from the verified tree), on the trees drafters offer.

    python -m pytest benchmarks/test_budget_planner.py --benchmark-only

Trees: PLD's 11-node chain, SAM's 40-node chain, and an 81-node tree shaped like Token
Recycling's template (8 / 21 / 25 / 15 / 8 / 3 nodes per level). The cost model is a
frozen table, so no model runs; the acceptance model has learned from 200 earlier steps
(its tables are warm, as in a running generator). ``extra_info`` holds the nodes verified.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from specdec.budget import AcceptanceModel, BudgetPlanner, CostTable, VerifyCostModel
from specdec.types import DraftTree

LEVELS = (8, 21, 25, 15, 8, 3)  # Token Recycling's 81-node template, nodes per level
COSTS = VerifyCostModel(
    CostTable((1, 8, 16, 32, 64, 128), (1, 4096), ((0.053, 0.083, 0.102, 0.129, 0.190, 0.312),) * 2, {}),
    learn=False,
)


def level_tree(levels: tuple[int, ...], rng: random.Random) -> DraftTree:
    """A tree with ``levels[d]`` nodes at depth ``d + 1``, each parent drawn from the level above."""
    tokens, parents, previous = [0], [-1], [0]
    for count in levels:
        current = []
        for _ in range(count):
            parent = previous[min(int(rng.expovariate(1.0)), len(previous) - 1)]
            tokens.append(len(tokens))
            parents.append(parent)
            current.append(len(tokens) - 1)
        previous = current
    return DraftTree(tuple(tokens), tuple(parents), "recycling")


def first_branch(tree: DraftTree, depth: int) -> list[int]:
    """The root and, ``depth`` times, the first child of the last node (fewer where the tree ends)."""
    children = tree.children()
    path = [0]
    while len(path) <= depth and children[path[-1]]:
        path.append(min(children[path[-1]].values()))
    return path


TREES = {
    "pld-chain-11": DraftTree.chain(0, list(range(1, 11)), "pld", feature=2),
    "sam-chain-40": DraftTree.chain(0, list(range(1, 40)), "sam-dynamic", feature=9),
    "recycling-tree-81": level_tree(LEVELS, random.Random(0)),
}


@pytest.mark.parametrize("name", list(TREES))
def test_plan_and_observe(benchmark: Any, name: str) -> None:
    tree = TREES[name]
    planner = BudgetPlanner(None, "auto", AcceptanceModel(), cost=COSTS)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    for _ in range(200):  # warm tables: accepted paths of random length along the first branch
        plan = planner.plan(tree, 500)
        planner.observe(plan, first_branch(plan.tree, int(rng.integers(0, 6))), 500, 0.1, 0.11)

    def step() -> Any:
        plan = planner.plan(tree, 500)
        planner.observe(plan, (0,), 500, 0.1, 0.11)
        return plan

    plan = benchmark(step)
    benchmark.extra_info["offered"] = tree.size
    benchmark.extra_info["verified"] = plan.tree.size
