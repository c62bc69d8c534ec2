"""Just-in-time build and cache of specdec's C++/CUDA extensions: one helper for all of them.

Every compiled piece (the ``cuda_ext`` backend's kernels, datastore builders) is built
with :func:`torch.utils.cpp_extension.load` (ninja + the system compiler) the first time it
is needed and cached under ``<cache_dir>/extensions/<name>-<key>``, where ``key`` hashes the
sources, the flags, torch's build and C++ ABI and Python's version (not the environment: virtual
environments with the same torch share a build; the first builds it, the others import it): a changed source gets a
fresh build directory and module name, so a stale binary is never loaded. A failed build
raises :class:`NativeBuildError` carrying the compiler's own output; callers decide whether
to fall back (and say so) or to fail.

Two things make a build trustworthy whatever the user's toolchain:

- **Linking**: on Linux every extension links with ``-Wl,--exclude-libs,ALL``, so a
  compiler that links its own copy of libstdc++ statically into the extension (a relocated
  GCC; ``-static-libstdc++``) cannot export that copy's symbols into a process where torch
  has already loaded the system ``libstdc++.so.6``. Two exported copies meet there, and
  formatting an integer into a ``TORCH_CHECK`` message (the ``num_put`` locale facet)
  crashes the process or drops the number, while dtypes and strings format fine.
- **Checking**: every build carries a canary (``csrc/format_check.cpp``), and after each
  build a child process loads the binary and formats an integer and a shape into a failing
  check, from the main thread and from another one. A build whose messages cannot name a
  bad value (or that dies trying) is refused with :class:`NativeBuildError`, once per
  build directory (the verdict is stamped there), before any user input reaches it.

A build that passed its check is imported directly by later processes (:func:`_import_checked`),
without torch's ninja pass over the build directory (~6 ms per extension, ~20 ms of a one-off
``run``'s start): its key already says the sources and flags are the ones it was built from.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from specdec.cachefiles import folder
from specdec.errors import SpecDecError

_LOADED: dict[str, ModuleType] = {}
_LOCK = threading.Lock()

# The canary every extension carries (see the module docstring), and the linker flags that
# keep a private libstdc++ copy from being exported (GNU ld, gold and lld all take them).
FORMAT_CHECK_SOURCE = Path(__file__).resolve().parent / "csrc" / "format_check.cpp"
HARDENING_LDFLAGS: tuple[str, ...] = ("-Wl,--exclude-libs,ALL",) if sys.platform.startswith("linux") else ()
_CHECK_VALUE = -1234567  # formatted by the canary; must come back in its message
_CHECK_STAMP = "format-check.ok"
_CHECK_SCRIPT = """
import ctypes, sys, threading
import torch  # the process must hold torch's libstdc++ before the extension loads, as in real use
library = ctypes.CDLL(sys.argv[1])
library.specdec_format_check.restype = ctypes.c_int
library.specdec_format_check.argtypes = (ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64)
messages = []
def check():
    buffer = ctypes.create_string_buffer(512)
    raised = library.specdec_format_check(int(sys.argv[2]), buffer, len(buffer))
    text = buffer.value.decode(errors="replace") if raised else "<the check did not raise>"
    messages.append(" ".join(text.split()))
check()
thread = threading.Thread(target=check)
thread.start()
thread.join()
print("\\n".join(messages))
"""


class NativeBuildError(SpecDecError):
    """A compiled extension failed to build or load; the message holds the compiler's output."""


_SOURCE_HASHES: dict[tuple[Path, int, int], bytes] = {}  # (path, size, mtime_ns) -> SHA-256 of its bytes


def _source_hash(source: Path) -> bytes:
    """SHA-256 of ``source``'s bytes, remembered while its size and modification time stay the same
    (drafters that load an extension ask for its key each time one is made: a re-read per call cost
    ~30 us per source file)."""
    stamp = source.stat()
    key = (source, stamp.st_size, stamp.st_mtime_ns)
    digest = _SOURCE_HASHES.get(key)
    if digest is None:
        digest = _SOURCE_HASHES[key] = hashlib.sha256(source.read_bytes()).digest()
    return digest


# load_extension's arguments (with $CXX and the working directory) -> the module name they gave, the files
# it was built from and their (size, mtime_ns): a later call with the same arguments and unchanged files
# returns the loaded module without resolving paths and hashing again (~0.5 ms a call, six calls per Generator).
_CALLS: dict[tuple[object, ...], tuple[str, list[Path], tuple[tuple[int, int] | None, ...]]] = {}


