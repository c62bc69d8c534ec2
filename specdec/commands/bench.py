"""``specdec bench``: the one door for measurements (docs/benchmarks.md has a command per figure).

    specdec bench --per-category 10 --drafters none,hf-generate,hf-pld,pld --out runs/a   # Spec-Bench
    specdec bench --report runs/a [runs/b]          # a saved run's tables, or two runs side by side
    specdec bench --report saved new --check        # exit 1 where new's MAT or identity regressed
    specdec bench replay runs/a --drafters pld,sam  # drafters over a run's recorded outputs, no model
    specdec bench replay runs/a --drafters sam --mode both   # one shared store vs one per request
    specdec bench judge --ids 241 --drafters "sam+recycling:temperature=0.7:seed=1" --position 78
    specdec bench quality --check tests/data/quality_baseline.json     # MAT/steps on fixed prompts
    specdec bench costs --kind sam                  # a datastore's build, size, load and step costs
    specdec bench curves --out runs/curves          # verification cost by tree size, per kernel variant
    specdec bench sizes --cpu-time --out runs/sizes  # random 1B/3B/8B shapes: curves, modeled drafter speedups
    specdec bench step --contexts 128,1024          # a plain step of run(drafter="none") against its forward
    specdec bench oneoff --out runs/oneoff          # what a user gets: one specdec.run per prompt vs HF generate
    specdec bench oneoff --fresh sam+recycling      # the same, one fresh process per prompt
    specdec bench llamacpp --out runs/llamacpp      # specdec.run vs llama.cpp's plain decoding of the same GGUF
    specdec bench load --out runs/load              # the one-off calls idle, beside a busy and a streaming process
    specdec bench margins --dtype bfloat16          # logit gap of verification vs one-token forwards (near-tie margins)
    specdec bench batch --batch-size 1,2,4,8 --out runs/batch   # many prompts: tokens/s by batch size vs HF
    specdec bench soak --out runs/soak              # one Generator, 500+ prompts: identity, store budget, RSS
    specdec bench ratios backend.json               # cuda_ext vs torch op ratios from pytest-benchmark
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specdec.backends import TREE_OPS
from specdec.bench import batched, llamacpp, oneoff, quality
from specdec.bench import load as load_bench
from specdec.bench import sizes as size_bench
from specdec.bench.corpora import GSM8K
from specdec.bench.curves import measure as measure_curves
from specdec.bench.curves import ratio_table
from specdec.bench.curves import write as write_curves
from specdec.bench.datastore_costs import measure as measure_costs
from specdec.bench.judge import judge_sampled
from specdec.bench.linears import check_paths as check_linear_paths
from specdec.bench.linears import measure as measure_linears
from specdec.bench.linears import write as write_linears
from specdec.bench.methods import ForwardMeter, SpecdecMethod, build_methods, parse_method, parse_methods
from specdec.bench.plot import plot_speedup
from specdec.bench.questions import DEFAULT_QUESTIONS, load_questions, select_questions
from specdec.bench.report import format_comparison, format_report, regressions
from specdec.bench.results import load_results, write_json_atomic
from specdec.bench.runner import BenchRun, BenchSettings, references, warm_up
from specdec.bench.stream_replay import REPLAY_MODES, cost_table, recorded_streams, replay_spec, replay_table
from specdec.commands.arguments import MODEL_HELP, FormerFlag
from specdec.drafters import DrafterContext
from specdec.errors import SpecDecError
from specdec.models import encode_prompt, gguf_file, load_model, load_tokenizer
from specdec.testing import near_tie_margin

DEFAULT_METHODS = "none,hf-generate,hf-pld,pld"
REPORT_FILE = "report.md"
PLOT_FILE = "speedup.png"
ONEOFF_PLOT = "oneoff.png"
DTYPES = ("float32", "float16", "bfloat16", "float64")


def _command_line() -> str:
    """The command as typed, for results.json: ``specdec bench ...`` whatever the entry point, after the
    ``SPECDEC_CPU_ISA=...`` that forced a kernel path."""
    program = Path(sys.argv[0]).name
    args = sys.argv[1:]
    isa = [f"SPECDEC_CPU_ISA={os.environ['SPECDEC_CPU_ISA']}"] if os.environ.get("SPECDEC_CPU_ISA") else []
    if program in ("specdec", "__main__.py", "cli.py"):
        return " ".join([*isa, shlex.join(["specdec", *args])])
    return " ".join([*isa, shlex.join(sys.argv)])


def load(args: argparse.Namespace) -> tuple[Any, Any]:
    """The model and tokenizer of ``--model``, in ``--dtype`` on ``--device``."""
    dtype = None if args.dtype is None else getattr(torch, args.dtype)
    if not getattr(args, "quiet", False):
        print(f"Loading the model ({args.model}) ...", file=sys.stderr)
    model: Any
    model, tokenizer = load_model(None if args.model == "default" else args.model, dtype=dtype, device=args.device)
    return model, tokenizer


def selected_questions(args: argparse.Namespace) -> list[Any]:
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    ids = [int(i) for i in args.ids.split(",") if i.strip()] if args.ids else None
    return select_questions(load_questions(args.questions), args.per_category, categories, ids)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.report:
        if len(args.report) > 2:
            raise SpecDecError(f"--report takes one or two run directories, got {len(args.report)}")
        if len(args.report) == 1:
            print(format_report(load_results(args.report[0])))
            return 0
        saved, new = load_results(args.report[0]), load_results(args.report[1])
        print(format_comparison(saved, new))
        if args.check:
            problems = regressions(saved, new)
            print("\n".join(["", "Regressions from A to B:", *problems]) if problems else "\nno regression from A to B")
            return 1 if problems else 0
        return 0
    if args.out is None:
        raise SpecDecError("--out DIR is required to run a benchmark (or use --report DIR [DIR2])")
    if args.check:
        raise SpecDecError("--check goes with --report SAVED NEW")
    specs = parse_methods(args.drafters or [DEFAULT_METHODS])
    selected = selected_questions(args)
    settings = BenchSettings(
        model=args.model, max_new_tokens=args.max_new_tokens, turns=args.turns, tree_ops=args.tree_ops,
        datastores=tuple(args.datastore), warmup_tokens=args.warmup_tokens, keep_outputs=args.keep_outputs,
    )
    model, tokenizer = load(args)
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


def cmd_replay(args: argparse.Namespace) -> int:
    runs = [load_results(path) for path in args.runs]
    streams = [stream for results in runs for stream in recorded_streams(results, args.method)]
    model = runs[0]["meta"]["settings"]["model"]
    tokenizer = load_tokenizer(None if model == "default" else model)  # datastores are checked against it
    eos = () if tokenizer.eos_token_id is None else (int(tokenizer.eos_token_id),)
    context = DrafterContext(vocab_size=len(tokenizer), tokenizer=tokenizer, eos_token_ids=eos)
    specs = parse_methods(args.drafters)
    rows = []
    for table in args.costs.split(","):
        cost = cost_table(table, model)
        print(f"\ncost table {table} (ms by nodes: " + ", ".join(
            f"{s}: {1e3 * float(cost.calibrated(np.array([s]), 300)[0]):.0f}"
            for s in (1, 8, 16, 32, 64)) + f"); {len(streams)} recorded outputs; each cell: modelled speedup, "
            "MAT, nodes per step")
        modes = REPLAY_MODES if args.mode == "both" else (args.mode,)
        table_rows = [{**row, "costs": table} for mode in modes for spec in specs
                      for row in replay_spec(spec, streams, context, cost, mode)]
        print(replay_table(table_rows), flush=True)
        rows += table_rows
    if args.json:
        write_json_atomic(args.json, {"command": _command_line(), "rows": rows})
    return 0


def cmd_judge(args: argparse.Namespace) -> int:
    spec = parse_method(args.drafters)
    if not spec.sampling:
        raise SpecDecError(f"{args.drafters!r} does not sample: greedy outputs are judged by their margin in a run")
    reference = parse_method("none:" + ":".join(f"{k}={json.dumps(v)}" for k, v in spec.sampling.items()))
    references([reference, spec])  # a run's checks (a seed is needed)
    questions = selected_questions(args)
    if len(questions) != 1:
        raise SpecDecError(f"the judge takes one question (--ids N), got {len(questions)}")
    question = questions[0]
    model, tokenizer = load(args)
    meter = ForwardMeter(model)
    try:
        methods = build_methods([reference, spec], model, tokenizer, meter, tree_ops=args.tree_ops)
        assert all(isinstance(m, SpecdecMethod) for m in methods)
        warm_up(methods, tokenizer, question, 16)
        prompt = encode_prompt(tokenizer, question.turns[0])
        runs = [method.generate(prompt, args.max_new_tokens) for method in methods]
    finally:
        meter.close()
    pairs = zip(runs[0].tokens, runs[1].tokens, strict=False)
    index = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
    print(f"{spec.label} on question {question.question_id}: "
          + ("identical to plain sampling" if index is None else f"first difference at output index {index}"))
    at = args.position if index is None else index
    if at is None:
        return 0
    boundary = judge_sampled(methods[0], methods[1], prompt, runs[0], runs[1], args.max_new_tokens, at,
                             near_tie_margin(next(model.parameters()).dtype))
    if index is None and boundary.shift is None:
        print(f"at output index {at}: a redo did not reproduce a run; no verdict")
    elif index is None:  # no difference here: how near a flip was this position?
        print(f"at output index {at}: " + "; ".join(
            "not reproduced" if d is None else f"token {d.token}, the draw {d.distance:.2e} from its bucket's boundary"
            for d in (boundary.reference, boundary.ours)) + f" (plain sampling; {spec.label}); the forwards' CDFs "
            f"differ by up to {boundary.shift:.1e}; near-boundary limit {boundary.limit:.1e}: "
            + ("a flip here would be rounding" if boundary.near_boundary else "a flip here would be a real difference"))
    else:
        print(boundary.describe())
    print(json.dumps({"question_id": question.question_id, "method": spec.label, "identical": index is None,
                      **boundary.to_json()}, indent=1))
    return 0


def cmd_quality(args: argparse.Namespace) -> int:
    """Measure the quality suite, then ``--check`` against and/or ``--write`` saved figures."""
    model, tokenizer = load(args)
    corpus = Path(args.corpus or GSM8K)
    figures, left_out = quality.measure_suite(model, tokenizer, corpus, args.drafters.split(",") if args.drafters
                                              else None)
    for label, reason in left_out.items():
        print(f"not measured: {label}: {reason}", file=sys.stderr)
    print(json.dumps({label: {"mat": f["mat"], "steps": f["steps"]} for label, f in figures.items()}, indent=1))
    if args.check:
        saved = quality.load_saved(args.check)["drafters"]
        if args.drafters:  # the saved drafters not named in --drafters were not asked for
            left_out = {**{label: "not in --drafters" for label in saved}, **left_out}
        problems = quality.check(figures, saved, left_out=left_out)
        print("\n".join(problems) or "no regression", file=sys.stderr)
        if problems:
            return 1
    if args.write:
        Path(args.write).parent.mkdir(parents=True, exist_ok=True)
        Path(args.write).write_text(json.dumps(quality.baseline_document(figures), indent=1) + "\n",
                                    encoding="utf-8")
        print(f"wrote {args.write}", file=sys.stderr)
    return 0


def cmd_margins(args: argparse.Namespace) -> int:
    """How far verification forwards' logits lie from one-token forwards' (:mod:`specdec.bench.margins`)."""
    from specdec.bench import margins

    model, tokenizer = load(args)
    prompts = [encode_prompt(tokenizer, p.text) for p in oneoff.heldout_prompts()[: args.prompts]]
    report = margins.measure(model, prompts, new_tokens=args.new_tokens, stride=args.stride)
    print(json.dumps({**report.to_json(), "new_tokens": args.new_tokens, "command": _command_line()}, indent=1))
    return 0


def cmd_costs(args: argparse.Namespace) -> int:
    report = measure_costs(args.kind, args.out, skip_build=args.skip_build, max_tokens=args.max_tokens)
    print(json.dumps(report, indent=1))
    return 0


def cmd_sliding_memory(args: argparse.Namespace) -> int:
    from specdec.bench import sliding_memory

    sliding_memory.main()
    return 0


def cmd_curves(args: argparse.Namespace) -> int:
    sizes = tuple(int(s) for s in args.sizes.split(","))
    contexts = tuple(int(c) for c in args.contexts.split(","))
    model, _ = load(args)
    report = measure_curves(model, args.variants, sizes, contexts, args.repeats, cpu_time=args.cpu_time)
    report["command"] = _command_line()
    print(write_curves(report, args.out))
    return 0


def cmd_sizes(args: argparse.Namespace) -> int:
    """Random-weight checkpoints of the shapes users run: curves and modeled speedups (:mod:`specdec.bench.sizes`)."""
    from specdec.backends import make_verifier

    unknown = [name for name in args.shapes.split(",") if name not in size_bench.SHAPES]
    if unknown:
        raise SpecDecError(f"unknown shape {unknown[0]!r}: known are {', '.join(size_bench.SHAPES)}")
    settings = size_bench.SizesSettings(
        dtype=getattr(torch, args.dtype), variants=args.variants, sizes=tuple(int(s) for s in args.sizes.split(",")),
        contexts=tuple(int(c) for c in args.contexts.split(",")), repeats=args.repeats, cpu_time=args.cpu_time,
        drafters=args.drafters, price=args.price, baseline=args.baseline, folder=args.folder,
        device=None if args.device is None else torch.device(args.device),
    )
    tokenizer = load_tokenizer(None)  # the recorded outputs' (the default model's); saved with each checkpoint
    eos = () if tokenizer.eos_token_id is None else (int(tokenizer.eos_token_id),)
    context = DrafterContext(vocab_size=len(tokenizer), tokenizer=tokenizer, eos_token_ids=eos)
    streams = size_bench.default_streams(args.runs or size_bench.DEFAULT_RUNS, args.streams)
    verifier = None
    if size_bench.needs_model(args.drafters, context):  # recycling learns from the model's predictions: run it
        default_model, _ = load_model(None)
        verifier = make_verifier(default_model)
    shapes = {name: size_bench.SHAPES[name] for name in args.shapes.split(",")}
    report = size_bench.measure(shapes, settings, streams, context, verifier, tokenizer, progress=not args.quiet)
    report["command"] = _command_line()
    print(size_bench.write(report, args.out))
    return 0


def cmd_step(args: argparse.Namespace) -> int:
    from specdec.bench import step as step_bench

    contexts = tuple(int(c) for c in args.contexts.split(","))
    model, tokenizer = load(args)
    report = step_bench.measure(model, tokenizer, contexts, args.repeats, args.engine)
    report["command"] = _command_line()
    if args.json is not None:
        write_json_atomic(Path(args.json), report)
    print(step_bench.markdown(report))
    return 0


def cmd_linears(args: argparse.Namespace) -> int:
    rows = tuple(int(r) for r in args.rows.split(","))
    paths = [p.strip() for p in args.paths.split(",")] if args.paths else None
    check_linear_paths(paths or [])  # a path this CPU cannot run fails before the model loads
    model, _ = load(args)
    report = measure_linears(model, rows, paths, args.repeats)
    report["command"] = _command_line()
    print(write_linears(report, args.out))
    return 0


def cmd_ratios(args: argparse.Namespace) -> int:
    print(ratio_table(json.loads(Path(args.json).read_text(encoding="utf-8"))))
    return 0


def cmd_oneoff(args: argparse.Namespace) -> int:
    if args.oneoff_child is not None:
        oneoff.child_main(args.oneoff_child)
        return 0
    if args.oneoff_warmed_child is not None:
        oneoff.warmed_child_main(args.oneoff_warmed_child)
        return 0
    if args.replot:
        saved, where = oneoff.load_saved(args.replot), Path(args.replot)
        path = where / ONEOFF_PLOT if where.is_dir() else where.with_suffix(".png")  # beside a named file
        print(oneoff.plot(saved["summary"], path, saved.get("command", "")))
        return 0
    model, tokenizer = load(args)
    prompts = oneoff.heldout_prompts()[: args.prompts]
    if args.fresh:
        results = oneoff.measure_fresh(model, prompts, args.fresh, args.max_new_tokens, args.model, not args.quiet,
                                       warmed=not args.no_warmed)  # fmt: skip
    else:
        results = oneoff.measure_in_process(model, tokenizer, prompts, args.drafters, args.max_new_tokens,
                                            not args.quiet, custom_generate=args.custom_generate)  # fmt: skip
    summary = oneoff.summarize(results)
    text = oneoff.format_summary(summary)
    interval = oneoff.fresh_ratio(results, args.fresh) if args.fresh else None
    against = oneoff.fresh_against_warmed(results, args.fresh, interval) if args.fresh else None
    if against is not None and interval is not None:
        summary["fresh_against_warmed"] = against
        summary["fresh_against_warmed_interval"] = interval.to_json()
        text += "\n" + against
    print(text)
    if args.out:
        _write_run(Path(args.out), {"summary": summary, "prompts": oneoff.to_json(results)}, text)
        if not args.no_plot:
            oneoff.plot(summary, Path(args.out) / ONEOFF_PLOT, _command_line())
    return 0


def cmd_llamacpp(args: argparse.Namespace) -> int:
    model, tokenizer = load(args)
    gguf = gguf_file(model)
    if gguf is None:
        raise SpecDecError(f"--model {args.model!r} was not loaded from a GGUF file: llama.cpp needs one")
    results = llamacpp.measure(model, tokenizer, gguf, drafters=args.drafters, prompts=args.prompts,
                               max_new_tokens=args.max_new_tokens, threads=args.threads, progress=not args.quiet)
    text = llamacpp.report(results)
    print(text)
    if args.out:
        _write_run(Path(args.out), results, text)
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    if args.load_child is not None:
        load_bench.child_main(args.load_child)
        return 0
    conditions = load_bench.parse_conditions(args.conditions)
    report = load_bench.measure(args.model, conditions, args.drafters, args.prompts, args.max_new_tokens,
                                not args.quiet, codes=args.code)  # fmt: skip
    report["command"] = _command_line()
    print(load_bench.write(report, args.out))
    return 0


def _write_run(out: Path, document: dict[str, Any], text: str) -> None:
    """``results.json`` (the document and the command) and ``report.md`` (the command and ``text``) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "results.json", {"command": _command_line(), **document})
    (out / REPORT_FILE).write_text(f"`{_command_line()}`\n\n{text}\n", encoding="utf-8")


