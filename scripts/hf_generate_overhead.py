"""#33: model.generate plain vs model.generate(custom_generate=specdec.hf_generate("sam+recycling")) vs specdec.run,
interleaved per held-out prompt, 128 new tokens, default model fp32. Prints tokens/s, ratios, identity."""
import time
import torch
import specdec
from specdec.models import load_model, encode_prompt
from specdec.bench.oneoff import heldout_prompts, WARM_PROMPT
from specdec.drafters import recycling_state

N = 128
model, tok = load_model()
hook = specdec.hf_generate(drafter="sam+recycling", tokenizer=tok)


def timed(fn):
    t = time.perf_counter(); out = fn(); return out, time.perf_counter() - t


warm = torch.tensor([encode_prompt(tok, WARM_PROMPT, None)])
model.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=8, do_sample=False)
model.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=8, do_sample=False, custom_generate=hook)
specdec.run(model, warm[0].tolist(), "sam+recycling", tokenizer=tok, max_new_tokens=8)
rows = []
for p in heldout_prompts()[:8]:
    ids = torch.tensor([encode_prompt(tok, p.text, None)])
    mask = torch.ones_like(ids)
    learned = recycling_state.snapshot_shared()  # both specdec arms start from the same Token Recycling matrix
    plain, tp = timed(lambda: model.generate(ids, attention_mask=mask, max_new_tokens=N, do_sample=False))
    recycling_state.restore_shared(learned)
    ours, th = timed(lambda: model.generate(ids, attention_mask=mask, max_new_tokens=N, do_sample=False, custom_generate=hook))
    recycling_state.restore_shared(learned)
    run, tr = timed(lambda: specdec.run(model, ids[0].tolist(), "sam+recycling", tokenizer=tok, max_new_tokens=N))
    n_plain = plain.shape[1] - ids.shape[1]; n_ours = ours.shape[1] - ids.shape[1]
    same = torch.equal(plain, ours)
    rows.append((p.kind, n_plain / tp, n_ours / th, len(run.tokens) / tr, same, run.tokens == ours[0, ids.shape[1]:].tolist()))
    print(f"{p.kind:10s} generate {n_plain / tp:6.1f} tok/s  custom_generate {n_ours / th:6.1f}  run {len(run.tokens) / tr:6.1f}  "
          f"identical to generate: {same}; run == custom_generate: {rows[-1][-1]}", flush=True)
g = sum(r[1] for r in rows) / len(rows); h = sum(r[2] for r in rows) / len(rows); r_ = sum(r[3] for r in rows) / len(rows)
print(f"\nmean tokens/s: generate {g:.1f}, custom_generate {h:.1f} ({h / g:.2f}x), specdec.run {r_:.1f} "
      f"(custom_generate / run {h / r_:.3f}); identical {sum(r[4] for r in rows)}/{len(rows)}")
