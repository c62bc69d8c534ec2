"""specdec's cache directory: what lives there, safe writes, and ``specdec cache info|clear``.

Everything specdec keeps between runs lies under :func:`specdec.models.cache_dir`
(``$SPECDEC_CACHE_DIR``, default ``~/.cache/specdec``), one folder per kind (:data:`KINDS`).
Every file is rebuilt on demand, so clearing any kind is safe; it only costs the time to
rebuild it. ``clear`` removes only entries whose names specdec itself gives (hash-named
files and folders), never anything else that may sit in a relocated cache directory.

    specdec cache info              # each kind: entries, size, what it is; the planner's statistics in detail
    specdec cache info --json
    specdec cache clear planner     # forget what budget="auto" learned
    specdec cache clear             # every kind
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_HASH16 = r"[0-9a-f]{16}"
_HASH_JSON = re.compile(rf"(\.)?{_HASH16}(\.json|-.*)$")  # a hash-named file, or its staging leftover


@dataclass(frozen=True)
class Kind:
    """One folder of the cache: its name, which entries specdec made there, and what they are."""

    name: str
    pattern: re.Pattern[str]
    about: str

    def folder(self) -> Path:
        if self.name == "planner":
            from specdec.budget.store import stats_dir

            return stats_dir()
        from specdec.models import cache_dir

        return cache_dir() / self.name

    def entries(self) -> list[Path]:
        """specdec's own entries in this kind's folder, sorted by name."""
        folder = self.folder()
        if not folder.is_dir():
            return []
        return sorted(p for p in folder.iterdir() if self.pattern.fullmatch(p.name))


KINDS = (
    Kind("models", re.compile(_HASH16), "converted checkpoints of the default model (~20 s to convert again)"),
    Kind("extensions", re.compile(r"[\w.-]+-[0-9a-f]{12}"), "compiled kernels (about a minute to build again)"),
    Kind("calibration", _HASH_JSON, "verification cost per tree size, per model and device (~10 s on a CPU)"),
    Kind("planner", _HASH_JSON, "what budget='auto' learned per model, tokenizer, drafter and device"),
    Kind("trusted", _HASH_JSON, "stamps of fully verified large datastores (they load without a full read)"),
    Kind("datastores", re.compile(r"\w+-bench\.\w+"), "datastores built by the benchmarks"),
    Kind("vllm_check", re.compile(_HASH16), "corpora of the vLLM integration check"),
)


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed into place: readers see a whole file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=f".{path.stem}-", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise


def checksum(document: Any) -> str:
    """SHA-256 of ``document``'s canonical JSON (sorted keys, no spaces): what a saved file's body must hash to."""
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def info() -> dict[str, Any]:
    """The cache's contents: per kind its folder, entry count, bytes and meaning; the planner files described."""
    from specdec.budget.store import enabled, summarize
    from specdec.models import cache_dir

    kinds = []
    for kind in KINDS:
        entries = kind.entries()
        kinds.append({"kind": kind.name, "folder": str(kind.folder()), "entries": len(entries),
                      "bytes": sum(_size(p) for p in entries), "about": kind.about})
    planner = next(k for k in KINDS if k.name == "planner")
    return {
        "cache_dir": str(cache_dir()),
        "planner_statistics": "on" if enabled() else "off (SPECDEC_PLANNER_CACHE)",
        "kinds": kinds,
        "planner": [summarize(p) for p in planner.entries() if p.suffix == ".json" and not p.name.startswith(".")],
    }


def clear(names: Sequence[str]) -> list[dict[str, Any]]:
    """Remove specdec's entries of the kinds ``names`` (all kinds when empty); what was removed, per kind."""
    chosen = [k for k in KINDS if not names or k.name in names]
    removed = []
    for kind in chosen:
        entries = kind.entries()
        freed = 0
        for entry in entries:
            freed += _size(entry)
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        removed.append({"kind": kind.name, "entries": len(entries), "bytes": freed})
    return removed


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB"


def cmd_cache(args: argparse.Namespace) -> int:
    if args.action == "clear":
        unknown = sorted(set(args.kinds) - {k.name for k in KINDS})
        if unknown:
            from specdec.errors import SpecDecError

            raise SpecDecError(f"unknown cache kind {unknown[0]!r}; kinds: {', '.join(k.name for k in KINDS)}")
        for row in clear(args.kinds):
            print(f"{row['kind']:<12} removed {row['entries']} entries, {_megabytes(row['bytes'])}")
        return 0
    report = info()
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"cache directory: {report['cache_dir']} (SPECDEC_CACHE_DIR moves it)")
    print(f"planner statistics: {report['planner_statistics']}")
    for row in report["kinds"]:
        print(f"  {row['kind']:<12} {row['entries']:>4} entries {_megabytes(row['bytes']):>10}   {row['about']}")
    if report["planner"]:
        print("saved planner statistics:")
    for item in report["planner"]:
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
                            description=__doc__.split("\n\n")[1] if __doc__ else None)
    parser.add_argument("action", choices=("info", "clear"))
    parser.add_argument("kinds", nargs="*", metavar="KIND",
                        help=f"with clear: the kinds to remove (default: all): {', '.join(k.name for k in KINDS)}")
    parser.add_argument("--json", action="store_true", help="with info: print the report as JSON")
    parser.set_defaults(func=cmd_cache)
