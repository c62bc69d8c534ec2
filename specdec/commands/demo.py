"""``specdec demo``: plain decoding vs speculative drafters, on prompts of the kinds users bring.

The first thing a user runs (``bash scripts/demo.sh``). Four prompts, one of each kind
(a code edit, a summary, a question with retrieval context, chat; ``specdec/data/prompts.json``,
each with a new-token budget (32-56) that keeps the whole demo near half a minute on a 2-core CPU),
every method in turn with a progress line, then each prompt's answer, a table of per-prompt
and overall speedups (Spec-Bench's definition: mean tokens/s over mean tokens/s) and whether
each output is identical to plain decoding's, and a plain statement, from what was measured,
of where speculation did not pay on this hardware and why.

One-time costs are paid before the clock starts: the verification cost calibration (first
run on a machine; cached), one short generation per method, and for fixed-shape engines
(``--engine graphs``, the default on a GPU; ``--engine compiled``) one verification per
tree-size bucket, so compiled forwards and CUDA graphs are made outside the timed runs. The
demo keeps ``engine="auto"`` and says what it picked and why: specdec's own forward
(``"specdec"``) for a Llama-family model on a CPU (else Hugging Face's, ``"hf"``), CUDA graphs
on a GPU (``specdec demo --device cuda``). Each method's ``Generator`` loads the planner statistics
earlier runs saved (and saves its own), as :func:`specdec.run` does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from specdec.api import Generator
from specdec.backends import auto_engine_reason
from specdec.budget.calibration import calibration_identity
from specdec.budget.machine_load import BUSY_SHARE, MachineWatch
from specdec.commands.arguments import add_budget_argument, add_model_argument, add_placement_arguments, engine_options
from specdec.errors import SpecDecError
from specdec.models import encode_prompt
from specdec.testing import compare_outputs
from specdec.types import GenerationResult

PAYS = 1.10  # a speedup under this "does not pay" in the demo's statement (one timed run each: noise ~5%)
EXPLAIN_SIZES = (2, 4, 8, 16)  # tree sizes whose cost the statement quotes, relative to a plain step
ACCEPTED_OFTEN = 0.4  # share of verified draft tokens accepted under which drafts are "seldom right"
FEW_TOKENS = 16  # new tokens under which the prefill hides any gain


@dataclass(frozen=True)
class DemoPrompt:
    kind: str
    prompt: str
    max_new_tokens: int


def demo_prompts() -> list[DemoPrompt]:
    """The built-in prompts, one per kind (``specdec/data/prompts.json``)."""
    text = resources.files("specdec").joinpath("data", "prompts.json").read_text(encoding="utf-8")
    return [DemoPrompt(p["kind"], p["prompt"], int(p["max_new_tokens"])) for p in json.loads(text)["demo"]]


def drafted_share(result: GenerationResult) -> tuple[float, float]:
    """``(share of steps that verified a draft, share of verified draft tokens accepted)``."""
    records = result.stats.records
    drafted = [r for r in records if r.tree_size > 1]
    nodes = sum(r.tree_size - 1 for r in drafted)
    accepted = sum(r.accepted for r in drafted)
    return (len(drafted) / len(records) if records else 0.0), (accepted / nodes if nodes else 0.0)


def cost_ratios(cost: Any, context: int) -> dict[int, float]:
    """Verification cost of :data:`EXPLAIN_SIZES` nodes over a plain step's, after ``context`` tokens."""
    seconds = cost.predict(np.array((1, *EXPLAIN_SIZES)), context)
    return {size: float(seconds[i + 1] / seconds[0]) for i, size in enumerate(EXPLAIN_SIZES)}


