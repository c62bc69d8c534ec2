"""`python warmup_trend.py N`: 50 chain verifications after each of N prompts in a fresh process, means per 25 (ms)."""

import sys

import numpy as np
from chain_timing import chain_seconds

seconds = [s for prompt in range(int(sys.argv[1])) for s in chain_seconds(prompt, 50)]
print(" ".join(f"{x:.2f}" for x in (np.array(seconds).reshape(-1, 25) * 1e3).mean(1)))
