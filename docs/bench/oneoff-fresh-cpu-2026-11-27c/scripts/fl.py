import json
import sys
import time

from specdec.api import Generator
from specdec.bench.oneoff import heldout_prompts
from specdec.models import encode_prompt, load_model
from specdec.types import DraftTree

model, tok = load_model(None)
g = Generator(model, tok, drafter="sam+recycling", store=False)
g.cost_model()
v = g.verifier


def measure(idx, n=60, size=6):
    ids = encode_prompt(tok, heldout_prompts()[idx].text, None)
    state, pending, _ = v.prefill(ids, reserve=600)
    ts = []
    for _i in range(n):
        tree = DraftTree.chain(pending, [1000 + j for j in range(size - 1)], source="x")
        t = time.perf_counter()
        res = v.verify(state, tree, topk=8)
        ts.append(time.perf_counter() - t)
        pending = res.bonus
    v.release(state)
    return sum(ts) / n * 1e3


if sys.argv[1] == "fresh":
    print(json.dumps(measure(int(sys.argv[2]))))
else:
    for _ in range(3):
        measure(0)
    print("ready", flush=True)
    for line in sys.stdin:
        print(json.dumps(measure(int(line))), flush=True)
