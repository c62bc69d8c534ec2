"""Compiled static-cache forwards kept on disk for later processes (specdec.backends.buckets.compile_cache, issue 30).

Each test points ``SPECDEC_COMPILED_DIR`` at a folder of its own. What torch stores and
reads is inductor's business; what is tested here is specdec's part: where it goes, that a
folder made for another torch or CPU or with a damaged seal is emptied with one warning, that
a compile failing on what the folder held is retried without it (one warning, plain greedy
tokens), ``specdec compile`` and ``specdec cache``. One test compiles for real (one bucket,
cold, then again from the folder, then from a corrupted folder) and counts inductor's cache
hits; the others replace the compiler by the eager forward (``bucket_forward.compile_forward``).
"""

from __future__ import annotations

import copy
import json
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_lossless import hf_greedy, random_prompt
from tiny_models import tiny_model
from torch._dynamo.utils import counters

import specdec
from specdec import cachefiles
from specdec.backends.buckets import compile_cache, sizes
from specdec.backends.buckets import forward as bucket_forward
from specdec.commands import main, precompile


@pytest.fixture
def compiled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private compiled folder for the test, and this process's activation forgotten before and after."""
    monkeypatch.setenv("SPECDEC_COMPILED_DIR", str(tmp_path / "compiled"))
    monkeypatch.delenv(compile_cache.INDUCTOR_ENV, raising=False)
    compile_cache.reset_for_tests()
    yield tmp_path / "compiled"
    compile_cache.reset_for_tests()


def messages(recwarn: pytest.WarningsRecorder) -> list[str]:
    return [str(w.message) for w in recwarn.list if "engine='compiled'" in str(w.message)]


def private_model(seed: int = 0) -> Any:
    return copy.deepcopy(tiny_model("llama", seed=seed))