def _stamps(files: Sequence[Path]) -> tuple[tuple[int, int] | None, ...]:
    """Each file's (size, mtime_ns), None where it cannot be read."""
    found: list[tuple[int, int] | None] = []
    for file in files:
        try:
            stamp = os.stat(file)
        except OSError:
            found.append(None)
            continue
        found.append((stamp.st_size, stamp.st_mtime_ns))
    return tuple(found)


def extension_key(sources: Sequence[Path], flags: Sequence[str], with_cuda: bool) -> str:
    """Hash of everything that changes the binary (``sources`` includes the headers they include)."""
    digest = hashlib.sha256()
    for source in sorted(sources):
        digest.update(source.name.encode())
        digest.update(_source_hash(source))
    digest.update(" ".join(flags).encode())
    # The binary's interface: torch's exact build (its version and commit) and C++ ABI, Python's version.
    # Not the environment: two virtual environments with the same torch load the same binary, so they
    # share one build (a second environment imports it, :func:`_import_checked`, instead of building again).
    abi = getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", None)
    digest.update(f"{torch.__version__}|{torch.version.git_version}|abi={abi}|{sys.version_info[:2]}".encode())
    digest.update(f"cuda={with_cuda}".encode())
    digest.update(os.environ.get("CXX", "").encode())  # another compiler is another binary
    return digest.hexdigest()[:12]


def check_error_formatting(library: Path, timeout_s: float = 120.0) -> None:
    """Refuse a built extension whose error messages cannot name a bad value (see the module docstring).

    Runs the canary in a child process (a crash there must not take this one down) and
    checks that both messages, main thread and a second thread, carry the formatted
    integer and shape. Raises :class:`NativeBuildError` naming what went wrong.
    """
    expected = (f"value {_CHECK_VALUE}", f"shape [{_CHECK_VALUE}, 3]")
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHECK_SCRIPT, str(library), str(_CHECK_VALUE)],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise NativeBuildError(f"the error-formatting check of {library.name} hung for {timeout_s:.0f} s") from error
    hint = (
        "; this usually means the extension carries its own copy of libstdc++ (a compiler that links it "
        f"statically, CXX={os.environ.get('CXX', '<unset>')!r}); build with the system compiler, e.g. CXX=/usr/bin/g++"
    )
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        raise NativeBuildError(
            f"extension {library.name} crashes ({name}) when it formats an integer into an error message" + hint
        )
    if done.returncode != 0:
        raise NativeBuildError(f"the error-formatting check of {library.name} failed:\n{done.stderr.strip()}")
    lines = done.stdout.strip().splitlines()
    bad = [line for line in lines if not all(part in line for part in expected)]
    if len(lines) != 2 or bad:
        got = bad[0] if bad else done.stdout.strip()
        raise NativeBuildError(
            f"extension {library.name} loses numbers in its error messages (expected {expected[0]!r} and "
            f"{expected[1]!r}, got {got!r})" + hint
        )


