"""Verification speed with the weights memory-mapped, copied, or copied onto transparent huge pages
(THP_MEM_ALLOC_ENABLE=1).

`[THP_MEM_ALLOC_ENABLE=1] python huge_pages.py mmap|copy|thp`: four fixed-budget generations of one prompt.
"""

import sys
import time

import torch

from specdec.api import Generator
from specdec.bench.oneoff import heldout_prompts
from specdec.models import encode_prompt, load_model

mode = sys.argv[1]
t = time.perf_counter()
model, tok = load_model(None)
load_ms = (time.perf_counter() - t) * 1e3
copy_ms = 0.0
if mode != "mmap":
    t = time.perf_counter()
    with torch.no_grad():
        done = {}
        for p in model.parameters():
            ptr = p.data_ptr()
            if ptr not in done:
                done[ptr] = p.data.clone()
            p.data = done[ptr]
        for _name, _b in list(model.named_buffers()):
            pass
    copy_ms = (time.perf_counter() - t) * 1e3
ids = encode_prompt(tok, heldout_prompts()[1].text, None)
rows = []
for _i in range(4):
    g = Generator(model, tok, drafter="sam+recycling", budget=8, planner_cache=False, store=False)
    t = time.perf_counter()
    r = g.generate(ids, max_new_tokens=128)
    call = (time.perf_counter() - t) * 1e3
    s = r.stats
    g.close()
    rows.append((call, s.prefill_s * 1e3, s.verify_s / s.steps * 1e3, s.steps))

with open("/proc/self/smaps_rollup") as handle:
    anon = [line for line in handle if line.startswith(("AnonHugePages", "FilePmdMapped", "Rss"))]
print(
    f"{mode:6s} load {load_ms:.0f} copy {copy_ms:.0f} | "
    + " | ".join(f"call {c:.0f} pre {p:.0f} step {v:.2f} n{s}" for c, p, v, s in rows)
    + " | "
    + " ".join(x.split()[0] + x.split()[1] for x in anon)
)
