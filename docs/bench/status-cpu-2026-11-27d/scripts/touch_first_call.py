import sys
import time

import torch

import specdec
from specdec.bench.oneoff import heldout_prompts
from specdec.models import encode_prompt, load_model

model, tok = load_model(None)
ids = encode_prompt(tok, heldout_prompts()[3].text, None)
out = []
for i in range(2):
    t = time.perf_counter()
    touch = 0.0
    if sys.argv[1] == "on" and i == 0:
        with torch.no_grad():
            for q in [*model.parameters(), *model.buffers()]:
                b = torch.empty(0, dtype=torch.uint8).set_(q.untyped_storage())
                b[::4096].sum()
        touch = time.perf_counter() - t
    r = specdec.run(model, ids, "sam+recycling", tokenizer=tok, max_new_tokens=16)
    s = time.perf_counter() - t
    out.append(
        (
            round(s * 1e3),
            round(touch * 1e3),
            round((s - touch - r.stats.total_s) * 1e3),
            round(r.stats.prefill_s * 1e3),
            round(r.stats.verify_s * 1e3),
        )
    )
print(sys.argv[1], "total/touch/outside/prefill/verify", out, flush=True)
