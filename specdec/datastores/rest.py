"""The ``rest`` datastore: corpus tokens and their suffix array, for REST drafting.

He et al., *REST: Retrieval-Based Speculative Decoding* (NAACL 2024): find where the end of
the current text occurs in a large corpus and draft the most frequent continuations as a
tree. The readable oracle is :mod:`specdec.reference.rest`; ``docs/algorithms/rest.md``
walks through it. Here the same rules run on memory-mapped arrays through a small C++
core (``csrc/rest_index.cpp``, built once by :func:`specdec.native.load_extension`).

**File** (kind ``rest``, version 1, in the container of :mod:`specdec.datastores.format`):

- ``tokens`` ``[N]``: every document's token ids followed by one **separator**, whose value
  is the tokenizer's vocabulary size (above every real id), in the narrowest unsigned dtype
  that holds it (uint16 for a 49,152-token vocabulary; uint32 or uint64 for larger ones, so
  no id is ever truncated);
- ``suffix_array`` ``[N]``: int32 when ``N < 2**31``, else int64 (pydivsufsort);
- ``doc_starts`` int64 ``[D + 1]``: document ``d`` is ``tokens[doc_starts[d] : doc_starts[d + 1] - 1]``,
  its separator at ``doc_starts[d + 1] - 1``.

So a corpus of ``T`` tokens in ``D`` documents costs ``(T + D) * (2 + 4)`` bytes with uint16
ids: 6 bytes per token plus the metadata. Queries never contain the separator, so a match
never spans two documents, and continuations stop at it.

**Retrieval** (:meth:`RestDatastore.retrieve`), for a context ending in the pending token:
the query is the last ``s`` tokens, ``s`` from ``len(context tail)`` down to ``min_query``;
the first ``s`` with matches (occurrences followed by at least one token of their document)
wins; up to ``max_matches`` of them, spread evenly over their suffix-array range, give
continuations of up to ``max_depth`` tokens; a trie counts every continuation prefix; the
draft is the ``num_draft`` most frequent prefixes, ranked by count (descending), depth
(ascending), then the prefix's token ids compared lexicographically, so the same input
always gives the same tree and every leading part of it is prefix-closed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
from pydivsufsort import divsufsort
from tqdm import tqdm

from specdec.cachefiles import TokenizerIdentity
from specdec.datastores.format import Datastore, Expected, read_datastore, write_datastore
from specdec.errors import DatastoreError
from specdec.native import load_extension

KIND = "rest"
KIND_VERSION = 1
_SOURCES = [Path(__file__).parent / "csrc" / "rest_index.cpp"]

IntArray = npt.NDArray[np.int64]

# The sections of a ``rest`` file (the module's docstring), checked before they are mapped.
SECTIONS = {
    "tokens": Expected(("|u1", "<u2", "<u4", "<u8"), "1-D little-endian unsigned ids"),
    "suffix_array": Expected(("<i4", "<i8"), "int32/int64 positions, 1-D"),
    "doc_starts": Expected(("<i8",), "1-D int64 document starts"),
}


def native() -> ModuleType:
    """The compiled retrieval core (built on first use, ~25 s; cached across processes)."""
    return load_extension("rest_index", _SOURCES)


def token_dtype(separator: int) -> np.dtype[Any]:
    """The narrowest unsigned dtype holding every id up to ``separator`` (the vocabulary size).

    >>> token_dtype(49152), token_dtype(100_000)
    (dtype('uint16'), dtype('uint32'))
    """
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if separator <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise DatastoreError(f"vocabulary size {separator} does not fit in 64 bits")


# -- build ----------------------------------------------------------------------------------


def concatenate(documents: Sequence[npt.NDArray[Any]], separator: int) -> tuple[npt.NDArray[Any], IntArray]:
    """``tokens[N]`` (each document then the separator) and ``doc_starts[D + 1]``; ids are checked.

    Raises :class:`DatastoreError` naming the document, position and value of the first id
    outside ``[0, separator)``. O(N) time, one output array of N ids.
    """
    lengths = np.fromiter((len(d) + 1 for d in documents), dtype=np.int64, count=len(documents))
    doc_starts = np.zeros(len(documents) + 1, dtype=np.int64)
    np.cumsum(lengths, out=doc_starts[1:])
    tokens = np.empty(int(doc_starts[-1]), dtype=token_dtype(separator))
    for index, document in enumerate(documents):
        ids = np.asarray(document)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise DatastoreError(f"document {index} must be a 1-D array of integer token ids, got {ids.dtype} "
                                 f"with shape {ids.shape}")
        if ids.size:
            bad = np.flatnonzero((ids < 0) | (ids >= separator))
            if bad.size:
                position = int(bad[0])
                raise DatastoreError(f"document {index} holds token id {int(ids[position])} at position {position}, "
                                     f"outside the vocabulary [0, {separator})")
        start, end = int(doc_starts[index]), int(doc_starts[index + 1]) - 1
        tokens[start:end] = ids
        tokens[end] = separator
    return tokens, doc_starts


def suffix_array(tokens: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The suffix array of ``tokens`` (int32 when it fits, else int64), by pydivsufsort.

    pydivsufsort sorts the big-endian bytes of the ids and keeps the suffixes starting on an
    id boundary, which orders them as id sequences. Peak memory: ~4 bytes per byte of
    ``tokens`` for the byte-level array plus the kept half (~20 bytes per uint16 token).
    """
    if len(tokens) == 0:
        return np.zeros(0, dtype=np.int32)
    order = np.asarray(divsufsort(tokens))
    index_dtype = np.int32 if len(tokens) <= np.iinfo(np.int32).max else np.int64
    return order.astype(index_dtype, copy=False)


