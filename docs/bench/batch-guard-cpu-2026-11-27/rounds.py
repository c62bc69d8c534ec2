import sys
import time

import numpy as np

import specdec
import specdec.budget.batch_planner as bp
from specdec.bench.oneoff import heldout_prompts
from specdec.models import load_model

model, tok = load_model()
prompts = [p.text for p in heldout_prompts(extra=True)]
B = int(sys.argv[1])
rounds = int(sys.argv[2])
mode = sys.argv[3]
if mode == "noguard":
    bp.BatchGuard.drafts = lambda self: True
gs = {d: specdec.Generator(model, tok, drafter=d, planner_cache=False, store=False) for d in ["none", "sam+recycling"]}
for g in gs.values():
    g._cost_model()
    g.generate_batch(prompts[16:24], batch_size=B, max_new_tokens=32)


def stats(res):
    steps = {}
    for r in res:
        for rec in r.stats.records:
            if rec.batch_rows == B:
                steps.setdefault((rec.step_s, rec.verify_s), []).append(rec)
    n = len(steps)
    st = sum(k[0] for k in steps)
    vt = sum(k[1] for k in steps)
    R = np.mean([sum(r.tree_size for r in s) for s in steps.values()])
    tps = np.mean([sum(r.accepted + 1 for r in s) for s in steps.values()])
    plainv = np.median([k[1] for k, s in steps.items() if all(r.tree_size == 1 for r in s)])
    tail = {}
    for r in res:
        for rec in r.stats.records:
            if rec.batch_rows < B:
                tail.setdefault((rec.step_s, rec.verify_s), []).append(rec)
    tn = len(tail)
    ts = sum(k[0] for k in tail)
    tt = sum(sum(r.accepted + 1 for r in s) for s in tail.values())
    pre = sum(r.stats.prefill_s for r in res)
    rows = np.mean([len(s) for s in tail.values()]) if tail else 0
    return (
        f"prefill {pre:.2f}s tail: steps {tn} {ts:.2f}s {tt} tok ({tt / max(ts, 1e-9):.0f} tok/s) rows {rows:.2f} | "
        f"full: steps {n} R {R:.2f} tok/step {tps:.2f} verify {1000 * vt / n:.1f} "
        f"plain-verify-med {1000 * plainv:.1f} other {1000 * (st - vt) / n:.2f}"
    )


for rnd in range(rounds):
    line = []
    out = {}
    for d, g in gs.items():
        t = time.perf_counter()
        res = g.generate_batch(prompts[:16], batch_size=B, max_new_tokens=128)
        sec = time.perf_counter() - t
        out[d] = sum(len(r.tokens) for r in res) / sec
        line.append(f"  {d}: {out[d]:.1f} tok/s {stats(res)}")
    print(f"round {rnd} ratio {out['sam+recycling'] / out['none']:.3f}", *line, sep="\n", flush=True)
    gd = gs["sam+recycling"].batch_guards.get(B)
    if gd:
        dr, pl = gd.drafting, gd.plain
        print(f"  guard drafting {dr.rate:.1f} x{dr.steps}, plain {pl.rate:.1f} x{pl.steps}")
    c = gs["sam+recycling"]._batch_cost
    print(
        "  batch cost pred R=4,6,8,12,16 @300:",
        [round(1000 * x, 1) for x in c.predict(np.array([4, 6, 8, 12, 16]), 300)],
        flush=True,
    )
