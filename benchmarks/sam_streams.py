"""Record the default model's greedy outputs once, for replaying drafters without a model.

The prompt set of issue 19 (docs/algorithms/sam.md, "Choosing the tree rule"): the
held-out-style prompts of ``benchmarks/data/heldout_prompts.jsonl`` (HumanEval- and
MBPP-like code, GSM8K-test-like math, code edits; written for this project) and
``--per-category`` Spec-Bench questions per category (first turn), each through the chat
template, ``--max-new-tokens`` greedy tokens by plain decoding (``drafter="none"``).

    python benchmarks/sam_streams.py            # resumable: appends to benchmarks/data/sam_streams.jsonl

The output holds, per prompt, its set (``heldout`` or ``spec_bench``), category, question id,
prompt ids and output ids: :mod:`benchmarks.sam_replay` replays drafters over them in seconds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HELDOUT = ROOT / "benchmarks" / "data" / "heldout_prompts.jsonl"
SPEC_BENCH = ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"


def prompt_set(per_category: int) -> list[tuple[str, Any]]:
    """``(set name, question)`` for the held-out prompts, then Spec-Bench's ``per_category`` per category."""
    from specdec.bench.questions import load_questions, select_questions

    chosen: list[tuple[str, Any]] = [("heldout", q) for q in load_questions(HELDOUT)]
    if SPEC_BENCH.is_file():
        chosen += [("spec_bench", q) for q in select_questions(load_questions(SPEC_BENCH), per_category)]
    return chosen


def load_streams(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The recorded streams: ``(meta, records)``; the file is JSON lines, a meta line first."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return lines[0]["meta"], lines[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "data" / "sam_streams.jsonl")
    parser.add_argument("--per-category", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()

    from tqdm import tqdm

    from specdec import Generator
    from specdec.models import encode_prompt

    meta = {"model": "default", "max_new_tokens": args.max_new_tokens, "per_category": args.per_category,
            "decoding": "greedy, drafter none",
            "command": f"python benchmarks/sam_streams.py --per-category {args.per_category} "
                       f"--max-new-tokens {args.max_new_tokens}"}
    done: set[tuple[str, int]] = set()
    if args.out.is_file():  # resume: keep what was recorded with the same settings
        old_meta, records = load_streams(args.out)
        if old_meta != meta:
            raise SystemExit(f"{args.out} was recorded with other settings: {old_meta}")
        done = {(r["set"], r["question_id"]) for r in records}
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta}) + "\n")
    generator = Generator("default", drafter="none", budget="full", store=False)
    todo = [(name, q) for name, q in prompt_set(args.per_category) if (name, q.question_id) not in done]
    for name, question in tqdm(todo, desc="recording greedy outputs"):
        prompt = encode_prompt(generator.tokenizer, question.turns[0])
        result = generator.generate(prompt, max_new_tokens=args.max_new_tokens)
        record = {"set": name, "category": question.category, "question_id": question.question_id,
                  "prompt": prompt, "output": result.tokens, "stop_reason": result.stats.stop_reason}
        with args.out.open("a") as out:
            out.write(json.dumps(record) + "\n")
    print(f"{len(done) + len(todo)} streams in {args.out}")


if __name__ == "__main__":
    main()
