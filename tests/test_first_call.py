"""What every ``Generator`` build asks, made cheap without changing the answer (issue 30).

A ``specdec.run`` call builds a Generator: it names the model (a weights fingerprint), the
device (the CPU's model name) and loads the compiled extensions (six ``load_extension`` calls).
Each of these has a fast path now; each test here checks that the fast path gives exactly what
the slow one gave, and that the slow one is still taken when the answer may have changed.
"""

from __future__ import annotations

import copy
import platform
import types
from pathlib import Path

import pytest
import torch
from conftest import use_private_cache
from tiny_models import tiny_model

from specdec import native
from specdec.backends import identity
from specdec.native import NativeBuildError


def torch_fingerprint(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> str:
    """The fingerprint through the torch ops alone, as every fingerprint was computed before the NumPy path."""
    with monkeypatch.context() as patch:
        patch.setattr(identity, "_NUMPY_DTYPES", frozenset())
        return identity._weights_fingerprint(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_fingerprint_fast_path_gives_the_saved_keys(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fingerprint keys saved planner statistics and recycling matrices: the NumPy path must give
    the torch path's digest bit for bit (bfloat16, which NumPy lacks, takes the torch path)."""
    model = copy.deepcopy(tiny_model("llama")).to(dtype)  # tiny_model is cached: not in place
    assert identity._weights_fingerprint(model) == torch_fingerprint(model, monkeypatch)


def test_fingerprint_samples_match_on_odd_tensors() -> None:
    """Non-contiguous, integer, boolean, scalar and tiny tensors: the same bytes either way."""
    generator = torch.Generator().manual_seed(0)
    cases = [
        torch.randn(37, 53, generator=generator).t(),  # not contiguous: the torch path
        torch.randn(1000, generator=generator)[::3],
        torch.randint(-(2**40), 2**40, (999,), generator=generator),
        torch.randint(0, 2, (130,), generator=generator).bool(),
        torch.tensor(3.5),
        torch.randn(5, generator=generator).half(),
        torch.randn(10_000, generator=generator, dtype=torch.float64),
        torch._neg_view(torch.randn(300, generator=generator)),  # a negative-bit view: NumPy cannot share it
    ]
    for tensor in cases:
        flat = tensor.reshape(-1)
        step = max(1, flat.numel() // 64)
        expected = flat[::step][:64].to(torch.float64).numpy().tobytes()
        assert identity._samples(tensor) == expected, tensor.dtype


def test_fingerprint_tells_checkpoints_apart() -> None:
    first = tiny_model("llama")
    second = copy.deepcopy(first)
    with torch.no_grad():
        second.lm_head.weight[0, 0] += 1.0  # the first value of a tensor is always sampled
    assert identity._weights_fingerprint(first) != identity._weights_fingerprint(second)


def test_cpu_name_reads_cpuinfo_without_a_child_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """``platform.processor()`` runs ``uname -p`` in a child process on Linux (~1.5 ms a Generator):
    with a model name in /proc/cpuinfo it is not asked, and the name is the one it always was."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    if not names:
        pytest.skip("no model name in /proc/cpuinfo here")

    def no_child(*args: object) -> str:
        raise AssertionError("platform.processor was asked")

    monkeypatch.setattr(platform, "processor", no_child)
    identity._cpu_name.cache_clear()
    try:
        assert identity.device_name(torch.device("cpu")) == f"cpu:{names[0]}"
    finally:
        identity._cpu_name.cache_clear()


def test_cpu_name_falls_back_without_cpuinfo(monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = open

    def no_cpuinfo(path: object, *args: object, **kwargs: object) -> object:
        if str(path) == "/proc/cpuinfo":
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", no_cpuinfo)
    monkeypatch.setattr(platform, "processor", lambda: "some-cpu")
    identity._cpu_name.cache_clear()
    try:
        assert identity.device_name(torch.device("cpu")) == "cpu:some-cpu"
    finally:
        identity._cpu_name.cache_clear()


@pytest.fixture
def fake_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``load_extension`` with torch's build pass and the binary check replaced by fakes (no compiler):
    the list records the module names torch was asked to build."""
    from torch.utils import cpp_extension

    built: list[str] = []

    def fake_load(name: str, **kwargs: object) -> types.ModuleType:
        built.append(name)
        module = types.ModuleType(name)
        module.__file__ = str(tmp_path / f"{name}.so")
        return module

    use_private_cache(monkeypatch, tmp_path / "cache")
    monkeypatch.setattr(cpp_extension, "load", fake_load)
    monkeypatch.setattr(native, "_checked", lambda module, build_dir: None)
    monkeypatch.setattr(native, "_LOADED", {})
    monkeypatch.setattr(native, "_CALLS", {})
    return built


def test_a_repeated_load_skips_resolving_and_hashing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_builds: list[str]
) -> None:
    source = tmp_path / "ops.cpp"
    source.write_text("// ops\n")
    first = native.load_extension("ops", [source])
    assert fake_builds == [first.__name__]

    def no_key(*args: object, **kwargs: object) -> str:
        raise AssertionError("the key was computed again")

    monkeypatch.setattr(native, "extension_key", no_key)
    assert native.load_extension("ops", [source]) is first
    assert native.load_extension("ops", [str(source)]) is first  # a str names the same file, another call key
    assert fake_builds == [first.__name__]  # built once


def test_a_build_says_what_it_builds_and_how_long_it_took(
    tmp_path: Path, fake_builds: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "ops.cpp"
    source.write_text("// ops\n")
    native.load_extension("ops", [source])
    said = capsys.readouterr().err
    assert "building the C++ extension 'ops'" in said and "later runs load it from" in said
    assert "built 'ops' in" in said
    native.load_extension("ops", [source])  # loaded: nothing to say
    assert capsys.readouterr().err == ""


def test_an_edited_source_still_meets_the_stale_build_check(tmp_path: Path, fake_builds: list[str]) -> None:
    """The fast path holds only while every file keeps its size and modification time: an edit takes
    the full path, whose key changes, and a second build of a loaded extension is refused as before."""
    source = tmp_path / "ops.cpp"
    source.write_text("// ops\n")
    native.load_extension("ops", [source])
    source.write_text("// ops, edited under a running process\n")
    with pytest.raises(NativeBuildError, match="already loaded another build"):
        native.load_extension("ops", [source])


def test_a_deleted_source_is_reported_not_served(tmp_path: Path, fake_builds: list[str]) -> None:
    source = tmp_path / "ops.cpp"
    source.write_text("// ops\n")
    native.load_extension("ops", [source])
    source.unlink()
    with pytest.raises(NativeBuildError, match="source files missing"):
        native.load_extension("ops", [source])
