"""``specdec generate``: generate text from a prompt, streaming it, then print the run's stats.

    specdec generate "prompt" --drafter pld --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

from specdec.api import Generator
from specdec.commands.arguments import (
    add_budget_argument,
    add_model_argument,
    add_placement_arguments,
    engine_options,
    parse_options,
)
from specdec.drafters import available_drafters
from specdec.errors import SpecDecError


class TextStream:
    """Prints decoded text as tokens arrive, holding back an incomplete UTF-8 character."""

    def __init__(self, decode: Callable[[list[int]], str], out: TextIO) -> None:
        self._decode = decode
        self._out = out
        self._tokens: list[int] = []
        self._printed = 0

    def __call__(self, tokens: list[int]) -> None:
        self._tokens.extend(tokens)
        text = self._decode(self._tokens)
        if text.endswith("\ufffd"):  # a multi-byte character split across tokens: wait for the rest
            return
        self._out.write(text[self._printed :])
        self._out.flush()
        self._printed = len(text)

    def finish(self) -> None:
        text = self._decode(self._tokens)
        self._out.write(text[self._printed :] + "\n")
        self._out.flush()


def cmd_generate(args: argparse.Namespace) -> int:
    generator = Generator(
        args.model, drafter=args.drafter, drafter_options=parse_options(args.option), device=args.device,
        dtype=args.dtype, **engine_options(args),
    )
    if generator.tokenizer is None:
        raise SpecDecError("the model has no tokenizer to decode the output")
    tokenizer = generator.tokenizer
    stream = TextStream(lambda t: str(tokenizer.decode(t, skip_special_tokens=True)), sys.stdout)
    result = generator.generate(
        args.prompt,
        max_new_tokens=args.max_new_tokens,
        chat_template=False if args.no_chat else None,
        stop=args.stop or None,
        max_nodes=args.max_nodes,
        budget=args.budget,
        on_tokens=None if args.quiet else stream,
    )
    if args.quiet:
        print(result.text)
    else:
        stream.finish()
    summary = result.stats.summary()
    print(json.dumps(summary) if args.json else _stats_text(summary), file=sys.stderr)
    return 0


def _stats_text(summary: dict[str, Any]) -> str:
    """A run's stats in two lines (the second, the budget's, only when a budget planner ran)."""
    return (
        f"[{summary['new_tokens']} tokens in {summary['total_s']:.2f} s: {summary['tokens_per_s']:.2f} tokens/s, "
        f"{summary['steps']} steps, MAT {summary['mat']:.2f}, mean tree {summary['mean_tree_size']:.1f} nodes; "
        f"draft {summary['draft_s']:.3f} s, verify {summary['verify_s']:.3f} s, prefill {summary['prefill_s']:.3f} s, "
        f"other {summary['other_s']:.3f} s; stop: {summary['stop_reason']}]" + _budget_text(summary)
    )


def _budget_text(summary: dict[str, Any]) -> str:
    """The budget's line: nodes offered vs verified, expected vs realised accepted tokens per step."""
    if not summary.get("budget"):
        return ""
    expected = summary["expected_accepted"]
    realised = summary["realised_accepted"]
    return (
        f"\n[budget {summary['budget']}: {summary['mean_offered']:.1f} nodes offered, "
        f"{summary['mean_tree_size']:.1f} verified per step; steps by reason {summary['steps_by_reason']}; "
        f"accepted per step: expected {expected if expected is not None else '-'}, "
        f"realised {realised if realised is not None else '-'}]"
    )


def register(sub: Any) -> None:
    gen = sub.add_parser("generate", help="generate text, streaming it, then print the stats")
    gen.add_argument("prompt")
    add_model_argument(gen)
    gen.add_argument("--drafter", default="pld", help=f"one of: {', '.join(available_drafters())}")
    gen.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a drafter option")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--max-nodes", type=int, default=None, help="cap on draft-tree nodes per step")
    add_budget_argument(gen)
    gen.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    add_placement_arguments(gen)
    gen.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    gen.add_argument("--quiet", action="store_true", help="print the text once at the end instead of streaming")
    gen.add_argument("--json", action="store_true", help="print the stats as JSON")
    gen.set_defaults(func=cmd_generate)
