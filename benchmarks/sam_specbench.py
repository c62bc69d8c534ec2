"""The ``sam`` drafter on Spec-Bench, side by side with ``pld`` and plain decoding, on the default model.

    flock /tmp/specdec-bench.lock python benchmarks/sam_specbench.py --out runs/sam-specbench.json
    python benchmarks/sam_specbench.py --report runs/sam-specbench.json      # the tables again
    python benchmarks/sam_specbench.py --replay runs/sam-streams.json        # MAT of many settings, no timing

Methods (``--methods``, default all): ``none`` (plain decoding through specdec's loop, the
baseline), ``pld``, ``sam`` (the dynamic automaton alone), ``sam+static`` (with the static
automaton of ``--datastore``), each verifying the drafter's whole chain (``budget="full"``:
what the drafter itself is worth), and ``pld@auto``, ``sam@auto``, ``sam+static@auto``
with the cost-aware budget a user gets by default (``budget="auto"``). ``sam`` runs with
the paper's defaults (l_bias 5, l_threshold 5, chain length 40); ``--sam-options`` changes
them, e.g. ``--sam-options '{"l_threshold": 2}'``.

The static automaton: ``--datastore PATH``, by default the one ``benchmarks/sam_costs.py``
builds (GSM8K, the Python standard library and /usr/share/doc, ~26M tokens), else one
built here from GSM8K alone.

Questions: the first turn of ``--per-category`` evenly spaced Spec-Bench questions per
category (MT-Bench's 80 as one category), chat-templated, ``--max-new-tokens`` each,
greedy, stopping at EOS. Methods run interleaved question by question (order rotated), so
drifting machine load hits all alike. Speedup is Spec-Bench's: the mean over a category's
questions of a method's tokens/s divided by the same mean for ``none``. MAT is tokens
emitted per target forward after the prefill (bonus included). Every output is compared
with plain decoding's: identical, or a first difference on a near-tie (top-two logit
margin under 1e-3), counted apart.

``--replay STREAMS``: MAT of many drafter settings at once, without timing. Plain decoding
writes each question's output once (cached in ``STREAMS``); then every setting replays it
(:func:`specdec.bench.replay.replay`: the real loop, the model replaced by the known
output). For a drafter of chains under ``budget="full"`` this *is* the MAT of a real run:
the model's greedy choices are the output, and a chain's accepted length is its longest
prefix that the output continues with. Microseconds per step, so settings are cheap.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
QUESTIONS = REPO.parent / "shared" / "data" / "spec_bench" / "question.jsonl"
GSM8K = REPO.parent / "shared" / "data" / "corpora" / "gsm8k_train.jsonl"
METHODS = ("none", "pld", "sam", "sam+static", "pld@auto", "sam@auto", "sam+static@auto")


def questions(per_category: int) -> list[tuple[str, int, str]]:
    """(category, question id, first turn) for ``per_category`` evenly spaced questions per category."""
    by_category: dict[str, list[dict[str, Any]]] = {}
    for line in QUESTIONS.read_text().splitlines():
        question = json.loads(line)
        category = "mt_bench" if question["question_id"] <= 160 else question["category"]
        by_category.setdefault(category, []).append(question)
    chosen = []
    for category, items in by_category.items():
        for i in range(per_category):
            question = items[i * len(items) // per_category]
            chosen.append((category, int(question["question_id"]), str(question["turns"][0])))
    return chosen


def default_datastore(tokenizer: Any) -> Path:
    """The costs benchmark's corpus automaton if built, else a GSM8K one (built once, cached)."""
    from specdec.datastores.corpus import iter_texts, tokenize_documents
    from specdec.datastores.format import TokenizerIdentity
    from specdec.datastores.sam import build
    from specdec.models import cache_dir

    big = cache_dir() / "datastores" / "sam-bench.sam"
    if big.exists():
        return big
    small = cache_dir() / "datastores" / "sam-gsm8k.sam"
    if not small.exists():
        texts = iter_texts([GSM8K], fields=["question", "answer"])
        build(tokenize_documents(tokenizer, texts, progress=False), small, TokenizerIdentity.of(tokenizer),
              progress=False)
    return small


