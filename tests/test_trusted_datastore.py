"""Trusted stamps (specdec.datastores.trust): a datastore verified in full once loads without the CRC pass,
and a changed, truncated, replaced or corrupt file is still refused.

The size threshold and the racy-timestamp margin are lowered so small files exercise the
same code; the CRC pass is counted, not timed.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specdec.cachefiles import TokenizerIdentity
from specdec.datastores import format as format_module
from specdec.datastores import trust
from specdec.datastores.format import read_datastore, read_header, write_datastore
from specdec.errors import DatastoreError

IDENTITY = TokenizerIdentity("abc123", 5000, "tok")


@pytest.fixture
def stamps(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    """A private cache directory, every size stamped, no racy margin; the log of CRC calls."""
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(trust, "TRUST_MIN_BYTES", 0)
    monkeypatch.setattr(trust, "RACY_S", 0.0)
    calls: list[int] = []
    crc = format_module._crc

    def counted(array: Any) -> int:
        calls.append(int(array.nbytes))
        return crc(array)

    monkeypatch.setattr(format_module, "_crc", counted)
    return calls


def make(tmp_path: Path, first: int = 0) -> Path:
    arrays = {"tokens": np.arange(first, first + 4000, dtype=np.uint32), "offsets": np.array([0, 4000], dtype=np.int64)}
    return write_datastore(tmp_path / "store.bin", kind="demo", kind_version=1, tokenizer=IDENTITY, arrays=arrays)


def load(path: Path, verify: bool = True) -> Any:
    return read_datastore(path, kind="demo", supported_versions=(1,), tokenizer=IDENTITY, verify=verify)


def test_a_verified_file_loads_on_its_stamp_next_time(stamps: list[int], tmp_path: Path) -> None:
    path = make(tmp_path)
    stamps.clear()  # the writer computed the checksums too
    first = load(path)
    assert not first.trusted and len(stamps) == 2  # both sections checked in full
    assert trust.stamp_path(path.resolve()).is_file()
    stamps.clear()
    second = load(path)
    assert second.trusted and stamps == []  # no CRC pass
    assert second["tokens"].tolist() == first["tokens"].tolist()


def timestamps_moved(path: Path, before: os.stat_result) -> None:
    """Touch ``path`` until its modification and change times differ from ``before``'s.

    However coarse the file system's timestamps (1 s, 2 s), the change is then one a stamp can
    see; no fixed sleep is assumed to be long enough. Gives up, failing, after 10 s.
    """
    deadline = time.monotonic() + 10.0
    while True:
        now = path.stat()
        if now.st_mtime_ns != before.st_mtime_ns and now.st_ctime_ns != before.st_ctime_ns:
            return
        assert time.monotonic() < deadline, "the file system's timestamps did not move in 10 s"
        time.sleep(0.01)
        os.utime(path)  # modification and change time: now


def flip_in_place(path: Path) -> None:
    """Change one payload byte through the same inode, its timestamps moved on (:func:`timestamps_moved`)."""
    before = path.stat()
    offset = next(s["offset"] for s in read_header(path)["sections"] if s["name"] == "tokens")
    with open(path, "r+b") as handle:
        handle.seek(offset + 101)
        byte = handle.read(1)
        handle.seek(offset + 101)
        handle.write(bytes([byte[0] ^ 0xFF]))
    timestamps_moved(path, before)


def test_a_file_changed_in_place_is_verified_and_refused(stamps: list[int], tmp_path: Path) -> None:
    path = make(tmp_path)
    load(path)
    before = path.stat()
    flip_in_place(path)
    with pytest.raises(DatastoreError, match="corrupt: section 'tokens' fails its checksum"):
        load(path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # the modification time put back: the change time
    with pytest.raises(DatastoreError, match="corrupt: section 'tokens'"):  # cannot be, so still refused
        load(path)


def test_a_truncated_or_replaced_file_is_not_trusted(stamps: list[int], tmp_path: Path) -> None:
    path = make(tmp_path)
    load(path)
    data = path.read_bytes()
    before = path.stat()
    path.write_bytes(data[:-64])
    timestamps_moved(path, before)
    with pytest.raises(DatastoreError, match="truncated"):
        load(path)
    make(tmp_path, first=7)  # rebuilt: a new file (another inode) under the same name
    stamps.clear()
    rebuilt = load(path)
    assert not rebuilt.trusted and stamps and rebuilt["tokens"][0] == 7
    assert load(path).trusted  # and stamped again


def test_a_bad_stamp_warns_and_the_file_is_verified_in_full(stamps: list[int], tmp_path: Path) -> None:
    path = make(tmp_path)
    load(path)
    stamp = trust.stamp_path(path.resolve())
    text = stamp.read_text()
    for damage in ("{not json", text.replace('"size"', '"size_"')):
        stamp.write_text(damage)
        stamps.clear()
        with pytest.warns(RuntimeWarning, match="ignoring the (unreadable|corrupt or foreign) datastore stamp"):
            store = load(path)
        assert not store.trusted and stamps  # verified in full
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert load(path).trusted  # a good stamp was written again


def test_what_is_never_stamped(stamps: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make(tmp_path)
    load(path, verify=False)  # not verified: nothing to vouch for
    assert not trust.stamp_path(path.resolve()).exists()
    monkeypatch.setattr(trust, "RACY_S", 3600.0)  # written within the racy margin
    load(path)
    assert not trust.stamp_path(path.resolve()).exists()
    monkeypatch.setattr(trust, "RACY_S", 0.0)
    monkeypatch.setattr(trust, "TRUST_MIN_BYTES", 32 << 20)  # small files verify fast: no stamp
    load(path)
    assert not trust.stamp_path(path.resolve()).exists()


def test_the_environment_turns_stamps_off(stamps: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make(tmp_path)
    load(path)
    monkeypatch.setenv("SPECDEC_TRUST_STAMPS", "0")
    stamps.clear()
    store = load(path)
    assert not store.trusted and len(stamps) == 2  # read in full, as before stamps
    monkeypatch.setenv("SPECDEC_TRUST_STAMPS", "1")
    assert load(path).trusted
