"""Just-in-time build and cache of specdec's C++/CUDA extensions: one helper for all of them.

Every compiled piece (the ``cuda_ext`` backend's kernels, datastore builders) is built
with :func:`torch.utils.cpp_extension.load` (ninja + the system compiler) the first time it
is needed and cached under ``<cache_dir>/extensions/<name>-<key>``, where ``key`` hashes the
sources, the flags, the torch version and the Python version: a changed source gets a
fresh build directory and module name, so a stale binary is never loaded. A failed build
raises :class:`NativeBuildError` carrying the compiler's own output; callers decide whether
to fall back (and say so) or to fail.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from specdec.errors import SpecDecError
from specdec.models import cache_dir

_LOADED: dict[str, ModuleType] = {}
_LOCK = threading.Lock()


class NativeBuildError(SpecDecError):
    """A compiled extension failed to build or load; the message holds the compiler's output."""


def extension_key(sources: Sequence[Path], flags: Sequence[str], with_cuda: bool) -> str:
    """Hash of everything that changes the binary (``sources`` includes the headers they include)."""
    import torch

    digest = hashlib.sha256()
    for source in sorted(sources):
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    digest.update(" ".join(flags).encode())
    digest.update(f"{torch.__version__}|{sys.version_info[:2]}|cuda={with_cuda}".encode())
    return digest.hexdigest()[:12]


def load_extension(
    name: str,
    sources: Sequence[str | os.PathLike[str]],
    *,
    extra_cflags: Sequence[str] = ("-O3",),
    extra_cuda_cflags: Sequence[str] = ("-O3",),
    with_cuda: bool = False,
    verbose: bool = False,
    depends: Sequence[str | os.PathLike[str]] = (),
) -> ModuleType:
    """Build (once) and import the extension ``name`` from ``sources``.

    The first build takes tens of seconds; later calls in the same process return the
    loaded module, and later processes load the cached binary in milliseconds.
    ``depends`` lists files the sources include (headers): not compiled, but hashed into
    the cache key, so editing a header also gives a fresh build.
    """
    paths = [Path(s).resolve() for s in sources]
    headers = [Path(s).resolve() for s in depends]
    missing = [str(p) for p in paths + headers if not p.is_file()]
    if missing:
        raise NativeBuildError(f"extension {name!r}: source files missing: {', '.join(missing)}")
    flags = [*extra_cflags, *(extra_cuda_cflags if with_cuda else ())]
    key = extension_key(paths + headers, flags, with_cuda)
    module_name = f"specdec_{name}_{key}"
    with _LOCK:
        if module_name in _LOADED:
            return _LOADED[module_name]
        stale = [loaded for loaded in _LOADED if loaded.rsplit("_", 1)[0] == f"specdec_{name}"]
        if stale:
            # Extensions register torch ops under one namespace: loading a second build of the
            # same one (its sources changed since this process loaded it) would abort the process.
            raise NativeBuildError(
                f"extension {name!r}: this process already loaded another build ({stale[0]}), its sources "
                "have changed since; restart Python to use the new build"
            )
        from torch.utils import cpp_extension

        build_dir = cache_dir() / "extensions" / f"{name}-{key}"
        build_dir.mkdir(parents=True, exist_ok=True)
        output = io.StringIO()
        try:
            # torch prints compiler output to stdout/stderr; keep it for the error message.
            with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
                module: ModuleType = cpp_extension.load(
                    name=module_name,
                    sources=[str(p) for p in paths],
                    extra_cflags=list(extra_cflags),
                    extra_cuda_cflags=list(extra_cuda_cflags) if with_cuda else None,
                    build_directory=str(build_dir),
                    with_cuda=with_cuda,
                    verbose=verbose,
                )
        except Exception as error:  # compiler, linker or import failure: report it whole
            log = output.getvalue().strip()
            raise NativeBuildError(
                f"building extension {name!r} failed: {error}" + (f"\n--- build output ---\n{log}" if log else "")
            ) from error
        _LOADED[module_name] = module
        return module
