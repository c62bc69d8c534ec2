"""The ``sam`` drafter: occurrence trees from suffix automata (SAM-Decoding, revised by measurement).

Hu et al., *SAM Decoding: Speculative Decoding via Suffix Automaton* (2024,
arXiv:2411.10666) find the longest suffix of the context (committed tokens plus the pending
one) that occurred before with suffix automata, and draft the tokens that followed it. Up
to three automata (*sources*) are matched every step:

- the **dynamic** automaton, one per sequence, over its prompt and generated text (C++,
  incremental: for each committed token the cursor advances first and the automaton is
  extended second, so a match always points to an earlier occurrence);
- the **shared store** (:class:`~specdec.datastores.shared_store.SharedStore`): earlier sequences
  of the same generator (or of whoever shares the store), two generations of an online
  automaton bounded in tokens, oldest evicted first;
- the **static** automaton over a corpus (:class:`~specdec.datastores.sam.StaticSuffixAutomaton`,
  a memory-mapped datastore shared by every sequence), its match length discounted by
  ``l_bias`` as in the paper.

The draft is the **occurrence tree** (:func:`specdec.reference.suffix_automaton.occurrence_tree`
states the rule, ``csrc/sam_occurrence_tree.cpp`` builds it): the trie of the continuations of every
earlier occurrence of the longest match, across the sources that have it, read from the
automata's transitions and per-state occurrence counts (no text is scanned); nodes best
first by how many occurrences share the prefix (recency breaks ties), at most
``max_children`` children a node, ``num_nodes`` nodes, ``chain_length - 1`` deep. It drafts
whenever any earlier occurrence exists: unlike the paper's standalone rule there is no
``l_threshold`` below which ``sam`` drafts nothing, and no fallback to a shorter match while
the longest one has a continuation (docs/algorithms/sam.md gives the measurements behind
both). With one occurrence the tree is the paper's chain.

Every node carries a feature for the budget planner (:func:`node_feature`: the match
length, the node's share of its parent's occurrences and its own count), and a source
label (``sam-dynamic``, ``sam-store``, ``sam-static``: the most recent source holding it).

Cost per step: O(1) amortized cursor steps per committed token and source, plus the tree:
O(N log N + the expanded states' degrees) for N nodes: tens of microseconds a step
(``benchmarks/test_sam_tree_cost.py`` measures it), most of it building the Python ``DraftTree``.
Memory: ~100 bytes per context token for
the dynamic automaton.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdec.datastores.sam import Cursor, StaticSuffixAutomaton, native
from specdec.datastores.shared_store import REMATCH_TOKENS, SharedStore
from specdec.drafters.base import DrafterContext, Factory, parse_options, require_positive
from specdec.errors import SpecDecError
from specdec.types import DrafterFactory, DraftTree, Feedback

SOURCE_DYNAMIC = "sam-dynamic"
SOURCE_STORE = "sam-store"
SOURCE_STATIC = "sam-static"
# Recency ranks of the sources (larger: more recent text; see occurrence_tree): the sequence's
# own text, the store's young and old generations, the corpus.
RANK_DYNAMIC, RANK_STORE_YOUNG, RANK_STORE_OLD, RANK_STATIC = 3, 2, 1, 0
_LABELS = {RANK_DYNAMIC: SOURCE_DYNAMIC, RANK_STORE_YOUNG: SOURCE_STORE, RANK_STORE_OLD: SOURCE_STORE,
           RANK_STATIC: SOURCE_STATIC}
# A node's label by the ranks holding it (a bit mask): the most recent one.
_LABEL_BY_MASK = tuple(_LABELS[max(r for r in range(4) if mask >> r & 1)] if mask else SOURCE_DYNAMIC
                       for mask in range(16))  # masks hold ranks 0..3 only (RANK_*)


def node_feature(match_length: int, occurrences: int, parent_occurrences: int) -> int:
    """What the budget planner learns acceptance by (0..44): match length x share x support.

    ``match_length`` class (1, 2-3, 4-7, 8-15, 16+), the node's share of its parent's
    occurrences (below a half, a half or more, all), and its own occurrences (1, 2-3, 4+).
    The drafter's hot path computes it in C++ (``node_feature`` in ``csrc/sam_occurrence_tree.cpp``); this
    is its statement, which the tests hold the compiled one to.

    >>> node_feature(1, 1, 3), node_feature(12, 4, 4), node_feature(40, 1, 1)
    (0, 35, 42)
    """
    length_class = 0 if match_length <= 1 else min(match_length.bit_length() - 1, 4)
    share = 2 if occurrences >= parent_occurrences else (1 if 2 * occurrences >= parent_occurrences else 0)
    support = 0 if occurrences <= 1 else (1 if occurrences <= 3 else 2)
    return (length_class * 3 + share) * 3 + support


def _parse_store(value: Any) -> bool | int | SharedStore:
    if isinstance(value, (SharedStore, bool)):
        return value
    if isinstance(value, int) and value >= 2:
        return value
    raise SpecDecError(
        f"drafter 'sam': store must be True (a store shared by the factory's sequences), False (none), "
        f"a token budget (int >= 2) or a specdec.SharedStore, got {value!r}"
    )


@dataclass(frozen=True)
class SamConfig:
    """Options of the ``sam`` drafter.

    ``num_nodes``: nodes of a draft tree, root (the pending token) included; the engine's
    ``max_nodes`` and the budget planner cut it further. ``max_children``: children a node
    may have. ``chain_length``: the deepest path, root included, as the reference's
    ``n_predicts`` (40: up to 39 draft tokens after the pending one).
    ``l_bias``: subtracted from the static corpus's match length before sources are
    compared (the corpus is less specific to this sequence than its own text).
    ``l_threshold``: the (biased) match length Algorithm 2 trusts: composites such as
    ``sam+recycling`` read it through :meth:`SamDrafter.match_length`; ``sam`` alone drafts
    at any length. ``datastore``: a static automaton file built by ``specdec datastore
    build --kind sam``. ``store``: the store of earlier sequences: True (the default: the
    generator's, or one the factory makes and its sequences share), False (none), a token
    budget for the factory's own store, or a :class:`~specdec.datastores.shared_store.SharedStore`.
    ``store_bias``: subtracted from the store's match length before sources are compared (1:
    another sequence's text is less specific to this one than its own, as a corpus is; measured
    in docs/algorithms/sam.md).
    ``match_factor``, ``match_offset``, ``min_share``: size by evidence (rule 4 of the
    reference's occurrence tree; off by default, as ``budget="auto"`` cuts trees by measured
    acceptance): at most ``match_factor`` x the match length + ``match_offset`` draft tokens,
    and no node with less than ``min_share`` of the match's occurrences. For small fixed
    budgets (``budget="full"`` with few nodes, a serving engine's chains): ``match_factor=1,
    match_offset=1, min_share=0.4`` is at or above Arctic's suffix decoding at its size
    (docs/algorithms/sam.md, "Small trees").
    """

    num_nodes: int = 40
    max_children: int = 4
    chain_length: int = 40
    l_bias: int = 5
    l_threshold: int = 5
    datastore: str | os.PathLike[str] | None = None
    store: bool | int | SharedStore = True
    store_bias: int = 1
    match_factor: float = 0.0
    match_offset: float = 0.0
    min_share: float = 0.0

    def __post_init__(self) -> None:
        require_positive("sam", num_nodes=self.num_nodes, max_children=self.max_children,
                         chain_length=self.chain_length)
        for key, upper in (("match_factor", math.inf), ("match_offset", math.inf), ("min_share", 1.0)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= upper \
                    or not math.isfinite(value):
                bound = "a finite number >= 0" if upper == math.inf else f"a number in [0, {upper:g}]"
                raise SpecDecError(f"drafter 'sam': {key} must be {bound}, got {value!r}")
        for key in ("l_bias", "l_threshold", "store_bias"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecDecError(f"drafter 'sam': {key} must be an int >= 0, got {value!r}")
        if self.datastore is not None and not isinstance(self.datastore, (str, os.PathLike)):
            raise SpecDecError(f"drafter 'sam': datastore must be a file path, got {self.datastore!r}")
        _parse_store(self.store)


class SamDrafter:
    """Per-sequence state (the dynamic automaton, cursors) over shared indexes (store, corpus).

    Implements :class:`~specdec.types.RetrievalDrafter`: :meth:`match_length` is the longest
    biased match behind the last proposal, ``max(m_d, m_store - store_bias, m_s - l_bias)``.
    :meth:`finish` hands the sequence to the shared store (once; :meth:`reset` does it for a
    drafter reused across sequences).
    """

    name = "sam"
    feedback_topk = 0

    def __init__(self, config: SamConfig | None = None, static: StaticSuffixAutomaton | None = None,
                 store: SharedStore | None = None) -> None:
        self.config = config or SamConfig()
        self.static = static
        self.store = store
        self._static_view = static.native_view if static is not None else None
        self._module = native()
        self._dynamic = self._module.DynamicSam()
        self._static_cursor: Cursor = (0, 0)
        self._store_version = -1  # the store version the cursors below were matched against
        self._store_cursors: list[tuple[Any, Cursor, int]] = []  # (generation, cursor, rank)
        self._prompt_len = 0
        self._finished = True  # nothing to hand to the store yet
        self.m_dynamic = 0  # match lengths behind the last proposal (pending token included)
        self.m_static = 0
        self.m_store = 0

    def reset(self, prompt: Sequence[int], feedback: Feedback | None = None) -> None:
        self.finish()
        tokens = list(prompt)
        self._dynamic = self._module.DynamicSam()
        self._dynamic.commit(tokens)
        self._static_cursor = (0, 0)
        if self._static_view is not None:
            self._static_cursor = self._static_view.advance(self._static_cursor, tokens)
        self._store_version = -1
        self._prompt_len = len(tokens)
        self._finished = False
        self.m_dynamic = self.m_static = self.m_store = 0

    def finish(self) -> None:
        """The sequence ended: add its committed text to the shared store (its output but the last
        token, the final bonus that was never committed; its prompt too when the store includes
        prompts). Idempotent; the engine's callers (``Generator``) call it."""
        if self._finished:
            return
        self._finished = True
        if self.store is not None:
            size = int(self._dynamic.size)
            start = 0 if self.store.include_prompts else self._prompt_len
            if size > start:
                self.store.add(self._dynamic.tail(size - start))

    def match_length(self) -> int:
        """The longest biased match behind the last proposal, whatever the node budget."""
        config = self.config
        return max(self.m_dynamic, self.m_store - config.store_bias, self.m_static - config.l_bias, 0)

    def _store_sources(self, pending: int) -> list[tuple[Any, int, int, int, int]]:
        """The store's generations as tree sources, cursors re-matched if the store changed."""
        store = self.store
        assert store is not None
        if store.version != self._store_version:
            tail = self._dynamic.tail(REMATCH_TOKENS)
            version, generations = store.snapshot()  # together: another thread may add meanwhile
            ranks = (RANK_STORE_YOUNG,) if len(generations) == 1 else (RANK_STORE_OLD, RANK_STORE_YOUNG)
            self._store_cursors = [(g, g.advance((0, 0), tail), rank) for g, rank in zip(generations, ranks,
                                                                                          strict=True)]
            self._store_version = version
        sources = []
        for generation, cursor, rank in self._store_cursors:
            state, length = generation.step(cursor, pending)
            self.m_store = max(self.m_store, length)
            sources.append((generation, state, length, self.config.store_bias, rank))
        return sources

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        config = self.config
        state, self.m_dynamic = self._dynamic.peek(pending)
        sources: list[tuple[Any, int, int, int, int]] = [(self._dynamic, state, self.m_dynamic, 0, RANK_DYNAMIC)]
        self.m_static = self.m_store = 0
        if self._static_view is not None:
            state, self.m_static = self._static_view.step(self._static_cursor, pending)
            sources.append((self._static_view, state, self.m_static, config.l_bias, RANK_STATIC))
        if self.store is not None:
            sources += self._store_sources(pending)
        budget = min(config.num_nodes, max_nodes)
        if budget < 2:
            return DraftTree.single(pending, source=self.name)
        # Features (node_feature) and source masks come from C++: no per-node Python loop.
        tokens, parents, _, masks, _, features = self._module.occurrence_tree(
            sources, pending, budget, config.chain_length - 1, config.max_children,
            float(config.min_share), float(config.match_factor), float(config.match_offset)
        )
        if len(tokens) == 1:
            return DraftTree.single(pending, source=self.name)
        labels = tuple(map(_LABEL_BY_MASK.__getitem__, masks))
        return DraftTree(tuple(tokens), tuple(parents), self.name, labels, tuple(features))

    def update(self, accepted: Sequence[int], feedback: Feedback | None) -> None:
        tokens = list(accepted)
        self._dynamic.commit(tokens)
        if self._static_view is not None:
            self._static_cursor = self._static_view.advance(self._static_cursor, tokens)
        if self.store is not None and self._store_version == self.store.version:
            self._store_cursors = [(g, g.advance(cursor, tokens), rank) for g, cursor, rank in self._store_cursors]

    # -- introspection (tests, benchmarks) ------------------------------------------------
    @property
    def dynamic(self) -> Any:
        """The C++ dynamic automaton (``check()``, ``cursor``, ``num_states``)."""
        return self._dynamic

    @property
    def static_cursor(self) -> Cursor:
        return self._static_cursor


def _store_for(config: SamConfig, context: DrafterContext) -> SharedStore | None:
    """The store a factory's drafters share: the option's, else the context's (a Generator's), else a new one."""
    option = config.store
    if isinstance(option, SharedStore):
        return option
    if option is False:
        return None
    if context.store is not None:
        return context.store if isinstance(context.store, SharedStore) else None
    return SharedStore() if option is True else SharedStore(int(option))


def sam_factory(options: Mapping[str, Any], context: DrafterContext) -> DrafterFactory:
    """The ``sam`` factory: loads the static automaton once (checked against the model's
    tokenizer, or its vocabulary size without one), picks the shared store its drafters
    share, and builds the C++ extension now, so a bad file or a missing compiler fails at
    construction, not mid-generation."""
    config = parse_options(SamConfig, "sam", options)
    static = None
    if config.datastore is not None:
        static = StaticSuffixAutomaton.load(
            config.datastore, tokenizer=context.tokenizer_identity(), vocab_size=context.vocab_size
        )
    native()
    store = _store_for(config, context)
    return Factory("sam", lambda: SamDrafter(config, static, store))
