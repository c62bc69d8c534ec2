"""The portable kernels' contract checks without torch (``tests/native/*.cpp``), compiled per target.

Each check program includes a kernel's portable source (``specdec/backends/specdec_engine/csrc/*.inc``), runs it on
random shapes against the contract written out one output at a time, and exits non-zero on any
bit that differs. Compiled here for the baseline target (on x86-64: no FMA instruction, so every
fused multiply-add is the C library's), for AVX2+FMA where this CPU has it, and for aarch64 (NEON)
under qemu's user-mode emulation where the cross compiler and qemu are installed
(``bash scripts/cross_check.sh`` installs them): the portable path of CPUs the project has no
machine of. A compiler that is missing skips the case with the reason; a failed compile fails it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parent / "native"
CHECKS = sorted(NATIVE.glob("*.cpp"))
FLAGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-Wno-psabi"]


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


TARGETS = {
    "baseline": (["g++"], [], []),
    "avx2": (["g++"], ["-mavx2", "-mfma"], []),
    "aarch64": (["aarch64-linux-gnu-g++"], ["-static"], ["qemu-aarch64"]),
}


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("source", CHECKS, ids=[path.stem for path in CHECKS])
def test_the_portable_kernel_keeps_its_contract_bitwise(source: Path, target: str, tmp_path: Path) -> None:
    compiler, flags, runner = TARGETS[target]
    missing = [tool for tool in [*compiler, *runner] if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (bash scripts/cross_check.sh installs them)")
    if target == "avx2" and not {"avx2", "fma"} <= _cpu_flags():
        pytest.skip("this CPU has no AVX2+FMA")
    binary = tmp_path / f"{source.stem}-{target}"
    build = subprocess.run([*compiler, *FLAGS, *flags, str(source), "-o", str(binary)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-4000:]
    result = subprocess.run([*runner, str(binary)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "passed" in result.stdout, result.stdout[-4000:] + result.stderr[-2000:]
