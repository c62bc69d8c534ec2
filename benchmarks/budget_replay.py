"""Draft budgets replayed on Spec-Bench: MAT and modelled speedup per category, no clock involved.

The budget rule's decisions depend on two models: acceptance (learned from the steps) and
cost (measured). This script replays the default model's own greedy outputs (teacher
forcing, :mod:`specdec.bench.replay`: a draft node is accepted exactly when it continues
the recorded output) through the real loop, drafters and planner, with a **frozen** cost
table, and prices every step with that table. Given the streams and the table, every
figure is deterministic, so a change to the rule can be judged here in seconds, free of
the noise of a shared machine (wall-clock tables come from ``specdec bench``, where a
method takes its budget as an option: ``pld:budget=full``).

    # record the streams once (the default model's plain greedy outputs; minutes)
    python benchmarks/budget_replay.py --make-streams --per-category 10 --streams runs/streams.json
    # replay every drafter under every budget and cost table (seconds)
    python benchmarks/budget_replay.py --streams runs/streams.json --drafters pld,sam --tables reference,flat

Cost tables: ``reference``: the verification times measured on this project's 2-core CPU
with the default model (design brief: 53, 83, 102, 129, 190 ms for 1, 8, 16, 32, 64
nodes); ``calibrated``: this machine's cached calibration (``specdec calibrate``);
``flat``: a synthetic accelerator where up to 64 nodes cost one plain step (128: 1.3x),
to show the same rule drafting longer where verification is cheap.
Drafters that learn from the model's predictions (``recycling``) cannot be replayed: a
recorded output has no top-k for rejected nodes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specdec.budget import AcceptanceModel, BudgetPlanner, CostTable, Throughput, VerifyCostModel

REPO = Path(__file__).resolve().parent.parent

CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
SIZES = (1, 8, 16, 32, 64, 128)
TABLES = {
    # ms at ~300 tokens of context (docs/budget.md); 128 nodes extrapolated from 32 -> 64.
    "reference": (53.0, 83.0, 102.0, 129.0, 190.0, 312.0),
    "flat": (10.0, 10.0, 10.0, 10.0, 10.0, 13.0),
}


def cost_table(name: str) -> VerifyCostModel:
    """A frozen cost model: a named table, or this machine's calibration of the default model."""
    if name == "calibrated":
        from specdec.backends import make_verifier
        from specdec.budget.cost import cost_model
        from specdec.models import load_model

        model, _ = load_model()
        return VerifyCostModel(cost_model(make_verifier(model))[0].table, learn=False)
    row = tuple(ms / 1e3 for ms in TABLES[name])
    return VerifyCostModel(CostTable(SIZES, (1, 4096), (row, row), {"device": name}), learn=False)


def make_streams(path: Path, per_category: int, max_new_tokens: int) -> None:
    """Record the default model's greedy outputs for the Spec-Bench selection (first turns, chat template)."""
    import specdec
    from specdec.bench.questions import DEFAULT_QUESTIONS, load_questions, select_questions
    from specdec.models import encode_prompt, load_model

    model, tokenizer = load_model()
    generator = specdec.Generator(model, tokenizer, drafter="pld", budget="full")  # lossless, and quicker
    streams = {}
    for question in select_questions(load_questions(REPO / DEFAULT_QUESTIONS), per_category):
        prompt = encode_prompt(tokenizer, question.turns[0])
        result = generator.generate(prompt, max_new_tokens=max_new_tokens)
        streams[str(question.question_id)] = {"category": question.category, "prompt": prompt, "output": result.tokens}
        print(f"{question.category} q{question.question_id}: {len(result.tokens)} tokens", file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(streams), encoding="utf-8")


