"""Token Recycling's matrix shared per model and kept across processes (specdec.drafters.recycling_state).

On tiny fp64 models, learned state on in a private cache directory (the ``planner_cache``
fixture, with a synthetic calibration). A "later process" is this one after
:func:`forget_shared`: nothing of the matrix is left in memory, only the file. Every run is
also compared with plain greedy decoding: a shared, loaded or rejected matrix changes drafts,
never tokens.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import IDENTITY_COUNTS
from test_lossless import hf_greedy
from tiny_models import VOCAB, tiny_model

import specdec
from specdec.drafters.recycling import RecyclingDrafter
from specdec.drafters.recycling_state import _SHARED, FORMAT, UNKNOWN, VERSION, forget_shared, matrix_path

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]
NEW_TOKENS = 24
# Nothing that needs a native extension (the torch backend, the dynamic cache, no sam): a private cache
# directory would build each again (minutes).
Generator = functools.partial(specdec.Generator, tree_ops="torch", engine="hf", budget="full")


def known_rows(drafter: Any) -> int:
    assert isinstance(drafter, RecyclingDrafter)
    return int((drafter.matrix[:, 0] != UNKNOWN).sum())


def generate(generator: Any, prompt: list[int] = PROMPT) -> list[int]:
    tokens: list[int] = generator.generate(prompt, max_new_tokens=NEW_TOKENS).tokens
    assert tokens == hf_greedy(generator.model, prompt, NEW_TOKENS)
    IDENTITY_COUNTS["llama/recycling (shared or saved matrix)"] += 1
    return tokens


@contextmanager
def matrix_warnings() -> Iterator[list[str]]:
    """The warnings about saved matrices that the block gives."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        messages: list[str] = []
        yield messages
    messages.extend(str(w.message) for w in caught if "Token Recycling matrix" in str(w.message))


def saved_files(root: Path) -> list[Path]:
    return sorted((root / "recycling").glob("*.npz"))


def test_generators_of_one_model_share_the_matrix(planner_cache: Path) -> None:
    model = tiny_model("llama")
    first, second = Generator(model, drafter="recycling"), Generator(model, drafter="recycling")
    drafter = first.new_drafter()
    assert isinstance(drafter, RecyclingDrafter) and drafter.state is second.new_drafter().state
    assert known_rows(drafter) == 0
    generate(first)
    learned = known_rows(second.new_drafter())  # what the first generator learned, the second drafts with
    assert learned > 0
    # A composite's recycling part and run() share it too; another k is another matrix.
    generate(Generator(model, drafter="pld+recycling"))
    assert len(_SHARED) == 1 and known_rows(second.new_drafter()) >= learned
    other_k = Generator(model, drafter="recycling", drafter_options={"k": 10}).new_drafter()
    assert isinstance(other_k, RecyclingDrafter) and other_k.state is not drafter.state and known_rows(other_k) == 0
    # Another model does not see it.
    assert known_rows(Generator(tiny_model("llama", seed=1), drafter="recycling").new_drafter()) == 0


def test_a_later_process_loads_the_saved_matrix(planner_cache: Path) -> None:
    model = tiny_model("llama")
    generate(Generator(model, drafter="recycling"))
    (path,) = saved_files(planner_cache.parent)
    saved = Generator(model, drafter="recycling").new_drafter()
    expected = np.array(saved.matrix)
    forget_shared()  # a new process: nothing in memory
    loaded = Generator(model, drafter="recycling").new_drafter()
    assert loaded.state is not saved.state and np.array_equal(loaded.matrix[:VOCAB], expected[:VOCAB])
    assert known_rows(loaded) > 0
    with np.load(path) as data:
        meta = json.loads(bytes(data["meta"]).decode())
    assert (meta["format"], meta["version"]) == (FORMAT, VERSION) and meta["identity"]["vocab_size"] == str(VOCAB)


