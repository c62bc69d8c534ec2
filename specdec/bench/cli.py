"""``specdec bench``: run Spec-Bench against the peers, or report on saved runs.

    specdec bench --per-category 10 --max-new-tokens 128 --drafters none,hf-generate,hf-pld,pld --out runs/a
    specdec bench --report runs/a             # the tables of a saved run
    specdec bench --report runs/a runs/b      # two runs side by side
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from specdec.bench.questions import DEFAULT_QUESTIONS
from specdec.errors import SpecDecError

DEFAULT_METHODS = "none,hf-generate,hf-pld,pld"
REPORT_FILE = "report.md"
PLOT_FILE = "speedup.png"


def _command_line() -> str:
    """The command as typed, for results.json: ``specdec bench ...`` whatever the entry point."""
    program = Path(sys.argv[0]).name
    args = sys.argv[1:]
    if program in ("specdec", "__main__.py", "cli.py"):
        return shlex.join(["specdec", *args])
    return shlex.join(sys.argv)


def cmd_bench(args: argparse.Namespace) -> int:
    from specdec.bench.report import format_comparison, format_report, load_results

    if args.report:
        if len(args.report) > 2:
            raise SpecDecError(f"--report takes one or two run directories, got {len(args.report)}")
        if len(args.report) == 1:
            print(format_report(load_results(args.report[0])))
        else:
            print(format_comparison(load_results(args.report[0]), load_results(args.report[1])))
        return 0
    if args.out is None:
        raise SpecDecError("--out DIR is required to run a benchmark (or use --report DIR [DIR2])")
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from specdec.bench.methods import parse_methods
    from specdec.bench.plot import plot_speedup
    from specdec.bench.questions import load_questions, select_questions
    from specdec.bench.report import format_report
    from specdec.bench.runner import BenchRun, BenchSettings
    from specdec.models import load_model

    specs = parse_methods(args.drafters or [DEFAULT_METHODS])
    questions = load_questions(args.questions)
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    selected = select_questions(questions, args.per_category, categories)
    settings = BenchSettings(
        model=args.model, max_new_tokens=args.max_new_tokens, turns=args.turns, backend=args.backend,
        datastores=tuple(args.datastore), warmup_tokens=args.warmup_tokens,
    )
    if not args.quiet:
        print(f"Loading the model ({args.model}) ...", file=sys.stderr)
    model, tokenizer = load_model(None if args.model == "default" else args.model)
    run = BenchRun(model, tokenizer, specs, settings, args.out, questions_file=args.questions,
                   command=_command_line(), resume=args.resume)
    if not args.quiet:
        print(f"{len(selected)} questions x {len(specs)} methods -> {run.path}", file=sys.stderr)
    results = run.run(selected, progress=not args.quiet)
    report = format_report(results)
    (Path(args.out) / REPORT_FILE).write_text(report + "\n", encoding="utf-8")
    if not args.no_plot:
        plot_speedup(results, Path(args.out) / PLOT_FILE)
    print(report)
    return 0


def register(sub: Any) -> None:
    bench = sub.add_parser(
        "bench", help="Spec-Bench: MAT, tokens/s and speedup per category, specdec drafters vs Hugging Face",
        description="Runs every method on every selected question (interleaved, after an untimed warm-up), "
        "prints per-category tables and writes results.json, report.md and speedup.png to --out.",
    )
    bench.add_argument("--questions", default=str(DEFAULT_QUESTIONS),
                       help="Spec-Bench question.jsonl (default: %(default)s)")
    bench.add_argument("--per-category", type=int, default=None, metavar="N",
                       help="N evenly spaced questions per category (default: all)")
    bench.add_argument("--categories", default=None, help="comma-separated categories to keep (default: all)")
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--drafters", action="append", default=None, metavar="SPECS",
                       help="comma-separated methods, the first being the speedup baseline: registered drafters, "
                       "hf-generate, hf-pld; options and labels as label=name:key=value "
                       f"(default: {DEFAULT_METHODS})")
    bench.add_argument("--datastore", action="append", default=[], metavar="PATH",
                       help="a datastore file (repeatable); its kind (rest, sam) names the drafter that reads it")
    bench.add_argument("--turns", type=int, choices=(1, 2), default=1, help="MT-Bench turns to ask (default: 1)")
    bench.add_argument("--model", default="default", help="a local checkpoint directory, or 'default'")
    bench.add_argument("--backend", default="auto")
    bench.add_argument("--warmup-tokens", type=int, default=16, help="length of each method's untimed warm-up")
    bench.add_argument("--out", default=None, metavar="DIR", help="where results.json, report.md, speedup.png go")
    bench.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    bench.add_argument("--no-plot", action="store_true")
    bench.add_argument("--quiet", action="store_true", help="no progress bar")
    bench.add_argument("--report", nargs="+", default=None, metavar="DIR",
                       help="print the tables of a saved run, or compare two runs (A then B)")
    bench.set_defaults(func=cmd_bench)
