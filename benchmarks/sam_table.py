"""Issue 19's table: pooled MAT of ``pld``, ``sam`` and ``sam+recycling`` on the default model.

Over the prompts recorded by ``benchmarks/sam_streams.py`` (held-out-style code, math and
code edits, and Spec-Bench), greedy, ``budget="full"`` (every drafted node verified, so
the figure judges drafting, not the planner), the recorded ``max_new_tokens``:

- ``--mode request``: one ``specdec.run`` per prompt (a fresh drafter and store each time);
- ``--mode stream``: every prompt through one ``Generator`` in order (its shared store on).

Every output is compared with the recorded plain greedy output: identical, or a first
difference on a near-tie (``specdec.testing.compare_outputs``), counted per method.
Results go to a JSON-lines file, one line per (method, mode, prompt), and the run resumes
where it stopped; ``--report`` prints the tables (pooled MAT = all new tokens after the
prefill over all target forwards; mean nodes verified per step).

    nice -n 5 python benchmarks/sam_table.py --methods pld,sam,sam+recycling --mode request
    nice -n 5 python benchmarks/sam_table.py --methods sam --mode stream --ids heldout:1,heldout:2,...
    python benchmarks/sam_table.py --report

The same command under an older checkout (``git archive 37713c7 | tar -x -C /tmp/old``,
then ``PYTHONPATH=/tmp/old``) measures that version; ``--label`` names its rows.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STREAMS = ROOT / "benchmarks" / "data" / "sam_streams.jsonl"
RESULTS = ROOT / "benchmarks" / "data" / "sam_table.jsonl"


def load_streams(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return lines[0]["meta"], lines[1:]


def load_results(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def measure(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    import specdec
    from specdec.testing import compare_outputs

    meta, streams = load_streams(args.streams)
    if args.ids:
        wanted = {(part.split(":")[0], int(part.split(":")[1])) for part in args.ids.split(",")}
        streams = [s for s in streams if (s["set"], s["question_id"]) in wanted]
    done = {(r["label"], r["mode"], r["set"], r["question_id"]) for r in load_results(args.out)}
    model, tokenizer = specdec.load_model()
    for method in args.methods.split(","):
        label = f"{args.label}{method}"
        generator = None
        if args.mode == "stream":
            generator = specdec.Generator(model, tokenizer, drafter=method, budget="full")
        todo = [s for s in streams if (label, args.mode, s["set"], s["question_id"]) not in done]
        if args.mode == "stream" and todo and len(todo) != len(streams):
            raise SystemExit(f"{label} stream: a stream run cannot resume midway (its store would differ); "
                             f"remove its lines from {args.out}")
        for record in tqdm(todo, desc=f"{label} ({args.mode})"):
            started = time.perf_counter()
            if generator is not None:
                result = generator.generate(record["prompt"], max_new_tokens=meta["max_new_tokens"])
            else:
                result = specdec.run(model, record["prompt"], method, tokenizer=tokenizer, budget="full",
                                     max_new_tokens=meta["max_new_tokens"])
            stats = result.stats
            comparison = compare_outputs(model, record["prompt"], result.tokens, record["output"])
            line = {"label": label, "method": method, "mode": args.mode, "set": record["set"],
                    "category": record["category"], "question_id": record["question_id"],
                    "steps": stats.steps, "emitted": stats.emitted_by_steps,
                    "nodes": sum(r.tree_size for r in stats.records), "identical": result.tokens == record["output"],
                    "acceptable": comparison.acceptable, "comparison": comparison.describe(),
                    "accepted_by_source": stats.accepted_by_source, "seconds": round(time.perf_counter() - started, 2)}
            with args.out.open("a") as out:
                out.write(json.dumps(line) + "\n")


def report(path: Path) -> str:
    """Pooled MAT per method and mode, per kind (held-out) and category (Spec-Bench)."""
    rows: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0, 0, 0]))
    for r in load_results(path):
        for group in ("all", r["set"], r["category"]):
            cell = rows[(r["label"], r["mode"])][group]
            cell[0] += r["emitted"]
            cell[1] += r["steps"]
            cell[2] += r["nodes"]
            cell[3] += int(r["identical"])
            cell[4] += 1
    groups = sorted({g for cells in rows.values() for g in cells if g not in ("all", "heldout", "spec_bench")})
    head = ["method", "mode", "all", "held-out", "Spec-Bench", *groups, "nodes/step", "identical"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for (label, mode), cells in sorted(rows.items()):
        def mat(group: str, cells: Any = cells) -> str:
            cell = cells.get(group)
            return f"{cell[0] / cell[1]:.2f}" if cell and cell[1] else "-"
        total = cells["all"]
        lines.append("| " + " | ".join([label, mode, mat("all"), mat("heldout"), mat("spec_bench"),
                                        *(mat(g) for g in groups), f"{total[2] / max(total[1], 1):.1f}",
                                        f"{total[3]}/{total[4]}"]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="pld,sam,sam+recycling")
    parser.add_argument("--mode", choices=("request", "stream"), default="request")
    parser.add_argument("--label", default="", help="prefix of the rows' names (an older checkout)")
    parser.add_argument("--streams", type=Path, default=STREAMS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--ids", default=None, help="only these prompts, as set:question_id,... "
                        "(e.g. heldout:1,heldout:2); in the file's order")
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    if args.report:
        print(report(args.out))
    else:
        measure(args)


if __name__ == "__main__":
    main()
