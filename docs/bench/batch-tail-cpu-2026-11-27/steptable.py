"""Does a cost table that sees the CPU kernels' row blocks (sizes 5, 9, 12, 13) plan batches better?

One process, two Generators (store=False, planner_cache=False) that differ only in the table their batch
planner prices with, in turn: ``python steptable.py ROUNDS``.
"""

import statistics
import sys
import time
from typing import Any

import numpy as np

import specdec
from specdec.bench.oneoff import heldout_prompts
from specdec.budget.calibration import calibrate
from specdec.budget.cost_model import CostTable, VerifyCostModel
from specdec.drafters import recycling_state
from specdec.models import load_model

model, tok = load_model()
prompts = [p.text for p in heldout_prompts(extra=True)]
first = specdec.Generator(model, tok, drafter="sam+recycling", planner_cache=False)
table0 = first._cost_model()[0].table
started = time.perf_counter()
table1 = calibrate(first.verifier, sizes=(1, 2, 3, 4, 5, 6, 8, 9, 12, 13, 16, 32, 64, 128))
print(f"calibrated in {time.perf_counter() - started:.1f}s; kernels same: {table1.kernels == table0.kernels}")
for table in (table0, table1):
    print(table.sizes)
    for context, row in zip(table.contexts, table.seconds, strict=True):
        print("  ", context, [round(1000 * x, 1) for x in row])


def make(table: CostTable) -> Any:
    generator = specdec.Generator(model, tok, drafter="sam+recycling", planner_cache=False, store=False)
    generator._cost_model()  # the calibrated kernels on its verifier
    cost = VerifyCostModel(table)
    generator._batch_cost_model = lambda: (cost, 0.0)
    return generator


def measure(generator: Any, batch: int) -> tuple[float, float, float]:
    """(tokens/s of the run, of its full-batch steps, mean rows a full-batch forward)."""
    started = time.perf_counter()
    results = generator.generate_batch(prompts[:16], batch_size=batch, max_new_tokens=128)
    seconds = time.perf_counter() - started
    records = [r for result in results for r in result.stats.records if r.batch_rows == batch]
    steps: dict[tuple[float, float], list[Any]] = {}
    for record in records:
        steps.setdefault((record.step_s, record.verify_s), []).append(record)
    full_s = sum(key[0] for key in steps)
    full_tokens = sum(r.accepted + 1 for r in records)
    rows = float(np.mean([sum(r.tree_size for r in step) for step in steps.values()]))
    return sum(len(result.tokens) for result in results) / seconds, full_tokens / full_s, rows


arms = {"blocks4-8": make(table0), "blocks+": make(table1)}
for generator in arms.values():
    generator.generate_batch(prompts[16:24], batch_size=8, max_new_tokens=48)
learned = recycling_state.snapshot_shared()
rows = []
for round_ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    for batch in (8, 4):
        order = list(arms.items()) if round_ % 2 == 0 else list(arms.items())[::-1]
        measured = {}
        for name, generator in order:
            recycling_state.restore_shared(learned)
            measured[name] = measure(generator, batch)
        a, b = measured["blocks4-8"], measured["blocks+"]
        print(f"round {round_} B={batch}: run {b[0] / a[0]:.3f} full {b[1] / a[1]:.3f} "
              f"(tok/s {a[0]:.1f} vs {b[0]:.1f}; forward rows {a[2]:.2f} vs {b[2]:.2f})", flush=True)
        rows.append((batch, b[0] / a[0], b[1] / a[1]))
for batch in (8, 4):
    mine = [row for row in rows if row[0] == batch]
    print(f"B={batch}: run median {statistics.median(r[1] for r in mine):.3f} "
          f"full median {statistics.median(r[2] for r in mine):.3f}")