def build(
    documents: Sequence[npt.NDArray[Any]],
    output: str | os.PathLike[str],
    tokenizer: TokenizerIdentity,
    *,
    progress: bool = True,
) -> dict[str, Any]:
    """Index ``documents`` (token id arrays) into one ``rest`` file at ``output``; return build stats.

    The separator is ``tokenizer.vocab_size``. Time: O(N log N) worst case for the suffix
    array (pydivsufsort, ~1 s per million tokens here), O(N) for the rest.
    """
    if not documents:
        raise DatastoreError("no documents to index")
    separator = int(tokenizer.vocab_size)
    if separator < 1:
        raise DatastoreError(f"tokenizer vocabulary size must be positive, got {separator}")
    bar = tqdm(total=3, desc="rest datastore", unit=" stage", disable=not progress)
    started = time.perf_counter()
    bar.set_postfix_str("concatenate")
    tokens, doc_starts = concatenate(documents, separator)
    bar.update()
    bar.set_postfix_str(f"suffix array of {len(tokens):,} ids")
    sorted_at = time.perf_counter()
    suffixes = suffix_array(tokens)
    bar.update()
    bar.set_postfix_str("write")
    written_at = time.perf_counter()
    corpus_tokens = len(tokens) - len(documents)
    meta = {"documents": len(documents), "tokens": corpus_tokens, "separator": separator}
    path = write_datastore(output, kind=KIND, kind_version=KIND_VERSION, tokenizer=tokenizer,
                           arrays={"tokens": tokens, "suffix_array": suffixes, "doc_starts": doc_starts}, meta=meta)
    bar.update()
    bar.close()
    done = time.perf_counter()
    size = path.stat().st_size
    return {
        "path": str(path),
        "token_dtype": str(tokens.dtype),
        "index_dtype": str(suffixes.dtype),
        "bytes": size,
        "bytes_per_token": round(size / max(corpus_tokens, 1), 3),
        "concatenate_s": round(sorted_at - started, 3),
        "suffix_array_s": round(written_at - sorted_at, 3),
        "write_s": round(done - written_at, 3),
    }


# -- load and retrieve ------------------------------------------------------------------------


