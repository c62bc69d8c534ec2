from chains import verify_chains

from specdec.api import Generator
from specdec.models import load_model

model, tok = load_model(None)


def gen():
    g = Generator(model, tok, drafter="sam+recycling", store=False)
    g.cost_model()
    return g


keep = gen()
sizes = [1, 6, 3, 9, 4, 12, 2, 8, 16, 5] * 3


def measure(v, idx):
    return verify_chains(v, tok, idx, sizes)


K, N = [], []
for r in range(8):
    K.append(measure(keep.verifier, r % 8))
    g = gen()
    N.append(measure(g.verifier, r % 8))
    g.close()
import numpy as np  # noqa: E402

K = np.array(K[1:]) * 1e3
N = np.array(N[1:]) * 1e3
print("first 10 steps kept ", np.round(K[:, :10].mean(0), 1))
print("first 10 steps new  ", np.round(N[:, :10].mean(0), 1))
print(f"steps 10-30 kept {K[:, 10:].mean():.2f} new {N[:, 10:].mean():.2f}")
