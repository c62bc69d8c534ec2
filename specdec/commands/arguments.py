"""Argument helpers the commands share: placement flags, ``--budget``, ``key=value`` options."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from specdec.backends import CACHES
from specdec.budget.planner import Budget
from specdec.errors import SpecDecError

MODEL_HELP = "a local checkpoint directory, or 'default'"


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """``--model``: a local checkpoint directory, or the default model."""
    parser.add_argument("--model", default="default", help=MODEL_HELP)


def add_placement_arguments(parser: argparse.ArgumentParser) -> None:
    """``--device``, ``--dtype`` and ``--cache``: where the model runs and how its verification forwards run."""
    parser.add_argument("--device", default=None, help="torch device for the model, e.g. cpu, cuda (default: cpu)")
    parser.add_argument("--dtype", default=None, help="model dtype: float32, bfloat16, float16 (default: float32)")
    parser.add_argument("--cache", default="auto", choices=CACHES,
                        help="KV cache: static (compiled/CUDA graphs), dynamic, or auto (static on CUDA)")


def budget_arg(text: str) -> str:
    """The argparse type of ``--budget``: a bad value fails before any model loads."""
    try:
        Budget.parse(text)
    except SpecDecError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def add_budget_argument(parser: argparse.ArgumentParser) -> None:
    """``--budget``: draft nodes per step."""
    parser.add_argument("--budget", default="auto", type=budget_arg,
                        help="draft nodes per step: auto (cost-aware), full, or a count N")


def parse_options(pairs: Sequence[str], what: str = "drafter option") -> dict[str, Any]:
    """``key=value`` pairs; values are parsed as JSON when they can be (numbers, booleans), else kept as text."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SpecDecError(f"{what} {pair!r} is not key=value")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options
