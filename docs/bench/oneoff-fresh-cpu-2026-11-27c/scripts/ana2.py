import json
import sys

import numpy as np

with open(sys.argv[1]) as handle:
    rows = [json.loads(line) for line in handle]
agg = {}
for r in rows:
    rec = r["records"]
    n = np.mean([x[0] for x in rec])
    mat = sum(x[3] + 1 for x in rec) / len(rec)
    v = np.array([x[4] for x in rec])
    p = np.array([x[5] if x[5] is not None else np.nan for x in rec])
    big = [x for x in rec if x[0] > 1]
    print(
        r["idx"],
        r["mode"][:4],
        f"steps {len(rec):3d} nodes {n:5.2f} mat {mat:4.2f} tok/s {r['tokens'] / r['seconds']:5.1f} "
        f"meas/pred {np.nanmean(v / p):4.2f} first5 {np.nanmean((v / p)[:5]):4.2f} v1st {v[0] * 1e3:5.1f} vmed {np.median(v) * 1e3:5.1f} g {r['after_cost']['global_ratio']:.2f}",  # noqa: E501
    )
    a = agg.setdefault(r["mode"], [])
    a.append((n, mat, r["tokens"] / r["seconds"], len(rec)))
for m, a in agg.items():
    a = np.array(a)
    print(m, "mean nodes {:.2f} mat {:.3f} tok/s {:.1f} steps {:.1f}".format(*tuple(a.mean(0))))
