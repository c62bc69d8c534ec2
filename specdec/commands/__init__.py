"""The command wing: every command-line entry point, above the library it drives.

``specdec`` (the console script, :func:`main`) and its subcommands, one module each:
``generate``, ``demo``, ``datastore``, ``calibrate``, ``bench``, ``recycling-template``,
``train-head``, ``cache``, ``cold-start``; their shared argument helpers (:mod:`~specdec.commands.arguments`);
and the ``python -m`` drivers of the vLLM integration (:mod:`~specdec.commands.vllm_flags`,
:mod:`~specdec.commands.vllm_check`). The commands import the library; no library module
imports them (``tests/test_layers.py`` holds that).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from specdec.commands import (
    bench,
    cache,
    calibrate,
    coldstart,
    datastore,
    demo,
    generate,
    precompile,
    recycling_template,
    train_head,
)
from specdec.errors import SpecDecError

# The subcommands, in the order ``specdec --help`` lists them; each module has ``register(subparsers)``.
SUBCOMMANDS = (generate, demo, datastore, calibrate, precompile, bench, recycling_template, train_head, cache,
               coldstart)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding for Hugging Face LMs.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in SUBCOMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``specdec ARGV``; a :class:`~specdec.errors.SpecDecError` prints one line and exits 2."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except SpecDecError as error:
        print(f"specdec: error: {error}", file=sys.stderr)
        return 2
    return code


__all__ = ["build_parser", "main"]
