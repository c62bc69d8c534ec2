"""Batched arms compared in lockstep: each arm's steps take turns with the others', so the machine's drift cancels.

    python scripts/batch_lockstep.py [--batch-size 4] [--arms none,sam+recycling] [--rounds 4]

Why: on a shared VM one arm's run of ``specdec bench batch`` (10 s) can run 10-30% faster or
slower than the next arm's minutes later (docs/benchmarks.md), more than the differences under
test. Here every arm decodes the same 16 held-out prompts (the batch loop of ``generate_batch``,
128 new tokens, ``budget="auto"``), and the arms take turns on one thread, one batched step each:
they alternate every ~30 ms and see the same machine. An arm's time is the sum of its turns (its
prefills, drafting, planning, verification and bookkeeping), its tokens/s its tokens over that
time. Each round starts every arm from the same learned state: Token Recycling's matrix warmed on
the warm-up prompts alone (as ``specdec bench batch`` gives its runs; put back before every round)
and the planner statistics those warm-up calls saved (in a folder of this run's own; the rounds run
the batch loop itself, which saves nothing, so every round's Generators load the same). New
Generators every round; the arm that starts rotates. Reported per round: each arm's
tokens/s and its ratio to the first arm; then the median ratio. Rows are checked against the
first arm's (``none``: plain decoding).

**Caveat (measured 2026-11-27, 00:11-00:16 UTC): the ratios to ``none`` come out too high.** A
drafting arm's allocations trigger Python's garbage collector, whose passes then land in whichever
arm's turn is running: at B = 4 this gave 1.136x where ``specdec bench batch`` gave 1.00x minutes
apart, and 1.006x with ``gc.disable()``. Compare drafting variants with one another here, not with
``none`` (docs/benchmarks.md, "Batches in lockstep").

An arm is a drafter name, optionally with ``:`` and a variant this script knows, to compare a
policy with its alternative in one process: ``sam+recycling:whole`` (a batch row offers its
drafter's whole tree, as before ``ROW_OFFER_NODES``), ``sam+recycling:everyrow`` (undrafted rows
age the acceptance statistics too, as before 2026-11-26); ``sam+recycling:whole:everyrow`` both
(the code before).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import specdec
from specdec import batching
from specdec.batching import BatchRequest, decode_batch
from specdec.bench import oneoff
from specdec.bench.batched import WARM_UP
from specdec.budget import batch_planner
from specdec.drafters.recycling_state import clear_shared, restore_shared, snapshot_shared
from specdec.models import encode_prompt

VARIANTS = ("whole", "everyrow")


MARK = object()  # what a stepping arm yields at the start of each batched step: its turn ends there


class Turn:
    """The arm whose code runs now (one thread: the arms' generators are advanced in turn): its variants."""

    variants: tuple[str, ...] = ()
    lockstep = False  # the driver of one_round runs: steps yield MARK (else generate_batch runs as shipped)


def stepping(original: Any) -> Any:
    """``batching._step`` yielding :data:`MARK` first: the driver moves on to the next arm there."""

    def step(*args: Any) -> Iterator[Any]:
        if Turn.lockstep:
            yield MARK
        yield from original(*args)

    return step


def patch_variants() -> None:
    """The variants (module docstring), each active only while an arm that names it runs its turn."""
    row_offer, observe = batch_planner.BatchPlanner.row_offer, batch_planner.BatchPlanner.observe

    def offer(self: Any, places: int) -> int | None:
        return None if "whole" in Turn.variants else row_offer(self, places)

    def observe_every_row(self: Any, batch: Any, accepted: Any, verify_s: float, step_s: float) -> None:
        if "everyrow" not in Turn.variants:
            observe(self, batch, accepted, verify_s, step_s)
            return
        # what observing a one-node tree did before: the clock ticked
        self.acceptance.steps += sum(plan.tree.size == 1 for plan in batch.plans)
        observe(self, batch, accepted, verify_s, step_s)

    batch_planner.BatchPlanner.row_offer = offer  # type: ignore[method-assign]
    batch_planner.BatchPlanner.observe = observe_every_row  # type: ignore[method-assign]


def one_round(model: Any, tokenizer: Any, arms: list[str], prompts: list[list[int]], batch: int,
              max_new: int, first: int) -> tuple[list[float], list[list[list[int]]]]:
    """Every arm once, in lockstep from arm ``first`` on: tokens/s per arm and each arm's rows (prompt order).

    Each arm is ``decode_batch`` as :meth:`specdec.Generator.iter_batch` runs it (its verifier, drafters,
    batch planner); the arms' generators are advanced in turn on this one thread, one batched step each
    (a second Python thread would get OpenMP a second team of threads, spinning beside the first).
    """
    generators, live, variants = [], [], []
    for arm in arms:
        drafter, *variant = arm.split(":")
        generator = specdec.Generator(model, tokenizer, drafter=drafter, store=False)
        config = generator.decoding_config(max_new_tokens=max_new)
        requests = [BatchRequest(index, list(prompt), config) for index, prompt in enumerate(prompts)]
        planner = batch_planner.BatchPlanner(config.budget, generator.acceptance, generator.batch_throughputs,
                                             generator._batch_cost_model)  # fmt: skip
        generators.append(generator)
        live.append(decode_batch(generator.verifier, requests, generator.new_drafter, batch_size=batch,
                                 planner=planner))  # fmt: skip
        variants.append(tuple(variant))
    seconds = [0.0] * len(arms)
    rows: list[dict[int, list[int]]] = [{} for _ in arms]
    running = [(first + k) % len(arms) for k in range(len(arms))]
    Turn.lockstep = True
    while running:
        for turn in list(running):
            Turn.variants = variants[turn]
            started = time.perf_counter()
            for item in live[turn]:
                if item is MARK:
                    break
                rows[turn][item.index] = list(item.result.tokens)
            else:
                running.remove(turn)
            seconds[turn] += time.perf_counter() - started
    Turn.variants, Turn.lockstep = (), False
    for generator in generators:
        generator.close()
    outs = [[out[i] for i in range(len(prompts))] for out in rows]
    return [sum(len(r) for r in out) / s for out, s in zip(outs, seconds, strict=True)], outs


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--arms", default="none,sam+recycling")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    arms = args.arms.split(",")
    for arm in arms:
        if any(v not in VARIANTS for v in arm.split(":")[1:]):
            raise SystemExit(f"{arm!r}: the variants are {', '.join(VARIANTS)}")
    stats = Path(tempfile.mkdtemp(prefix="lockstep-planner-"))
    os.environ["SPECDEC_PLANNER_DIR"] = str(stats)  # read at every Generator's start
    model, tokenizer = specdec.load_model()
    prompts = [encode_prompt(tokenizer, p.text, None) for p in oneoff.heldout_prompts()[:16]]
    warm = [encode_prompt(tokenizer, text, None) for text in WARM_UP]
    batching._step = stepping(batching._step)
    patch_variants()
    saved = snapshot_shared()
    try:
        clear_shared()
        for arm in dict.fromkeys(a.split(":")[0] for a in arms):  # calibration, kernels, the warm-up matrix
            with specdec.Generator(model, tokenizer, drafter=arm, store=False) as generator:
                generator.generate_batch(warm, batch_size=args.batch_size, max_new_tokens=8)
        learned = snapshot_shared()
        ratios: list[list[float]] = [[] for _ in arms]
        print(f"B = {args.batch_size}, {len(prompts)} prompts, {args.max_new_tokens} new tokens, arms in lockstep")
        for r in range(args.rounds):
            restore_shared(learned)
            rates, outs = one_round(model, tokenizer, arms, prompts, args.batch_size, args.max_new_tokens,
                                    r % len(arms))  # fmt: skip
            same = [sum(a == b for a, b in zip(out, outs[0], strict=True)) for out in outs]
            for k in range(len(arms)):
                ratios[k].append(rates[k] / rates[0])
            print(f"round {r}: " + "  ".join(f"{arm} {rate:6.1f} tok/s ({rate / rates[0]:.3f}x, {s}/{len(prompts)} "
                                             "rows as the first arm's)" for arm, rate, s in zip(arms, rates, same,
                                                                                                  strict=True)))
        for arm, values in zip(arms[1:], ratios[1:], strict=True):
            print(f"{arm} / {arms[0]}: median {statistics.median(values):.3f} over {len(values)} rounds "
                  f"({min(values):.3f}-{max(values):.3f})")
    finally:
        restore_shared(saved)
        shutil.rmtree(stats, ignore_errors=True)


if __name__ == "__main__":
    main()
