import pickle
import sys

import numpy as np

import specdec
from specdec.bench.oneoff import heldout_prompts
from specdec.models import load_model

model, tok = load_model()
prompts = [p.text for p in heldout_prompts(extra=True)]
B = int(sys.argv[1]) if len(sys.argv) > 1 else 8
g = specdec.Generator(model, tok, drafter="sam+recycling", planner_cache=False, store=False)
g._cost_model()
g.generate_batch(prompts[16:24], batch_size=B, max_new_tokens=32)
allsteps = []
for _rnd in range(2):
    res = g.generate_batch(prompts[:16], batch_size=B, max_new_tokens=128)
    steps = {}
    for r in res:
        for rec in r.stats.records:
            if rec.batch_rows == B:
                steps.setdefault((rec.step_s, rec.verify_s), []).append(rec)
    for (st, vt), recs in steps.items():
        allsteps.append(
            dict(
                R=sum(r.tree_size for r in recs),
                vt=vt,
                st=st,
                pred=recs[0].predicted_s,
                exp=sum(r.expected or 0 for r in recs),
                acc=sum(r.accepted for r in recs),
                probe=any(r.reason == "probe" for r in recs),
                drafting=sum(r.offered > 1 for r in recs),
            )
        )
with open(f"steps{B}.pkl", "wb") as handle:
    pickle.dump(allsteps, handle)
cm = g._batch_cost
print("batch cost model pred 8..32 @ctx300:", [round(1000 * x, 1) for x in cm.predict(np.arange(8, 33, 2), 300)])
plain = np.median([s["vt"] for s in allsteps if s["R"] == B])
print("plain med", plain)
for name, sel in [
    ("plain", lambda s: s["R"] == B),
    ("auto", lambda s: s["R"] > B and not s["probe"]),
    ("probe", lambda s: s["probe"]),
]:
    ss = [s for s in allsteps if sel(s)]
    if not ss:
        continue
    extra_s = sum(s["vt"] - plain for s in ss)
    acc = sum(s["acc"] for s in ss)
    exp = sum(s["exp"] for s in ss)
    xr = sum(s["R"] - B for s in ss)
    print(
        f"{name:6s} steps {len(ss)} extra rows {xr} accepted {acc} expected {exp:.1f} "
        f"extra verify s {extra_s:.2f} -> tokens worth {extra_s / (plain / B):.0f}; "
        f"pred extra {sum((s['pred'] or 0) for s in ss) - len(ss) * plain:.2f}"
    )
