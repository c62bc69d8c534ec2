"""`budget="auto"` against `budget=8` in one process, two Generators taking turns prompt by prompt (8 held-out
prompts, twice): tokens/s, and per step reason the tree size, verification ms and accepted tokens.

`python budget_reasons.py on|off [SHRINK]`: the learned state (planner statistics, Token Recycling's matrix) on, in the
folders $SPECDEC_PLANNER_DIR and $SPECDEC_RECYCLING_DIR (set them to new empty ones), or off. SHRINK sets the cost
model's SHRINK_STEPS for the process (a trial, not landed; raw/budget_shrink.txt). The next two lines (the auto steps'
tree sizes, the cost model's per-size corrections) were added after the runs of raw/budget_reasons.txt, the last ones
(expected against accepted draft tokens, trees up to 8 nodes and larger) after those of raw/budget_shrink.txt.
"""

import collections
import sys

import numpy as np

from specdec.api import Generator
from specdec.bench.oneoff import heldout_prompts
from specdec.models import encode_prompt, load_model

cm = sys.modules["specdec.budget.cost_model"]  # the package re-exports a function of that name
model, tok = load_model(None)
P = heldout_prompts()
CACHE = sys.argv[1] == "on"
if len(sys.argv) > 2:
    cm.SHRINK_STEPS = float(sys.argv[2])
print("SHRINK_STEPS", cm.SHRINK_STEPS)
gens = {
    b: Generator(model, tok, drafter="sam+recycling", store=False, budget=b, planner_cache=CACHE) for b in ("auto", 8)
}
for g in gens.values():
    g.generate(encode_prompt(tok, P[11].text, None), max_new_tokens=64)
agg = {b: collections.defaultdict(list) for b in gens}
tot = {b: [0.0, 0, 0] for b in gens}
for rep in range(2):
    for i in range(8):
        for b, g in gens.items() if (i + rep) % 2 == 0 else reversed(list(gens.items())):
            r = g.generate(encode_prompt(tok, P[i].text, None), max_new_tokens=128)
            for s in r.stats.records:
                agg[b][s.reason].append((s.tree_size, s.verify_s, s.accepted, s.expected or 0.0))
            tot[b][0] += r.stats.total_s
            tot[b][1] += len(r.tokens)
            tot[b][2] += r.stats.steps
for b in gens:
    print(
        f"budget {b}: steps {tot[b][2]}, total {tot[b][0]:.2f} s, tokens {tot[b][1]}, "
        f"tokens/s {tot[b][1] / tot[b][0]:.1f}"
    )
    for k, v in agg[b].items():
        a = np.array(v)
        print(
            f"  {k:9s} n={len(v):4d} size {a[:, 0].mean():5.2f} verify {a[:, 1].mean() * 1e3:5.2f} ms "
            f"accepted {a[:, 2].mean():.2f}"
        )

sizes = collections.Counter(v[0] for v in agg["auto"]["auto"])
print("auto step sizes", sorted(sizes.items()))
m, _ = gens["auto"].cost_model()
print(
    "corrections",
    [round(float(x), 3) for x in m.correction(np.array(m.table.sizes))],
    "counts",
    [round(float(c), 1) for c in m._count],
)
for b, reason in (("auto", "auto"), (8, "fixed")):  # expected against accepted draft tokens, by tree size
    a = np.array(agg[b][reason])
    for name, rows in (("<= 8 nodes", a[a[:, 0] <= 8]), ("> 8 nodes", a[a[:, 0] > 8])):
        if len(rows):
            print(
                f"budget {b} {name}: n={len(rows)} size {rows[:, 0].mean():.2f} "
                f"verify {rows[:, 1].mean() * 1e3:.2f} ms expected {rows[:, 3].mean():.2f} "
                f"accepted {rows[:, 2].mean():.2f}"
            )
