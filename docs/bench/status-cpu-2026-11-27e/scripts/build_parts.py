"""The first and a later Generator build of one process, timed part by part (no profiler), then a 16-token
generation."""

import functools
import time

import specdec.api as api
import specdec.backends.identity as ident
import specdec.budget.planner_stats as ps
from specdec.models import encode_prompt, load_model

T = {}


def wrap(mod, name, label=None):
    f = getattr(mod, name)

    @functools.wraps(f)
    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            T[label or name] = T.get(label or name, 0) + (time.perf_counter() - t) * 1e3

    setattr(mod, name, g)


model, tok = load_model(None)
for n in [
    "make_verifier",
    "make_factory",
    "open_planner_stats",
    "eos_token_ids",
    "_resolve_model",
    "SharedMatrices",
    "resolve_store",
]:
    wrap(api, n)
wrap(api.calibration_cache, "cached_table")
wrap(ident, "_weights_fingerprint", "fingerprint")
wrap(ident, "device_name")
wrap(ps.PlannerStatsFile, "load", "stats.load")
for _rep in range(2):
    T.clear()
    t = time.perf_counter()
    g = api.Generator(model, tok, drafter="sam+recycling")
    tot = (time.perf_counter() - t) * 1e3
    print(f"build {tot:.1f} ms:", {k: round(v, 1) for k, v in T.items()})
    T.clear()
    ids = encode_prompt(tok, "Write a Python function that reverses a string.", None)
    t = time.perf_counter()
    r = g.generate(ids, max_new_tokens=16)
    tot = (time.perf_counter() - t) * 1e3
    print(
        f"  generate16 {tot:.1f} ms (total_s {r.stats.total_s * 1e3:.1f}, prefill "
        f"{r.stats.prefill_s * 1e3:.1f}, steps {r.stats.steps}, verify {r.stats.verify_s * 1e3:.1f} "
        f"draft {r.stats.draft_s * 1e3:.1f})"
    )
    g.close()
