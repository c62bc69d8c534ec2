import os
import shutil
import tempfile

src = "/tmp/exp/fw/r1/sF"
work = tempfile.mkdtemp()
shutil.copytree(src, work + "/s")
os.environ["SPECDEC_PLANNER_DIR"] = work + "/s/planner"
os.environ["SPECDEC_RECYCLING_DIR"] = work + "/s/recycling"
from specdec.api import Generator  # noqa: E402
from specdec.bench.oneoff import heldout_prompts  # noqa: E402
from specdec.budget.acceptance import AcceptanceModel  # noqa: E402
from specdec.budget.planner import Throughput  # noqa: E402
from specdec.models import encode_prompt, load_model  # noqa: E402

model, tok = load_model(None)
g = Generator(model, tok, drafter="sam+recycling", store=False)
g.generate(encode_prompt(tok, heldout_prompts()[9].text, None), max_new_tokens=128)
acc2, tp2 = AcceptanceModel(), Throughput()
g.planner_stats.__class__.for_identity(g.planner_stats.identity).load(acc2, tp2)
keys = [k for k in g.acceptance._counts if len(k) == 4]
d = [abs(g.acceptance.conditional(k) - acc2.conditional(k)) for k in keys]
print("keys", len(keys), "max |dq|", max(d), "steps mem/loaded", g.acceptance.steps, acc2.steps)
print("tp mem", g.throughput.state(), "\ntp load", tp2.state())
print(
    "prior etc",
    g.acceptance.prior,
    acc2.prior,
    g.acceptance.memory,
    acc2.memory,
    g.acceptance.prior_weight,
    acc2.prior_weight,
)
