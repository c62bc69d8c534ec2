"""Hugging Face's own forward over a prompt, five times in one fresh process: what a process's first forward costs,
whoever runs it."""

import time

import torch

from specdec.bench.oneoff import heldout_prompts
from specdec.models import encode_prompt, load_model

model, tok = load_model(None)
ids = torch.tensor([encode_prompt(tok, heldout_prompts()[0].text, None)])
r = []
with torch.no_grad():
    for _i in range(5):
        t = time.perf_counter()
        model(ids)
        r.append(round((time.perf_counter() - t) * 1e3, 1))
print(
    f"HF forward over the prompt ({ids.shape[1]} tokens), calls 1-5 ms:",
    r,
    "first-call excess",
    round(r[0] - sorted(r[1:])[1], 1),
)