def _library_seal(library: Path) -> str:
    """``"<size> <sha256>"`` of a built library: what its check stamp records, so a damaged copy is seen."""
    digest = hashlib.sha256()
    with open(library, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return f"{library.stat().st_size} {digest.hexdigest()}"


def _damaged(library: Path, sealed: str) -> str | None:
    """Why ``library`` is not the file its stamp sealed (``"<size> <sha256>"``), or None when it is.

    Importing a truncated shared library maps pages past its end and dies with a Bus error (not an
    exception) in every later process, so the size and hash are checked before any import.
    """
    size = sealed.partition(" ")[0]
    try:
        if library.stat().st_size != int(size):
            return f"{library.stat().st_size} bytes, its build had {size}"
        if _library_seal(library) != sealed:
            return "its bytes differ from its build's (sha256)"
    except (OSError, ValueError) as error:
        return f"it cannot be read ({error})"
    return None


def _import_checked(module_name: str, build_dir: Path) -> ModuleType | None:
    """The module of an earlier build of this key that passed :func:`check_error_formatting` (its stamp
    names the library, its size and sha256), imported as torch would import it; None when there is none,
    another process is building there (its lock), or the import fails (then the normal path builds or
    reports). A library that is not the one its stamp sealed (truncated, edited) is removed with one
    warning naming it, so the normal path links it again; where it cannot be removed (a read-only
    cache) :class:`NativeBuildError` names it: importing it would end the process with a Bus error.
    A stamp without a seal (an older specdec's) is sealed after the check ran again in a child."""
    stamp = build_dir / _CHECK_STAMP
    try:
        name, _, sealed = stamp.read_text().strip().partition("\n")
    except OSError:
        return None
    library = build_dir / name
    if library.parent != build_dir or not library.is_file() or (build_dir / "lock").exists():
        return None
    if not sealed:  # a stamp of an older specdec: check the library in a child (a crash ends it), then seal it
        try:
            check_error_formatting(library)
        except NativeBuildError:
            return None  # the normal path builds (or reports) it
        with contextlib.suppress(OSError):  # a read-only cache: checked again by the next process
            stamp.write_text(f"{library.name}\n{_library_seal(library)}\n")
    problem = _damaged(library, sealed) if sealed else None
    if problem is not None:
        try:
            stamp.unlink(missing_ok=True)  # another process may have removed them first
            library.unlink(missing_ok=True)
        except OSError as error:
            raise NativeBuildError(
                f"the built extension {library} is damaged ({problem}) and cannot be removed "
                f"({error.strerror or error}): delete {build_dir} (`specdec cache clear extensions`)"
            ) from error
        warnings.warn(f"specdec: the built extension {library} is damaged ({problem}); building it again",
                      RuntimeWarning, stacklevel=3)  # fmt: skip
        return None
    spec = importlib.util.spec_from_file_location(module_name, library)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (ImportError, OSError):
        return None
    return module


def _checked(module: ModuleType, build_dir: Path) -> None:
    """Run :func:`check_error_formatting` on a freshly built (or not yet checked) binary; stamp the verdict
    with the library's name, size and sha256 (:func:`_import_checked` checks them before a later import)."""
    stamp = build_dir / _CHECK_STAMP
    library = Path(str(module.__file__))
    if stamp.is_file() and stamp.read_text().strip().partition("\n")[2] == _library_seal(library):
        return
    check_error_formatting(library)
    stamp.write_text(f"{library.name}\n{_library_seal(library)}\n")


# torch's build lock (``<build dir>/lock``, a FileBaton) is left behind when a process is killed mid-build,
# and every later process would wait on it forever. A build takes about a minute here (tens of minutes on
# nothing we know of), so a lock this old is a killed build's.
STALE_LOCK_S = 15 * 60.0


def wait_for_build_lock(build_dir: Path, name: str, poll_s: float = 1.0) -> None:
    """Return once ``build_dir`` holds no build lock: another process's build finished, or its lock was stale.

    A lock is waited on (one message on stderr) until it goes or is :data:`STALE_LOCK_S` old; a stale one
    is removed with a warning that names it, so a build killed earlier costs a later process at most
    that long instead of a hang.
    """
    lock = build_dir / "lock"
    said = False
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if age >= STALE_LOCK_S:
            warnings.warn(
                f"specdec: extension {name!r}: removing a build lock {age / 60:.0f} minutes old ({lock}), left by "
                "a build that was killed; proceeding",
                RuntimeWarning,
                stacklevel=3,
            )
            lock.unlink(missing_ok=True)
            return
        if not said:
            print(
                f"specdec: extension {name!r}: waiting for another process's build (lock {lock}, {age:.0f} s old; "
                f"one older than {STALE_LOCK_S / 60:.0f} minutes is taken for a killed build's and removed)",
                file=sys.stderr,
            )
            said = True
        time.sleep(poll_s)


def load_extension(
    name: str,
    sources: Sequence[str | os.PathLike[str]],
    *,
    extra_cflags: Sequence[str] = ("-O3",),
    extra_cuda_cflags: Sequence[str] = ("-O3",),
    extra_ldflags: Sequence[str] = (),
    with_cuda: bool = False,
    verbose: bool = False,
    depends: Sequence[str | os.PathLike[str]] = (),
) -> ModuleType:
    """Build (once) and import the extension ``name`` from ``sources``.

    The first build takes tens of seconds; later calls in the same process return the
    loaded module, and later processes load the cached binary in milliseconds.
    ``depends`` lists files the sources include (headers): not compiled, but hashed into
    the cache key, so editing a header also gives a fresh build. ``extra_ldflags`` come after
    :data:`HARDENING_LDFLAGS`, which every build gets. A fresh build is checked in a child
    process (:func:`check_error_formatting`) before it is used.
    """
    call = (name, tuple(os.fspath(s) for s in sources), tuple(os.fspath(d) for d in depends), tuple(extra_cflags),
            tuple(extra_cuda_cflags), tuple(extra_ldflags), with_cuda,
            os.environ.get("CXX", ""), os.getcwd())  # fmt: skip
    known = _CALLS.get(call)
    if known is not None:  # asked before in this process: the same module while its files are unchanged
        module_name, files, stamps = known
        if _stamps(files) == stamps and module_name in _LOADED:
            return _LOADED[module_name]
    paths = [Path(s).resolve() for s in (*sources, FORMAT_CHECK_SOURCE)]
    headers = [Path(s).resolve() for s in depends]
    missing = [str(p) for p in paths + headers if not p.is_file()]
    if missing:
        raise NativeBuildError(f"extension {name!r}: source files missing: {', '.join(missing)}")
    ldflags = [*HARDENING_LDFLAGS, *extra_ldflags]
    flags = [*extra_cflags, *(extra_cuda_cflags if with_cuda else ()), *ldflags]
    stamps = _stamps(paths + headers)  # before the key: a file edited meanwhile is seen at the next call
    key = extension_key(paths + headers, flags, with_cuda)
    module_name = f"specdec_{name}_{key}"
    _CALLS[call] = (module_name, paths + headers, stamps)
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
        build_dir = folder("extensions") / f"{name}-{key}"
        checked = _import_checked(module_name, build_dir)
        if checked is not None:
            _LOADED[module_name] = checked
            return checked
        try:
            build_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # a NativeBuildError: callers with a fallback (torch's ops) take it
            raise NativeBuildError(
                f"extension {name!r}: cannot make its build folder {build_dir} ({error.strerror or error}); "
                "set SPECDEC_EXTENSIONS_DIR to a writable folder"
            ) from error
        wait_for_build_lock(build_dir, name)
        # Another process (perhaps another environment, whose paths ninja's build file names) may have built
        # and checked it meanwhile: import that rather than let ninja see other paths and build again.
        checked = _import_checked(module_name, build_dir)
        if checked is not None:
            _LOADED[module_name] = checked
            return checked
        output = io.StringIO()
        started = time.perf_counter()
        print(f"specdec: building the C++ extension {name!r} (first use of these sources on this machine; later "
              f"runs load it from {build_dir}) ...", file=sys.stderr, flush=True)
        try:
            # torch prints compiler output to stdout/stderr; keep it for the error message.
            # Imported here, not at the top: it imports setuptools (~35-120 ms), which a process
            # that finds its builds checked and cached (every run after the first) never needs.
            from torch.utils import cpp_extension

            with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
                module: ModuleType = cpp_extension.load(
                    name=module_name,
                    sources=[str(p) for p in paths],
                    extra_cflags=list(extra_cflags),
                    extra_cuda_cflags=list(extra_cuda_cflags) if with_cuda else None,
                    extra_ldflags=ldflags,
                    build_directory=str(build_dir),
                    with_cuda=with_cuda,
                    verbose=verbose,
                )
        except Exception as error:  # compiler, linker or import failure: report it whole
            log = output.getvalue().strip()
            raise NativeBuildError(
                f"building extension {name!r} failed: {error}" + (f"\n--- build output ---\n{log}" if log else "")
            ) from error
        _checked(module, build_dir)
        print(f"specdec: built {name!r} in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        _LOADED[module_name] = module
        return module


_META_LIBRARIES: dict[str, torch.library.Library] = {}  # namespace -> the Library of its Meta kernels (kept alive)


def register_meta(qualname: str, function: Callable[..., Any]) -> None:
    """``function`` as the Meta kernel of the op ``qualname`` (``"namespace::name"``), once its extension loaded.

    The Meta kernel is what FakeTensor tracing (``torch.compile``, ``torch.library.opcheck``) runs
    to learn an op's output shapes, and what a call with a meta tensor runs. Why not
    ``torch.library.register_fake``, which does the same: each call looks up its caller's source
    line with ``inspect``, whose first use in a process walks the path of every loaded module
    (~1,000 with torch and transformers). That cost fell inside the first ``specdec.run`` of every
    fresh process. With this change and the lazy import of ``torch.utils.cpp_extension`` (see
    :func:`load_extension`), that first ``run`` spends less time outside its generation.
    """
    namespace, name = qualname.split("::")
    library = _META_LIBRARIES.get(namespace)
    if library is None:
        library = _META_LIBRARIES[namespace] = torch.library.Library(namespace, "IMPL")  # type: ignore[no-untyped-call]
    library.impl(name, function, "Meta")  # type: ignore[no-untyped-call]
