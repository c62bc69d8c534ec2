"""The build helper refuses binaries whose error messages cannot name a bad value (issue 15).

A compiler that links libstdc++ statically into an extension (a relocated GCC, as on the
GPU image where the crash was found; ``-static-libstdc++`` here) brings a second copy of
libstdc++ into a process where torch already holds the system one. Formatting an integer
into a ``TORCH_CHECK`` message then crashes (SIGSEGV there) or drops the number (here).
These tests build a tiny extension with that flag and check both halves of the fix:
the hardened link (``HARDENING_LDFLAGS``) makes its messages whole, and without it the
child-process check refuses the build instead of letting it meet user input.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import ALLOW_NO_COMPILER, native_or_skip, use_private_cache

from specdec import native
from specdec.native import NativeBuildError, load_extension

SOURCE = r"""
#include <torch/extension.h>
// Raises with an integer and a shape in its message, like the tree ops' argument checks.
void reject(int64_t value) {
  TORCH_CHECK(value >= 0, "reject: value must be >= 0, got ", value, " (shape ", at::IntArrayRef({value, 2}), ")");
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("reject", &reject); }
"""

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the clash needs GNU/ELF linking")


def _source(tmp_path: Path) -> Path:
    path = tmp_path / "canary.cpp"
    path.write_text(SOURCE)
    return path


HARDENED = ("-static-libstdc++",) if sys.platform.startswith("linux") else ()


@pytest.fixture(scope="module")
def hardened_canary(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The canary built once for this module (a build costs ~30 s): linked with ``-static-libstdc++``
    where the clash exists, through the hardened link and the check. (its cache folder, its source)"""
    root = tmp_path_factory.mktemp("canary")
    with pytest.MonkeyPatch.context() as patch:
        cache = use_private_cache(patch, root / "cache")
        source = _source(root)
        load_extension("canary_hardened", [source], extra_ldflags=HARDENED)
    return cache, source


