"""Compile the CUDA kernels with nvcc where they cannot run: a check that the CUDA source builds.

On a machine without a GPU (or with a CPU-only torch) the extension carries only its CPU
kernels, so nothing would notice a CUDA source that no longer compiles. This module
compiles ``csrc/tree_ops_cuda.cu`` to an object file with the flags
``torch.utils.cpp_extension`` uses (C++20, its ``COMMON_NVCC_FLAGS``, torch's include
directories), which checks syntax, types, templates and the ATen/c10 CUDA APIs used. It
cannot link or run the kernels: that needs a CUDA build of torch and a device.

Against a CPU-only torch wheel one generated header (``c10/cuda/impl/cuda_cmake_macros.h``)
is absent; it only matters for Windows DLL exports, and ``C10_CUDA_NO_CMAKE_CONFIGURE_FILE``
(c10's own switch) skips it. Run::

    python -m specdec.backends.cuda_ext.nvcc_check            # sm_90 (H100); --arch sm_80 etc.

The object is cached by a hash of the sources, flags and nvcc version, like the extension.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from torch.utils import cpp_extension

from specdec.backends.cuda_ext.build import CUDA_SOURCES, HEADERS
from specdec.cachefiles import folder

# Kernels the object must define (their host-side launch stubs carry these names).
KERNELS = ("first_fault_kernel", "tree_mask_kernel", "row_top_kernel", "walk_kernel", "compact_kv_kernel")


@dataclass(frozen=True)
class CompileReport:
    """The outcome of one nvcc compile: the command, its exit status and output, the object file."""

    command: tuple[str, ...]
    returncode: int
    output: str
    object_path: Path
    cached: bool

    @property
    def own_warnings(self) -> list[str]:
        """Compiler warnings about specdec's own sources (torch's headers warn about themselves)."""
        names = tuple(p.name for p in (*CUDA_SOURCES, *HEADERS))
        return [line for line in self.output.splitlines() if "warning" in line and any(n in line for n in names)]

    @property
    def missing_kernels(self) -> list[str]:
        """Kernels absent from the object file (empty when the compile succeeded)."""
        if not self.object_path.is_file():
            return list(KERNELS)
        data = self.object_path.read_bytes()
        return [name for name in KERNELS if name.encode() not in data]


def find_nvcc() -> str | None:
    """The nvcc on ``$CUDA_HOME/bin`` or on the PATH, or None."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def nvcc_command(nvcc: str, source: Path, output: Path, arch: str) -> list[str]:
    """The compile command, with the flags ``torch.utils.cpp_extension`` passes to nvcc."""
    includes = [*cpp_extension.include_paths("cpu"), sysconfig.get_paths()["include"]]
    defines = ["-DSPECDEC_WITH_CUDA"]
    torch_include = Path(cpp_extension.include_paths("cpu")[0])
    if not (torch_include / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").is_file():
        defines.append("-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE")  # a CPU-only wheel: see the module docstring
    compute = arch.replace("sm_", "compute_")
    return [
        nvcc, "-c", str(source), "-o", str(output),
        "-std=c++20", "-O3", "-Xcompiler", "-fPIC", f"-gencode=arch={compute},code={arch}",
        *cpp_extension.COMMON_NVCC_FLAGS, *defines, *(f"-I{path}" for path in includes),
    ]  # fmt: skip


def compile_cuda_source(arch: str = "sm_90", nvcc: str | None = None, use_cache: bool = True) -> CompileReport:
    """Compile ``tree_ops_cuda.cu`` for ``arch``; raise FileNotFoundError when there is no nvcc."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found: set CUDA_HOME or put nvcc on the PATH")
    source = CUDA_SOURCES[0]
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
    digest = hashlib.sha256(version.encode() + arch.encode())
    for path in (*CUDA_SOURCES, *HEADERS):
        digest.update(path.read_bytes())
    directory = folder("extensions") / f"nvcc-check-{digest.hexdigest()[:12]}"
    directory.mkdir(parents=True, exist_ok=True)
    output = directory / "tree_ops_cuda.o"
    command = nvcc_command(nvcc, source, output, arch)
    log = directory / "nvcc.log"
    if use_cache and output.is_file() and log.is_file():
        return CompileReport(tuple(command), 0, log.read_text(), output, cached=True)
    output.unlink(missing_ok=True)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    text = done.stdout + done.stderr
    if done.returncode == 0:
        log.write_text(text)
    return CompileReport(tuple(command), done.returncode, text, output, cached=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="sm_90", help="GPU architecture, e.g. sm_80 (A100), sm_90 (H100)")
    parser.add_argument("--no-cache", action="store_true", help="compile even when a cached object exists")
    args = parser.parse_args(argv)
    try:
        report = compile_cuda_source(args.arch, use_cache=not args.no_cache)
    except FileNotFoundError as error:
        print(error, file=sys.stderr)
        return 2
    print(" ".join(report.command))
    if report.returncode != 0:
        print(report.output, file=sys.stderr)
        print(f"nvcc failed with exit status {report.returncode}", file=sys.stderr)
        return 1
    for line in report.own_warnings:
        print(line)
    print(
        f"compiled {CUDA_SOURCES[0].name} for {args.arch}{' (cached)' if report.cached else ''}: {report.object_path}; "
        f"kernels missing: {report.missing_kernels or 'none'}; own warnings: {len(report.own_warnings)}"
    )
    return 0 if not report.missing_kernels else 1


if __name__ == "__main__":
    sys.exit(main())
