"""Fresh processes and one long-lived process in turn, with identical trees (budget=8, no learned state): does a fresh
process verify slower?

`python alternate_fixed_trees.py PAIRS` from the checkout's root.
"""

import sys

import numpy as np
from alternation import ask, fresh, start_warmed

CHILD = "alternate_child.py"
w = start_warmed(CHILD)
fresh(CHILD, 11)
F, W = [], []
for rep in range(int(sys.argv[1])):
    i = rep % 8
    f = fresh(CHILD, i)
    ww = ask(w, i)
    assert f["steps"] == ww["steps"], (f, ww)
    F.append(f)
    W.append(ww)
    print(
        i,
        f"steps {f['steps']} per-step fresh {f['verify'] / f['steps'] * 1e3:.2f} "
        f"warmed {ww['verify'] / ww['steps'] * 1e3:.2f} prefill {f['prefill'] * 1e3:.0f}/{ww['prefill'] * 1e3:.0f} "
        f"call {f['call'] * 1e3:.0f}/{ww['call'] * 1e3:.0f}",
        flush=True,
    )
r = np.array([f["verify"] / ww["verify"] for f, ww in zip(F, W, strict=False)])
c = np.array([f["call"] / ww["call"] for f, ww in zip(F, W, strict=False)])
print(
    f"verify fresh/warmed: mean {r.mean():.3f} median {np.median(r):.3f}; call "
    f"{c.mean():.3f}; sum verify {sum(f['verify'] for f in F) / sum(x['verify'] for x in W):.3f}"
)
