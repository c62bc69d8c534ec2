"""usage: trace4.py fresh|warmed|reload STATEDIR IDXS OUT  (idx -1 = WARM_PROMPT)"""

import json
import os
import sys
import time

mode, state, idxs, out = sys.argv[1:5]
os.environ["SPECDEC_PLANNER_DIR"] = state + "/planner"
os.environ["SPECDEC_RECYCLING_DIR"] = state + "/recycling"
from specdec.api import Generator  # noqa: E402
from specdec.bench.oneoff import WARM_PROMPT, heldout_prompts  # noqa: E402
from specdec.models import encode_prompt, load_model  # noqa: E402

model, tok = load_model(None)
prompts = heldout_prompts()
g = None
rows = []
for i in json.loads(idxs):
    if g is None or mode == "reload":
        g = Generator(model, tok, drafter="sam+recycling", store=False)
    ids = encode_prompt(tok, WARM_PROMPT if i < 0 else prompts[i].text, None)
    t = time.perf_counter()
    r = g.generate(ids, max_new_tokens=128)
    s = time.perf_counter() - t
    rows.append(
        {
            "mode": mode,
            "idx": i,
            "steps": r.stats.steps,
            "nodes": r.stats.mean_tree_size,
            "seconds": s,
            "tokens": len(r.tokens),
            "verify_s": r.stats.verify_s,
        }
    )
with open(out, "a") as f:
    for d in rows:
        f.write(json.dumps(d) + "\n")