@linux_only
def test_hardened_link_keeps_numbers_in_messages_under_a_static_libstdcxx(
    hardened_canary: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, source = hardened_canary
    use_private_cache(monkeypatch, cache)
    module = load_extension("canary_hardened", [source], extra_ldflags=HARDENED)
    with pytest.raises(RuntimeError, match=r"got -42 \(shape \[-42, 2\]\)"):
        module.reject(-42)
    assert any(path.name == "format-check.ok" for path in cache.rglob("*"))


@linux_only
def test_unhardened_static_libstdcxx_build_is_refused_by_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_private_cache(monkeypatch, tmp_path / "cache")
    monkeypatch.setattr(native, "HARDENING_LDFLAGS", ())
    with pytest.raises(NativeBuildError, match="libstdc\\+\\+") as caught:
        load_extension("canary_unhardened", [_source(tmp_path)], extra_ldflags=("-static-libstdc++",))
    # Either symptom is named: the number lost from the message here, a crash on other machines.
    assert "loses numbers" in str(caught.value) or "crashes (SIG" in str(caught.value)
    assert not any(path.name == "format-check.ok" for path in (tmp_path / "cache").rglob("*"))


def test_every_build_links_hardened_and_carries_the_canary() -> None:
    if sys.platform.startswith("linux"):
        assert "-Wl,--exclude-libs,ALL" in native.HARDENING_LDFLAGS
    assert native.FORMAT_CHECK_SOURCE.is_file()
    assert "specdec_format_check" in native.FORMAT_CHECK_SOURCE.read_text()


def test_check_names_a_library_that_cannot_load(tmp_path: Path) -> None:
    bogus = tmp_path / "not_a_library.so"
    bogus.write_bytes(b"\x7fELF broken")
    with pytest.raises(NativeBuildError, match="error-formatting check of not_a_library.so failed"):
        native.check_error_formatting(bogus)


def test_a_failed_build_fails_its_tests_unless_the_machine_says_it_has_no_compiler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """scripts/test.sh and CI fail when an extension cannot be built, the compiler's message in the failure."""

    def broken() -> None:
        raise NativeBuildError("building extension 'demo' failed\n--- build output ---\nc++: command not found")

    monkeypatch.delenv(ALLOW_NO_COMPILER, raising=False)
    with pytest.raises(pytest.fail.Exception, match="(?s)the demo extension did not build.*c\\+\\+: command not found"):
        native_or_skip("demo", broken)
    monkeypatch.setenv(ALLOW_NO_COMPILER, "1")
    with pytest.raises(pytest.skip.Exception, match="(?s)SPECDEC_ALLOW_NO_COMPILER=1.*command not found"):
        native_or_skip("demo", broken)
    assert native_or_skip("demo", lambda: "built") == "built"


def test_a_killed_builds_lock_is_removed_once_stale_and_a_live_one_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch's build lock left by a killed build would hang every later process: a stale one is removed
    with a warning; a fresh one is waited for (one message) until its build ends or it turns stale."""
    import os
    import threading
    import time

    lock = tmp_path / "lock"
    native.wait_for_build_lock(tmp_path, "x", poll_s=0.01)  # no lock: returns at once
    lock.touch()
    old = time.time() - native.STALE_LOCK_S - 5
    os.utime(lock, (old, old))
    with pytest.warns(RuntimeWarning, match="removing a build lock 15 minutes old"):
        native.wait_for_build_lock(tmp_path, "x", poll_s=0.01)
    assert not lock.exists()

    lock.touch()  # a live build: it ends (its lock goes) while we wait
    threading.Timer(0.2, lock.unlink).start()
    native.wait_for_build_lock(tmp_path, "x", poll_s=0.01)
    assert "waiting for another process's build" in capsys.readouterr().err

    lock.touch()  # a lock that turns stale while we wait
    monkeypatch.setattr(native, "STALE_LOCK_S", 0.3)
    with pytest.warns(RuntimeWarning, match="left by a build that was killed"):
        native.wait_for_build_lock(tmp_path, "x", poll_s=0.01)
    assert not lock.exists()


def test_a_checked_build_is_imported_without_the_ninja_pass_and_only_then(
    hardened_canary: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later process imports a build whose check passed (its stamp names the library) directly; a
    build without that stamp, with a stamp naming no library, or under another process's lock goes
    through torch's build (here made to fail, to show which path ran)."""
    from torch.utils import cpp_extension

    cache, source = hardened_canary  # built and checked by the fixture: stamped
    use_private_cache(monkeypatch, cache)
    (build_dir,) = (cache / "extensions").iterdir()
    stamp = build_dir / "format-check.ok"
    assert stamp.is_file()

    def no_build(*args: object, **kwargs: object) -> None:
        raise RuntimeError("torch's build pass ran")

    monkeypatch.setattr(cpp_extension, "load", no_build)
    monkeypatch.setattr(native, "_LOADED", {})  # as a new process sees it
    module = load_extension("canary_hardened", [source], extra_ldflags=HARDENED)
    with pytest.raises(RuntimeError, match=r"got -7 \(shape \[-7, 2\]\)"):
        module.reject(-7)  # the real, checked binary

    for spoil in ("lock", "no library", "no stamp"):
        monkeypatch.setattr(native, "_LOADED", {})
        saved = stamp.read_text()
        if spoil == "lock":
            (build_dir / "lock").touch()
            monkeypatch.setattr(native, "wait_for_build_lock", lambda *args: None)
        elif spoil == "no library":
            stamp.write_text("gone.so\n")
        else:
            stamp.unlink()
        with pytest.raises(NativeBuildError, match="torch's build pass ran"):
            load_extension("canary_hardened", [source], extra_ldflags=HARDENED)
        (build_dir / "lock").unlink(missing_ok=True)
        stamp.write_text(saved)


def test_a_process_whose_builds_are_cached_imports_no_build_tooling() -> None:
    """Loading both extensions from their checked builds (this session built them) imports neither
    ``torch.utils.cpp_extension`` nor setuptools, which it pulls in (~35-120 ms of a one-off ``run``),
    and leaves the ops' shape functions registered as Meta kernels (``native.register_meta``)."""
    import subprocess

    from specdec.backends.cuda_ext import build
    from specdec.backends.specdec_engine import cpu_kernels

    native_or_skip("cpu_kernels", cpu_kernels.load)
    native_or_skip("tree_ops", build.load)
    code = (
        "import sys, torch, transformers\n"
        "from specdec.backends.specdec_engine import cpu_kernels\n"
        "from specdec.backends.cuda_ext import build\n"
        "cpu_kernels.load(); build.load()\n"
        "heavy = sorted(m for m in ('setuptools', 'torch.utils.cpp_extension') if m in sys.modules)\n"
        "meta = [torch._C._dispatch_has_kernel_for_dispatch_key(op, 'Meta')\n"
        "        for op in ('specdec::tree_mask', 'specdec_cpu::skinny_linear')]\n"
        "print(heavy, meta)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[] [True, True]", done.stdout