def replay_run(drafter_name: str, budget: str, streams: dict[str, Any], cost: VerifyCostModel, context: Any,
               options: dict[str, Any], model: Any = None) -> list[dict[str, Any]]:
    """Decode every stream's prompt in order with one drafter factory and one planner memory (as a Generator keeps).

    With ``model`` None the "model" is the recorded stream (teacher forcing, no forward);
    with a model, its real verifier decides (minutes: every step is a forward) and drafters
    that learn from the model's predictions (``recycling``) work. Either way the planner
    sees only the frozen ``cost`` and a fixed overhead, so no clock enters a decision.
    """
    from specdec.backends import make_verifier
    from specdec.bench.replay import ReplayVerifier
    from specdec.drafters import make_factory
    from specdec.engine import StopRules, decode

    factory = make_factory(drafter_name, options, context)
    vocab = int(context.vocab_size)
    # Overhead fixed at 0, as the modelled times count only verification: no clock in any decision.
    acceptance, throughput = AcceptanceModel(), Throughput(fixed_overhead_s=0.0)
    model_verifier = None if model is None else make_verifier(model)
    rows = []
    for question_id, item in streams.items():
        prompt, output = item["prompt"], item["output"]
        if len(output) < 2:
            continue
        verifier: Any = model_verifier or ReplayVerifier([*prompt, *output], vocab)
        planner = BudgetPlanner(verifier, budget, acceptance, throughput, cost=cost)
        rules = StopRules(len(output), frozenset(context.eos_token_ids))
        result = decode(verifier, factory.create(), prompt, rules, planner=planner)
        if model is None:
            assert result.tokens == output, f"replay of q{question_id} diverged"
        run_s, plain_s, committed = 0.0, 0.0, len(prompt)
        for record in result.stats.records:
            run_s += float(cost.calibrated(np.array([record.tree_size]), committed)[0])
            plain_s += float(cost.calibrated(np.ones(1, dtype=np.int64), committed)[0]) * (record.accepted + 1)
            committed += record.accepted + 1
        stats = result.stats
        rows.append({"category": item["category"], "question_id": question_id, "mat": stats.mat,
                     "run_s": run_s, "plain_s": plain_s, "nodes": stats.mean_tree_size,
                     "offered": stats.budget_summary()["mean_offered"],
                     "expected": stats.budget_summary()["expected_accepted"],
                     "realised": stats.budget_summary()["realised_accepted"],
                     "same_as_recorded": result.tokens == output})
    return rows


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Per category and overall: modelled speedup (total plain time / total run time), MAT, nodes."""
    cells = {}
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[row["category"]].append(row)
        groups["overall"].append(row)
    for category, runs in groups.items():
        speedup = sum(r["plain_s"] for r in runs) / sum(r["run_s"] for r in runs)
        cells[category] = (f"{speedup:.2f}x, MAT {np.mean([r['mat'] for r in runs]):.2f}, "
                           f"{np.mean([r['nodes'] for r in runs]):.1f} nodes")
    return cells


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", required=True, help="recorded outputs (JSON), written by --make-streams")
    parser.add_argument("--make-streams", action="store_true")
    parser.add_argument("--per-category", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--drafters", default="pld,sam")
    parser.add_argument("--budgets", default="auto,full")
    parser.add_argument("--tables", default="reference,flat")
    parser.add_argument("--datastore", default=None, help="a datastore file for the drafters that take one (rest)")
    parser.add_argument("--json", default=None, help="also write the per-question rows here")
    parser.add_argument("--model", action="store_true",
                        help="verify with the default model itself instead of the recorded outputs (slow; "
                        "needed for drafters that learn from the model, e.g. recycling)")
    args = parser.parse_args(argv)
    path = Path(args.streams)
    if args.make_streams:
        make_streams(path, args.per_category, args.max_new_tokens)
    streams = json.loads(path.read_text(encoding="utf-8"))
    from specdec.drafters import DrafterContext
    from specdec.models import load_tokenizer

    model = None
    if args.model:
        from specdec.models import load_model

        model, tokenizer = load_model()
    else:
        tokenizer = load_tokenizer()  # the default model's: datastores are checked against it
    context = DrafterContext(vocab_size=len(tokenizer), tokenizer=tokenizer, eos_token_ids=(tokenizer.eos_token_id,))
    all_rows = []
    for table in args.tables.split(","):
        cost = cost_table(table)
        print(f"\n## cost table: {table} (ms by nodes: "
              + ", ".join(f"{s}: {1e3 * float(cost.calibrated(np.array([s]), 300)[0]):.0f}" for s in SIZES) + ")")
        print("| drafter | budget | " + " | ".join((*CATEGORIES, "overall")) + " |")
        print("| --- | --- |" + " --- |" * (len(CATEGORIES) + 1))
        for drafter in args.drafters.split(","):
            options = {"datastore": args.datastore} if args.datastore and "rest" in drafter else {}
            for budget in args.budgets.split(","):
                rows = replay_run(drafter, budget, streams, cost, context, options, model)
                cells = summarize(rows)
                print(f"| {drafter} | {budget} | " + " | ".join(cells.get(c, "-") for c in (*CATEGORIES, "overall"))
                      + " |", flush=True)
                all_rows += [{**r, "table": table, "drafter": drafter, "budget": budget} for r in rows]
    if args.json:
        Path(args.json).write_text(json.dumps(all_rows, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
