import glob
import os
import sys
import tempfile

d = tempfile.mkdtemp()
os.environ["SPECDEC_PLANNER_DIR"] = d + "/p"
os.environ["SPECDEC_RECYCLING_DIR"] = d + "/r"
import numpy as np  # noqa: E402

import specdec  # noqa: E402
from specdec.api import Generator  # noqa: E402
from specdec.bench.oneoff import WARM_PROMPT  # noqa: E402
from specdec.drafters.recycling_state import _SHARED  # noqa: E402
from specdec.models import encode_prompt, load_model  # noqa: E402

model, tok = load_model(None)
ids = encode_prompt(tok, WARM_PROMPT, None)
mode = sys.argv[1]
if mode == "run":
    r = specdec.run(model, ids, "sam+recycling", tokenizer=tok, max_new_tokens=128)
elif mode == "gen":
    r = Generator(model, tok, drafter="sam+recycling", store=False).generate(ids, max_new_tokens=128)
mem = {k: int((v.array[:, 0] != -1).sum()) for k, v in _SHARED.items()}
files = {os.path.basename(f): int((np.load(f)["matrix"][:, 0] != -1).sum()) for f in glob.glob(d + "/r/*.npz")}
print(mode, "steps", r.stats.steps, "in memory", list(mem.values()), "saved", files)
