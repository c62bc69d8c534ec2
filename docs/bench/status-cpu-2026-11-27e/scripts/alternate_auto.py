"""As alternate_fixed_trees.py with the default budget and the learned state: two chains from one seed state, as `bench
oneoff --fresh` runs them, without the build and without Hugging Face's arm.

`python alternate_auto.py PAIRS` from the checkout's root.
"""

import os
import shutil
import sys
import tempfile

import numpy as np
from alternation import ask, fresh, start_warmed

CHILD = "alternate_auto_child.py"
seed = tempfile.mkdtemp()
os.makedirs(seed + "/r")
os.makedirs(seed + "/p")
env0 = dict(os.environ, SPECDEC_RECYCLING_DIR=seed + "/r", SPECDEC_PLANNER_DIR=seed + "/p")
fresh(CHILD, 11, env0)
dirs = {}
for arm in "wf":
    d = tempfile.mkdtemp()
    shutil.copytree(seed, d, dirs_exist_ok=True)
    dirs[arm] = dict(os.environ, SPECDEC_RECYCLING_DIR=d + "/r", SPECDEC_PLANNER_DIR=d + "/p")
w = start_warmed(CHILD, dirs["w"])
F, W = [], []
for rep in range(int(sys.argv[1])):
    i = rep % 10
    f = fresh(CHILD, i, dirs["f"])
    ww = ask(w, i)
    F.append(f)
    W.append(ww)
    print(
        i,
        f"steps {f['steps']}/{ww['steps']} nodes {f['nodes']:.2f}/{ww['nodes']:.2f} "
        f"per-step {f['verify'] / f['steps'] * 1e3:.2f}/{ww['verify'] / ww['steps'] * 1e3:.2f} "
        f"call {f['call'] * 1e3:.0f}/{ww['call'] * 1e3:.0f}",
        flush=True,
    )
    print("   corr fresh ", f["before"])
    print("   corr warmed", ww["before"])
print("sizes", F[0]["sizes"])


def s(L, k):
    return sum(x[k] for x in L)


print(
    f"steps {s(F, 'steps') / s(W, 'steps'):.3f} verify {s(F, 'verify') / s(W, 'verify'):.3f} "
    f"call {s(F, 'call') / s(W, 'call'):.3f} "
    f"nodes {np.mean([x['nodes'] for x in F]):.2f}/{np.mean([x['nodes'] for x in W]):.2f}"
)
