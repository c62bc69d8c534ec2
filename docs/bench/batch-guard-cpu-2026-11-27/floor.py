import sys
import time

import specdec
import specdec.budget.batch_planner as bp
from specdec.bench.oneoff import heldout_prompts
from specdec.models import load_model

model, tok = load_model()
prompts = [p.text for p in heldout_prompts(extra=True)]
B = int(sys.argv[1]) if len(sys.argv) > 1 else 8
gs = {
    d: specdec.Generator(model, tok, drafter=d.split(":")[0], planner_cache=False, store=False)
    for d in ["none", "sam+recycling", "sam+recycling:closed"]
}
for g in gs.values():
    g._cost_model()
orig = bp.RowGate.drafts


def run(d, g, n=128, ps=prompts[:16]):
    bp.RowGate.drafts = (lambda self, s: False) if d.endswith("closed") else orig
    t = time.perf_counter()
    res = g.generate_batch(ps, batch_size=B, max_new_tokens=n)
    sec = time.perf_counter() - t
    return sum(len(r.tokens) for r in res) / sec


for d, g in gs.items():
    run(d, g, 32, prompts[16:24])
out = {d: [] for d in gs}
for rnd in range(3):
    for d, g in gs.items():
        out[d].append(run(d, g))
    print(rnd, {d: round(v[-1], 1) for d, v in out.items()}, flush=True)
for d, v in out.items():
    print(d, "ratio to none per round", [round(a / b, 3) for a, b in zip(v, out["none"], strict=False)])
