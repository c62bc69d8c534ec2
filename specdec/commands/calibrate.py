"""``specdec calibrate``: measure (or show the cached) verification cost, and the budgets it implies.

    specdec calibrate                       # the default model on this machine's device
    specdec calibrate --recalibrate --json  # measure again, overwrite the cache, print JSON
    specdec calibrate --device cuda --dtype float16

The table gives the seconds one verification takes per tree size and context length; the
budget table shows what ``budget="auto"`` would verify of a chain draft whose tokens are
each accepted with probability ``q`` (given the previous one was), at plain decoding's
rate: long drafts where verification is cheap (a GPU), short or none where it is not.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from specdec.backends import make_verifier
from specdec.budget.calibration import calibration_identity
from specdec.budget.calibration_cache import calibration_path, cost_model
from specdec.budget.machine_load import busy_reason
from specdec.budget.planner import choose_budget
from specdec.commands.arguments import add_model_argument, add_placement_arguments, engine_choice
from specdec.models import load_model
from specdec.types import DEFAULT_KERNEL, KernelChoice

# Per-token conditional acceptance of the example chains, and their length (a SAM-sized chain).
EXAMPLE_ACCEPTANCE = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
EXAMPLE_CHAIN = 40
EXAMPLE_CONTEXT = 512


def budget_examples(model: Any, context: int = EXAMPLE_CONTEXT, chain: int = EXAMPLE_CHAIN) -> list[dict[str, Any]]:
    """For each example ``q``: nodes ``auto`` verifies of a ``chain``-node chain, and the expected speedup.

    ``model`` is a :class:`~specdec.budget.cost_model.VerifyCostModel`; the rate is plain decoding's
    (``1 / cost(1)``), what a run starts from. O(len(EXAMPLE_ACCEPTANCE) * chain).
    """
    costs = model.predict(np.arange(1, chain + 1), context)  # [chain]
    rows = []
    for q in EXAMPLE_ACCEPTANCE:
        accept_probs = q ** np.arange(chain, dtype=np.float64)  # [chain] p_i = q^i along a chain
        k, _ = choose_budget(accept_probs, costs, 1.0 / float(costs[0]))
        expected = float(accept_probs[:k].sum())  # 1 (bonus) + expected accepted draft tokens
        rows.append({"q": q, "nodes": k, "expected_tokens": round(expected, 3),
                     "expected_speedup": round(expected / float(costs[k - 1]) * float(costs[0]), 3)})
    return rows


def kernel_lines(choice: KernelChoice) -> list[str]:
    """One line per range of forward sizes that runs kernels other than the default (measured faster here)."""
    lines, low = [], 1
    for up_to, variant in choice.ranges:
        if variant != DEFAULT_KERNEL:
            sizes = "one-node steps" if up_to == 1 else f"trees of {low} to {up_to} nodes"
            lines.append(f"{sizes} run {variant} kernels (measured faster here)")
        low = up_to + 1
    if choice.beyond != DEFAULT_KERNEL:
        lines.append(f"trees of {low} nodes or more run {choice.beyond} kernels")
    return lines


def cmd_calibrate(args: argparse.Namespace) -> int:
    model, _ = load_model(None if args.model == "default" else args.model, dtype=args.dtype, device=args.device)
    engine, tree_ops = engine_choice(args, model)
    verifier = make_verifier(model, engine, tree_ops=tree_ops)
    cost, spent = cost_model(verifier, measure=True, recalibrate=args.recalibrate, cache_busy=args.force)
    table = cost.table
    busy = busy_reason(table)
    ms_rows = [[round(s * 1e3, 2) for s in row] for row in table.seconds]
    budgets = budget_examples(cost)
    report: dict[str, Any] = {
        "identity": calibration_identity(verifier),
        "cache": str(calibration_path(calibration_identity(verifier))),
        "calibration_s": round(spent, 2),
        "sizes": list(table.sizes),
        "contexts": list(table.contexts),
        "ms": ms_rows,
        "kernels": table.to_json()["kernels"],
        "spread": round(table.spread, 4),
        "others_share": round(table.others_share, 4),
        "busy": busy,
        "cached": bool(busy is None or args.force or not spent),
        "budgets": budgets,
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{report['identity']['device']}, {report['identity']['dtype']}: "
          f"{'measured in ' + str(report['calibration_s']) + ' s' if spent else 'cached'} ({report['cache']})")
    print(f"measured with repeats spread by {table.spread:.0%} and other processes using "
          f"{table.others_share:.0%} of the CPUs" + ("" if busy is None else f": a busy machine ({busy})")
          + ("" if report["cached"] else "; not cached (--force caches it anyway)"))
    print("verification ms by tree size (columns) and context length (rows):")
    print("context  " + "  ".join(f"{s:>7}" for s in table.sizes))
    for context, ms_row in zip(table.contexts, ms_rows, strict=True):
        print(f"{context:>7}  " + "  ".join(f"{ms:7.2f}" for ms in ms_row))
    for line in kernel_lines(table.kernels):
        print(line)
    print(f"\nbudget='auto' on a {EXAMPLE_CHAIN}-node chain at context {EXAMPLE_CONTEXT}, plain decoding's rate:")
    print("   q   nodes  expected tokens  expected speedup")
    for row in budgets:
        print(f"{row['q']:>5}  {row['nodes']:>5}  {row['expected_tokens']:>15}  {row['expected_speedup']:>16}")
    return 0


HELP = "measure the verification cost per tree size (cached) and show the budgets it implies"
DESCRIPTION = ("Calibrates the cost model behind budget='auto' for a model, device and dtype (or shows the cached "
               "calibration) and prints the draft budgets it picks for example acceptance rates.")


def register(sub: Any) -> None:
    parser = sub.add_parser("calibrate", help=HELP, description=DESCRIPTION)
    add_model_argument(parser)
    add_placement_arguments(parser)
    parser.add_argument("--recalibrate", action="store_true", help="measure again and overwrite the cache")
    parser.add_argument("--force", action="store_true",
                        help="cache the measurement even when the machine was busy (for machines never quiet)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=cmd_calibrate)
