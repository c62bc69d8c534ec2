"""Compiled static-cache forwards that survive the process: inductor's on-disk caches in specdec's cache.

Why: ``engine="compiled"`` compiles one forward per tree-size bucket with ``torch.compile``
(:mod:`specdec.backends.buckets.forward`), and :mod:`specdec.backends.buckets.shared` shares them only
within a process: every new process paid the whole compile again. torch keeps what it
compiled on disk when told where: inductor's FX graph cache (the generated code of each
graph, looked up by a hash of the graph, its input metadata, the compile settings and the
torch version) and the C++ kernels it built. Frozen weights are stored by metadata only and
bound from the live model when a graph is loaded, so one entry serves every checkpoint of an
architecture, and a graph of another model never matches. (torch's AOTAutograd cache refuses
frozen graphs, so a later process still traces each bucket; it skips inductor's lowering,
code generation and C++ builds. fp32/bf16 graphs on a CPU are storable because specdec
compiles them without prepacking (``BucketForward.weight_prepack``): prepacked weights are
oneDNN (mkldnn) tensors, which inductor cannot pickle ("Bypassing FX Graph Cache because
'mkldnn tensors unpickleable'", torch 2.13). Measured in docs/static-cache.md.)

**Where.** ``<cache_dir>/compiled/<key>/`` (:func:`folder`), ``key`` a hash of
:func:`identity`: the torch and Python versions, the machine, the CPU model and the CPU
capability torch dispatches to (AVX2, AVX-512...). specdec points ``TORCHINDUCTOR_CACHE_DIR``
there for the process at its first static-cache compile (:func:`activate`), unless the user
set it to a folder of their own (then theirs is used as it is; torch's default folder, which torch
itself writes into the variable at its first use, does not count). ``specdec compile`` fills it up front;
``specdec cache info|clear compiled`` shows and removes it.

**Bad folders.** Each folder holds ``key.json``, its identity sealed with a checksum. A
folder whose ``key.json`` does not parse, fails its checksum, or names another identity
(copied from another machine, written by another torch under a colliding name) gives one
warning and is emptied: the buckets compile again and fill it anew. A corrupt entry that
inductor itself trips over fails the compile; :func:`discard` empties the folder and the
static verifier compiles once more without the disk cache (one warning), so neither a crash
nor a wrong token can come of it (and every compiled forward is still checked against the
eager forward at its first use).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from specdec import cachefiles
from specdec.backends.identity import device_name

FORMAT = 1  # the layout of a compiled folder; bumped when it changes
INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
KEY_FILE = "key.json"

_LOCK = threading.Lock()
_ACTIVE: Path | None = None  # the folder this process compiles into, once activated
_DISCARDED = False  # whether this process emptied it after a failed compile already (done once at most)


def identity() -> dict[str, str]:
    """What inductor's CPU code depends on beyond its own cache keys (module docstring)."""
    return {
        "format": str(FORMAT),
        "torch": torch.__version__,
        "python": ".".join(map(str, sys.version_info[:3])),
        "machine": platform.machine(),
        "cpu": device_name(torch.device("cpu")),
        "capability": str(torch.backends.cpu.get_cpu_capability()),
    }


def key(found: dict[str, str] | None = None) -> str:
    """The folder name of an identity (this process's by default): 16 hex digits."""
    return cachefiles.checksum(found if found is not None else identity())[:16]


def folder() -> Path:
    """``<cache_dir>/compiled/<key>``: where this process's compiled forwards go (module docstring)."""
    return cachefiles.folder("compiled") / key()


def problem(path: Path, expected: dict[str, str]) -> str | None:
    """Why the folder ``path`` cannot be used for ``expected`` (None: it can, or it is new)."""
    sealed = path / KEY_FILE
    if not path.exists():
        return None
    if not sealed.exists():
        return "it has no key.json" if any(path.iterdir()) else None
    try:
        document = json.loads(sealed.read_text(encoding="utf-8"))
        body, seal = document["identity"], document["checksum"]
    except (OSError, ValueError, KeyError, TypeError):
        return "its key.json does not parse"
    if seal != cachefiles.checksum(body):
        return "its key.json fails its checksum"
    if body != expected:
        differing = sorted(k for k in set(body) | set(expected) if body.get(k) != expected.get(k))
        first = differing[0]
        return f"it was made for {first} {body.get(first)!r}, not {expected.get(first)!r}"
    return None


def _seal(path: Path, found: dict[str, str]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    document = {"identity": found, "checksum": cachefiles.checksum(found)}
    cachefiles.write_atomically(path / KEY_FILE, json.dumps(document))


def _torch_default() -> str:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(default_cache_dir())


def activate() -> Path | None:
    """Point inductor's disk caches at :func:`folder` for this process (once); the folder, or None when
    the user set ``TORCHINDUCTOR_CACHE_DIR`` themselves (theirs is used untouched) or the folder cannot be
    made or sealed (a read-only or full cache: one warning, and inductor's default folder serves)."""
    global _ACTIVE
    with _LOCK:
        if _ACTIVE is not None:
            return _ACTIVE
        given = os.environ.get(INDUCTOR_ENV)
        if given and given != _torch_default():  # torch writes its default there at its first use of it
            return None
        found = identity()
        path = cachefiles.folder("compiled") / key(found)
        why = problem(path, found)
        if why is not None:
            warnings.warn(f"engine='compiled': the compiled forwards in {path} cannot be used ({why}); removed, "
                          "compiling again", RuntimeWarning, stacklevel=3)
            shutil.rmtree(path, ignore_errors=True)
        try:
            _seal(path, found)
        except OSError as error:  # a read-only or full cache: inductor keeps its own folder, one warning
            cachefiles.warn_unwritable_once("engine='compiled''s compiled forwards", path, error)
            return None
        os.environ[INDUCTOR_ENV] = str(path)
        torch._inductor.config.fx_graph_cache = True
        _ACTIVE = path
        return path


def discard(reason: str) -> bool:
    """Empty this process's compiled folder after a compile failed in it (module docstring); whether
    there was one to empty (then the caller compiles again, :func:`disabled`)."""
    global _DISCARDED
    with _LOCK:
        path = _ACTIVE
        if path is None or _DISCARDED:
            return False
        _DISCARDED = True
    warnings.warn(f"engine='compiled': compiling from {path} failed ({reason}); removed it, compiling again",
                  RuntimeWarning, stacklevel=3)
    for entry in path.iterdir() if path.is_dir() else []:
        if entry.name == KEY_FILE:
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    return True


@contextmanager
def disabled() -> Iterator[None]:
    """Compile without reading inductor's FX graph cache (the retry after :func:`discard`)."""
    with torch._inductor.config.patch(fx_graph_cache=False):
        yield


def reset_for_tests() -> None:
    """Forget the activated folder (tests point ``SPECDEC_COMPILED_DIR`` elsewhere and activate again)."""
    global _ACTIVE, _DISCARDED
    with _LOCK:
        if _ACTIVE is not None and os.environ.get(INDUCTOR_ENV) == str(_ACTIVE):
            del os.environ[INDUCTOR_ENV]
        _ACTIVE = None
        _DISCARDED = False


def describe(path: Path) -> dict[str, Any]:
    """A compiled folder for ``specdec cache info``: its identity and whether this process can use it."""
    try:
        body = json.loads((path / KEY_FILE).read_text(encoding="utf-8"))["identity"]
    except (OSError, ValueError, KeyError, TypeError):
        body = {}
    return {"folder": str(path), "torch": body.get("torch", "?"), "capability": body.get("capability", "?"),
            "usable": problem(path, identity()) is None and path.name == key()}