def cmd_batch(args: argparse.Namespace) -> int:
    try:
        sizes = [int(b) for b in args.batch_size.split(",") if b.strip()]
    except ValueError:
        raise SpecDecError(f"--batch-size takes comma-separated ints, got {args.batch_size!r}") from None
    held_out = oneoff.heldout_prompts(extra=args.prompts is not None)  # the 48 more only when asked for a count
    if args.prompts is not None and not 1 <= args.prompts <= len(held_out):
        raise SpecDecError(f"--prompts takes 1 to {len(held_out)} held-out prompts, got {args.prompts}")
    model, tokenizer = load(args)
    texts = [prompt.text for prompt in held_out[: args.prompts]]
    runs = batched.measure(model, tokenizer, texts, args.drafters, sizes, args.max_new_tokens, not args.quiet,
                           args.repeats)
    summary = batched.summarize(runs)
    text = batched.format_summary(summary)
    print(text)
    if args.out:
        out = Path(args.out)
        _write_run(out, {"max_new_tokens": args.max_new_tokens, "summary": summary,
                         "runs": [r.to_json() for r in runs]}, text)  # fmt: skip
        if not args.no_plot:
            title = f"{args.model}, {len(texts)} held-out prompts, {args.max_new_tokens} new tokens, greedy"
            batched.plot(summary, out / "batch.png", title)
    return 0


