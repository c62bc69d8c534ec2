"""A fresh process's first generations, step by step: is an early step slower than its prediction, and what does the
cost model make of it?

`python early_steps.py I [I ...]`: in this process, one generation per held-out prompt index I (-1: the bench's earlier,
unmeasured prompt), 128 new tokens, with the default drafter and budget, the learned state in $SPECDEC_PLANNER_DIR and
$SPECDEC_RECYCLING_DIR. Per generation: the ratio measured / predicted verification of its first 8 steps and of the
rest, the steps by reason, the mean tree size of the steps that drafted, and the cost model's correction at 1 and 8
nodes after it.
"""

import sys
import time

import numpy as np

from specdec.api import Generator
from specdec.bench.oneoff import WARM_PROMPT, heldout_prompts
from specdec.models import encode_prompt, load_model

start = time.perf_counter()
model, tok = load_model(None)
prompts = heldout_prompts()
gen = Generator(model, tok, drafter="sam+recycling", store=False)
for i in map(int, sys.argv[1:]):
    text = WARM_PROMPT if i < 0 else prompts[i].text
    result = gen.generate(encode_prompt(tok, text, None), max_new_tokens=128)
    recs = result.stats.records
    ratio = np.array([r.verify_s / r.predicted_s for r in recs if r.predicted_s])
    drafted = [r.tree_size for r in recs if r.tree_size > 1]
    reasons: dict[str, int] = {}
    for r in recs:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    cost, _ = gen.cost_model()
    corr = cost.correction(np.array([1, 8]))
    print(
        f"gen {i}: {result.stats.steps} steps, {len(result.tokens) / result.stats.total_s:.1f} tok/s, "
        f"measured/predicted first 8 steps {ratio[:8].mean():.3f} (max {ratio[:8].max():.2f}), "
        f"rest {ratio[8:].mean():.3f}; drafted {len(drafted)} steps at {np.mean(drafted):.2f} nodes; "
        f"{dict(sorted(reasons.items()))}; correction at 1 and 8 nodes {corr[0]:.3f} {corr[1]:.3f}"
    )
print(f"process: {time.perf_counter() - start:.1f} s")
