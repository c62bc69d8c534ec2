"""#33: model.generate plain vs model.generate(custom_generate=specdec.hf_generate("sam+recycling")) vs specdec.run,
interleaved per held-out prompt, 128 new tokens, default model fp32. Prints tokens/s, ratios, identity.

Usage: .venv/bin/python scripts/hf_generate_overhead.py
"""

import time
from collections.abc import Callable
from typing import Any

import torch

import specdec
from specdec.bench.oneoff import WARM_PROMPT, heldout_prompts
from specdec.drafters import recycling_state
from specdec.models import encode_prompt, load_model

N = 128
model, tok = load_model()
hook = specdec.hf_generate(drafter="sam+recycling", tokenizer=tok)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def generate(ids: torch.Tensor, **options: Any) -> torch.Tensor:
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, do_sample=False, **options)


warm = torch.tensor([encode_prompt(tok, WARM_PROMPT, None)])
model.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=8, do_sample=False)
model.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=8, do_sample=False, custom_generate=hook)
specdec.run(model, warm[0].tolist(), "sam+recycling", tokenizer=tok, max_new_tokens=8)
rows = []
for p in heldout_prompts()[:8]:
    ids = torch.tensor([encode_prompt(tok, p.text, None)])
    learned = recycling_state.snapshot_shared()  # both specdec arms start from the same Token Recycling matrix
    plain, tp = timed(lambda ids=ids: generate(ids))
    recycling_state.restore_shared(learned)
    ours, th = timed(lambda ids=ids: generate(ids, custom_generate=hook))
    recycling_state.restore_shared(learned)
    run, tr = timed(lambda ids=ids: specdec.run(model, ids[0].tolist(), "sam+recycling", tokenizer=tok,
                                                max_new_tokens=N))  # fmt: skip
    n_plain, n_ours = plain.shape[1] - ids.shape[1], ours.shape[1] - ids.shape[1]
    same = torch.equal(plain, ours)
    run_same = run.tokens == ours[0, ids.shape[1] :].tolist()
    rows.append((p.kind, n_plain / tp, n_ours / th, len(run.tokens) / tr, same, run_same))
    print(f"{p.kind:10s} generate {n_plain / tp:6.1f} tok/s  custom_generate {n_ours / th:6.1f}  "
          f"run {len(run.tokens) / tr:6.1f}  identical to generate: {same}; run == custom_generate: {run_same}",
          flush=True)  # fmt: skip
g = sum(r[1] for r in rows) / len(rows)
h = sum(r[2] for r in rows) / len(rows)
r_ = sum(r[3] for r in rows) / len(rows)
print(f"\nmean tokens/s: generate {g:.1f}, custom_generate {h:.1f} ({h / g:.2f}x), specdec.run {r_:.1f} "
      f"(custom_generate / run {h / r_:.3f}); identical {sum(r[4] for r in rows)}/{len(rows)}")
