import json
import sys

import numpy as np

for fn in sys.argv[1:]:
    d = json.load(open(fn))  # noqa: SIM115
    F, W = [], []
    for r in d["prompts"]:
        a = r["arms"]
        f = next(k for k in a if k.startswith("run:"))
        w = next(k for k in a if k.startswith("warmed:"))
        for arm, out in ((a[f], F), (a[w], W)):
            s = arm["split"]
            out.append(
                (
                    arm["seconds"],
                    s["outside_s"],
                    s["prefill_s"],
                    s["verify_s"],
                    s["draft_s"],
                    arm["steps"],
                    s["nodes"],
                    len(arm["tokens"]),
                )
            )
    F, W = np.array(F), np.array(W)
    tot = W[:, 0].sum()
    names = ["seconds", "outside", "prefill", "verify", "draft"]
    parts = ", ".join(f"{n} {(F[:, i].sum() - W[:, i].sum()) / tot * 100:+.1f}%" for i, n in enumerate(names))
    rest = (F[:, 0].sum() - F[:, 1:5].sum()) - (W[:, 0].sum() - W[:, 1:5].sum())
    print(
        fn.split("/")[-2],
        parts,
        f"other {rest / tot * 100:+.1f}%",
        "steps %.1f/%.1f nodes %.2f/%.2f tokens %d/%d"  # noqa: UP031
        % (F[:, 5].mean(), W[:, 5].mean(), F[:, 6].mean(), W[:, 6].mean(), F[:, 7].sum(), W[:, 7].sum()),
    )
