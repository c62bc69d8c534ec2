"""Measured/predicted verification time, first use of each tree size in a process against later uses.

Reads the traces of docs/bench/oneoff-fresh-cpu-2026-11-27c/raw (records: tree_size, offered, reason, accepted,
expected, verify_s, predicted_s, step_s).
"""

import json
import statistics as st
import sys

for name in sys.argv[1:]:
    with open(name) as handle:
        generations = [json.loads(line) for line in handle]
    for kind in ("--oneoff-child", "--oneoff-warmed-child"):
        first, later, seen_by_pid = [], [], {}
        for generation in generations:
            if generation["argv"][0] != kind:
                continue
            seen = seen_by_pid.setdefault(generation["pid"], set())
            for record in generation["records"]:
                size, measured, predicted = record[0], record[5], record[6]
                if predicted is None or measured is None:
                    continue
                (later if size in seen else first).append(measured / predicted)
                seen.add(size)
        print(
            f"{name} {kind}: first use n={len(first)} median {st.median(first):.3f} mean {st.mean(first):.3f}; "
            f"later n={len(later)} median {st.median(later):.3f} mean {st.mean(later):.3f}"
        )
