"""The datastore file format shared by every persistent index (static automaton, REST).

One file, memory-mapped on load::

    offset 0   magic      8 bytes   b"SPECDEC\\x00"
    offset 8   container  u32 LE    CONTAINER_VERSION (this layout)
    offset 12  meta_len   u32 LE    length of the JSON metadata that follows
    offset 16  meta_crc   u32 LE    CRC-32 of the JSON metadata
    offset 20  reserved   u32
    offset 24  metadata   JSON      kind, kind_version, tokenizer identity, vocab size, sections, ...
    ...        sections   raw little-endian arrays, each starting on a 64-byte boundary

The metadata lists every section (name, dtype, shape, offset, byte length, CRC-32). A
reader checks, in order, and fails with :class:`DatastoreError` naming what is wrong:
the magic (not a datastore), the container version (newer than this code), the metadata
checksum, the kind and its version, the tokenizer identity and vocabulary size, every
section's entry (a numeric little-endian dtype, a shape of non-negative sizes whose bytes
are its length, and, where the kind says, the dtypes and axes it expects: :class:`Expected`),
that the file is long enough for every section (truncation), and (unless ``verify=False``)
every section's CRC-32 (corruption). A datastore never yields a draft it was not built for.
Every entry is checked before any section is mapped: a header is JSON anyone can write with
its CRC recomputed, and ``np.memmap`` of an ``object`` dtype turns file bytes into pointers
(a crash on first read), so nothing the header says is trusted until it has been checked.

Sections are mapped read-only with :func:`numpy.memmap`, so loading costs the checks and
page faults on first touch, not a copy; many sequences (and processes) share the pages.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from specdec.cachefiles import TokenizerIdentity, atomic_file
from specdec.datastores.trust import is_trusted, remember_verified
from specdec.errors import DatastoreError

MAGIC = b"SPECDEC\x00"
CONTAINER_VERSION = 1
_PREFIX = struct.Struct("<8sIIII")  # magic, container, meta_len, meta_crc, reserved
_ALIGN = 64
_CRC_BLOCK = 1 << 24  # bytes per crc32 call: bounded memory for huge sections


@dataclass(frozen=True)
class Section:
    """Where one array lives in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    crc32: int


@dataclass(frozen=True)
class Expected:
    """What a kind's section must be: one of ``dtypes`` (numpy dtype strings), ``ndim`` axes.

    ``what`` says it in words for the error (``"1-D little-endian unsigned ids"``).
    """

    dtypes: tuple[str, ...]
    what: str
    ndim: int = 1


# Numeric kinds a section may hold: bool, signed and unsigned integers, floats. Never
# objects (pointers), strings, structured or subarray dtypes.
_NUMERIC_KINDS = "biuf"


@dataclass
class Datastore:
    """A loaded datastore: its metadata and its sections as read-only memory maps."""

    path: Path
    kind: str
    kind_version: int
    tokenizer: TokenizerIdentity
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray[Any, Any]] = field(default_factory=dict)
    trusted: bool = False  # the CRC pass was skipped on a stamp of an earlier full verification (trust.py)

    def __getitem__(self, name: str) -> np.ndarray[Any, Any]:
        return self.arrays[name]

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays.values())


def _crc(array: npt.NDArray[Any]) -> int:
    view = np.ascontiguousarray(array).data.cast("B")
    crc = 0
    for start in range(0, len(view), _CRC_BLOCK):
        crc = zlib.crc32(view[start : start + _CRC_BLOCK], crc)
    return crc