def run(args: argparse.Namespace) -> dict[str, Any]:
    import specdec
    from specdec.models import encode_prompt
    from specdec.testing import compare_outputs

    model, tokenizer = specdec.load_model()
    datastore = args.datastore or default_datastore(tokenizer)
    sam_options = json.loads(args.sam_options)
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown or "none" not in methods:
        raise SystemExit(f"methods must include 'none' and come from {', '.join(METHODS)}; got {unknown or methods}")
    generators = {}
    for method in methods:
        name, _, budget = method.partition("@")
        drafter = "sam" if name.startswith("sam") else name
        options = dict(sam_options) if drafter == "sam" else {}
        if name == "sam+static":
            options["datastore"] = str(datastore)
        generator = specdec.Generator(model, tokenizer, drafter=drafter, drafter_options=options,
                                      budget=budget or "full")
        generators[method] = generator
    records: list[dict[str, Any]] = []
    chosen = questions(args.per_category)
    for index, (category, question_id, text) in enumerate(chosen):
        prompt = encode_prompt(tokenizer, text)
        order = methods[index % len(methods) :] + methods[: index % len(methods)]
        outputs = {}
        for method in order:
            result = generators[method].generate(prompt, max_new_tokens=args.max_new_tokens)
            stats = result.stats
            outputs[method] = result.tokens
            records.append({
                "question_id": question_id, "category": category, "method": method,
                "new_tokens": stats.new_tokens, "steps": stats.steps, "mat": stats.mat,
                "tokens_per_s": stats.tokens_per_s, "total_s": stats.total_s, "draft_s": stats.draft_s,
                "mean_tree_size": stats.mean_tree_size, "steps_by_source": stats.steps_by_source,
                "accepted_by_source": stats.accepted_by_source,
            })
        for method in methods:
            comparison = compare_outputs(model, prompt, outputs[method], outputs["none"])
            for record in records[-len(methods) :]:
                if record["method"] == method:
                    record["output"] = comparison.describe()
                    record["acceptable"] = comparison.acceptable
        print(f"[{index + 1}/{len(chosen)}] {category} q{question_id}: "
              + ", ".join(f"{r['method']} {r['mat']:.2f}/{r['tokens_per_s']:.1f}" for r in records[-len(methods):]),
              file=sys.stderr, flush=True)
    return {"config": {"per_category": args.per_category, "max_new_tokens": args.max_new_tokens,
                       "datastore": str(datastore), "sam_options": sam_options, "methods": methods},
            "records": records}


REPLAY_SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "pld": ("pld", {}),
    "sam": ("sam", {}),
    "sam l_threshold=3": ("sam", {"l_threshold": 3}),
    "sam l_threshold=2": ("sam", {"l_threshold": 2}),
    "sam l_threshold=1": ("sam", {"l_threshold": 1}),
    "sam+static": ("sam", {"datastore": None}),
    "sam+static l_threshold=2": ("sam", {"datastore": None, "l_threshold": 2}),
    "sam+static l_threshold=2 l_bias=2": ("sam", {"datastore": None, "l_threshold": 2, "l_bias": 2}),
}


def plain_streams(path: Path, per_category: int, max_new_tokens: int) -> list[dict[str, Any]]:
    """Each question's prompt and plain-decoding output (computed once, cached in ``path``)."""
    if path.exists():
        cached: list[dict[str, Any]] = json.loads(path.read_text())
        return cached
    import specdec
    from specdec.models import encode_prompt

    model, tokenizer = specdec.load_model()
    generator = specdec.Generator(model, tokenizer, drafter="none")
    streams = []
    for category, question_id, text in questions(per_category):
        prompt = encode_prompt(tokenizer, text)
        output = generator.generate(prompt, max_new_tokens=max_new_tokens).tokens
        streams.append({"category": category, "question_id": question_id, "prompt": prompt, "output": output})
        print(f"plain output of q{question_id} ({category}): {len(output)} tokens", file=sys.stderr, flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(streams))
    return streams


