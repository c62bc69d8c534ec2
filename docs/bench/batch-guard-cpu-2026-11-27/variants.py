import random
import time

import numpy as np

import specdec
from specdec.models import load_model
from specdec.types import DraftTree

model, tok = load_model()
g = specdec.Generator(model, tok, drafter="sam+recycling", planner_cache=False, store=False)
cm, _ = g._cost_model()
v = g.verifier
B = 8
ctx = 250
rng = random.Random(0)
states, pend = [], []
for b in range(B):
    s, p, _ = v.prefill([rng.randrange(v.vocab_size) for _ in range(ctx + 20 * b)], reserve=64)
    states.append(s)
    pend.append(p)
V = v.vocab_size


def chain(b, k):
    return DraftTree.chain(pend[b], [rng.randrange(V) for _ in range(k)])


def branch(b, k):  # root with k children
    return DraftTree(tuple([pend[b]] + [rng.randrange(V) for _ in range(k)]), tuple([-1] + [0] * k))


cases = {
    "R8 topk0": (lambda: [chain(b, 0) for b in range(B)], 0),
    "R8 topk8": (lambda: [chain(b, 0) for b in range(B)], 8),
    "R10 2rows+1 chain topk0": (lambda: [chain(b, 1 if b < 2 else 0) for b in range(B)], 0),
    "R10 2rows+1 chain topk8": (lambda: [chain(b, 1 if b < 2 else 0) for b in range(B)], 8),
    "R10 1row+2 branch topk8": (lambda: [branch(b, 2) if b == 0 else chain(b, 0) for b in range(B)], 8),
    "R12 1row+4 chain topk8": (lambda: [chain(b, 4) if b == 0 else chain(b, 0) for b in range(B)], 8),
    "R12 4rows+1 chain topk8": (lambda: [chain(b, 1 if b < 4 else 0) for b in range(B)], 8),
    "R16 8rows+1 chain topk0": (lambda: [chain(b, 1) for b in range(B)], 0),
    "R16 8rows+1 chain topk8": (lambda: [chain(b, 1) for b in range(B)], 8),
    "R16 1row+8 chain topk8": (lambda: [chain(b, 8) if b == 0 else chain(b, 0) for b in range(B)], 8),
}


times = {k: [] for k in cases}
for rnd in range(12):
    for name, (mk, topk) in cases.items():
        trees = mk()
        t = time.perf_counter()
        v.verify_batch(states, trees, topk)
        el = time.perf_counter() - t
        for b, s in enumerate(states):
            v.rewind(s, ctx + 20 * b)
        if rnd:
            times[name].append(el)
for name, t in times.items():
    print(f"{name:28s} min {1000 * min(t):.1f} p25 {1000 * np.percentile(t, 25):.1f} med {1000 * np.median(t):.1f}")
