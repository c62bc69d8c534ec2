import os
import shutil
import sys
import tempfile
import time

src = "/tmp/exp/fw/r1/sF"
work = tempfile.mkdtemp()
shutil.copytree(src, work + "/s")
os.environ["SPECDEC_PLANNER_DIR"] = work + "/s/planner"
os.environ["SPECDEC_RECYCLING_DIR"] = work + "/s/recycling"
import torch  # noqa: E402

import specdec  # noqa: E402
from specdec.bench.oneoff import heldout_prompts  # noqa: E402
from specdec.models import encode_prompt, load_model  # noqa: E402

t = time.perf_counter()
model, tok = load_model(None)
load = time.perf_counter() - t
touch = 0.0
if sys.argv[1] == "off":
    import specdec.api

    specdec.api.page_in = lambda m: 0
if False:
    t = time.perf_counter()
    with torch.no_grad():
        for q in model.parameters():
            q.sum()
    touch = time.perf_counter() - t
ids = encode_prompt(tok, heldout_prompts()[3].text, None)
out = []
for _i in range(2):
    t = time.perf_counter()
    r = specdec.run(model, ids, "sam+recycling", tokenizer=tok, max_new_tokens=16)
    s = time.perf_counter() - t
    out.append(
        (
            round(s * 1e3),
            round((s - r.stats.total_s) * 1e3),
            round(r.stats.prefill_s * 1e3),
            round(r.stats.verify_s * 1e3),
        )
    )
print(sys.argv[1], f"load {load * 1e3:.0f} touch {touch * 1e3:.0f}", "run/outside/prefill/verify", out)
shutil.rmtree(work)
