"""What the rows of a full batch did, two runs of 16 held-out prompts in one process: `python gates.py B`."""

import collections
import sys
import time

import numpy as np

from specdec.api import Generator
from specdec.bench.oneoff import heldout_prompts
from specdec.models import encode_prompt, load_model

model, tok = load_model(None)
prompts = [encode_prompt(tok, p.text, None) for p in heldout_prompts()]
B = int(sys.argv[1])
g = Generator(model, tok, drafter="sam+recycling", store=False)
g.generate_batch(prompts[:8], batch_size=B, max_new_tokens=64)
for _ in range(2):
    t = time.perf_counter()
    rs = g.generate_batch(prompts[:16], batch_size=B, max_new_tokens=128)
    elapsed = time.perf_counter() - t
    full = [x for r in rs for x in r.stats.records if x.batch_rows == B]
    drafted = [x for x in full if x.tree_size > 1]
    reasons = dict(collections.Counter(x.reason for x in full))
    print(f"B={B} tok/s {sum(len(r.tokens) for r in rs) / elapsed:.1f}; full-batch row-steps {len(full)} {reasons}")
    print(
        f"  offered > 1: {sum(x.offered > 1 for x in full)}; verified > 1: {len(drafted)}, "
        f"mean size {np.mean([x.tree_size for x in drafted]):.2f}, "
        f"accepted {np.mean([x.accepted for x in drafted]):.2f}, "
        f"expected {np.mean([x.expected or 0 for x in drafted]):.2f}"
    )
    print(
        f"  tokens a row-step {np.mean([x.accepted + 1 for x in full]):.3f}; "
        f"a step {np.mean([x.step_s for x in full]) * 1e3:.1f} ms"
    )