def explain(
    kinds: Sequence[str],
    speedups: dict[str, list[float]],
    results: dict[str, list[GenerationResult]],
    ratios: dict[int, float] | None,
    device: str,
) -> list[str]:
    """Plain sentences, from the measurements, on where speculation did not pay and why.

    ``speedups[method][i]`` and ``results[method][i]`` are prompt ``i``'s (``kinds[i]``);
    ``ratios``: :func:`cost_ratios` of this device (None: no cost model was loaded).
    """
    lines = []
    if ratios is not None:
        quoted = ", ".join(f"{size} tokens {ratio:.2f}x" for size, ratio in ratios.items())
        lines.append(f"On this device ({device}) verifying a draft costs, next to a plain step: {quoted} "
                     "(this machine's cost model, learned from its own steps and this run's).")
    for i, kind in enumerate(kinds):
        losing = {name: values[i] for name, values in speedups.items() if values[i] < PAYS}
        if len(losing) < len(speedups):
            continue
        pieces = ", ".join(f"{name} {value:.2f}x" for name, value in losing.items())
        lines.append(f"Speculation does not pay on the {kind} prompt here ({pieces}): "
                     f"{'; '.join(_why(results, i, max(losing, key=lambda n: results[n][i].stats.mat), ratios))}.")
    if len(lines) == (ratios is not None):
        every = all(value >= PAYS for values in speedups.values() for value in values)
        lines.append(f"Speculation paid on every prompt here ({'each method' if every else 'on each, a method'} "
                     f"at {PAYS:.2f}x or more).")
    if ratios is not None and ratios[EXPLAIN_SIZES[-1]] > 1.5:
        lines.append(
            "Where verifying many tokens costs about one plain step (a datacenter GPU), the same drafts pay "
            "more: long drafts are nearly free there (docs/budget.md)."
        )
    return lines


def _why(results: dict[str, list[GenerationResult]], i: int, name: str, ratios: dict[int, float] | None) -> list[str]:
    """The reasons, from ``name``'s run on prompt ``i``, why its drafts did not pay there."""
    result = results[name][i]
    drafted, accepted = drafted_share(result)
    reasons = []
    if accepted < ACCEPTED_OFTEN:
        reasons.append(f"its drafts were seldom right ({name}: {accepted:.0%} of the verified draft tokens accepted, "
                       f"MAT {result.stats.mat:.2f}), as the answer repeats little of the prompt")
    else:
        reasons.append(f"its drafts were often right ({name}: {accepted:.0%} accepted, MAT "
                       f"{result.stats.mat:.2f}), but few steps had one")
    size = EXPLAIN_SIZES[-2]
    if ratios is not None and ratios[size] > 1.2:
        reasons.append(f"a draft of {size} tokens costs {ratios[size]:.1f}x a plain step here, so budget='auto' "
                       f"verified a draft on only {drafted:.0%} of the steps and ran the rest as plain steps")
    if result.stats.new_tokens < FEW_TOKENS:
        reasons.append(f"{result.stats.new_tokens} new tokens are too few for any gain to show over the prefill")
    return reasons


def format_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(str(row[c]).ljust(w) for c, w in zip(columns, widths, strict=True)))
    return "\n".join(lines)


def _device_text(verifier: Any) -> str:
    identity = calibration_identity(verifier)
    threads = f", {torch.get_num_threads()} threads" if verifier.device.type == "cpu" else ""
    return f"{identity['device']}{threads}, {identity['dtype']}"


def _warm_up(generators: dict[str, Any], prompts: list[DemoPrompt], ids: list[list[int]]) -> Any:
    """Pay every one-time cost before the clock starts; the speculative methods' cost model."""
    first = next(g for name, g in generators.items() if name != "none")
    cost, _ = first.cost_model()  # the cached table, else a prior (no timing run): the steps refine it
    if getattr(first.verifier, "buckets", None):
        print("Compiling or capturing the static cache's forward for every tree-size bucket (once per method) ...",
              file=sys.stderr)
    longest = max(ids, key=len)
    for generator in generators.values():
        generator.cost_model()  # every verifier runs the kernels a measured table chose, plain decoding too
        generator.verifier.warm_up(len(longest) + max(p.max_new_tokens for p in prompts))
        generator.generate(prompts[0].prompt, max_new_tokens=4)
    return cost


