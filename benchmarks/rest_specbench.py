"""REST on Spec-Bench with the default model, next to plain decoding, ``pld`` and ``sam``.

    flock /tmp/specdec-bench.lock python benchmarks/rest_specbench.py --datastore PATH.rest \\
        [--sam-datastore PATH.sam] [--auto] [--per-category 3] [--max-new-tokens 128] [--out runs/rest.json]
    python benchmarks/rest_specbench.py --report runs/rest.json      # the tables again

``--datastore`` is a ``rest`` datastore (``benchmarks/rest_datastore.py`` builds the >10M-token
one: GSM8K, the standard library's source, ``/usr/share/doc``). ``--sam-datastore`` adds
``sam`` with a static automaton; ``--build-sam`` first builds one from the same documents
as the ``rest`` file (its own documents, no re-tokenizing).

Methods run with the model: ``none`` (plain decoding through specdec's loop, the baseline),
``pld`` and ``sam`` with their whole drafts (``budget="full"``) and ``rest`` at fixed node
budgets 16, 32 and 64 (root included; on this CPU a 64-node forward costs ~3.5x a one-token
one); ``--auto`` adds ``rest`` with the cost-aware ``budget="auto"``.

**Replayed MAT.** For drafters that do not learn from the model (all of these), the
accepted path of a step depends only on the draft tree and on the model's own greedy
continuation, which lossless decoding makes equal to plain decoding's output. So each
drafter is also replayed over ``none``'s output (:mod:`specdec.bench.replay`, the real loop
with a verifier that answers from the known output): the MAT it would reach at node
budgets 2 to 128, in milliseconds instead of forwards. For the methods also run with the
model, replayed and measured MAT agree (the last step can differ at an EOS).

Questions: the first turn of ``--per-category`` evenly spaced
Spec-Bench questions per category (indices ``i * len / n``), chat-templated, greedy,
``--max-new-tokens`` each, stopping at EOS. Methods run interleaved question by question,
so drifting machine load hits all alike. Speedup is Spec-Bench's: a method's mean
tokens/s over a category's questions divided by the baseline's. MAT (tokens per target
forward, bonus included) is deterministic; tokens/s is not. Every output is compared with
plain decoding's (identical, or a first difference on a near-tie, top-two logit margin
under 1e-3, which is reported).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

QUESTIONS = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "spec_bench" / "question.jsonl"
CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


@dataclass
class Method:
    label: str
    drafter: str
    options: dict[str, Any] = field(default_factory=dict)
    budget: str | int = "full"


REPLAY_BUDGETS = (2, 4, 8, 16, 24, 32, 48, 64, 128)


def methods(datastore: str, sam_datastore: str | None, auto: bool) -> list[Method]:
    listed = [Method("none", "none", budget=1), Method("pld", "pld"), Method("sam", "sam")]
    if sam_datastore:
        listed.append(Method("sam+static", "sam", {"datastore": sam_datastore}))
    listed += [Method(f"rest@{n}", "rest", {"datastore": datastore}, budget=n) for n in (16, 32, 64)]
    if auto:
        listed.append(Method("rest@auto", "rest", {"datastore": datastore}, budget="auto"))
    return listed


def replayed(listed: list[Method], prompt: list[int], output: list[int], vocab_size: int,
             context: Any) -> list[dict[str, Any]]:
    """Replay every drafter of ``listed`` (but ``none``) over the known ``output`` at each budget."""
    from specdec.bench.replay import replay
    from specdec.drafters import make_factory

    rows = []
    seen: set[tuple[str, str]] = set()
    for method in listed:
        key = (method.drafter, json.dumps(method.options, sort_keys=True))
        if method.drafter == "none" or key in seen:
            continue
        seen.add(key)
        for budget in REPLAY_BUDGETS:
            # rest's own cap (num_draft = 64) would stop it at 65 nodes; let it fill larger budgets
            options = method.options | ({"num_draft": budget - 1} if method.drafter == "rest" and budget > 65 else {})
            factory = make_factory(method.drafter, options, context)
            stats = replay(factory.create(), prompt + output, len(prompt), vocab_size=vocab_size,
                           max_nodes=budget).stats
            label = method.label.split("@")[0]
            rows.append({"drafter": label, "budget": budget, "mat": stats.mat, "steps": stats.steps,
                         "mean_tree_size": stats.mean_tree_size})
    return rows


def load_questions(per_category: int) -> list[tuple[str, str]]:
    """(category, first-turn text) of ``per_category`` evenly spaced questions per category."""
    from specdec.bench import questions

    if not QUESTIONS.exists():
        sys.exit(f"{QUESTIONS} is absent: the Spec-Bench questions ship with ../shared/data")
    return [(q.category, q.turns[0])
            for q in questions.select_questions(questions.load_questions(QUESTIONS), per_category)]


def build_sam(rest_path: str, out: str) -> None:
    from specdec.datastores import BUILDERS, rest

    module_name, _, function_name = BUILDERS["sam"].partition(":")
    builder = getattr(__import__(module_name, fromlist=[function_name]), function_name)
    store = rest.load(rest_path, verify=False)
    documents = [store.document(i).astype("int64") for i in range(store.num_documents)]
    print(json.dumps(builder(documents, Path(out), store.tokenizer, progress=True)), file=sys.stderr)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run (or resume: rows already in ``--out`` are kept) every question, saving after each."""
    import specdec
    from specdec.models import encode_prompt, load_model
    from specdec.testing import compare_outputs

    model, tokenizer = load_model()
    listed = methods(args.datastore, args.sam_datastore, args.auto)
    saved = json.loads(args.out.read_text()) if args.out and args.out.exists() else {}
    rows: list[dict[str, Any]] = saved.get("rows", [])
    replay_rows: list[dict[str, Any]] = saved.get("replay", [])
    done = {r["question"] for r in rows}
    generators = {m.label: specdec.Generator(model, tokenizer, drafter=m.drafter, drafter_options=m.options,
                                             budget=m.budget) for m in listed}
    context = generators["none"].context
    questions = load_questions(args.per_category)
    warm = encode_prompt(tokenizer, questions[0][1])
    for generator in generators.values():  # one-time costs (extension loads, page faults) out of the clock
        generator.generate(warm, max_new_tokens=4)
    results = {"settings": {k: str(v) for k, v in vars(args).items()} | {"methods": [m.__dict__ for m in listed]},
               "rows": rows, "replay": replay_rows}
    for index, (category, text) in enumerate(questions):
        if index in done:
            continue
        prompt = encode_prompt(tokenizer, text)
        outputs: dict[str, Any] = {}
        order = listed[index % len(listed) :] + listed[: index % len(listed)]
        fresh = []
        for method in order:
            started = time.perf_counter()
            result = generators[method.label].generate(prompt, max_new_tokens=args.max_new_tokens)
            wall = time.perf_counter() - started
            outputs[method.label] = result
            stats = result.stats
            fresh.append({"question": index, "category": category, "method": method.label,
                          "new_tokens": stats.new_tokens, "steps": stats.steps, "mat": stats.mat,
                          "tokens_per_s": stats.new_tokens / wall, "mean_tree_size": stats.mean_tree_size,
                          "draft_s": stats.draft_s, "verify_s": stats.verify_s, "wall_s": wall})
        base = outputs["none"].tokens
        for row in fresh:
            comparison = compare_outputs(model, prompt, outputs[row["method"]].tokens, base)
            row["identical"] = comparison.identical
            row["comparison"] = comparison.describe()
            if not comparison.acceptable:
                print(f"NOT LOSSLESS: question {index} {row['method']}: {comparison.describe()}", file=sys.stderr)
        rows += fresh
        for row in replayed(listed, prompt, base, generators["none"].verifier.vocab_size, context):
            replay_rows.append({"question": index, "category": category, **row})
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=1))
        print(f"question {index + 1}/{len(questions)} ({category}) done", file=sys.stderr)
    return results