def seal(path: Path, identity: dict[str, str], *, checksum: str | None = None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    document = {"identity": identity, "checksum": checksum or cachefiles.checksum(identity)}
    (path / compile_cache.KEY_FILE).write_text(json.dumps(document), encoding="utf-8")


def test_activate_seals_a_folder_per_identity_and_points_inductor_there(compiled: Path) -> None:
    path = compile_cache.activate()
    assert path == compile_cache.folder() and path.parent == compiled and path.name == compile_cache.key()
    assert os.environ[compile_cache.INDUCTOR_ENV] == str(path)
    assert compile_cache.problem(path, compile_cache.identity()) is None
    assert compile_cache.activate() == path  # once per process
    assert compile_cache.describe(path)["usable"] and compile_cache.describe(path)["torch"] == torch.__version__


def test_a_folder_the_user_chose_is_left_alone(compiled: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(compile_cache.INDUCTOR_ENV, str(tmp_path / "mine"))
    assert compile_cache.activate() is None
    assert os.environ[compile_cache.INDUCTOR_ENV] == str(tmp_path / "mine") and not compiled.exists()


def stale_torch(identity: dict[str, str]) -> dict[str, str]:
    return {**identity, "torch": "2.4.0"}


BAD_SEALS: dict[str, tuple[Callable[[Path], None], str]] = {
    "unparsable": (lambda p: (p / compile_cache.KEY_FILE).write_text("{not json", encoding="utf-8"), "does not parse"),
    "bad checksum": (lambda p: seal(p, compile_cache.identity(), checksum="0" * 64), "fails its checksum"),
    "stale torch": (lambda p: seal(p, stale_torch(compile_cache.identity())), "made for torch '2.4.0'"),
    "foreign cpu": (lambda p: seal(p, {**compile_cache.identity(), "capability": "NEON"}), "capability 'NEON'"),
    "no seal": (lambda p: (p / compile_cache.KEY_FILE).unlink(), "no key.json"),
}


@pytest.mark.parametrize("case", sorted(BAD_SEALS))
def test_a_folder_with_a_bad_seal_is_emptied_with_one_warning(
    case: str, compiled: Path, recwarn: pytest.WarningsRecorder
) -> None:
    path = compiled / compile_cache.key()
    seal(path, compile_cache.identity())
    (path / "fxgraph").mkdir()
    (path / "fxgraph" / "entry").write_bytes(b"compiled code of another torch")
    damage, why = BAD_SEALS[case]
    damage(path)
    assert compile_cache.activate() == path
    (message,) = messages(recwarn)
    assert why in message and "compiling again" in message
    assert sorted(p.name for p in path.iterdir()) == [compile_cache.KEY_FILE]  # emptied, sealed anew
    assert compile_cache.problem(path, compile_cache.identity()) is None


def test_another_torchs_folder_is_never_used_and_cache_clear_removes_both(
    compiled: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = compile_cache.identity()
    monkeypatch.setattr(compile_cache, "identity", lambda: stale_torch(real))
    old = compile_cache.activate()
    compile_cache.reset_for_tests()
    monkeypatch.setattr(compile_cache, "identity", lambda: real)
    new = compile_cache.activate()
    assert old is not None and new is not None and old != new  # another key: another folder
    assert not compile_cache.describe(old)["usable"] and compile_cache.describe(new)["usable"]
    (row,) = cachefiles.clear(["compiled"])
    assert row["entries"] == 2 and not any(compiled.iterdir())


def fails_once() -> tuple[Callable[..., Any], list[int]]:
    """A stand-in compiler whose first function fails like a load of a damaged entry; later ones are eager."""
    built: list[int] = []

    def compile_forward(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        built.append(1)
        if len(built) > 1:
            return function

        def broken(*args: Any) -> torch.Tensor:
            raise RuntimeError("could not load the compiled module: invalid ELF header")

        return broken

    return compile_forward, built


def test_a_compile_that_fails_on_the_folder_empties_it_and_compiles_again(
    compiled: Path, monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder
) -> None:
    compile_forward, built = fails_once()
    monkeypatch.setattr(bucket_forward, "compile_forward", compile_forward)
    path = compile_cache.activate()
    assert path is not None
    (path / "damaged.so").write_bytes(b"garbage")
    model = private_model(seed=3)
    prompt = random_prompt(random.Random(3))[:12]
    generator = specdec.Generator(model, drafter="none", engine="compiled", budget="full")
    assert generator.generate(prompt, max_new_tokens=10).tokens == hf_greedy(model, prompt, 10)
    (message,) = messages(recwarn)  # no fallback to eager: the retry compiled
    assert "failed (RuntimeError: could not load" in message and "compiling again" in message
    assert len(built) == 2 and generator.verifier.forward._runners[1].mode == "inductor"
    assert sorted(p.name for p in path.iterdir()) == [compile_cache.KEY_FILE]
    # Once per process: a second failure falls back to eager forwards (the warning says so).
    monkeypatch.setattr(bucket_forward, "compile_forward", fails_once()[0])
    other = private_model(seed=4)
    generator = specdec.Generator(other, drafter="none", engine="compiled", budget="full")
    assert generator.generate(prompt, max_new_tokens=10).tokens == hf_greedy(other, prompt, 10)
    assert "are not possible for this model" in messages(recwarn)[-1] and len(messages(recwarn)) == 2


@pytest.mark.slow  # inductor compiles cold on purpose (~35 s on a 2-core CPU)
def test_a_later_compile_reads_the_folder_and_a_corrupted_one_compiles_again(compiled: Path) -> None:
    """For real: one bucket compiled cold, then by a new model object (what a later process does: its
    own trace, inductor's code read from the folder), then from a folder whose entries are garbage.
    The tiny models are fp64: fp32 weights are prepacked for oneDNN, and inductor stores no graph
    holding those (docs/static-cache.md)."""
    prompt = random_prompt(random.Random(30))[:12]
    options: dict[str, Any] = {"max_new_tokens": 8, "engine": "compiled", "budget": "full"}

    def run(seed: int) -> tuple[int, int]:
        hits, misses = counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]
        model = private_model(seed)
        assert specdec.run(model, prompt, "none", **options).tokens == hf_greedy(model, prompt, 8)
        return counters["inductor"]["fxgraph_cache_hit"] - hits, counters["inductor"]["fxgraph_cache_miss"] - misses

    assert run(seed=5) == (0, 1)  # cold: compiled and stored
    entries = list((compiled / compile_cache.key() / "fxgraph").rglob("*"))
    assert any(p.is_file() for p in entries)
    assert run(seed=6) == (1, 0)  # other weights, same architecture: the stored graph, bound to these weights
    for entry in entries:
        if entry.is_file():
            entry.write_bytes(b"garbage")
    assert run(seed=7) == (0, 1)  # unreadable: compiled again (torch logs it), the right tokens


def test_the_compile_command_builds_every_bucket_and_says_where(
    compiled: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    built: list[int] = []

    def compile_forward(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        built.append(1)
        return function

    monkeypatch.setattr(bucket_forward, "compile_forward", compile_forward)
    model = private_model(seed=8)
    monkeypatch.setattr(precompile, "Generator", lambda name, **kw: specdec.Generator(model, **kw))
    assert main(["compile", "--quiet", "--drafter", "pld", "--engine", "compiled"]) == 0
    out = capsys.readouterr().out
    buckets = sizes.BUCKETS
    assert f"compiled {len(buckets)} buckets" in out and "peak memory" in out
    assert f"stored in {compile_cache.folder()}" in out and len(built) == len(buckets)
    assert main(["compile", "--max-tokens", "0"]) == 2


def test_the_compile_command_on_a_cpu_llama_builds_the_native_kernels_and_compiles_no_bucket(
    compiled: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """engine="auto" on a CPU runs specdec's own forward for the Llama family: nothing for inductor to do."""
    built: list[int] = []
    monkeypatch.setattr(bucket_forward, "compile_forward", lambda function: built.append(1) or function)
    model = private_model(seed=8)
    monkeypatch.setattr(precompile, "Generator", lambda name, **kw: specdec.Generator(model, **kw))
    assert main(["compile", "--quiet", "--drafter", "pld"]) == 0
    out = capsys.readouterr().out
    assert "engine 'specdec' (specdec's own forward) here" in out and "nothing else to compile" in out and not built