def replay_report(streams: list[dict[str, Any]], datastore: Path) -> str:
    """MAT per category of every :data:`REPLAY_SETTINGS` entry, by replaying the plain outputs."""
    from specdec.bench.replay import replay
    from specdec.drafters import DrafterContext, make_factory
    from specdec.models import load_tokenizer

    tokenizer = load_tokenizer()
    context = DrafterContext(vocab_size=len(tokenizer), tokenizer=tokenizer)
    categories = [*sorted({s["category"] for s in streams}), "overall"]
    lines = [f"MAT by replay of plain decoding's outputs ({len(streams)} questions, budget 'full')", "",
             "| setting | " + " | ".join(categories) + " |", "| --- " * (len(categories) + 1) + "|"]
    for label, (name, options) in REPLAY_SETTINGS.items():
        options = {k: (str(datastore) if k == "datastore" else v) for k, v in options.items()}
        factory = make_factory(name, options, context)
        emitted: dict[str, int] = dict.fromkeys(categories, 0)
        steps: dict[str, int] = dict.fromkeys(categories, 0)
        for stream in streams:
            if len(stream["output"]) < 2:
                continue
            tokens = stream["prompt"] + stream["output"]
            stats = replay(factory.create(), tokens, len(stream["prompt"]), vocab_size=len(tokenizer)).stats
            for category in (stream["category"], "overall"):
                emitted[category] += stats.emitted_by_steps
                steps[category] += stats.steps
        cells = [f"{emitted[c] / max(steps[c], 1):.2f}" for c in categories]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(data: dict[str, Any]) -> str:
    """Per category and overall: MAT, tokens/s and speedup over ``none``; output identity."""
    records = data["records"]
    methods = data["config"]["methods"]
    categories = [*sorted({r["category"] for r in records}), "overall"]

    def pick(method: str, category: str) -> list[dict[str, Any]]:
        return [r for r in records if r["method"] == method and category in ("overall", r["category"])]

    lines = [f"Spec-Bench, {data['config']['per_category']} questions/category, "
             f"{data['config']['max_new_tokens']} new tokens; MAT / tokens/s / speedup vs none", ""]
    lines.append("| category | " + " | ".join(methods) + " |")
    lines.append("| --- " * (len(methods) + 1) + "|")
    for category in categories:
        base = statistics.mean(r["tokens_per_s"] for r in pick("none", category))
        cells = []
        for method in methods:
            chosen = pick(method, category)
            speed = statistics.mean(r["tokens_per_s"] for r in chosen)
            mat = sum(r["mat"] * r["steps"] for r in chosen) / max(sum(r["steps"] for r in chosen), 1)
            cells.append(f"{mat:.2f} / {speed:.1f} / {speed / base:.2f}x")
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    lines.append("")
    for method in methods:
        chosen = pick(method, "overall")
        identical = sum(r["output"] == "identical" for r in chosen)
        acceptable = sum(bool(r["acceptable"]) for r in chosen)
        lines.append(f"{method}: {identical}/{len(chosen)} identical to plain decoding, "
                     f"{acceptable - identical} differing first on a near-tie, {len(chosen) - acceptable} otherwise")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--datastore", type=Path, default=None)
    parser.add_argument("--sam-options", default="{}", help="JSON options of every sam method")
    parser.add_argument("--out", type=Path, default=None, help="write the records here (JSON)")
    parser.add_argument("--report", type=Path, default=None, help="print the tables of a saved run")
    parser.add_argument("--replay", type=Path, default=None, help="plain outputs file (made if absent): MAT by replay")
    args = parser.parse_args()
    if args.report:
        print(report(json.loads(args.report.read_text())))
        return
    if args.replay:
        streams = plain_streams(args.replay, args.per_category, args.max_new_tokens)
        if args.datastore is None:
            from specdec.models import load_tokenizer

            args.datastore = default_datastore(load_tokenizer())
        print(replay_report(streams, args.datastore))
        return
    if not QUESTIONS.exists():
        raise SystemExit(f"{QUESTIONS} is absent: this benchmark needs ../shared/data")
    data = run(args)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1))
    print(report(data))


if __name__ == "__main__":
    main()
