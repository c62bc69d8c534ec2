"""Argument helpers the commands share: placement flags, ``--budget``, ``key=value`` options."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from specdec.backends import CACHES, ENGINES, TREE_OPS, former_spellings
from specdec.budget.planner import Budget
from specdec.errors import SpecDecError

MODEL_HELP = "a local checkpoint directory, or 'default'"


class FormerFlag(argparse.Action):
    """A flag's former spelling: stores into the new flag's ``dest`` and names the new flag on stderr."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:  # fmt: skip
        print(f"specdec: {option_string} is deprecated: use --{self.dest.replace('_', '-')}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """``--model``: a local checkpoint directory, or the default model."""
    parser.add_argument("--model", default="default", help=MODEL_HELP)


def add_placement_arguments(parser: argparse.ArgumentParser) -> None:
    """``--device``, ``--dtype`` and ``--engine``: where the model runs and what runs its forward."""
    parser.add_argument("--device", default=None, help="torch device for the model, e.g. cpu, cuda (default: cpu)")
    parser.add_argument("--dtype", default=None, help="model dtype: float32, bfloat16, float16 (default: float32)")
    add_engine_arguments(parser)


def add_engine_arguments(parser: argparse.ArgumentParser, engines: Sequence[str] = ENGINES,
                         default: str = "auto") -> None:  # fmt: skip
    """``--engine`` (what runs the model's forward) and ``--tree-ops`` (tests and benchmarks), with their
    former spellings ``--cache`` and ``--backend`` (hidden; :func:`engine_options` warns)."""
    parser.add_argument("--engine", default=default, choices=engines,
                        help="what runs the model's forward: auto (specdec's own on a CPU for Llama-family models, "
                             "CUDA graphs on a GPU), hf, specdec, compiled, graphs, ... (default: %(default)s)")
    parser.add_argument("--tree-ops", default="auto", choices=TREE_OPS,
                        help="the tree operations, for tests and benchmarks (default: %(default)s)")
    parser.add_argument("--cache", default=None, choices=CACHES, help=argparse.SUPPRESS)  # former --engine
    parser.add_argument("--backend", default=None, choices=TREE_OPS, help=argparse.SUPPRESS)  # former --tree-ops


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~specdec.Generator` keywords of :func:`add_engine_arguments`'s flags (the former ones warn there)."""
    return {"engine": args.engine, "tree_ops": args.tree_ops, "cache": args.cache, "backend": args.backend}


def engine_choice(args: argparse.Namespace, model: Any) -> tuple[str, str]:
    """``(engine, tree_ops)`` of :func:`add_engine_arguments`'s flags for ``model`` (the former ones warn)."""
    return former_spellings(model, args.engine, args.tree_ops, args.cache, args.backend)


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