def _timed_runs(generators: dict[str, Any], prompts: list[DemoPrompt]) -> dict[str, list[GenerationResult]]:
    """Every method over every prompt, the methods in turn on each prompt (plain decoding first: the baseline),
    one progress line. In turn, not one method over all prompts and then the next: a machine's memory
    bandwidth can drift between minutes (by a third on a shared cloud VM), and a prompt's speedup compares
    two runs seconds apart only when they are timed next to each other."""
    results: dict[str, list[GenerationResult]] = {name: [] for name in generators}
    bar = tqdm(prompts, desc="timing", unit="prompt", file=sys.stderr, leave=True)
    for prompt in bar:
        for name, generator in generators.items():
            results[name].append(generator.generate(prompt.prompt, max_new_tokens=prompt.max_new_tokens))
        done = len(results["none"])
        base = sum(r.stats.tokens_per_s for r in results["none"]) / done
        parts = [f"none {base:.1f} tokens/s"] + [
            f"{name} {sum(r.stats.tokens_per_s for r in runs) / done / base:.2f}x"
            for name, runs in results.items() if name != "none"]
        bar.set_postfix_str(", ".join(parts))
    bar.close()
    return results


def _table(
    prompts: list[DemoPrompt], ids: list[list[int]], results: dict[str, list[GenerationResult]], model: Any
) -> tuple[list[dict[str, Any]], list[str]]:
    """The table's rows (per prompt, then overall) and a sentence per output that differs from plain decoding's."""
    drafters = [name for name in results if name != "none"]
    base_rates = [r.stats.tokens_per_s for r in results["none"]]
    verdicts: list[str] = []
    rows = []
    for i, prompt in enumerate(prompts):
        row: dict[str, Any] = {"prompt": prompt.kind, "tokens": results["none"][i].stats.new_tokens,
                               "none tokens/s": f"{base_rates[i]:.1f}"}
        same = []
        for name in drafters:
            result = results[name][i]
            row[name] = f"{result.stats.tokens_per_s / base_rates[i]:.2f}x (MAT {result.stats.mat:.2f})"
            comparison = compare_outputs(model, ids[i], result.tokens, results["none"][i].tokens)
            same.append(comparison.identical)
            if not comparison.identical:
                verdicts.append(f"{name} on the {prompt.kind} prompt: {comparison.describe()}")
                if not comparison.acceptable:
                    row["identical"] = "NO"
        row.setdefault("identical", "yes" if all(same) else "near-tie")
        rows.append(row)
    mean_base = sum(base_rates) / len(base_rates)
    overall: dict[str, Any] = {"prompt": "overall", "tokens": sum(r.stats.new_tokens for r in results["none"]),
                               "none tokens/s": f"{mean_base:.1f}"}
    for name in drafters:
        mean = sum(r.stats.tokens_per_s for r in results[name]) / len(prompts)
        mat = sum(r.stats.emitted_by_steps for r in results[name]) / max(1, sum(r.stats.steps for r in results[name]))
        overall[name] = f"{mean / mean_base:.2f}x (MAT {mat:.2f})"
    overall["identical"] = f"{len(rows) * len(drafters) - len(verdicts)}/{len(rows) * len(drafters)}"
    return [*rows, overall], verdicts


