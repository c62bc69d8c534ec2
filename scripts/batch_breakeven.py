"""What a draft node must be worth at batch size B: the forward's cost per extra row against the
acceptance the drafts reach (issue #32; docs/budget.md, "Batches").

    python scripts/batch_breakeven.py [--batch-size 8]

Two measurements in this process, both from the learned state ``specdec bench batch`` gives its
runs (Token Recycling's matrix warmed on the warm-up prompts alone, so nothing drafts from the
measured prompts' outputs; the matrix this process started with is put back at the end):

1. the batched verification alone, ``B`` rows with 0 to ``2B`` extra nodes, timed in paired
   rounds (:func:`step_costs`): the plain step (``R = B``), the cost of each extra row, and the
   break-even acceptance ``p* = (ms per extra row) / (ms per plain token)``: a draft node pays for
   its row only if it is accepted more often than that (before its drafting is paid);
2. ``generate_batch`` over the 16 held-out prompts at 128 new tokens, ``sam+recycling`` with
   ``budget=2`` (every row verifies its drafter's best node, every step):
   how often those nodes were accepted, binned by the acceptance model's estimate, and what a
   perfect choice among them by estimate could gain: the extra tokens of the nodes estimated
   above ``p*``, less ``p*`` for each, per row-step. That bounds what the planner can win at this
   ``B`` with one node a row (deeper nodes are accepted less often than their parents).

Measured 2026-11-26 (19:29 UTC) on a 2-vCPU AMD EPYC (Zen 4), B = 8, 43 s: a plain step 34.9 ms
(4.36 ms a token), each extra row +2.19 ms (+5.0 ms for the first: a third four-row pass of
the kernels), so ``p* = 0.50``. The best nodes were accepted 0.56 of the time (the model expected
0.57; by estimate bin 0.15 / 0.55 / 0.51 / 0.77 / 0.91), the 65% estimated above ``p*`` 0.68:
choosing exactly those gains +0.116 tokens a row-step, so at most ~1.12x on the decoding and,
with the prefills (a quarter of a batch-8 run, the same in both arms), ~1.08x on the run before
drafting costs. 1.1x at B = 8 is out of reach on this CPU for these drafters.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import specdec
from specdec.bench import oneoff
from specdec.bench.batched import WARM_UP
from specdec.drafters.recycling_state import clear_shared, restore_shared, snapshot_shared
from specdec.models import encode_prompt
from specdec.types import BatchVerifier, DraftTree

BINS = ((0.0, 0.35), (0.35, 0.5), (0.5, 0.65), (0.65, 0.8), (0.8, 1.01))


def step_costs(model: Any, tokenizer: Any, prompts: list[list[int]], batch: int, rounds: int) -> tuple[float, float]:
    """Median ms of a plain batched verification (R = B) and the ms of each extra row, from paired timings.

    ``batch`` rows (a prompt and 64 more tokens each) are verified with 0..2B extra nodes (chains of
    random tokens spread over the rows), the sizes timed in turn, forwards and backwards, ``rounds``
    times: each size's time minus the plain one of the same round, so the machine's drift between
    minutes cancels. The rows are prefilled again every 4 rounds (each call commits one token a row).
    """
    rng = random.Random(0)
    extras = [0, 1, 2, 4, 6, 8, 12, 16]
    times: dict[int, list[float]] = {k: [] for k in extras}
    with specdec.Generator(model, tokenizer, drafter="sam+recycling", store=False) as generator:
        verifier = generator.verifier
        if not isinstance(verifier, BatchVerifier):
            raise SystemExit(f"engine {verifier.engine!r}: no batched verification")
        live: list[list[Any]] = []
        for r in range(rounds + 1):
            if r % 4 == 0:
                for state, _ in live:
                    verifier.release(state)
                live = []
                for prompt in prompts[:batch]:
                    state, pending, _ = verifier.prefill(prompt + [rng.randrange(1000, 2000) for _ in range(64)])
                    live.append([state, pending])
            for extra in extras if r % 2 else extras[::-1]:
                sizes = [extra // batch + (b < extra % batch) for b in range(batch)]
                trees = [DraftTree.chain(pending, [rng.randrange(1000, 2000) for _ in range(size)])
                         for size, (_, pending) in zip(sizes, live, strict=True)]  # fmt: skip
                started = time.perf_counter()
                results = verifier.verify_batch([state for state, _ in live], trees, 0)
                seconds = time.perf_counter() - started
                for row, result in zip(live, results, strict=True):
                    row[1] = result.bonus
                if r:  # the first round warms every size
                    times[extra].append(seconds * 1e3)
        for state, _ in live:
            verifier.release(state)
    plain = statistics.median(times[0])
    print(f"B = {batch}: batched verification by extra rows ({rounds} paired rounds)")
    diffs = {k: statistics.median(a - b for a, b in zip(times[k], times[0], strict=True)) for k in extras[1:]}
    for k, d in diffs.items():
        print(f"  R = {batch + k:3d}: {statistics.median(times[k]):6.2f} ms, {d:+6.2f} ms over R = {batch} "
              f"({d / k:.2f} ms a row)")  # fmt: skip
    slope = sum(k * d for k, d in diffs.items()) / sum(k * k for k in diffs)
    return plain, slope


def best_nodes(model: Any, tokenizer: Any, prompts: list[list[int]], batch: int, breakeven: float) -> None:
    """The drafter's best node per row and step (``budget=2``): accepted against expected, binned."""
    with specdec.Generator(model, tokenizer, drafter="sam+recycling", store=False, budget=2) as generator:
        results = generator.generate_batch(prompts, batch_size=batch, max_new_tokens=128)
    pairs = [(r.expected or 0.0, r.accepted) for result in results for r in result.stats.records if r.tree_size == 2]
    accepted, expected = statistics.mean(a for _, a in pairs), statistics.mean(e for e, _ in pairs)
    print(f"the best node of each row's draft ({len(pairs)} nodes): accepted {accepted:.2f}, "
          f"the acceptance model expected {expected:.2f}")  # fmt: skip
    for low, high in BINS:
        inside = [(e, a) for e, a in pairs if low <= e < high]
        if inside:
            print(f"  estimate [{low:.2f}, {high:.2f}): {len(inside):4d} nodes, accepted "
                  f"{statistics.mean(a for _, a in inside):.2f}")  # fmt: skip
    above = [a for e, a in pairs if e >= breakeven]
    share = len(above) / max(len(pairs), 1)
    print(f"  {share:.0%} of them estimated above p* = {breakeven:.2f}; those were accepted "
          f"{statistics.mean(above) if above else 0.0:.2f}")  # fmt: skip
    steps = sum(r.stats.steps for r in results)
    gain = sum(a - breakeven for a in above) / max(steps, 1)
    print(f"  choosing exactly those: {gain:+.3f} tokens a row-step net of their rows' cost, so the decoding "
          f"at most {1 + gain:.3f}x plain batched decoding before drafting costs and prefills")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=24)
    args = parser.parse_args()
    model, tokenizer = specdec.load_model()
    prompts = [encode_prompt(tokenizer, p.text, None) for p in oneoff.heldout_prompts()[:16]]
    saved = snapshot_shared()
    try:
        clear_shared()
        for budget in ("auto", 2):  # calibration, kernels, and the matrix warmed on other prompts
            with specdec.Generator(model, tokenizer, drafter="sam+recycling", store=False, budget=budget) as generator:
                generator.generate_batch([encode_prompt(tokenizer, t, None) for t in WARM_UP],
                                         batch_size=args.batch_size, max_new_tokens=32)  # fmt: skip
        learned = snapshot_shared()
        plain, per_row = step_costs(model, tokenizer, prompts, args.batch_size, args.rounds)
        per_token = plain / args.batch_size
        breakeven = per_row / per_token
        print(f"plain step {plain:.2f} ms ({per_token:.2f} ms a token), {per_row:.2f} ms an extra row: "
              f"p* = {breakeven:.2f}")  # fmt: skip
        restore_shared(learned)
        best_nodes(model, tokenizer, prompts, args.batch_size, breakeven)
    finally:
        restore_shared(saved)


if __name__ == "__main__":
    main()
