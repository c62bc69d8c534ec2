"""Batch 8 from an empty learned state: plain batched decoding against ``sam+recycling`` with and without
the row gate (issue #32; docs/benchmarks.md, "batch 8 taken apart").

    python scripts/batch_cold_start.py [--batch-size 8] [--rounds 2]

Each arm runs in its own fresh process, with empty Token Recycling and planner folders. The process
warms up on 4 prompts at 32 new tokens, then times ``generate_batch`` over the 16 held-out prompts at
128 new tokens. The arms are ``none``, ``gated`` (``sam+recycling`` as shipped) and ``ungated``
(the same, every row drafting every step). They alternate for ``--rounds`` rounds, and each prints
one line: tokens/s, row-steps, seconds. Measured 2026-11-26 on a 2-vCPU AMD EPYC (Zen 4): ``none``
211-213 tokens/s, ``gated`` 200-208, ``ungated`` 200-202; again at 20:51 UTC, after the gate came to
count net gains: ``none`` 226.9 / 231.2, ``gated`` 216.3 / 222.9 (0.953x / 0.964x), ``ungated``
210.6 / 206.3.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ARMS = ("none", "gated", "ungated")


def child(arm: str, batch_size: int) -> None:
    """One arm, timed, in this (fresh) process; prints its line."""
    import specdec
    from specdec.bench import oneoff
    from specdec.budget import batch_planner
    from specdec.models import encode_prompt

    if arm == "ungated":
        batch_planner.RowGate.drafts = lambda self, seconds_per_token: True  # type: ignore[method-assign]
    model, tokenizer = specdec.load_model()
    prompts = [encode_prompt(tokenizer, p.text, None) for p in oneoff.heldout_prompts()[:16]]
    drafter = "none" if arm == "none" else "sam+recycling"
    with specdec.Generator(model, tokenizer, drafter=drafter, store=False) as generator:
        generator.generate_batch(prompts[:4], batch_size=4, max_new_tokens=32)
        started = time.perf_counter()
        results = generator.generate_batch(prompts, batch_size=batch_size, max_new_tokens=128)
        seconds = time.perf_counter() - started
    tokens = sum(len(r.tokens) for r in results)
    steps = sum(r.stats.steps for r in results)
    print(f"{arm} B={batch_size}: {tokens / seconds:.1f} tokens/s, row-steps {steps}, {seconds:.2f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.batch_size)
        return
    for _ in range(args.rounds):
        for arm in ARMS:
            with tempfile.TemporaryDirectory() as recycling, tempfile.TemporaryDirectory() as planner:
                env = {**os.environ, "SPECDEC_RECYCLING_DIR": recycling, "SPECDEC_PLANNER_DIR": planner}
                command = [sys.executable, __file__, "--child", arm, "--batch-size", str(args.batch_size)]
                subprocess.run(command, env=env, check=True)


if __name__ == "__main__":
    main()