def test_an_unchanged_matrix_is_not_written_again(planner_cache: Path) -> None:
    model = tiny_model("llama")
    generator = Generator(model, drafter="recycling")
    generate(generator)
    (path,) = saved_files(planner_cache.parent)
    path.write_bytes(b"a marker that a save would replace")
    generator.context.recycling.save()  # no rows changed since the last save
    assert path.read_bytes() == b"a marker that a save would replace"


def _corrupt(path: Path, case: str) -> None:
    """Turn the valid saved matrix at ``path`` into a bad one of kind ``case``."""
    with np.load(path) as data:
        matrix = np.array(data["matrix"])
        meta = json.loads(bytes(data["meta"]).decode())
    if case == "truncated":
        path.write_bytes(path.read_bytes()[:100])
        return
    if case == "not a zip":
        path.write_bytes(b"\x00\x01 definitely not numpy")
        return
    if case == "another version":
        meta["version"] = VERSION + 1
    elif case == "another model":
        meta["identity"] = dict(meta["identity"], weights="0" * 16)
    elif case == "wrong shape":
        matrix = matrix[:, :1].copy()
    elif case == "ids past the vocabulary":
        matrix[0, 0] = VOCAB + 5
    elif case == "floats":
        matrix = matrix.astype(np.float32)
    with path.open("wb") as out:
        np.savez(out, matrix=matrix, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))


BAD = ["truncated", "not a zip", "another version", "another model", "wrong shape", "ids past the vocabulary",
       "floats"]  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_a_bad_file_warns_once_and_starts_fresh(planner_cache: Path, case: str) -> None:
    model = tiny_model("llama")
    generate(Generator(model, drafter="recycling"))
    (path,) = saved_files(planner_cache.parent)
    _corrupt(path, case)
    forget_shared()
    with matrix_warnings() as messages:
        generator = Generator(model, drafter="recycling")
        drafter = generator.new_drafter()
        assert known_rows(drafter) == 0  # a fresh matrix
        generate(generator)
        Generator(model, drafter="pld+recycling").new_drafter()  # the shared matrix: not read again
    assert len(messages) == 1 and str(path) in messages[0] and "starting afresh" in messages[0], messages
    # The next save replaced it with a good file: a later process loads it without a word.
    forget_shared()
    with matrix_warnings() as messages:
        assert known_rows(Generator(model, drafter="recycling").new_drafter()) > 0
    assert not messages


def test_planner_cache_off_neither_reads_nor_writes(planner_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model("llama")
    generate(Generator(model, drafter="recycling"))
    (path,) = saved_files(planner_cache.parent)
    before = path.read_bytes()
    assert known_rows(Generator(model, drafter="recycling").new_drafter()) > 0  # on: loaded and shared
    forget_shared()
    off = Generator(model, drafter="recycling", planner_cache=False)
    assert known_rows(off.new_drafter()) == 0 and not _SHARED  # not loaded, not registered for others
    generate(off, [7, 7, 1, 2, 7, 7, 1, 2, 9, 9])
    assert not _SHARED and path.read_bytes() == before and saved_files(planner_cache.parent) == [path]
    assert known_rows(off.new_drafter()) == 0  # a matrix of its own per sequence
    # An unreadable file is never even opened, with the option or the environment switch.
    path.write_bytes(b"garbage that a read would warn about")
    with matrix_warnings() as messages:
        with Generator(model, drafter="recycling", planner_cache=False) as generator:
            generator.generate(PROMPT, max_new_tokens=4)
        monkeypatch.setenv("SPECDEC_PLANNER_CACHE", "0")
        with Generator(model, drafter="recycling") as generator:
            generator.generate(PROMPT, max_new_tokens=4)
    assert not messages and not _SHARED and path.read_bytes() == b"garbage that a read would warn about"


def test_the_file_is_named_by_identity(planner_cache: Path) -> None:
    identity = {"weights": "abc", "vocab_size": "10", "k": "2"}
    assert matrix_path(identity) == matrix_path(dict(reversed(list(identity.items()))))  # order-free
    assert matrix_path(identity) != matrix_path(dict(identity, k="4"))
    assert matrix_path(identity).parent == planner_cache.parent / "recycling"
