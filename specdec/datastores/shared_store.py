"""The store shared across requests: earlier sequences' text, for the ``sam`` drafter to draft from.

A model repeats itself across requests as well as within one: answers to similar questions
share their phrasing, code shares its idioms. :class:`SharedStore` keeps what earlier
sequences generated (their output, and optionally their prompts) in an online generalized
suffix automaton with occurrence counts (``SharedSam`` in ``csrc/sam.h``), and every
``sam`` drafter that holds the store drafts from it as a third source beside its own
sequence's automaton and a static corpus (the occurrence tree of
:mod:`specdec.reference.suffix_automaton`).

**Who fills it.** A sequence's text enters the store when the sequence ends
(``SamDrafter.finish()``; :class:`~specdec.api.Generator` calls it after every generation),
so a sequence never finds its own text twice (its own automaton has it already), and an
unfinished sequence never shows half an answer to another. A long-lived user of the
drafters (a serving engine) calls ``finish()`` when a request ends, or :meth:`SharedStore.add`.

**Bounded memory, oldest first, without deleting from an automaton.** A suffix automaton
has no delete: removing a text would need the states it created, split and counted to be
undone. So the store keeps two **generations**, each an automaton of whole sequences: new
sequences go into the young one; when adding a sequence would take the young generation
past half of ``max_tokens``, the old generation is dropped (the oldest sequences, all at
once), the young one becomes the old, and a fresh young one starts. The store therefore
always holds the most recent sequences, between ``max_tokens / 2`` and ``max_tokens`` tokens
of them once full (plus at most one sequence longer than half the budget), and adding costs
amortized O(1) per token with no rebuild and no stall. A draft reads both generations, the
young one ranked more recent (its occurrences break ties first).

**Readers.** Each drafter keeps its own cursors into the generations. Adding a sequence may
split the state a cursor points to, so every change bumps :attr:`SharedStore.version`, and a
drafter that sees a new version re-matches the last :data:`REMATCH_TOKENS` committed
tokens (~10 us) instead of trusting its cursors. Matches longer than that are cut to it,
which leaves the occurrence they point to, and so the draft, the same in practice.

Memory: ~100 bytes per stored token at most (automaton with counts, the tokens); the
default budget of 1M tokens is ~100 MB when full.

**Threads.** One store may serve generators in several threads. Every method holds the
store's lock, and every compiled call (an add, a reader's step or draft) holds the GIL from
start to end, so a reader never sees an automaton half-way through an add; a reader takes
the version and the generations together (:meth:`SharedStore.snapshot`), so it never pairs
one version with another state of the generations. A reader's cursors may be a sequence
behind (the version tells it to re-match); drafts are verified by the model, so that only
ever costs speed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from specdec.datastores.sam import native
from specdec.errors import SpecDecError

DEFAULT_MAX_TOKENS = 1_000_000
REMATCH_TOKENS = 256  # committed tokens a reader re-matches after the store changed


class SharedStore:
    """An online suffix automaton over earlier sequences, bounded by ``max_tokens``, oldest evicted first.

    ``include_prompts``: store each sequence's prompt with its output (default: output only,
    as Arctic Inference's suffix cache does: prompts repeat chat templates and system
    prompts, which the sequence's own automaton already covers). Pass one object to many
    calls (``specdec.run(..., store=store)``) or generators to share what they learn.

    >>> store = SharedStore(max_tokens=8)
    >>> store.add([1, 2, 3, 4]); store.add([5, 6, 7]); store.num_tokens, store.num_sequences
    (7, 2)
    >>> store.add([8, 9]); store.num_tokens, store.num_sequences   # [1, 2, 3, 4] is evicted
    (5, 2)
    """

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS, *, include_prompts: bool = False) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 2:
            raise SpecDecError(f"a shared store's max_tokens must be an int >= 2, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self.include_prompts = bool(include_prompts)
        self._native = native()
        self._young: Any = self._native.SharedSam()
        self._old: Any = None
        self._lock = threading.Lock()
        self._version = 0
        self.evicted_sequences = 0
        self.evicted_tokens = 0

    def add(self, tokens: Sequence[int]) -> None:
        """Store one finished sequence (token ids). O(len(tokens)) amortized; may evict the old generation."""
        document = [int(t) for t in tokens]
        if not document:
            return
        if min(document) < 0:
            raise SpecDecError(f"a shared store holds token ids >= 0, got {min(document)}")
        with self._lock:
            young = self._young
            if young.size > 0 and young.size + len(document) > self.max_tokens // 2:
                if self._old is not None:
                    self.evicted_sequences += int(self._old.num_documents)
                    self.evicted_tokens += int(self._old.size)
                self._old, self._young = young, self._native.SharedSam()
            self._young.add_document(document)
            self._version += 1

    def clear(self) -> None:
        """Forget every stored sequence."""
        with self._lock:
            self._young, self._old = self._native.SharedSam(), None
            self._version += 1

    @property
    def version(self) -> int:
        """Changes so far (adds, evictions, clears): readers re-match their cursors when it moves."""
        return self._version

    def generations(self) -> list[Any]:
        """The compiled automata, oldest first (one or two ``SharedSam``)."""
        return self.snapshot()[1]

    def snapshot(self) -> tuple[int, list[Any]]:
        """``(version, generations)`` read together: the generations as they are at that version."""
        with self._lock:
            return self._version, [g for g in (self._old, self._young) if g is not None]

    @property
    def num_tokens(self) -> int:
        return sum(int(g.size) for g in self.generations())

    @property
    def num_sequences(self) -> int:
        return sum(int(g.num_documents) for g in self.generations())

    @property
    def nbytes(self) -> int:
        """Bytes the automata and their texts hold (allocated capacity)."""
        return sum(int(g.memory_bytes) for g in self.generations())

    def check(self) -> None:
        """Raise :class:`SpecDecError` naming the first broken invariant of either generation (tests)."""
        for generation in self.generations():
            problem = generation.check()
            if problem:
                raise SpecDecError(f"shared store: {problem}")

    def __repr__(self) -> str:
        return (f"SharedStore(max_tokens={self.max_tokens}, sequences={self.num_sequences}, "
                f"tokens={self.num_tokens}, include_prompts={self.include_prompts})")