@dataclass(frozen=True)
class Retrieval:
    """One REST retrieval: the match and the ranked draft nodes.

    ``match_length`` is the query length ``s`` that matched (0: none, and the rest is empty);
    ``lo, hi`` the suffix-array range of its matches (all of them, before sampling);
    ``sampled`` how many of them fed the trie. Draft node ``k`` carries ``tokens[k]``; its
    parent is tree node ``parents[k]`` (0 is the root, the pending token; ``j + 1`` is draft
    node ``j``); ``counts[k]`` sampled continuations start with its prefix. Nodes are best
    first. Shapes: int64 ``[K]`` each.
    """

    match_length: int
    lo: int
    hi: int
    sampled: int
    tokens: IntArray
    parents: IntArray
    counts: IntArray


class RestDatastore:
    """A loaded ``rest`` datastore: read-only memory maps shared by every drafter that uses it.

    Nothing here is per sequence; :meth:`retrieve` is a pure function of its arguments and
    releases the GIL while it searches.
    """

    def __init__(self, store: Datastore) -> None:
        self.path = store.path
        self.tokenizer = store.tokenizer
        self.meta = store.meta
        missing = [name for name in ("tokens", "suffix_array", "doc_starts") if name not in store.arrays]
        if missing:
            raise DatastoreError(f"{store.path} lacks section {missing[0]!r} of a rest datastore")
        self.tokens: npt.NDArray[Any] = store["tokens"]
        self.suffix_array: npt.NDArray[Any] = store["suffix_array"]
        self.doc_starts: IntArray = np.asarray(store["doc_starts"])
        self.separator = int(self.meta.get("separator", -1))
        self._native = native()
        self._check_layout()

    def _check_layout(self) -> None:
        """Cheap structural checks (O(D)): what a well-formed file must satisfy beyond its CRCs."""
        where, tokens, suffixes, starts = self.path, self.tokens, self.suffix_array, self.doc_starts
        if self.separator != self.tokenizer.vocab_size:
            raise DatastoreError(f"{where}: separator {self.separator} is not the vocabulary size "
                                 f"{self.tokenizer.vocab_size}")
        if tokens.ndim != 1 or tokens.dtype.kind != "u" or tokens.dtype.byteorder == ">":
            raise DatastoreError(f"{where}: tokens must be 1-D little-endian unsigned ids, got {tokens.dtype}")
        if self.separator > np.iinfo(tokens.dtype).max:
            raise DatastoreError(f"{where}: separator {self.separator} does not fit the tokens' {tokens.dtype}")
        if suffixes.shape != tokens.shape or suffixes.dtype not in (np.dtype("<i4"), np.dtype("<i8")):
            raise DatastoreError(f"{where}: suffix_array must be int32/int64 of the tokens' length {len(tokens)}, "
                                 f"got {suffixes.dtype} of shape {suffixes.shape}")
        if starts.ndim != 1 or len(starts) < 2 or starts[0] != 0 or starts[-1] != len(tokens):
            raise DatastoreError(f"{where}: doc_starts must run from 0 to {len(tokens)} over at least one document")
        if np.any(np.diff(starts) < 1):
            raise DatastoreError(f"{where}: doc_starts is not strictly increasing")
        if np.any(tokens[starts[1:] - 1] != self.separator):
            raise DatastoreError(f"{where}: a document does not end with the separator {self.separator}")

    def check_tokens(self) -> None:
        """O(N): the separators sit exactly at the document ends (no id reaches the separator elsewhere)."""
        documents = len(self.doc_starts) - 1
        at_or_above = int(np.count_nonzero(self.tokens >= self.separator))
        if at_or_above != documents:
            raise DatastoreError(f"{self.path}: {at_or_above} ids reach the separator {self.separator}, "
                                 f"expected one per document ({documents})")

    def check(self) -> None:
        """Every invariant, O(N + adjacent common prefixes): layout, separators, a sorted suffix array."""
        self._check_layout()
        self.check_tokens()
        problem = str(self._native.check(self.tokens, self.suffix_array))
        if problem:
            raise DatastoreError(f"{self.path}: {problem}")

    @property
    def num_tokens(self) -> int:
        """Corpus tokens (separators excluded)."""
        return len(self.tokens) - self.num_documents

    @property
    def num_documents(self) -> int:
        return len(self.doc_starts) - 1

    def retrieve(
        self,
        context: Sequence[int] | IntArray,
        *,
        min_query: int = 2,
        max_matches: int = 5000,
        max_depth: int = 10,
        num_draft: int = 64,
    ) -> Retrieval:
        """The REST draft after ``context`` (its last tokens, pending last; all of it is the longest query).

        Cost: O(log Q) suffix-array range searches of O(Q log N) each, plus O(m * max_depth)
        for the trie over the ``m <= max_matches`` sampled matches (tens to hundreds of
        microseconds on a 10M-token store).
        """
        query = np.asarray(context, dtype=np.int64)
        length, lo, hi, sampled, tokens, parents, counts = self._native.retrieve(
            self.tokens, self.suffix_array, self.separator, query, min_query, max_matches, max_depth, num_draft
        )
        return Retrieval(int(length), int(lo), int(hi), int(sampled), tokens, parents, counts)

    def match_range(self, query: Sequence[int]) -> tuple[int, int]:
        """Suffix-array range ``[lo, hi)`` of the matches of all of ``query`` that have a continuation."""
        lo, hi = self._native.match_range(self.tokens, self.suffix_array, self.separator,
                                          np.asarray(query, dtype=np.int64))
        return int(lo), int(hi)

    def locate(self, positions: npt.NDArray[Any]) -> list[tuple[int, int]]:
        """``(document, offset)`` of each position in ``tokens`` (e.g. ``suffix_array[lo:hi]``)."""
        positions = np.asarray(positions, dtype=np.int64)
        documents = np.searchsorted(self.doc_starts, positions, side="right") - 1
        offsets = positions - self.doc_starts[documents]
        return list(zip(documents.tolist(), offsets.tolist(), strict=True))

    def document(self, index: int) -> npt.NDArray[Any]:
        """Token ids of document ``index`` (separator excluded)."""
        if not 0 <= index < self.num_documents:
            raise DatastoreError(f"document index {index} outside [0, {self.num_documents})")
        return self.tokens[self.doc_starts[index] : self.doc_starts[index + 1] - 1]


