import time

from specdec.api import Generator
from specdec.bench.oneoff import heldout_prompts
from specdec.models import encode_prompt, load_model
from specdec.types import DraftTree

model, tok = load_model(None)


def gen():
    g = Generator(model, tok, drafter="sam+recycling", store=False)
    g.cost_model()
    return g


keep = gen()
sizes = [1, 6, 3, 9, 4, 12, 2, 8, 16, 5] * 3


def measure(v, idx):
    ids = encode_prompt(tok, heldout_prompts()[idx].text, None)
    state, pending, _ = v.prefill(ids, reserve=600)
    ts = []
    for n in sizes:
        tree = DraftTree.chain(pending, [1000 + j for j in range(n - 1)], source="x")
        t = time.perf_counter()
        res = v.verify(state, tree, topk=8)
        ts.append(time.perf_counter() - t)
        pending = res.bonus
    v.release(state)
    return ts


K, N = [], []
for r in range(8):
    K.append(measure(keep.verifier, r % 8))
    g = gen()
    N.append(measure(g.verifier, r % 8))
    g.close()
import numpy as np  # noqa: E402

K = np.array(K[1:]) * 1e3
N = np.array(N[1:]) * 1e3
print("first 10 steps kept ", np.round(K[:, :10].mean(0), 1))
print("first 10 steps new  ", np.round(N[:, :10].mean(0), 1))
print(f"steps 10-30 kept {K[:, 10:].mean():.2f} new {N[:, 10:].mean():.2f}")
