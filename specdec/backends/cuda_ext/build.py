"""Building the ``cuda_ext`` extension: its sources, flags and the CUDA decision, built once per process.

The extension is compiled just in time by :func:`specdec.native.load_extension` (the one
build-and-cache helper of the package): ~1 minute the first time on 2 cores, milliseconds
from the cache afterwards, rebuilt when a source or header changes. The CUDA kernels
(``csrc/tree_ops_cuda.cu``) join the build when torch is a CUDA build with a usable device
and the CUDA toolkit is found (``torch.utils.cpp_extension.CUDA_HOME``); otherwise the
extension carries the CPU kernels only.

A failed build is remembered for the rest of the process, so ``tree_ops="auto"`` pays for
it (and warns) once, and ``tree_ops="cuda_ext"`` raises the same error, compiler output
included, every time it is asked for.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import ModuleType

import torch

from specdec.backends.cuda_ext import ops
from specdec.errors import SpecDecError
from specdec.native import NativeBuildError, load_extension

CSRC = Path(__file__).resolve().parent / "csrc"
CPU_SOURCES = (CSRC / "tree_ops.cpp",)
CUDA_SOURCES = (CSRC / "tree_ops_cuda.cu",)
HEADERS = (CSRC / "tree_ops.h", CSRC / "checks.h", CSRC / "faults.h")

_LOCK = threading.Lock()
_FAILURE: NativeBuildError | None = None


class BackendUnavailableError(SpecDecError):
    """The extension built, but cannot serve this model (its device has no kernels here)."""


def cuda_build_possible() -> bool:
    """Whether the CUDA kernels can be compiled and run here: a CUDA torch, a device, a toolkit."""
    if torch.version.cuda is None or not torch.cuda.is_available():
        return False
    from torch.utils.cpp_extension import CUDA_HOME  # imports setuptools: only where a GPU could use it

    return CUDA_HOME is not None


def load() -> ModuleType:
    """The built extension (its ops registered as ``torch.ops.specdec.*``); :class:`NativeBuildError` if it fails."""
    global _FAILURE
    with _LOCK:
        if _FAILURE is not None:
            raise _FAILURE
        with_cuda = cuda_build_possible()
        defines = ("-DSPECDEC_WITH_CUDA",) if with_cuda else ()
        try:
            module = load_extension(
                "tree_ops",
                [*CPU_SOURCES, *(CUDA_SOURCES if with_cuda else ())],
                depends=HEADERS,
                extra_cflags=("-O3", *defines),
                extra_cuda_cflags=("-O3", *defines),
                with_cuda=with_cuda,
            )
        except NativeBuildError as error:
            _FAILURE = error
            raise
        ops.register_fakes()
        return module
