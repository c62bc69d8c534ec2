"""A tried and rejected idea: the weights fingerprint in a background thread while the Generator is built.

`python background_fingerprint.py plain|bg|bgtouch`.
"""

import sys
import threading
import time

import torch

import specdec.api as api
import specdec.backends.identity as ident
from specdec.bench.oneoff import heldout_prompts
from specdec.models import encode_prompt, load_model

model, tok = load_model(None)
ids = encode_prompt(tok, heldout_prompts()[0].text, None)
mode = sys.argv[1]
t0 = time.perf_counter()
if mode in ("bg", "bgtouch"):
    box = {}

    def work():
        box["fp"] = ident._weights_fingerprint(model)
        if mode == "bgtouch":
            with torch.no_grad():
                for p in model.state_dict().values():
                    if p.numel() > 1024:
                        p.detach().reshape(-1)[::1024].sum()

    th = threading.Thread(target=work, daemon=True)
    th.start()
    orig = ident._weights_fingerprint

    def waited(m):
        th.join()
        return box["fp"]

    ident._weights_fingerprint = waited
g = api.Generator(model, tok, drafter="sam+recycling")
t1 = time.perf_counter()
r = g.generate(ids, max_new_tokens=128)
t2 = time.perf_counter()
s = r.stats
print(
    f"{mode:8s} build {(t1 - t0) * 1e3:5.1f} prefill {s.prefill_s * 1e3:5.1f} "
    f"steps {s.steps} per-step {s.verify_s / s.steps * 1e3:5.2f} call {(t2 - t0) * 1e3:6.1f}"
)
