"""Replay drafters over the default model's recorded greedy outputs: MAT in seconds, no model.

Each recorded prompt (``benchmarks/sam_streams.py``) is replayed through the real loop
(:func:`specdec.bench.replay.replay`) with every draft verified whole (``budget="full"``):
the replayed "model" emits the recorded output, so a drafter's MAT here is exactly its MAT
on the default model wherever the real run's output equals the recording (greedy, lossless:
``benchmarks/sam_table.py`` checks it). Modes:

- ``request``: a fresh drafter per prompt (its own text only);
- ``stream``: the prompts in order, one store (``sam``) or cache (``arctic:shared``) shared,
  each sequence added when it ends, as one ``Generator`` does.

    python benchmarks/sam_replay.py                   # the tables of docs/algorithms/sam.md
    python benchmarks/sam_replay.py --methods "sam:num_nodes=11,arctic:max_spec_factor=4" --mode stream

A method is ``name[:key=value...]`` as in ``specdec bench`` (``arctic`` needs arctic-inference).
Prints pooled MAT (all new tokens after the prefill over all target forwards), per kind and
category, and the mean nodes verified per step.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STREAMS = ROOT / "benchmarks" / "data" / "sam_streams.jsonl"
VOCAB = 49152  # the default model's
DEFAULT_REQUEST = ("pld", "sam", "sam:num_nodes=11", "sam:num_nodes=20", "arctic", "arctic:max_spec_factor=4",
                   "arctic:max_spec_factor=8")
DEFAULT_STREAM = ("sam", "sam:num_nodes=8", "sam:num_nodes=10", "sam:num_nodes=14", "sam:num_nodes=20",
                  "arctic:shared=true", "arctic:shared=true:max_spec_factor=4", "arctic:shared=true:max_spec_factor=8")


def load_streams(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()[1:] if line.strip()]


def replay_method(spec: str, records: list[dict[str, Any]], mode: str) -> dict[str, list[int]]:
    """``{group: [emitted, steps, nodes]}`` over the records for one method spec."""
    from specdec.bench.methods import parse_method
    from specdec.bench.replay import replay
    from specdec.drafters import DrafterContext, make_factory

    method = parse_method(spec)
    options = dict(method.options)
    if method.name == "sam" and mode == "request":
        options.setdefault("store", False)
    factory = make_factory(method.name, options, DrafterContext(vocab_size=VOCAB))
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for record in records:
        if len(record["output"]) < 2:
            continue
        drafter = factory.create()  # per sequence; in stream mode the factory's store or cache is shared
        stream = record["prompt"] + record["output"]
        stats = replay(drafter, stream, len(record["prompt"]), vocab_size=VOCAB).stats
        finish = getattr(drafter, "finish", None)
        if callable(finish):
            finish()
        for group in ("all", record["set"], record["category"]):
            cell = totals[group]
            cell[0] += stats.emitted_by_steps
            cell[1] += stats.steps
            cell[2] += sum(r.tree_size for r in stats.records)
    return totals


def table(results: dict[str, dict[str, list[int]]], mode: str) -> str:
    groups = sorted({g for cells in results.values() for g in cells if g not in ("all", "heldout", "spec_bench")})
    head = ["method", "mode", "all", "held-out", "Spec-Bench", *groups, "nodes/step"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for spec, cells in results.items():
        def mat(group: str, cells: dict[str, list[int]] = cells) -> str:
            cell = cells.get(group)
            return f"{cell[0] / cell[1]:.2f}" if cell and cell[1] else "-"
        nodes = cells["all"][2] / max(cells["all"][1], 1)
        lines.append("| " + " | ".join([f"`{spec}`", mode, mat("all"), mat("heldout"), mat("spec_bench"),
                                        *(mat(g) for g in groups), f"{nodes:.1f}"]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=None, help="comma-separated method specs (default: the docs' tables)")
    parser.add_argument("--mode", choices=("request", "stream", "both"), default="both")
    parser.add_argument("--streams", type=Path, default=STREAMS)
    args = parser.parse_args()
    from specdec.drafters import available_drafters

    records = load_streams(args.streams)
    for mode in ("request", "stream") if args.mode == "both" else (args.mode,):
        specs = args.methods.split(",") if args.methods else list(DEFAULT_REQUEST if mode == "request"
                                                                   else DEFAULT_STREAM)
        specs = [s for s in specs if s.split(":")[0] in available_drafters()]
        results = {spec: replay_method(spec, records, mode) for spec in specs}
        print(table(results, mode))
        print()


if __name__ == "__main__":
    main()
