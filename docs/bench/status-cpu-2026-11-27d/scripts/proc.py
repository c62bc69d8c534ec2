"""A long-lived process for proc_drive.py: per prompt index read on stdin, the mean of 60 chain verifications (ms)."""

import sys

import numpy as np
from chain_timing import chain_seconds

chain_seconds(0, 60)
print("ready", flush=True)
for line in sys.stdin:
    print(f"{float(np.mean(chain_seconds(int(line), 60)) * 1e3):.2f}", flush=True)
