"""Verification cost by tree size with and without the CPU fast paths, side by side.

Three verifiers over one model, timed in the same interleaved rounds (so a drift of the
machine's load hits all alike), at each tree size and context:

- ``usual``: Hugging Face's ``sdpa`` attention as it comes (KV repeated per layer under a
  mask) and ``linear`` everywhere: what specdec ran before these fast paths;
- ``grouped``: attention over grouped heads without the KV copy (:mod:`specdec.backends.gqa`);
- ``grouped+narrow``: that, plus narrow products for every multi-node tree
  (:mod:`specdec.backends.narrow`; calibration turns them on only up to the size where
  they win, this column shows them at every size).

The fastest of ``--repeats`` rounds is kept (other jobs only ever add time). Prints a
Markdown table and writes JSON::

    flock /tmp/specdec-bench.lock python benchmarks/kernel_curves.py --out runs/kernel_curves.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
CONTEXTS = (64, 1024)


def measure(sizes: tuple[int, ...], contexts: tuple[int, ...], repeats: int) -> dict[str, Any]:
    import torch

    from specdec.backends import make_verifier
    from specdec.models import load_model
    from specdec.types import DraftTree

    model, _ = load_model()
    variants = {"usual": make_verifier(model), "grouped": make_verifier(model), "grouped+narrow": make_verifier(model)}
    variants["usual"].grouped = None
    variants["grouped+narrow"].narrow_rows = max(sizes)
    rng = random.Random(0)
    vocab = variants["usual"].vocab_size
    prompt = [rng.randrange(vocab) for _ in range(max(contexts))]
    states = {name: verifier.prefill(prompt) for name, verifier in variants.items()}
    best: dict[str, dict[int, dict[int, float]]] = {name: {c: {} for c in contexts} for name in variants}
    for context in sorted(contexts, reverse=True):  # crop the prefilled caches down, context by context
        for round_ in range(repeats + 1):  # round 0 warms up
            for size in sizes:
                tokens = [rng.randrange(vocab) for _ in range(size - 1)]
                for name, verifier in variants.items():
                    state, pending, _ = states[name]
                    state.cache.crop(-(state.committed_len - context))
                    state.committed_len = context
                    started = time.perf_counter()
                    verifier.verify(state, DraftTree.chain(pending, tokens))
                    elapsed = time.perf_counter() - started
                    if round_:
                        kept = best[name][context].get(size, float("inf"))
                        best[name][context][size] = min(kept, elapsed)
    return {
        "sizes": list(sizes),
        "contexts": list(contexts),
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "ms": {name: {str(c): [round(best[name][c][s] * 1e3, 2) for s in sizes] for c in contexts} for name in best},
    }


def markdown(report: dict[str, Any]) -> str:
    sizes = report["sizes"]
    lines = ["| context | kernels | " + " | ".join(str(s) for s in sizes) + " |",
             "| --- | --- | " + " | ".join("---" for _ in sizes) + " |"]
    for context in report["contexts"]:
        usual_one = report["ms"]["usual"][str(context)][0]
        for name, by_context in report["ms"].items():
            row = by_context[str(context)]
            cells = [f"{ms:.1f} ({ms / usual_one:.2f}x)" for ms in row]
            lines.append(f"| {context} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    args = parser.parse_args(argv)
    report = measure(SIZES, CONTEXTS, args.repeats)
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    print("\nverification ms by tree size (x: over the usual 1-node step at that context)\n")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
