"""``specdec cache info|clear``: what specdec keeps in its cache directory, and removing it.

    specdec cache info              # each kind: entries, size, what it is; the planner's statistics in detail
    specdec cache info --json
    specdec cache clear planner     # forget what budget="auto" learned
    specdec cache clear             # every kind
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from specdec import cachefiles
from specdec.backends.buckets import compile_cache
from specdec.budget.planner_stats import enabled, summarize
from specdec.errors import SpecDecError


def report() -> dict[str, Any]:
    """:func:`specdec.cachefiles.info`, plus whether planner statistics are on and each saved file described."""
    planner = cachefiles.kind("planner")
    return {
        **cachefiles.info(),
        "planner_statistics": "on" if enabled() else "off (SPECDEC_PLANNER_CACHE)",
        "planner": [summarize(p) for p in planner.entries() if p.suffix == ".json" and not p.name.startswith(".")],
        "compiled": [compile_cache.describe(p) for p in cachefiles.kind("compiled").entries()],
    }


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB"


def cmd_cache(args: argparse.Namespace) -> int:
    if args.action == "clear":
        known = [k.name for k in cachefiles.KINDS]
        unknown = sorted(set(args.kinds) - set(known))
        if unknown:
            raise SpecDecError(f"unknown cache kind {unknown[0]!r}; kinds: {', '.join(known)}")
        for row in cachefiles.clear(args.kinds):
            print(f"{row['kind']:<12} removed {row['entries']} entries, {_megabytes(row['bytes'])}")
        return 0
    found = report()
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    print(f"cache directory: {found['cache_dir']} (SPECDEC_CACHE_DIR moves it)")
    print(f"planner statistics: {found['planner_statistics']}")
    for row in found["kinds"]:
        print(f"  {row['kind']:<12} {row['entries']:>4} entries {_megabytes(row['bytes']):>10}   {row['about']}")
    for item in found["compiled"]:
        use = "used by this torch and CPU" if item["usable"] else "another torch or CPU: unused (cache clear compiled)"
        print(f"  compiled forwards for torch {item['torch']} ({item['capability']}): {use}")
    if found["planner"]:
        print("saved planner statistics:")
    for item in found["planner"]:
        if not item["ok"]:
            print(f"  {item['file']}: unreadable or stale ({item.get('problem', 'checksum or version')}); "
                  "the next run of its identity starts afresh and replaces it")
            continue
        saved = time.strftime("%Y-%m-%d %H:%M", time.localtime(item["saved_at"])) if item.get("saved_at") else "?"
        print(f"  {item['drafter']:<28} {item['runs']:>5} runs, {item['trials']:>9} trials; {item['device']}; "
              f"saved {saved}")
    return 0


def register(sub: Any) -> None:
    parser = sub.add_parser("cache", help="show or remove what specdec caches (models, kernels, calibration, "
                            "planner statistics, datastore stamps)",
                            description=cachefiles.__doc__.split("\n\n")[1] if cachefiles.__doc__ else None)
    parser.add_argument("action", choices=("info", "clear"))
    parser.add_argument("kinds", nargs="*", metavar="KIND",
                        help=f"with clear: the kinds to remove (default: all): "
                        f"{', '.join(k.name for k in cachefiles.KINDS)}")
    parser.add_argument("--json", action="store_true", help="with info: print the report as JSON")
    parser.set_defaults(func=cmd_cache)