# Loaded datastores, shared by every drafter that names the same unchanged file with the
# same expectations: (path, size, mtime_ns, tokenizer fingerprint, vocab_size, verify) -> store.
_CACHE: dict[tuple[Any, ...], RestDatastore] = {}
_CACHE_LOCK = threading.Lock()


def load(
    path: str | os.PathLike[str],
    *,
    tokenizer: TokenizerIdentity | None = None,
    vocab_size: int | None = None,
    verify: bool = True,
) -> RestDatastore:
    """Open the ``rest`` datastore at ``path`` (memory-mapped), checked and cached.

    The file is checked against ``tokenizer`` (or at least ``vocab_size``), then every
    section's CRC-32 and the separators (``verify=True``, a full read: ~0.1 s per 10M
    tokens), then its layout. A datastore is cached per (path, size, mtime) and these
    arguments, so many drafters and sequences share one memory map; a rewritten file is
    reopened.
    """
    source = Path(path).resolve()
    try:
        stat = source.stat()
    except OSError as error:
        raise DatastoreError(f"no datastore file at {str(path)!r} ({error.strerror})") from error
    key = (str(source), stat.st_size, stat.st_mtime_ns, tokenizer.fingerprint if tokenizer else None, vocab_size,
           verify)
    with _CACHE_LOCK:
        cached = _CACHE.get(key)
        if cached is not None:
            return cached
        store = RestDatastore(read_datastore(source, kind=KIND, supported_versions=(KIND_VERSION,),
                                             tokenizer=tokenizer, vocab_size=vocab_size, verify=verify,
                                             expected=SECTIONS))
        if verify:
            store.check_tokens()
        _CACHE[key] = store
        return store
