import sys
import time

import numpy as np

import specdec
import specdec.budget.batch_planner as bp
from specdec.bench.oneoff import heldout_prompts
from specdec.models import load_model

model, tok = load_model()
prompts = [p.text for p in heldout_prompts(extra=True)]
Bs = [int(x) for x in sys.argv[1].split(",")]
rounds = int(sys.argv[2])
NP = int(sys.argv[3]) if len(sys.argv) > 3 else 16
arms = ["none", "sam+recycling:guard", "sam+recycling:noguard"]
gs = {d: specdec.Generator(model, tok, drafter=d.split(":")[0], planner_cache=False, store=False) for d in arms}
for g in gs.values():
    g._cost_model()
orig = bp.BatchGuard.drafts


def run(d, g, B, n=128, ps=None):
    ps = prompts[:NP] if ps is None else ps
    bp.BatchGuard.drafts = (lambda self: True) if d.endswith("noguard") else orig
    t = time.perf_counter()
    res = g.generate_batch(ps, batch_size=B, max_new_tokens=n)
    sec = time.perf_counter() - t
    return sum(len(r.tokens) for r in res) / sec, res


for B in Bs:
    for d, g in gs.items():
        run(d, g, B, 32, prompts[56:64])
    out = {d: [] for d in gs}
    for rnd in range(rounds):
        for d, g in gs.items() if rnd % 2 == 0 else reversed(gs.items()):
            out[d].append(run(d, g, B)[0])
        print(B, rnd, {d: round(v[-1], 1) for d, v in out.items()}, flush=True)
    for d, v in out.items():
        r = [a / b for a, b in zip(v, out["none"], strict=False)]
        print(
            f"B={B} {d:24s} ratio to none per round",
            [round(x, 3) for x in r],
            "median",
            round(float(np.median(r)), 3),
            "mean",
            round(float(np.mean(r)), 3),
            flush=True,
        )
    gd = gs["sam+recycling:guard"].batch_guards.get(B)
    if gd:
        d, p = gd.drafting, gd.plain
        print(f"guard {B} drafting {d.rate:.1f} x{d.steps} plain {p.rate:.1f} x{p.steps}")
