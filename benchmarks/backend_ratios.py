"""The cuda_ext vs torch ratio table from the backend microbenchmarks, in one command.

    flock /tmp/specdec-bench.lock python benchmarks/backend_ratios.py            # run, then tabulate
    python benchmarks/backend_ratios.py --json results.json                      # tabulate a saved run
    flock /tmp/specdec-bench.lock python benchmarks/backend_ratios.py -k "step"  # a subset

Runs ``benchmarks/test_bench_backend.py`` under pytest-benchmark, then prints, per op, device,
tree size and KV length, the median time of each backend and the speedup (torch median /
cuda_ext median). Medians, because the machines this runs on are often shared.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run_benchmarks(output: Path, select: str | None) -> None:
    command = [
        sys.executable, "-m", "pytest", str(HERE / "test_bench_backend.py"), "--benchmark-only", "-q",
        "-p", "no:cacheprovider", f"--benchmark-json={output}",
    ]  # fmt: skip
    if select:
        command += ["-k", select]
    subprocess.run(command, check=True)


def table(results: dict[str, Any]) -> str:
    """Markdown: one row per (op, device, nodes, KV), medians in microseconds and the speedup."""
    medians: dict[tuple[str, str, int, int | None], dict[str, float]] = defaultdict(dict)
    for bench in results["benchmarks"]:
        info = bench["extra_info"]
        if "op" not in info:  # a saved run of the whole suite: keep the backend benchmarks
            continue
        key = (info["op"], info["device"], info["nodes"], info["committed"])
        medians[key][info["backend"]] = bench["stats"]["median"]
    lines = [
        "| op | device | nodes | KV | torch (us) | cuda_ext (us) | speedup |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key in sorted(medians, key=lambda k: (k[0], k[1], k[2], k[3] or 0)):
        op, device, nodes, committed = key
        torch_s, ext_s = medians[key].get("torch"), medians[key].get("cuda_ext")
        kv = "-" if committed is None else f"{committed // 1024}K"
        speedup = f"{torch_s / ext_s:.1f}x" if torch_s and ext_s else "-"
        cells = [f"{s * 1e6:.0f}" if s else "-" for s in (torch_s, ext_s)]
        lines.append(f"| {op} | {device} | {nodes} | {kv} | {cells[0]} | {cells[1]} | {speedup} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="tabulate this pytest-benchmark JSON instead of running")
    parser.add_argument("-k", dest="select", help="pytest -k expression: run a subset")
    parser.add_argument("--save", type=Path, help="keep the run's JSON here")
    args = parser.parse_args(argv)
    path = args.json
    if path is None:
        path = args.save or Path(tempfile.mkdtemp()) / "backend.json"
        run_benchmarks(path, args.select)
    print(table(json.loads(path.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