def cmd_soak(args: argparse.Namespace) -> int:
    """One generator over every prompt kind (:mod:`specdec.bench.soak`); exit 1 on any failed check."""
    from specdec.bench import soak

    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    new_tokens = [int(n) for n in args.new_tokens.split(",") if n.strip()]
    model, tokenizer = load(args)
    prompts = soak.default_prompts(tokenizer, args.questions)
    if args.prompts is not None:
        prompts = prompts[: args.prompts]
    cases = soak.build_cases(prompts, drafters, new_tokens)
    if not args.quiet:
        print(f"{len(cases)} prompts, drafters {', '.join(drafters)}, store budget {args.store_tokens} tokens, "
              f"warm-up {args.warmup} prompts", file=sys.stderr)
    on_row = None
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        rows = Path(args.out) / "rows.jsonl"
        rows.write_text("", encoding="utf-8")

        def on_row(row: soak.SoakRow) -> None:
            with rows.open("a", encoding="utf-8") as file:
                file.write(json.dumps(dataclasses.asdict(row)) + "\n")

    report = soak.soak(model, tokenizer, cases, store=args.store_tokens, warmup=args.warmup,
                       rss_growth_mb=args.rss_growth_mb, budget=args.budget, engine=args.engine,
                       threads=args.threads, batch_every=args.batch_every, on_row=on_row, progress=not args.quiet)
    text = soak.format_report(report, _command_line())
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "results.json", {"command": _command_line(), **soak.to_json(report)})
        (out / REPORT_FILE).write_text(text + "\n", encoding="utf-8")
        soak.plot_rss(report, out / "rss.png", f"soak: {len(cases)} prompts, one Generator ({args.model}, CPU)")
    return 1 if report.problems() else 0


