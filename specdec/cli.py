"""The ``specdec`` command: ``generate``, ``demo`` and the subcommands other modules add.

``specdec generate "prompt" --drafter pld --max-new-tokens 128`` streams the text as it is
decided and prints the run's stats after it; ``specdec demo`` compares plain decoding
with speculative drafters on the default model.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from specdec.errors import SpecDecError

DEMO_PROMPT = (
    "Here is a Python function:\n\n"
    "def moving_average(values, window):\n"
    "    result = []\n"
    "    for i in range(len(values) - window + 1):\n"
    "        total = 0\n"
    "        for j in range(window):\n"
    "            total += values[i + j]\n"
    "        result.append(total / window)\n"
    "    return result\n\n"
    "Rename the function to `rolling_mean` and the argument `values` to `data`. "
    "Reply with the whole updated function only."
)


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


def _parse_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``key=value`` pairs; values are parsed as JSON when they can be (numbers, booleans)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SpecDecError(f"drafter option {pair!r} is not key=value")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def _format_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(str(row[c]).ljust(w) for c, w in zip(columns, widths, strict=True)))
    return "\n".join(lines)


def cmd_generate(args: argparse.Namespace) -> int:
    from specdec.api import Generator

    generator = Generator(
        args.model, drafter=args.drafter, drafter_options=_parse_options(args.option), backend=args.backend
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


def cmd_demo(args: argparse.Namespace) -> int:
    from specdec.api import Generator

    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    if "none" not in drafters:
        drafters.insert(0, "none")
    print(f"Loading the model ({args.model}) ...", file=sys.stderr)
    generators = {name: Generator(args.model, drafter=name, budget=args.budget) for name in drafters}
    prompt = args.prompt or DEMO_PROMPT
    print(f"Prompt:\n{prompt}\n", file=sys.stderr)
    generators["none"].generate(prompt, max_new_tokens=8)  # warm-up: first calls pay one-time costs
    results = {}
    for name, generator in generators.items():
        print(f"... {name}", file=sys.stderr)
        results[name] = generator.generate(prompt, max_new_tokens=args.max_new_tokens)
    baseline = results["none"]
    print("Generated text:\n" + (baseline.text or ""))
    rows = []
    for name, result in results.items():
        stats = result.stats
        rows.append(
            {
                "drafter": name,
                "tokens": stats.new_tokens,
                "tokens/s": f"{stats.tokens_per_s:.2f}",
                "MAT": f"{stats.mat:.2f}",
                "speedup": f"{stats.tokens_per_s / baseline.stats.tokens_per_s:.2f}x",
                "identical": "yes" if result.tokens == baseline.tokens else "NO",
            }
        )
    print()
    print(_format_table(rows, ["drafter", "tokens", "tokens/s", "MAT", "speedup", "identical"]))
    return 0 if all(r["identical"] == "yes" for r in rows) else 1


def build_parser() -> argparse.ArgumentParser:
    from specdec.budget.cli import budget_arg
    from specdec.drafters import available_drafters

    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding for Hugging Face LMs.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text, streaming it, then print the stats")
    gen.add_argument("prompt")
    gen.add_argument("--model", default="default", help="a local checkpoint directory, or 'default'")
    gen.add_argument("--drafter", default="pld", help=f"one of: {', '.join(available_drafters())}")
    gen.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a drafter option")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--max-nodes", type=int, default=None, help="cap on draft-tree nodes per step")
    gen.add_argument("--budget", default="auto", type=budget_arg,
                     help="draft nodes per step: auto (cost-aware), full, or a count N")
    gen.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    gen.add_argument("--backend", default="auto")
    gen.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    gen.add_argument("--quiet", action="store_true", help="print the text once at the end instead of streaming")
    gen.add_argument("--json", action="store_true", help="print the stats as JSON")
    gen.set_defaults(func=cmd_generate)

    demo = sub.add_parser("demo", help="plain decoding vs speculative drafters on the default model")
    demo.add_argument("--model", default="default")
    demo.add_argument("--drafters", default="none,pld,sam+recycling")
    demo.add_argument("--prompt", default=None)
    demo.add_argument("--max-new-tokens", type=int, default=128)
    demo.add_argument("--budget", default="auto", type=budget_arg,
                      help="draft nodes per step: auto (cost-aware), full, or a count N")
    demo.set_defaults(func=cmd_demo)

    for module in SUBCOMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return parser


# Modules that add subcommands; each has `register(subparsers)` and is imported only here.
SUBCOMMAND_MODULES: list[str] = [
    "specdec.datastores.cli",
    "specdec.budget.cli",
    "specdec.bench.cli",
    "specdec.drafters.template_calibration",
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except SpecDecError as error:
        print(f"specdec: error: {error}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
