"""The datastore container: round trip, and a clear error for every kind of bad file."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from specdec.cachefiles import TokenizerIdentity
from specdec.datastores.corpus_reader import iter_texts, tokenize_documents
from specdec.datastores.format import CONTAINER_VERSION, read_datastore, read_header, write_datastore
from specdec.errors import DatastoreError, SpecDecError

IDENTITY = TokenizerIdentity("abc123", 1000, "tok-a")
OTHER = TokenizerIdentity("def456", 1000, "tok-b")


def make(tmp_path: Path, **changes: object) -> Path:
    arrays = {"tokens": np.arange(1000, dtype=np.uint32), "offsets": np.array([0, 10, 1000], dtype=np.int64),
              "empty": np.zeros(0, dtype=np.int32)}
    kwargs = dict(kind="demo", kind_version=2, tokenizer=IDENTITY, arrays=arrays, meta={"documents": 2})
    kwargs.update(changes)
    return write_datastore(tmp_path / "store.bin", **kwargs)  # type: ignore[arg-type]


def test_round_trip(tmp_path: Path) -> None:
    path = make(tmp_path)
    store = read_datastore(path, kind="demo", supported_versions=(1, 2), tokenizer=IDENTITY)
    assert store.meta == {"documents": 2}
    assert store.tokenizer == IDENTITY
    np.testing.assert_array_equal(store["tokens"], np.arange(1000, dtype=np.uint32))
    assert store["offsets"].tolist() == [0, 10, 1000]
    assert store["empty"].shape == (0,)
    assert isinstance(store["tokens"], np.memmap)
    assert all(s["offset"] % 64 == 0 for s in read_header(path)["sections"])


def test_not_a_datastore(tmp_path: Path) -> None:
    path = tmp_path / "x.bin"
    path.write_bytes(b"hello world, this is not it" * 3)
    with pytest.raises(DatastoreError, match="not a specdec datastore"):
        read_datastore(path, kind="demo", supported_versions=(2,))
    with pytest.raises(DatastoreError, match="no datastore file"):
        read_datastore(tmp_path / "missing.bin", kind="demo", supported_versions=(2,))


def test_wrong_kind_and_versions(tmp_path: Path) -> None:
    path = make(tmp_path)
    with pytest.raises(DatastoreError, match="is a 'demo' datastore, not 'rest'"):
        read_datastore(path, kind="rest", supported_versions=(2,))
    with pytest.raises(DatastoreError, match="version 2; this specdec reads versions 1: upgrade specdec"):
        read_datastore(path, kind="demo", supported_versions=(1,))
    with pytest.raises(DatastoreError, match="version 2; this specdec reads versions 3: rebuild it"):
        read_datastore(path, kind="demo", supported_versions=(3,))


def test_newer_container(tmp_path: Path) -> None:
    path = make(tmp_path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, CONTAINER_VERSION + 1)
    path.write_bytes(bytes(data))
    with pytest.raises(DatastoreError, match="newer than this specdec supports"):
        read_datastore(path, kind="demo", supported_versions=(2,))


def test_wrong_tokenizer_and_vocabulary(tmp_path: Path) -> None:
    path = make(tmp_path)
    with pytest.raises(DatastoreError, match="built with another tokenizer \\(tok-a.*tok-b"):
        read_datastore(path, kind="demo", supported_versions=(2,), tokenizer=OTHER)
    with pytest.raises(DatastoreError, match="past this model's vocabulary of 500"):
        read_datastore(path, kind="demo", supported_versions=(2,), vocab_size=500)


def test_truncated(tmp_path: Path) -> None:
    path = make(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(DatastoreError, match="truncated: section 'tokens'"):
        read_datastore(path, kind="demo", supported_versions=(2,))
    path.write_bytes(data[:40])
    with pytest.raises(DatastoreError, match="truncated: its header"):
        read_datastore(path, kind="demo", supported_versions=(2,))


def test_corrupt_payload_and_header(tmp_path: Path) -> None:
    path = make(tmp_path)
    data = bytearray(path.read_bytes())
    header = read_header(path)
    offset = next(s["offset"] for s in header["sections"] if s["name"] == "tokens")
    data[offset + 17] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DatastoreError, match="corrupt: section 'tokens' fails its checksum"):
        read_datastore(path, kind="demo", supported_versions=(2,))
    # verify=False skips the payload check (documented: the caller trades safety for load time)
    read_datastore(path, kind="demo", supported_versions=(2,), verify=False)
    data[30] ^= 0x01  # inside the JSON metadata
    path.write_bytes(bytes(data))
    with pytest.raises(DatastoreError, match="header checksum"):
        read_datastore(path, kind="demo", supported_versions=(2,))


def test_corpus_reading(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(json.dumps({"question": "q1", "answer": "a1"}) + "\n\n"
                                      + json.dumps({"question": "q2", "answer": "a2"}) + "\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("x = 1\n")
    (tmp_path / "src" / "skip.bin").write_text("binary")
    texts = list(iter_texts([tmp_path / "a.jsonl", tmp_path / "src"], fields=["question", "answer"]))
    assert texts == ["q1\na1", "q2\na2", "x = 1\n"]
    with pytest.raises(SpecDecError, match="no 'text' field; pick fields with --field"):
        list(iter_texts([tmp_path / "a.jsonl"]))
    with pytest.raises(SpecDecError, match="no field 'body'"):
        list(iter_texts([tmp_path / "a.jsonl"], fields=["body"]))
    with pytest.raises(SpecDecError, match="no such input"):
        list(iter_texts([tmp_path / "nope"]))

    class Chars:
        def __call__(self, texts: list[str], add_special_tokens: bool = False) -> dict[str, list[list[int]]]:
            return {"input_ids": [[ord(c) for c in t] for t in texts]}

    docs = tokenize_documents(Chars(), ["ab", "", "cde"], progress=False)
    assert [d.tolist() for d in docs] == [[97, 98], [99, 100, 101]]
    assert [d.tolist() for d in tokenize_documents(Chars(), ["ab", "cde"], max_tokens=3, progress=False)] == [
        [97, 98], [99]]