def _model_options(parser: argparse.ArgumentParser, sub: bool) -> None:
    """``--model``, ``--device``, ``--dtype`` (on a subcommand, unset ones keep the ``bench`` level's value)."""
    default = argparse.SUPPRESS if sub else None
    parser.add_argument("--model", default=argparse.SUPPRESS if sub else "default",
                        help=MODEL_HELP)
    parser.add_argument("--device", default=default, help="where the model runs: cpu, cuda, cuda:1 (default: cpu)")
    parser.add_argument("--dtype", default=default, choices=DTYPES,
                        help="the model's dtype (default: float32 for the default model, else the checkpoint's)")


def _question_options(parser: argparse.ArgumentParser, sub: bool) -> None:
    def default(value: Any) -> Any:
        return argparse.SUPPRESS if sub else value

    parser.add_argument("--questions", default=default(str(DEFAULT_QUESTIONS)),
                        help=f"Spec-Bench question.jsonl (default: {DEFAULT_QUESTIONS})")
    parser.add_argument("--per-category", type=int, default=default(None), metavar="N",
                        help="N evenly spaced questions per category (default: all)")
    parser.add_argument("--categories", default=default(None), help="comma-separated categories to keep")
    parser.add_argument("--ids", default=default(None), help="comma-separated question ids to keep")
    parser.add_argument("--max-new-tokens", type=int, default=default(128))
    parser.add_argument("--tree-ops", default=default("auto"), choices=TREE_OPS,
                        help="specdec's tree operations, for comparing them (default: auto)")
    parser.add_argument("--backend", dest="tree_ops", default=default("auto"), choices=TREE_OPS,
                        action=FormerFlag, help=argparse.SUPPRESS)


