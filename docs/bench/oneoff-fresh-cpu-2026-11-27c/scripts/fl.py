import json
import sys

from chains import verify_chains

from specdec.api import Generator
from specdec.models import load_model

model, tok = load_model(None)
g = Generator(model, tok, drafter="sam+recycling", store=False)
g.cost_model()
v = g.verifier


def measure(idx, n=60, size=6):
    return sum(verify_chains(v, tok, idx, [size] * n)) / n * 1e3


if sys.argv[1] == "fresh":
    print(json.dumps(measure(int(sys.argv[2]))))
else:
    for _ in range(3):
        measure(0)
    print("ready", flush=True)
    for line in sys.stdin:
        print(json.dumps(measure(int(line))), flush=True)
