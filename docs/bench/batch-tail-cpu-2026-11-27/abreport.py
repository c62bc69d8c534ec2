"""Per-repeat ratios of the A/B runs (ab.sh): ``python abreport.py OUT old1,new1,old2,new2``."""

import json
import sys
from pathlib import Path


def tokens_per_s(run: dict, part: str) -> float:
    return run["split"][f"{part}_tokens"] / run["split"][f"{part}_s"]


def main() -> None:
    base, arms = Path(sys.argv[1]), sys.argv[2].split(",")
    for arm in arms:
        runs = json.loads((base / arm / "results.json").read_text())["runs"]
        by: dict[tuple[str, int], list[dict]] = {}
        for run in runs:
            by.setdefault((run["arm"], run["batch_size"]), []).append(run)
        out = []
        for batch in sorted({key[1] for key in by}):
            plain, spec = by[("none", batch)], by[("sam+recycling", batch)]
            pairs = list(zip(plain, spec, strict=True))  # the same repeat: the arms ran in the same minute
            ratio = [round(b["tokens_per_s"] / a["tokens_per_s"], 3) for a, b in pairs]
            full = [round(tokens_per_s(b, "full") / tokens_per_s(a, "full"), 3) for a, b in pairs]
            tail = [f"{tokens_per_s(b, 'tail'):.0f}" for b in spec]
            out.append(f"B={batch}: run {ratio} full {full} sar tail tok/s {tail}")
        print(arm, " | ".join(out))


if __name__ == "__main__":
    main()
