"""Cold vs warmed process from one saved state S. usage: trace2.py cold|warm SDIR IDXS OUT"""

import json
import os
import shutil
import sys
import tempfile
import time

mode, src, idxs, out = sys.argv[1:5]
work = tempfile.mkdtemp()
shutil.copytree(src, work + "/s")
os.environ["SPECDEC_PLANNER_DIR"] = work + "/s/planner"
os.environ["SPECDEC_RECYCLING_DIR"] = work + "/s/recycling"
from specdec.api import Generator  # noqa: E402
from specdec.bench.oneoff import heldout_prompts  # noqa: E402
from specdec.models import encode_prompt, load_model  # noqa: E402

model, tok = load_model(None)
prompts = heldout_prompts()
if mode == "warm":  # forwards of every size, nothing learned kept
    g0 = Generator(model, tok, drafter="sam+recycling", planner_cache=False, store=False)
    for t in ["Write a haiku about rivers.", "List three prime numbers and explain why."]:
        g0.generate(encode_prompt(tok, t, None), max_new_tokens=96)
    cm = g0._cost
g = Generator(model, tok, drafter="sam+recycling", store=False)
saved = g.planner_stats.cost
if mode == "warm":
    cm.load_state(saved)
    cm.drift_steps = 32
rows = []
for n, i in enumerate(json.loads(idxs)):
    ids = encode_prompt(tok, prompts[i].text, None)
    t = time.perf_counter()
    r = g.generate(ids, max_new_tokens=128)
    s = time.perf_counter() - t
    recs = [
        [x.tree_size, x.offered, x.reason, x.accepted, x.verify_s, x.predicted_s, x.step_s] for x in r.stats.records
    ]
    rows.append(
        {
            "mode": mode,
            "idx": i,
            "n": n,
            "seconds": s,
            "tokens": len(r.tokens),
            "records": recs,
            "after_cost": g._cost.state(),
            "after_tp": g.throughput.state(),
        }
    )
with open(out, "a") as f:
    for d in rows:
        f.write(json.dumps(d) + "\n")
shutil.rmtree(work)