def report(results: dict[str, Any]) -> str:
    rows = results["rows"]
    labels = list(dict.fromkeys(r["method"] for r in rows))
    base_label = "none"

    def pick(label: str, category: str | None) -> list[dict[str, Any]]:
        return [r for r in rows if r["method"] == label and (category is None or r["category"] == category)]

    lines = []
    header = f"{'method':<12}" + "".join(f"{c[:13]:>24}" for c in [*CATEGORIES, "overall"])
    for metric in ("mat", "tokens_per_s", "speedup"):
        lines += ["", f"## {metric} (per category; speedup = mean tokens/s over the baseline's)", header]
        for label in labels:
            cells = []
            for category in [*CATEGORIES, None]:
                mine = pick(label, category)
                if not mine:
                    cells.append(f"{'-':>24}")
                    continue
                if metric == "speedup":
                    base = statistics.mean(r["tokens_per_s"] for r in pick(base_label, category))
                    value = statistics.mean(r["tokens_per_s"] for r in mine) / base
                    cells.append(f"{value:>23.2f}x")
                else:
                    cells.append(f"{statistics.mean(r[metric] for r in mine):>24.2f}")
            lines.append(f"{label:<12}" + "".join(cells))
    lines += ["", "## token identity with plain decoding (identical / near-tie / total), mean tree size"]
    for label in labels:
        mine = pick(label, None)
        identical = sum(r["identical"] for r in mine)
        near = sum(not r["identical"] and "a near-tie" in r["comparison"] for r in mine)
        tree = statistics.mean(r["mean_tree_size"] for r in mine)
        lines.append(f"{label:<12} {identical}/{near}/{len(mine)}   mean tree {tree:.1f} nodes")
    replay_rows = results.get("replay", [])
    if replay_rows:
        drafters = list(dict.fromkeys(r["drafter"] for r in replay_rows))
        budgets = sorted({r["budget"] for r in replay_rows})
        lines += ["", "## replayed MAT over plain decoding's output, by node budget (root included), all questions",
                  f"{'drafter':<12}" + "".join(f"{b:>8}" for b in budgets)]
        for drafter in drafters:
            cells = [statistics.mean(r["mat"] for r in replay_rows if r["drafter"] == drafter and r["budget"] == b)
                     for b in budgets]
            lines.append(f"{drafter:<12}" + "".join(f"{c:>8.3f}" for c in cells))
        lines += ["", "## replayed rest MAT by category at budgets 16 / 32 / 64",
                  f"{'category':<16}" + "".join(f"{b:>8}" for b in (16, 32, 64))]
        for category in CATEGORIES:
            cells = [statistics.mean(r["mat"] for r in replay_rows if r["drafter"] == "rest" and r["budget"] == b
                                     and r["category"] == category) for b in (16, 32, 64)]
            lines.append(f"{category:<16}" + "".join(f"{c:>8.3f}" for c in cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datastore", help="a rest datastore")
    parser.add_argument("--sam-datastore", default=None)
    parser.add_argument("--build-sam", action="store_true", help="build --sam-datastore from --datastore's documents")
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--auto", action="store_true", help="also run rest with budget='auto'")
    parser.add_argument("--out", type=Path, default=None, help="save the rows as JSON (and resume from it)")
    parser.add_argument("--report", type=Path, default=None, help="print the tables of a saved run")
    args = parser.parse_args()
    if args.report:
        print(report(json.loads(args.report.read_text())))
        return
    if not args.datastore:
        parser.error("--datastore is required")
    if args.build_sam:
        if not args.sam_datastore:
            parser.error("--build-sam needs --sam-datastore PATH")
        build_sam(args.datastore, args.sam_datastore)
    print(report(run(args)))


if __name__ == "__main__":
    main()
