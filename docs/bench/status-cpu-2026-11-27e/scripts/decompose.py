"""Every stored `bench oneoff --fresh` run taken apart: fresh/warmed time, steps, fixed part, per-step verification,
drafting, nodes.

`python decompose.py` from the checkout's root (reads docs/bench/*/results.json and one level deeper). A second line per
run: the fixed part per prompt, the time outside the generation and the prefill, fresh against warmed (ms; this was
`fixed_part.py`, folded in after its run: `raw/fixed_part.txt`).
"""

import glob
import json
from pathlib import Path

import numpy as np

paths = sorted(set(glob.glob("docs/bench/*/results.json") + glob.glob("docs/bench/*/*/results.json")))
for path in paths:
    d = json.loads(Path(path).read_text())
    P = d.get("prompts")
    if not isinstance(P, list) or not P or not any(a.startswith("warmed:") for a in P[0]["arms"]):
        continue
    spec = next(a for a in P[0]["arms"] if a.startswith("warmed:"))[7:]
    F = f"run:{spec}"
    W = f"warmed:{spec}"
    if P[0]["arms"][F].get("split") is None:
        continue
    rows = []
    for p in P:
        f = p["arms"][F]
        w = p["arms"][W]
        fs = f["split"]
        ws = w["split"]
        rows.append(
            [
                f["seconds"],
                w["seconds"],
                f["steps"],
                w["steps"],
                fs["outside_s"] + fs["prefill_s"] + fs.get("calibration_s", 0),
                ws["outside_s"] + ws["prefill_s"] + ws.get("calibration_s", 0),
                fs["verify_s"],
                ws["verify_s"],
                fs["draft_s"],
                ws["draft_s"],
                fs["nodes"],
                ws["nodes"],
                p["arms"]["hf"]["seconds"],
                p["arms"]["hf:warmed"]["seconds"],
            ]
        )
    r = np.array(rows).sum(0)
    tot = r[0] / r[1]
    print(
        f"{Path(path).parent.name[-22:]:24s} {spec[:14]:14s} n={len(P):2d} time {tot:.3f} "
        f"steps {r[2] / r[3]:.3f} fixed +{(r[4] - r[5]) / r[1] * 100:4.1f}% verify/step "
        f"{(r[6] / r[2]) / (r[7] / r[3]):.3f} verify +{(r[6] - r[7]) / r[1] * 100:4.1f}% "
        f"draft +{(r[8] - r[9]) / r[1] * 100:4.1f}% nodes {r[10] / len(P):.2f}/{r[11] / len(P):.2f} "
        f"hf {r[12] / r[13]:.3f}"
    )
    o = (
        np.array(
            [
                [
                    p["arms"][F]["split"]["outside_s"],
                    p["arms"][W]["split"]["outside_s"],
                    p["arms"][F]["split"]["prefill_s"],
                    p["arms"][W]["split"]["prefill_s"],
                    p["arms"][W]["seconds"],
                ]
                for p in P
            ]
        )
        * 1e3
    )
    m = o.mean(0)
    print(
        f"{Path(path).parent.name[-22:]:24s} outside {m[0]:5.1f} vs {m[1]:4.1f}  "
        f"prefill {m[2]:5.1f} vs {m[3]:5.1f} (median diff {np.median(o[:, 2] - o[:, 3]):5.1f}) "
        f" warmed call {m[4]:6.0f} ms"
    )