def register(sub: Any) -> None:
    bench = sub.add_parser(
        "bench", help="measure: Spec-Bench runs against the peers, replays, costs, curves, the judge",
        description="With no subcommand: runs every method on every selected question (interleaved, after an "
        "untimed warm-up), prints per-category tables and writes results.json, report.md and speedup.png to --out.",
    )
    _model_options(bench, sub=False)
    _question_options(bench, sub=False)
    bench.add_argument("--drafters", action="append", default=None, metavar="SPECS",
                       help="comma-separated methods, the first being the speedup baseline: registered drafters, "
                       "hf-generate, hf-pld, hf-static; options and labels as label=name:key=value "
                       f"(default: {DEFAULT_METHODS})")
    bench.add_argument("--datastore", action="append", default=[], metavar="PATH",
                       help="a datastore file (repeatable); its kind (rest, sam) names the drafter that reads it")
    bench.add_argument("--turns", type=int, choices=(1, 2), default=1, help="MT-Bench turns to ask (default: 1)")
    bench.add_argument("--warmup-tokens", type=int, default=16, help="length of each method's untimed warm-up")
    bench.add_argument("--keep-outputs", action="store_true",
                       help="save every prompt and output (token ids) in results.json, for `specdec bench replay`")
    bench.add_argument("--out", default=None, metavar="DIR", help="where results.json, report.md, speedup.png go")
    bench.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    bench.add_argument("--no-plot", action="store_true")
    bench.add_argument("--quiet", action="store_true", help="no progress bar")
    bench.add_argument("--report", nargs="+", default=None, metavar="DIR",
                       help="print the tables of a saved run, or compare two runs (A then B)")
    bench.add_argument("--check", action="store_true",
                       help="with --report A B: exit 1 where B's deterministic figures regressed from A's (MAT "
                       "down more than 3%%, more outputs that differ from their reference)")
    bench.set_defaults(func=cmd_bench)
    commands = bench.add_subparsers(dest="bench_command",
                                    metavar="{replay,judge,quality,margins,costs,curves,sizes,step,oneoff,load,batch,soak,ratios}")

    replay = commands.add_parser("replay", help="drafter specs over a run's recorded greedy outputs: MAT and "
                                 "modelled speedup under frozen cost tables, no model, no clock")
    replay.add_argument("runs", nargs="+", metavar="RUN", help="run directories made with --keep-outputs")
    replay.add_argument("--drafters", required=True, action="append", metavar="SPECS",
                        help="method specs (budget=auto|full|N, max_nodes=N and drafter options); budget "
                        "defaults to auto, as in a run")
    replay.add_argument("--method", default=None, help="whose outputs to replay (default: the run's reference)")
    replay.add_argument("--costs", default="reference", help="cost tables: reference, flat, calibrated (comma-"
                        "separated; default: reference)")
    replay.add_argument("--mode", choices=("stream", "request", "both"), default="stream",
                        help="stream (default): the recorded outputs in order through one drafter factory, as "
                        "one Generator (and a run's method) decodes them: sam's store and arctic:shared=true's "
                        "cache are shared; request: a fresh factory per output, nothing shared; both: each")
    replay.add_argument("--json", default=None, metavar="PATH", help="also write every per-question row here")
    replay.set_defaults(func=cmd_replay)

    judge = commands.add_parser("judge", help="a sampled method against plain sampling on one question: is a "
                                "difference a near-boundary draw or real?")
    _model_options(judge, sub=True)
    _question_options(judge, sub=True)
    judge.add_argument("--drafters", required=True, metavar="SPEC", help="one sampled method spec (with seed=N)")
    judge.add_argument("--position", type=int, default=None,
                       help="output index to examine when the outputs are identical")
    judge.set_defaults(func=cmd_judge)

    quality = commands.add_parser("quality", help="MAT and steps of every drafter on fixed prompts (the "
                                  "regression guard tests/test_quality.py runs)")
    _model_options(quality, sub=True)
    quality.add_argument("--write", metavar="PATH", help="save the figures here (the regression baseline)")
    quality.add_argument("--check", metavar="PATH", help="compare with the figures saved here")
    quality.add_argument("--drafters", default=None, help="comma-separated method specs (default: the suite)")
    quality.add_argument("--corpus", default=None, help="GSM8K jsonl for the datastores (default: ../shared's)")
    quality.set_defaults(func=cmd_quality)

    margins = commands.add_parser("margins", help="largest |logit difference| between verification forwards and "
                                  "one-token forwards, per verifier and tree size: the measure behind a dtype's "
                                  "near-tie margin (specdec.testing.near_tie_margin)")
    _model_options(margins, sub=True)
    margins.add_argument("--prompts", type=int, default=8, help="held-out prompts measured (default 8)")
    margins.add_argument("--new-tokens", type=int, default=64, help="plain decoding's tokens per prompt")
    margins.add_argument("--stride", type=int, default=8, help="a chain starts every this many output positions")
    margins.set_defaults(func=cmd_margins)

    costs = commands.add_parser("costs", help="a datastore's build, size, load and per-step costs on a >10M-token "
                                "corpus (GSM8K, the Python standard library, /usr/share/doc)")
    costs.add_argument("--kind", required=True, choices=("sam", "rest"))
    costs.add_argument("--out", type=Path, default=None, help="the datastore file (default: in the cache)")
    costs.add_argument("--skip-build", action="store_true", help="measure an existing --out file")
    costs.add_argument("--max-tokens", type=int, default=None, help="cap the corpus (default: all of it)")
    costs.set_defaults(func=cmd_costs)

    window = commands.add_parser("sliding-memory", help="KV memory of a sliding-window model after 8 windows: "
                                 "generate's cache, engine='hf''s and the bucket engines' (docs/usage.md)")
    window.set_defaults(func=cmd_sliding_memory)

    curves = commands.add_parser("curves", help="verification ms by tree size and context, kernel variants "
                                 "side by side (interleaved rounds, fastest kept)")
    _model_options(curves, sub=True)
    curves.add_argument("--variants", default=None, metavar="SPECS",
                        help="comma-separated label=key=value:key=value verifier settings (make_verifier "
                        "arguments or verifier attributes; default: hf, specdec, specdec+cpu, specdec+cpu-attention)")
    curves.add_argument("--sizes", default="1,2,3,4,6,8,12,16,32,64")
    curves.add_argument("--contexts", default="64,1024")
    curves.add_argument("--repeats", type=int, default=5)
    curves.add_argument("--cpu-time", action="store_true",
                        help="one thread, timed by its CPU time (time.thread_time): what a kernel costs on a machine "
                        "whose other jobs make wall clock swing")
    curves.add_argument("--out", default=None, metavar="DIR", help="write curves.json, curves.md, curves.png here")
    curves.set_defaults(func=cmd_curves)

    sized = commands.add_parser("sizes", help="random-weight checkpoints of Llama-3.2-1B/3B, Llama-3.1-8B and "
                                "Qwen2.5-1.5B shapes: verification curves, and the drafters' MODELED speedups on them "
                                "(the default model's recorded outputs priced by each shape's curve)")
    sized.add_argument("--shapes", default=",".join(size_bench.SHAPES),
                       help="comma-separated shapes (default: %(default)s)")
    sized.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="the checkpoints' dtype (default: "
                       "%(default)s)")
    sized.add_argument("--device", default=None, help="where the shapes run (default: cpu)")
    sized.add_argument("--variants", default=size_bench.DEFAULT_VARIANTS, metavar="SPECS",
                       help="the curves' variants, as `specdec bench curves` takes them (default: %(default)s)")
    sized.add_argument("--sizes", default="1,4,8,16", help="tree sizes measured (default: %(default)s)")
    sized.add_argument("--contexts", default="1024", help="committed tokens (default: %(default)s)")
    sized.add_argument("--repeats", type=int, default=3)
    sized.add_argument("--cpu-time", action="store_true",
                       help="one thread, timed by its CPU time (as `specdec bench curves --cpu-time`)")
    sized.add_argument("--drafters", default=size_bench.DEFAULT_DRAFTERS, metavar="SPECS",
                       help="drafter specs modeled on each shape's curve (default: %(default)s)")
    sized.add_argument("--price", default="specdec", metavar="VARIANT",
                       help="the variant whose curve prices the drafters' steps (default: %(default)s)")
    sized.add_argument("--baseline", default="hf", metavar="VARIANT",
                       help="the variant whose one-node forward is the plain decoding compared with (default: "
                       "%(default)s)")
    sized.add_argument("--runs", nargs="+", type=Path, default=None, metavar="RUN",
                       help="runs (made with --keep-outputs) whose reference's outputs are modeled (default: "
                       "benchmarks/data/sam_streams/heldout and spec_bench)")
    sized.add_argument("--streams", type=int, default=None, metavar="N", help="the first N recorded outputs only")
    sized.add_argument("--folder", type=Path, default=None, metavar="DIR",
                       help="write the checkpoints here and keep them (reused when present; default: a temporary "
                       "folder per shape, removed once measured)")
    sized.add_argument("--out", default=None, metavar="DIR", help="write sizes.json, sizes.md, sizes.png here")
    sized.add_argument("--quiet", action="store_true", help="no progress bar")
    sized.set_defaults(func=cmd_sizes)

    plain = commands.add_parser("step", help="a plain step of run(drafter='none') against its one-node forward: "
                                "CPU time on 1 thread and wall time, the ratio, and where the rest goes")
    _model_options(plain, sub=True)
    plain.add_argument("--contexts", default="128,1024",
                       help="committed tokens before the steps (default: %(default)s)")
    plain.add_argument("--repeats", type=int, default=20, help="timed steps and forwards per context (median kept)")
    plain.add_argument("--engine", default="auto", help="the Generator's engine (default: auto)")
    plain.add_argument("--json", default=None, metavar="PATH", help="also write the report here")
    plain.set_defaults(func=cmd_step)

    linears = commands.add_parser("linears", help="the CPU kernels' linear layers alone: ms and GFLOP/s per "
                                  "thread by kernel path and row count, weights streamed and cache-resident")
    _model_options(linears, sub=True)
    linears.add_argument("--rows", default="1,8,16", help="row counts (default: %(default)s)")
    linears.add_argument("--paths", default=None, metavar="PATHS",
                         help="comma-separated kernel paths (avx512, avx512-blocks, avx2, avx2-blocks, avx2-lanes16, "
                         "portable; default: those this CPU runs but portable); torch's linear is always timed "
                         "beside them")
    linears.add_argument("--repeats", type=int, default=5)
    linears.add_argument("--out", default=None, metavar="DIR", help="write linears.json, linears.md, linears.png here")
    linears.set_defaults(func=cmd_linears)

    one = commands.add_parser("oneoff", help="what a user gets: specdec.run with default arguments, one call per "
                              "held-out prompt (or one fresh process per prompt), against HF greedy generate")
    _model_options(one, sub=True)
    one.add_argument("--drafters", default="sam+recycling,none", metavar="SPECS",
                     help="comma-separated specs, each timed as run:SPEC and generator:SPEC (default: %(default)s)")
    one.add_argument("--fresh", default=None, metavar="SPEC",
                     help="instead: one fresh process per prompt running specdec.run with SPEC once")
    one.add_argument("--max-new-tokens", type=int, default=128)
    one.add_argument("--custom-generate", action="store_true",
                     help="also time model.generate(..., custom_generate=specdec.hf_generate(SPEC)) as "
                     "hf_generate:SPEC (one hf_generate object kept across prompts)")
    one.add_argument("--prompts", type=int, default=None, help="the first N held-out prompts (default: all)")
    one.add_argument("--out", default=None, metavar="DIR", help="where results.json, report.md, oneoff.png go")
    one.add_argument("--no-plot", action="store_true")
    one.add_argument("--replot", default=None, metavar="DIR",
                     help="instead: redraw DIR/oneoff.png from a saved run's DIR/results.json (or a named "
                     "results file: the plot beside it, .png for .json)")
    one.add_argument("--quiet", action="store_true", help="no progress bar")
    one.add_argument(oneoff.CHILD_FLAG, dest="oneoff_child", default=None, help=argparse.SUPPRESS)
    one.add_argument(oneoff.WARMED_FLAG, dest="oneoff_warmed_child", default=None, help=argparse.SUPPRESS)
    one.add_argument("--no-warmed", action="store_true",
                     help="with --fresh: skip the warmed process that runs the same prompts beside them")
    one.set_defaults(func=cmd_oneoff)

    cpp = commands.add_parser("llamacpp", help="specdec.run beside llama-cpp-python's plain greedy decoding of the "
                              "same GGUF file: same prompts, token ids and threads, in turn (needs llama-cpp-python)")
    _model_options(cpp, sub=True)
    cpp.add_argument("--drafters", default="none,sam+recycling", metavar="SPECS",
                     help="comma-separated specs, each timed as run:SPEC (default: %(default)s)")
    cpp.add_argument("--prompts", type=int, default=12, help="the first N held-out prompts (default: %(default)s)")
    cpp.add_argument("--max-new-tokens", type=int, default=128)
    cpp.add_argument("--threads", type=int, default=None, help="threads of both (default: torch's)")
    cpp.add_argument("--out", default=None, metavar="DIR", help="where results.json and report.md go")
    cpp.add_argument("--quiet", action="store_true", help="no progress bar")
    cpp.set_defaults(func=cmd_llamacpp)

    loaded = commands.add_parser("load", help="the one-off calls beside other work: idle, beside busy processes and "
                                 "beside a memory-streaming one, each in a fresh process with empty caches")
    loaded.add_argument("--model", default="default", help="the model (default: %(default)s)")
    loaded.add_argument("--conditions", default="idle,busy:1,stream", metavar="LIST",
                        help="comma-separated: idle, busy:N (N processes computing), stream (default: %(default)s)")
    loaded.add_argument("--drafters", default="sam+recycling,none", metavar="SPECS",
                        help="comma-separated specs, the first also timed as the process's first call "
                        "(default: %(default)s)")
    loaded.add_argument("--prompts", type=int, default=12, help="the first N held-out prompts (default: %(default)s)")
    loaded.add_argument("--max-new-tokens", type=int, default=128)
    loaded.add_argument("--out", default=None, metavar="DIR", help="write load.json, load.md, load.png here")
    loaded.add_argument("--code", action="append", default=[], metavar="DIR",
                        help="another specdec checkout (e.g. a worktree of main) measured in turn with this one "
                        "under each condition, its extension builds kept in DIR/.extensions (repeatable)")
    loaded.add_argument("--quiet", action="store_true", help="no progress bar")
    loaded.add_argument(load_bench.CHILD_FLAG, dest="load_child", default=None, help=argparse.SUPPRESS)
    loaded.set_defaults(func=cmd_load)

    batch = commands.add_parser("batch", help="many prompts: aggregate tokens/s by batch size, specdec's batches "
                                "(and B=1's single-sequence path) against HF's batched greedy generate")
    _model_options(batch, sub=True)
    batch.add_argument("--batch-size", default="1,2,4,8", metavar="B,B,...",
                       help="comma-separated batch sizes (default: %(default)s)")
    batch.add_argument("--drafters", default="none,sam+recycling,hf-generate", metavar="SPECS",
                       help="comma-separated greedy specs; hf-generate is HF's batched generate, hf-static the "
                       "same on HF's static cache, compiled (hf-static:compile=false: not) (default: %(default)s)")
    batch.add_argument("--max-new-tokens", type=int, default=128)
    batch.add_argument("--prompts", type=int, default=None,
                       help="the first N held-out prompts (default: the 16 of the one-off measurements; up to 64: "
                            "48 more of the same kinds follow them)")  # fmt: skip
    batch.add_argument("--repeats", type=int, default=1,
                       help="rounds of the whole plan, interleaved; each figure is the median (default: %(default)s)")
    batch.add_argument("--out", default=None, metavar="DIR", help="where results.json, report.md, batch.png go")
    batch.add_argument("--no-plot", action="store_true")
    batch.add_argument("--quiet", action="store_true", help="no progress bar")
    batch.set_defaults(func=cmd_batch)

    soak = commands.add_parser("soak", help="one Generator over Spec-Bench, held-out and short prompts with "
                               "rotating drafters, greedy and sampled, stop strings: every output against plain "
                               "decoding, the shared store against its budget, RSS after the warm-up; exit 1 on "
                               "a failure")
    _model_options(soak, sub=True)
    soak.add_argument("--questions", default=str(DEFAULT_QUESTIONS),
                      help=f"Spec-Bench question.jsonl (default: {DEFAULT_QUESTIONS})")
    soak.add_argument("--prompts", type=int, default=None, help="the first N interleaved prompts (default: all)")
    soak.add_argument("--drafters", default="sam+recycling,pld,sam,recycling,none", metavar="NAMES",
                      help="drafters in rotation, one per prompt (default: %(default)s)")
    soak.add_argument("--new-tokens", default="24,32,48", metavar="N,N,...",
                      help="max new tokens in rotation (default: %(default)s)")
    soak.add_argument("--budget", default="auto", help="the generator's draft budget: auto, full or N")
    soak.add_argument("--store-tokens", type=int, default=1024,
                      help="the shared store's budget (default 1024: a 500-prompt soak evicts)")
    soak.add_argument("--warmup", type=int, default=50, help="prompts before RSS growth is measured (default 50)")
    soak.add_argument("--rss-growth-mb", type=float, default=64.0,
                      help="largest RSS after the warm-up minus the RSS at its end, in MiB, above which the "
                      "soak fails (default 64: docs/benchmarks.md 'Soak')")
    soak.add_argument("--threads", type=int, default=2,
                      help="threads calling the one Generator, prompts taken in turn (default 2)")
    soak.add_argument("--batch-every", type=int, default=5, metavar="N",
                      help="every N-th greedy prompt decoded in a batch of two with the previous one "
                      "(default 5; 0: never)")
    soak.add_argument("--engine", default="auto", help="the engine soaked (default: auto)")
    soak.add_argument("--out", default=None, metavar="DIR", help="where results.json, report.md, rss.png go")
    soak.add_argument("--quiet", action="store_true", help="no progress bar")
    soak.set_defaults(func=cmd_soak)

    ratios = commands.add_parser("ratios", help="the cuda_ext vs torch table from a pytest-benchmark JSON of "
                                 "benchmarks/test_bench_backend.py")
    ratios.add_argument("json", help="pytest --benchmark-json output")
    ratios.set_defaults(func=cmd_ratios)
