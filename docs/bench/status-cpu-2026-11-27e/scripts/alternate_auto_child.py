"""The child of alternate_auto.py: `fresh I` one Generator for prompt I; `warmed` one Generator for every prompt from
stdin."""

import json
import sys
import time

from specdec.api import Generator
from specdec.bench.oneoff import heldout_prompts
from specdec.models import encode_prompt, load_model

model, tok = load_model(None)
P = heldout_prompts()
G = None


def one(i, keep):
    global G
    ids = encode_prompt(tok, P[i].text, None)
    g = G if (keep and G is not None) else Generator(model, tok, drafter="sam+recycling", store=False)
    if keep:
        G = g
    m, _ = g.cost_model()
    before = [round(float(x), 3) for x in m.correction(__import__("numpy").array(m.table.sizes))]
    t = time.perf_counter()
    r = g.generate(ids, max_new_tokens=128)
    call = time.perf_counter() - t
    s = r.stats
    [st.tree_size for st in s.records] if hasattr(s, "records") else []
    if not keep:
        g.close()
    return dict(
        call=call,
        prefill=s.prefill_s,
        verify=s.verify_s,
        steps=s.steps,
        nodes=s.mean_tree_size,
        before=before,
        sizes=list(m.table.sizes),
    )


if sys.argv[1] == "fresh":
    print(json.dumps(one(int(sys.argv[2]), False)))
else:
    one(11, True)
    print(json.dumps({"ready": 1}), flush=True)
    for line in sys.stdin:
        print(json.dumps(one(int(line), True)), flush=True)
