import json
import sys

import numpy as np

with open(sys.argv[1]) as handle:
    rows = [json.loads(line) for line in handle]
from collections import Counter

pids = Counter(r["pid"] for r in rows)
warm = next(p for p, c in pids.items() if c > 1)
W = [r for r in rows if r["pid"] == warm]
F = [r for r in rows if r["pid"] != warm]
print(len(W), len(F))


def s(r):
    rec = r["records"]
    n = np.mean([x[0] for x in rec])
    tp = r["before"]["tp"]
    rate = tp["tokens"] / tp["seconds"] if tp["seconds"] else 0
    c = r["before"]["cost"] or r["before"]["saved_cost"]
    v = np.array([x[5] for x in rec])
    p = np.array([x[6] if x[6] else np.nan for x in rec])
    reasons = Counter(x[2] for x in rec)
    return f"len {r['prompt_len']:4d} steps {len(rec):3d} nodes {n:5.2f} rate0 {rate:6.1f} ovh {tp['overhead_s'] * 1e3:4.2f} g0 {c['global_ratio'] if c else 0:4.2f} m/p {np.nanmean(v / p):4.2f} first3 {np.round((v / p)[:3], 2)} {dict(reasons)}"  # noqa: E501


for f, w in zip(F, W, strict=False):
    print("F", s(f))
    print("W", s(w))