def write_datastore(
    path: str | os.PathLike[str],
    *,
    kind: str,
    kind_version: int,
    tokenizer: TokenizerIdentity,
    arrays: Mapping[str, npt.NDArray[Any]],
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``arrays`` and metadata to ``path`` atomically (:func:`~specdec.cachefiles.atomic_file`)."""
    target = Path(path)
    prepared = {name: np.ascontiguousarray(array) for name, array in arrays.items()}
    for name, array in prepared.items():
        if array.dtype.byteorder == ">":
            raise DatastoreError(f"section {name!r} is big-endian; datastores are little-endian")

    def layout(data_start: int) -> list[Section]:
        sections, offset = [], data_start
        for name, array in prepared.items():
            offset = -(-offset // _ALIGN) * _ALIGN
            sections.append(Section(name, array.dtype.str, tuple(int(s) for s in array.shape), offset,
                                    int(array.nbytes), _crc(array)))
            offset += int(array.nbytes)
        return sections

    def metadata(sections: list[Section]) -> bytes:
        document = {
            "kind": kind,
            "kind_version": int(kind_version),
            "tokenizer": {"fingerprint": tokenizer.fingerprint, "vocab_size": tokenizer.vocab_size,
                          "name": tokenizer.name},
            "meta": dict(meta or {}),
            "sections": [s.__dict__ | {"shape": list(s.shape)} for s in sections],
        }
        return json.dumps(document, sort_keys=True).encode()

    # The metadata's length fixes where the data starts; offsets are padded numbers, so
    # iterate until the layout is stable (twice at most in practice).
    data_start = 0
    for _ in range(8):
        sections = layout(data_start)
        blob = metadata(sections)
        needed = -(-(_PREFIX.size + len(blob)) // _ALIGN) * _ALIGN
        if needed == data_start:
            break
        data_start = needed
    else:  # pragma: no cover - the layout converges in two rounds
        raise DatastoreError("could not lay out the datastore header")

    with atomic_file(target, binary=True) as out:
        out.write(_PREFIX.pack(MAGIC, CONTAINER_VERSION, len(blob), zlib.crc32(blob), 0))
        out.write(blob)
        for section, array in zip(sections, prepared.values(), strict=True):
            out.write(b"\x00" * (section.offset - out.tell()))
            out.write(array.data.cast("B"))
    return target


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The metadata of a datastore file, after the magic, version and metadata checks."""
    source = Path(path)
    if not source.is_file():
        raise DatastoreError(f"no datastore file at {str(source)!r}")
    with open(source, "rb") as handle:
        prefix = handle.read(_PREFIX.size)
        if len(prefix) < _PREFIX.size:
            raise DatastoreError(f"{source} is not a specdec datastore (only {len(prefix)} bytes)")
        magic, container, meta_len, meta_crc, _ = _PREFIX.unpack(prefix)
        if magic != MAGIC:
            raise DatastoreError(f"{source} is not a specdec datastore (bad magic {magic!r})")
        if container > CONTAINER_VERSION:
            raise DatastoreError(
                f"{source} uses datastore container version {container}, newer than this specdec supports "
                f"({CONTAINER_VERSION}): upgrade specdec or rebuild the datastore"
            )
        blob = handle.read(meta_len)
    if len(blob) < meta_len:
        raise DatastoreError(f"{source} is truncated: its header is cut short")
    if zlib.crc32(blob) != meta_crc:
        raise DatastoreError(f"{source} is corrupt: its header checksum does not match")
    try:
        header = json.loads(blob)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DatastoreError(f"{source} is corrupt: its header is not JSON ({error})") from error
    if not isinstance(header, dict):
        raise DatastoreError(f"{source} is corrupt: its header is a JSON {type(header).__name__}, not an object")
    return header


def _tokenizer(source: Path, header: dict[str, Any]) -> TokenizerIdentity:
    """The tokenizer identity the header names, or :class:`DatastoreError` when it is missing or malformed."""
    stored = header.get("tokenizer")
    if not isinstance(stored, dict):
        raise DatastoreError(f"{source} is corrupt: its header has no tokenizer identity")
    fingerprint, vocab_size = stored.get("fingerprint"), stored.get("vocab_size")
    if not isinstance(fingerprint, str) or isinstance(vocab_size, bool) or not isinstance(vocab_size, int) \
            or vocab_size < 0:
        raise DatastoreError(f"{source} is corrupt: its tokenizer identity {stored!r} needs a fingerprint string "
                             "and a non-negative vocab_size")
    return TokenizerIdentity(fingerprint, vocab_size, str(stored.get("name", "")))


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _sections(source: Path, header: dict[str, Any], expected: Mapping[str, Expected] | None) -> list[Section]:
    """Every section entry of ``header``, checked before anything is mapped (see the module's docstring)."""
    entries = header.get("sections")
    if not isinstance(entries, list):
        raise DatastoreError(f"{source} is corrupt: its header has no list of sections")
    sections: list[Section] = []
    for index, raw in enumerate(entries):
        name = raw.get("name") if isinstance(raw, dict) else None
        if not isinstance(name, str):
            raise DatastoreError(f"{source} is corrupt: section entry {index} has no name")
        where = f"{source}: section {name!r}"
        shape = raw.get("shape")
        if not isinstance(shape, list) or not all(_is_count(size) for size in shape):
            raise DatastoreError(f"{where} has shape {shape!r}, not a list of non-negative sizes")
        if not all(_is_count(raw.get(key)) for key in ("offset", "nbytes", "crc32")):
            raise DatastoreError(f"{where} needs a non-negative offset, nbytes and crc32")
        try:
            dtype = np.dtype(raw.get("dtype"))
        except (TypeError, ValueError) as error:
            raise DatastoreError(f"{where} has dtype {raw.get('dtype')!r}, which is not a numpy dtype") from error
        if dtype.kind not in _NUMERIC_KINDS or dtype.byteorder == ">" or dtype.hasobject:
            raise DatastoreError(f"{where} has dtype {raw.get('dtype')!r} ({dtype}); sections hold little-endian "
                                 "numbers (bool, integers, floats)")
        rule = None if expected is None else expected.get(name)
        if expected is not None and rule is None:
            raise DatastoreError(f"{where} is not a section of a {header.get('kind')!r} datastore")
        if rule is not None and (dtype not in [np.dtype(d) for d in rule.dtypes] or len(shape) != rule.ndim):
            raise DatastoreError(f"{where} must be {rule.what}, got {dtype} of shape {tuple(shape)}")
        if math.prod(shape) * dtype.itemsize != raw["nbytes"]:
            raise DatastoreError(f"{where} declares {raw['nbytes']} bytes, but shape {tuple(shape)} of {dtype} "
                                 f"takes {math.prod(shape) * dtype.itemsize}")
        if any(section.name == name for section in sections):
            raise DatastoreError(f"{where} appears twice")
        sections.append(Section(name, dtype.str, tuple(shape), raw["offset"], raw["nbytes"], raw["crc32"]))
    for name in expected or {}:
        if not any(section.name == name for section in sections):
            raise DatastoreError(f"{source} lacks section {name!r}")
    return sections


def read_datastore(
    path: str | os.PathLike[str],
    *,
    kind: str,
    supported_versions: tuple[int, ...],
    tokenizer: TokenizerIdentity | None = None,
    vocab_size: int | None = None,
    verify: bool = True,
    expected: Mapping[str, Expected] | None = None,
) -> Datastore:
    """Open and check a datastore of ``kind``; sections come back as read-only memory maps.

    ``tokenizer`` (when known) must match the one the datastore was built with;
    otherwise ``vocab_size`` (the model's) must at least cover the datastore's ids.
    ``verify=False`` skips the per-section CRC-32 (a full read of the file). With
    ``verify=True`` a large file verified in full before and unchanged since (a trusted
    stamp, :mod:`specdec.datastores.trust`) skips it too; every other check still runs.
    ``expected`` (the kind's sections, by name) makes every other section, a missing one, or
    another dtype or number of axes a :class:`DatastoreError`, before anything is mapped.
    """
    source = Path(path)
    header = read_header(source)
    if header.get("kind") != kind:
        raise DatastoreError(f"{source} is a {header.get('kind')!r} datastore, not {kind!r}")
    version = header.get("kind_version", -1)
    if not isinstance(version, int):
        raise DatastoreError(f"{source} is corrupt: its kind_version {version!r} is not an integer")
    if version not in supported_versions:
        newer = version > max(supported_versions)
        advice = ": upgrade specdec" if newer else (
            f": rebuild it from its corpus with `specdec datastore build --kind {kind} --input ... -o {source.name}`"
        )
        raise DatastoreError(
            f"{source} is a {kind!r} datastore of version {version}; this specdec reads versions "
            f"{', '.join(map(str, supported_versions))}" + advice
        )
    identity = _tokenizer(source, header)
    sections = _sections(source, header, expected)
    meta = header.get("meta", {})
    if not isinstance(meta, dict):
        raise DatastoreError(f"{source} is corrupt: its meta is a JSON {type(meta).__name__}, not an object")
    if tokenizer is not None and tokenizer.fingerprint != identity.fingerprint:
        raise DatastoreError(
            f"{source} was built with another tokenizer ({identity.name or 'unnamed'}, vocabulary hash "
            f"{identity.fingerprint}) than this model's ({tokenizer.name or 'unnamed'}, {tokenizer.fingerprint}): "
            "rebuild it with this model's tokenizer"
        )
    if vocab_size is not None and identity.vocab_size > vocab_size:
        raise DatastoreError(
            f"{source} holds token ids up to {identity.vocab_size - 1}, past this model's vocabulary of {vocab_size}"
        )
    status = source.stat()
    file_size = status.st_size
    trusted = verify and is_trusted(source.resolve(), status, header)
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    for section in sections:
        if section.offset + section.nbytes > file_size:
            raise DatastoreError(
                f"{source} is truncated: section {section.name!r} needs bytes up to {section.offset + section.nbytes}, "
                f"the file has {file_size}"
            )
        if section.nbytes == 0:
            array: np.ndarray[Any, Any] = np.zeros(section.shape, dtype=np.dtype(section.dtype))
        else:
            array = np.memmap(source, dtype=np.dtype(section.dtype), mode="r", offset=section.offset,
                              shape=section.shape)
        if verify and not trusted and _crc(array) != section.crc32:
            raise DatastoreError(f"{source} is corrupt: section {section.name!r} fails its checksum")
        arrays[section.name] = array
    if verify and not trusted:  # verified in full: later loads of this unchanged file may skip the CRC pass
        remember_verified(source.resolve(), status, header)
    return Datastore(source, kind, version, identity, dict(meta), arrays, trusted)