def cmd_demo(args: argparse.Namespace) -> int:
    drafters = [d.strip() for d in args.drafters.split(",") if d.strip() and d.strip() != "none"]
    if not drafters:
        raise SpecDecError("--drafters names no speculative drafter to compare with plain decoding")
    prompts = demo_prompts() if not args.prompt else [DemoPrompt("your prompt", p, 128) for p in args.prompt]
    if args.max_new_tokens is not None:
        prompts = [DemoPrompt(p.kind, p.prompt, args.max_new_tokens) for p in prompts]
    print(f"Loading the model ({args.model}; the first run converts it once) ...", file=sys.stderr)
    started = time.perf_counter()
    generators = {
        name: Generator(args.model, drafter=name, budget=args.budget, device=args.device, dtype=args.dtype,
                        planner_cache=False if args.no_planner_cache else None, **engine_options(args))
        for name in ["none", *drafters]
    }
    plain = generators["none"]
    engine = plain.verifier.engine
    why = f" (auto: {auto_engine_reason(plain.model, plain.verifier.device)})" if args.engine == "auto" else ""
    print(f"Device: {_device_text(plain.verifier)}; engine {engine!r}{why}; budget {args.budget}", file=sys.stderr)
    stats = {name: g.planner_memory.stats for name, g in generators.items() if name != "none"}
    saved = [f"{name}: {s.runs} earlier runs" if s and s.runs else f"{name}: none yet" for name, s in stats.items()]
    print("Planner statistics: " + ("; ".join(saved) if generators[drafters[0]].planner_memory.stats else "off"),
          file=sys.stderr)
    ids = [encode_prompt(plain.tokenizer, p.prompt, None) for p in prompts]
    print(f"Model and verifiers ready in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    started = time.perf_counter()
    cost = _warm_up(generators, prompts, ids)
    print(f"One-time costs paid in {time.perf_counter() - started:.1f} s (nothing is timed for the budget: the "
          "verification cost is learned from the steps themselves); now timing every method ...", file=sys.stderr)

    watch = MachineWatch.start(plain.verifier.device.type == "cpu")
    results = _timed_runs(generators, prompts)
    busy = watch.others_share()

    for prompt, result in zip(prompts, results["none"], strict=True):
        print(f"\n[{prompt.kind}] {result.text or ''}".rstrip())
    rows, verdicts = _table(prompts, ids, results, plain.model)
    print()
    print(format_table(rows, ["prompt", "tokens", "none tokens/s", *drafters, "identical"]))
    print("\nSpeedup: tokens/s over plain decoding's (overall: mean tokens/s over mean tokens/s); every "
          "output is checked token by token against plain decoding's.")
    for verdict in verdicts:
        print(f"  {verdict}")
    base_rates = [r.stats.tokens_per_s for r in results["none"]]
    speedups = {name: [r.stats.tokens_per_s / b for r, b in zip(results[name], base_rates, strict=True)]
                for name in drafters}
    context = sum(len(i) for i in ids) // len(ids)
    print()
    for line in explain([p.kind for p in prompts], speedups, results, cost_ratios(cost, context),
                        _device_text(plain.verifier)):
        print(line)
    if busy is not None and busy > BUSY_SHARE:
        print(f"Note: other processes used {busy:.0%} of this machine's CPU time during the timed runs, so these "
              "speedups are noisy; rerun on a quiet machine for steady figures.")
    return 1 if any(row["identical"] == "NO" for row in rows) else 0


def register(sub: Any) -> None:
    demo = sub.add_parser(
        "demo", help="plain decoding vs speculative drafters on prompts of four kinds (code edit, summary, "
        "question with context, chat)",
        description="Runs plain decoding and each drafter on the built-in prompts (or yours), then prints the "
        "answers, per-prompt and overall speedups, token identity with plain decoding, and where speculation "
        "does not pay on this hardware and why.",
    )
    add_model_argument(demo)
    demo.add_argument("--drafters", default="pld,sam+recycling",
                      help="speculative methods to compare with plain decoding (default: %(default)s)")
    demo.add_argument("--prompt", action="append", default=[], help="your own prompt (repeatable) instead of "
                      "the built-in ones")
    demo.add_argument("--max-new-tokens", type=int, default=None,
                      help="new tokens per prompt (default: each built-in prompt's own, 32-56; 128 for yours)")
    add_budget_argument(demo)
    demo.add_argument("--no-planner-cache", action="store_true",
                      help="neither load nor save planner statistics (start from the prior)")
    add_placement_arguments(demo)
    demo.set_defaults(func=cmd_demo)
