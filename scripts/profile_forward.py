"""Where a native verification forward's time goes (default model, fp32, context 1024): torch profiler per op.

Usage: .venv/bin/python scripts/profile_forward.py [--looped] [ROWS ...]   (default: 1 8); docs/budget.md shows a run.

The default runs the layer loop as one C++ call (specdec_cpu::decoder_layers), whose kernels the profiler sees
as that op's own time; --looped runs the same kernels from the Python loop, one profiler row per kernel.
"""

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from specdec.backends.slot_cache import StaticKVCache
from specdec.backends.specdec_engine import cpu_kernels
from specdec.backends.specdec_engine.model_runner import PLAIN, DecoderRunner, Kernels, Segment
from specdec.models import load_model

torch.manual_seed(0)
model, tok = load_model()
runner = DecoderRunner(model)
cpu_kernels.load()
# The kernels engine="specdec" runs: the CPU kernels, the layer loop in one call (decoder_layers) where it fits.
looped = "--looped" in sys.argv
K = Kernels(
    cpu_kernels.skinny_linear, cpu_kernels.tree_attention, cpu_kernels.skinny_linears,
    cpu_kernels.tree_attention_segments, cpu_kernels.write_segments, None if looped else cpu_kernels.decoder_layers,
)
ctx = 1024
cache = StaticKVCache(runner.num_layers, 2048, torch.device("cpu"))
ids = torch.randint(0, 49152, (1, ctx))
with torch.inference_mode():
    runner.forward([Segment(ids, torch.arange(ctx)[None], cache, 0, None, last_only=True)], PLAIN)
    for rows in [int(a) for a in sys.argv[1:] if a != "--looped"] or [1, 8]:
        toks = torch.randint(0, 49152, (1, rows))
        pos = torch.arange(ctx, ctx + rows)[None]
        seg = Segment(toks, pos, cache, ctx, None)
        for _ in range(5):
            runner.forward([seg], K)
        n = 20
        t = time.perf_counter()
        for _ in range(n):
            runner.forward([seg], K)
        wall = (time.perf_counter() - t) / n * 1e3
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(n):
                runner.forward([seg], K)
        ev = prof.key_averages()
        total_self = sum(e.self_cpu_time_total for e in ev) / n / 1e3
        print(f"\n== rows {rows}: wall {wall:.1f} ms/forward; profiled self time {total_self:.1f} ms")
        rows_ = sorted(ev, key=lambda e: -e.self_cpu_time_total)[:14]
        for e in rows_:
            print(f"  {e.key:42s} {e.self_cpu_time_total / n / 1e3:7.2f} ms  {e.count // n:5d} calls")
