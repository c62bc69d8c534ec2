"""The static suffix automaton: a corpus index for SAM-Decoding, built once, memory-mapped.

``specdec datastore build --kind sam`` turns a corpus (token documents) into one file;
:meth:`StaticSuffixAutomaton.load` maps it read-only, so loading costs the checks, not a
copy, and every drafter (and process) shares the pages. The automaton is *generalized*:
each document starts again from the root, so no matched string and no draft crosses a
document boundary (the SAM-Decoding reference joins documents with EOS and drafts across
them). Semantics, names and the draft rule are those of
:mod:`specdec.reference.suffix_automaton`, the oracle this is tested against.

Layout (sections of the datastore file, version 2; see ``csrc/sam.h`` for the reasons)::

    tokens      [N]    uint16/uint32  the corpus, documents one after another
    doc_starts  [D+1]  int64          document d is tokens[doc_starts[d] : doc_starts[d+1]]
    length      [S]    int32          per state: longest string's length
    link        [S]    int32          suffix link (-1 for the root, state 0)
    draft_endpos [S]   int32          where the paper's chain of a match in the state starts (below)
    occurrences [S]    int32          |endpos|: how often the state's strings occur in the corpus
    last_endpos [S]    int32          max(endpos): where their latest occurrence ends
    edge_start  [S+1]  uint32         state v's transitions are edge_*[edge_start[v]:edge_start[v+1]]
    edge_token  [E]    uint16/uint32  sorted within each state
    edge_target [E]    int32

With S ~ 1.5 N and E ~ 2 N this is about 50 bytes per corpus token (the reference's
Python object graph costs several hundred). Building runs in C++ (amortized O(1) per
token); matching and drafting run in C++ over the mapped arrays. ``occurrences`` and
``last_endpos`` (new in version 2) let the ``sam`` drafter read the occurrence tree of a
match, REST's frequency trie, straight from the transitions; a version-1 file lacks them
and is refused with the command that rebuilds it.

``draft_endpos[v]`` is the end of the occurrence of the state's strings with the most
tokens after it *in its document* (ties: the earliest). In one text that is the paper's
``min_endpos`` (the earliest occurrence has the most text after it); with documents kept
apart the earliest occurrence may end its document, with nothing to draft, while a later
one continues, so the principle, not the literal rule, carries over.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from specdec.cachefiles import TokenizerIdentity
from specdec.datastores.format import Expected, read_datastore, write_datastore
from specdec.errors import DatastoreError, SpecDecError
from specdec.native import load_extension

KIND = "sam"
KIND_VERSION = 2  # 2: per-state occurrences and last_endpos (occurrence trees)
_CSRC = Path(__file__).parent / "csrc"
# One extension from four files (csrc/sam.h says what each holds); the header is hashed
# into the build's cache key, so editing it also gives a fresh build.
SOURCES = tuple(_CSRC / name for name in ("sam_automaton.cpp", "sam_static_view.cpp", "sam_occurrence_tree.cpp",
                                          "sam_bindings.cpp"))
HEADERS = (_CSRC / "sam.h",)
# Largest corpus: positions and state ids are int32.
MAX_TOKENS = 2**31 - 2

Cursor = tuple[int, int]  # (state, match length); (0, 0) is no match
_STATE_SECTIONS = ("length", "link", "draft_endpos", "occurrences", "last_endpos")
_TOKENS = Expected(("<u2", "<u4"), "1-D uint16/uint32 token ids")
# The sections of a ``sam`` file (the layout above), checked before they are mapped.
SECTIONS = {
    "tokens": _TOKENS,
    "doc_starts": Expected(("<i8",), "1-D int64 document starts"),
    **{name: Expected(("<i4",), "1-D int32 per state") for name in _STATE_SECTIONS},
    "edge_start": Expected(("<u4",), "1-D uint32 edge starts"),
    "edge_token": _TOKENS,
    "edge_target": Expected(("<i4",), "1-D int32 edge targets"),
}


def native() -> ModuleType:
    """The compiled automata (built on first use, ~15 s, then cached; see :mod:`specdec.native`)."""
    return load_extension("sam", SOURCES, depends=HEADERS)


def _concatenate(documents: Sequence[npt.NDArray[np.int64]], vocab_size: int | None) -> tuple[Any, Any]:
    """The corpus as int32 ``tokens[N]`` and int64 ``doc_starts[D+1]``, checking every id."""
    lengths = np.fromiter((len(d) for d in documents), dtype=np.int64, count=len(documents))
    doc_starts = np.zeros(len(documents) + 1, dtype=np.int64)
    np.cumsum(lengths, out=doc_starts[1:])
    total = int(doc_starts[-1])
    if total > MAX_TOKENS:
        raise SpecDecError(f"a static automaton holds at most {MAX_TOKENS} tokens; the corpus has {total}")
    tokens = np.concatenate([np.asarray(d, dtype=np.int64) for d in documents]) if documents else np.zeros(0, np.int64)
    if total:
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0:
            raise SpecDecError(f"token id {low} is negative")
        limit = vocab_size if vocab_size is not None else 2**31
        if high >= limit:
            raise SpecDecError(f"token id {high} is outside the vocabulary of {limit}")
    return tokens.astype(np.int32), doc_starts


def build_arrays(
    documents: Sequence[npt.NDArray[np.int64]], *, vocab_size: int | None = None, progress: bool = False
) -> tuple[dict[str, npt.NDArray[Any]], dict[str, Any]]:
    """Build the automaton of ``documents`` (int64 token arrays): its sections and build stats.

    Token sections are uint16 when every id (and ``vocab_size``, when given) fits, else
    uint32. Time O(N) amortized; peak memory about 100 bytes per token (the growable
    builder, then the exported arrays), reported as ``builder_peak_bytes``.
    """
    tokens, doc_starts = _concatenate(documents, vocab_size)
    width = vocab_size if vocab_size is not None else (int(tokens.max()) + 1 if len(tokens) else 0)
    narrow = width <= 2**16
    builder = native().StaticBuilder(len(tokens))
    started, cpu_started = time.perf_counter(), time.process_time()
    bar = tqdm(total=len(tokens), desc="building suffix automaton", unit=" tok", unit_scale=True, disable=not progress)
    first = 0
    batch = 1 << 20  # tokens per call: the progress bar's granularity
    while first < len(documents):
        last = int(np.searchsorted(doc_starts, doc_starts[first] + batch, side="right"))
        last = min(max(last - 1, first + 1), len(documents))
        builder.add_documents(tokens, doc_starts, first, last)
        bar.update(int(doc_starts[last] - doc_starts[first]))
        first = last
    bar.close()
    arrays: dict[str, npt.NDArray[Any]] = {
        "tokens": tokens.astype(np.uint16 if narrow else np.uint32),
        "doc_starts": doc_starts,
        **builder.finish(narrow),
    }
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    stats = {
        "states": int(builder.num_states),
        "edges": int(builder.num_edges),
        "build_s": round(seconds, 3),
        "tokens_per_s": round(len(tokens) / seconds) if seconds > 0 else None,
        # CPU time of this (single-threaded) build: the per-core rate on a shared machine
        "build_cpu_s": round(cpu_seconds, 3),
        "tokens_per_cpu_s": round(len(tokens) / cpu_seconds) if cpu_seconds > 0 else None,
        "builder_peak_bytes": int(builder.peak_bytes),
        "builder_pool_entries": int(builder.pool_entries),
    }
    return arrays, stats


def build(
    documents: Sequence[npt.NDArray[np.int64]], output: Path, tokenizer: TokenizerIdentity, *, progress: bool = True
) -> dict[str, Any]:
    """``specdec datastore build --kind sam``: write the static automaton of ``documents`` to ``output``."""
    arrays, stats = build_arrays(documents, vocab_size=tokenizer.vocab_size, progress=progress)
    num_tokens = len(arrays["tokens"])
    meta = {"tokens": num_tokens, "documents": len(documents), "states": stats["states"], "edges": stats["edges"]}
    write_datastore(output, kind=KIND, kind_version=KIND_VERSION, tokenizer=tokenizer, arrays=arrays, meta=meta)
    file_bytes = output.stat().st_size
    return {
        "kind": KIND,
        **stats,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "file": str(output),
        "file_bytes": file_bytes,
        "bytes_per_token": round(file_bytes / max(num_tokens, 1), 2),
    }


class StaticSuffixAutomaton:
    """A read-only generalized suffix automaton: cursor steps and drafts over compact arrays.

    Shared by every sequence (a drafter keeps only its own cursor). ``step`` and
    ``advance`` are amortized O(1) per token (a transition lookup is O(log degree));
    ``draft`` is O(k + log D) for k tokens.

    >>> sam = StaticSuffixAutomaton.from_documents([np.array([5, 1, 2]), np.array([1, 2, 3, 9])])
    >>> state, length = sam.advance((0, 0), [7, 1, 2])
    >>> length, sam.draft(state, 5)       # "1 2" first ends document 0; document 1 continues it
    (2, [3, 9])
    """

    def __init__(self, arrays: dict[str, npt.NDArray[Any]], meta: dict[str, Any] | None = None,
                 path: Path | None = None) -> None:
        self.arrays = arrays
        self.meta = dict(meta or {})
        self.path = path
        missing = [name for name in ("tokens", "doc_starts", *_STATE_SECTIONS, "edge_start", "edge_token",
                                     "edge_target") if name not in arrays]
        if missing:
            raise DatastoreError(f"{path or 'the automaton'} lacks section {missing[0]!r}")
        token_dtype = arrays["tokens"].dtype
        view_type = {np.dtype(np.uint16): "StaticView16", np.dtype(np.uint32): "StaticView32"}.get(token_dtype)
        if view_type is None or arrays["edge_token"].dtype != token_dtype:
            raise DatastoreError(f"{path or 'the automaton'} stores tokens as {token_dtype}, not uint16 or uint32")
        try:  # dtypes and shapes are checked here; every later read is bounds-checked (csrc/sam.h)
            self._view = getattr(native(), view_type)(arrays)
        except (TypeError, ValueError) as error:
            raise DatastoreError(f"{path or 'the automaton'} is corrupt: {error}") from error
        self.verified = False

    @classmethod
    def from_documents(cls, documents: Sequence[Sequence[int] | npt.NDArray[np.int64]]) -> StaticSuffixAutomaton:
        """Build in memory (no file): tests and small corpora."""
        arrays, stats = build_arrays([np.asarray(d, dtype=np.int64) for d in documents])
        return cls(arrays, {"documents": len(documents), **stats})

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        tokenizer: TokenizerIdentity | None = None,
        vocab_size: int | None = None,
        verify: bool = True,
    ) -> StaticSuffixAutomaton:
        """Map the datastore at ``path`` after every check of :func:`~specdec.datastores.format.read_datastore`.

        Loaded automata are cached per (file, size, mtime, tokenizer, vocabulary), so many
        drafters and generators share one memory map; a rewritten file is loaded afresh.
        ``verify`` checks every section's CRC-32 once (a full read, ~380 MB per 10M tokens),
        which catches truncation and corruption. The arrays' structure is not checked at
        load (another full pass); the compiled reads are bounds-checked instead, so a file
        crafted to pass its checksums can give wrong drafts, never a crash or a hang, and
        verification keeps the output exact. :meth:`check` checks the structure in full.
        """
        source = Path(path).resolve()
        if not source.is_file():
            raise DatastoreError(f"no datastore file at {str(path)!r}")
        status = source.stat()
        key = (str(source), status.st_size, status.st_mtime_ns, tokenizer.fingerprint if tokenizer else None,
               vocab_size)
        with _CACHE_LOCK:
            cached = _CACHE.get(key)
            if cached is not None and (cached.verified or not verify):
                return cached
            store = read_datastore(source, kind=KIND, supported_versions=(KIND_VERSION,), tokenizer=tokenizer,
                                   vocab_size=vocab_size, verify=verify, expected=SECTIONS)
            automaton = cls(store.arrays, store.meta, source)
            automaton.verified = verify
            _CACHE[key] = automaton
            return automaton

    # -- matching and drafting ----------------------------------------------------------
    def step(self, cursor: Cursor, token: int) -> Cursor:
        """The cursor after one more context token."""
        state, length = self._view.step(cursor, token)
        return int(state), int(length)

    def advance(self, cursor: Cursor, tokens: Sequence[int]) -> Cursor:
        """The cursor after every token of ``tokens``."""
        state, length = self._view.advance(cursor, list(tokens))
        return int(state), int(length)

    def draft(self, state: int, num_tokens: int) -> list[int]:
        """Up to ``num_tokens`` tokens after the match in ``state`` (from ``draft_endpos``, within
        its document), moving to the suffix link while fewer remain (the reference rule)."""
        return list(self._view.draft(state, num_tokens))

    def state(self, state: int) -> tuple[int, int, int]:
        """``(length, link, draft_endpos)`` of ``state``."""
        view = self._view
        return int(view.state_length(state)), int(view.state_link(state)), int(view.state_draft_endpos(state))

    def occurrences(self, state: int) -> tuple[int, int]:
        """``(occurrences, last_endpos)`` of ``state``: how often its strings occur, and where last."""
        view = self._view
        return int(view.state_occurrences(state)), int(view.state_last_endpos(state))

    def check(self) -> None:
        """Raise :class:`DatastoreError` naming the first broken invariant (O(sum of lengths): tests)."""
        problem = self._view.check()
        if problem:
            raise DatastoreError(f"{self.path or 'the automaton'}: {problem}")

    # -- sizes --------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return int(self._view.num_tokens)

    @property
    def num_states(self) -> int:
        return int(self._view.num_states)

    @property
    def num_edges(self) -> int:
        return int(self._view.num_edges)

    @property
    def num_documents(self) -> int:
        return len(self.arrays["doc_starts"]) - 1

    @property
    def nbytes(self) -> int:
        """Bytes of the mapped sections (what a fully touched automaton keeps resident)."""
        return sum(int(a.nbytes) for a in self.arrays.values())

    @property
    def native_view(self) -> Any:
        """The C++ view, for drafters that call it directly on their hot path."""
        return self._view


_CACHE: dict[tuple[Any, ...], StaticSuffixAutomaton] = {}
_CACHE_LOCK = threading.Lock()
