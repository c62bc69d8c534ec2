"""One process: four Generator builds of the default model in turn (ms): the first pays first-time work, the rest what
every `run` pays.

Run it in fresh processes with PYTHONPATH set to each checkout to compare two versions (docs/benchmarks.md).
"""

import time

from specdec.api import Generator
from specdec.models import load_model

model, tok = load_model(None)
r = []
for _i in range(4):
    t = time.perf_counter()
    g = Generator(model, tok, drafter="sam+recycling")
    r.append((time.perf_counter() - t) * 1e3)
    g.close()
print(" ".join(f"{x:.1f}" for x in r))
