"""Every stored `specdec bench oneoff --fresh` run: its fresh/warmed ratio and the 90% interval over its prompts.

`python intervals.py [DIR ...]` from the checkout's root: the runs in DIR (their results.json), or every stored run
(docs/bench/*/results.json and one level deeper); the last line pools the runs listed.
"""

import json
import sys
from pathlib import Path

import numpy as np

from specdec.bench.oneoff import FRESH_TARGET, Prompt, PromptResult, Timing, fresh_ratio

rows = []
found = [*Path("docs/bench").glob("*/results.json"), *Path("docs/bench").glob("*/*/results.json")]
for path in [Path(d) / "results.json" for d in sys.argv[1:]] or sorted(found):
    document = json.loads(path.read_text())
    prompts = document.get("prompts")
    if not isinstance(prompts, list) or not prompts or not any("warmed:" in arm for arm in prompts[0]["arms"]):
        continue
    spec = next(arm for arm in prompts[0]["arms"] if arm.startswith("warmed:")).removeprefix("warmed:")
    results = [PromptResult(Prompt(p["kind"], p["prompt"]), p["ids"],
                            {arm: Timing(t["tokens"], t["seconds"]) for arm, t in p["arms"].items()})
               for p in prompts]  # fmt: skip
    interval = fresh_ratio(results, spec)
    if interval is None:
        continue
    rows.append(interval.ratio)
    print(
        f"{path.parent!s:58s} {len(results):2d} prompts  {interval.ratio:.3f}  "
        f"[{interval.low:.3f}, {interval.high:.3f}]  {interval.verdict()}"
    )
if not rows:
    sys.exit("no stored fresh runs found: run from the checkout's root, or name their folders")
ratios = np.array(rows)
draws = np.random.default_rng(0).choice(ratios, size=(4000, len(ratios))).mean(axis=1)
low, high = np.quantile(draws, [0.05, 0.95])
print(
    f"{len(ratios)} runs: mean {ratios.mean():.3f}, median {np.median(ratios):.3f}, 90% interval of the mean over "
    f"runs {low:.3f}-{high:.3f}; runs at or above {FRESH_TARGET}: {int((ratios >= FRESH_TARGET).sum())}"
)
