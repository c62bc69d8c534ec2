"""The child of alternate_fixed_trees.py: `fresh I` generates prompt I once; `warmed` serves prompt indices
from stdin."""

import json
import sys
import time

from specdec.api import Generator
from specdec.bench.oneoff import heldout_prompts
from specdec.models import encode_prompt, load_model

model, tok = load_model(None)
P = heldout_prompts()


def one(i):
    ids = encode_prompt(tok, P[i].text, None)
    g = Generator(model, tok, drafter="sam+recycling", budget=8, planner_cache=False, store=False)
    t = time.perf_counter()
    r = g.generate(ids, max_new_tokens=128)
    call = time.perf_counter() - t
    s = r.stats
    g.close()
    return dict(call=call, prefill=s.prefill_s, verify=s.verify_s, steps=s.steps, draft=s.draft_s)


if sys.argv[1] == "fresh":
    print(json.dumps(one(int(sys.argv[2]))))
else:
    one(11)
    print(json.dumps({"ready": 1}), flush=True)
    for line in sys.stdin:
        print(json.dumps(one(int(line))), flush=True)
