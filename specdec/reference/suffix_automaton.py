"""The suffix automaton and SAM-Decoding's drafting rules, the readable reference.

Papers: Blumer et al., *The smallest automaton recognizing the subwords of a text*
(TCS 1985) for the automaton and its online construction; Hu et al., *SAM Decoding:
Speculative Decoding via Suffix Automaton* (2024, arXiv:2411.10666) for drafting with it.
This file is the oracle the compact automata (``specdec.datastores.sam``, C++) and the
``sam`` drafter are tested against; it favours the obvious over the fast.

Symbols
-------
A **text** is a list of token ids; a **corpus** is several texts (*documents*) stored one
after another in ``tokens``. The **position** of a token is its index in ``tokens``.
A substring never spans two documents.

- ``endpos(x)``: the set of positions where an occurrence of the substring ``x`` ends.
- **State**: substrings with the same ``endpos`` set form one state. They are the
  suffixes of the state's longest string down to some length, so a state is described by:

  - ``length``: the length of its longest string;
  - ``link`` (the *suffix link*): the state of the longest suffix of its strings that has a
    larger ``endpos`` set; the state's strings have lengths ``length(link) + 1 .. length``;
  - ``next[t]``: the state of ``x + [t]`` for any string ``x`` of the state (one target for
    all of them, because they share ``endpos``);
  - ``min_endpos``: ``min(endpos)``, where the earliest occurrence of its strings ends: the
    tokens after it are the **draft** a match in this state proposes.

  State 0, the **root**, holds the empty string (``length`` 0, ``link`` -1).

Online construction (:meth:`SuffixAutomaton.extend`, amortized O(1) per token)
-----------------------------------------------------------------------------
Appending token ``t`` to the document whose whole prefix so far is in state ``last``
creates ``cur`` (``length = length(last) + 1``, ``min_endpos`` = the new position) for the
new prefix, then walks the suffix links from ``last`` (the suffixes of the old prefix,
longest first), adding ``next[t] = cur`` to every state that lacks ``t``. The walk stops:

1. at the end of the chain (``p == -1``): ``t`` never occurred before, so every suffix of
   the new prefix is new: ``link(cur)`` is the root;
2. at a state ``p`` with ``next[t] = q`` and ``length(q) == length(p) + 1``: the longest
   old suffix followed by ``t`` is exactly ``q``'s longest string, so ``link(cur) = q``;
3. at ``p`` with ``next[t] = q`` and ``length(q) > length(p) + 1``: ``q`` mixes strings that
   now end at the new position (lengths up to ``length(p) + 1``) with longer ones that do
   not, so it splits: a **clone** takes the short ones (``length(p) + 1``, ``q``'s ``next``
   and ``link``), ``q`` and ``cur`` link to it, and the states on the walk that sent ``t``
   to ``q`` now send it to the clone. The clone's ``endpos`` is ``q``'s plus the new
   position, which is the largest so far, so the clone **inherits q's** ``min_endpos``.

For a corpus (a *generalized* automaton), each document starts again from the root
(:meth:`~SuffixAutomaton.start_document`). Then ``last`` may already have ``next[t]``
(the document's prefix so far occurred in an earlier document): no state is created, and
``last`` becomes that target, or a clone of it by the same rule as case 3. This keeps the
automaton minimal and makes every state's strings occur inside single documents.

Why amortized O(1): each token adds at most two states; the suffix-link walk adding
transitions adds one transition per step (at most ``3n`` transitions in all), and the
redirect walk of case 3 shortens the chain of suffix links of ``last``, whose length
therefore grows by O(1) per token (the classical potential argument of Blumer et al.).

The cursor (matching, amortized O(1) per token)
-----------------------------------------------
A :class:`Cursor` ``(state, length)`` tracks the longest suffix of a *query* (the
context being generated) that occurs in the text: on token ``t``, while the state has no
``next[t]``, move to its suffix link and set ``length`` to that state's ``length``; then
take ``next[t]`` and add 1. At the root with no ``t``, reset to ``(0, 0)``. The cursor
is *canonical*: ``length(link(state)) < length <= length(state)``, so ``state`` is the
state of the matched string and ``min_endpos(state)`` an occurrence of it. Each token
adds 1 to ``length`` and each link step removes at least 1, hence amortized O(1).

Drafting (SAM-Decoding)
-----------------------
The draft for a match in ``state`` is the ``k`` tokens after an occurrence of it. The
paper takes the earliest, ``min_endpos(state)``: in one text the earliest occurrence has
the most text after it. With documents kept apart the earliest occurrence may end its
document, with nothing after it, while a later one continues; so the draft starts at
:meth:`~SuffixAutomaton.draft_endpos`, the occurrence with the most tokens after it *in its
document* (ties: the earliest), which is ``min_endpos`` whenever there is one document.
When fewer than ``k`` tokens follow, the reference moves to the suffix link (a shorter
match, with more occurrences) while the state's link is not the root, and drafts from
where it stops (:meth:`SuffixAutomaton.draft`), never past its document's end.

- *Dynamic automaton*: one per sequence over the committed tokens (prompt + generated).
  For each committed token the cursor is advanced first and the automaton extended
  second, so a match always points to an earlier occurrence. The pending token (decided,
  not committed) is matched but never added: the draft follows it.
- *Static automaton*: built offline over a corpus; only the cursor moves.
- *Adaptive selection* (Algorithm 2, :func:`select_source`): with match lengths ``m_d``
  (dynamic) and ``m_s`` (static), ``m_s' = m_s - l_bias``; if ``max(m_d, m_s') >=
  l_threshold`` draft from the dynamic automaton when ``m_d >= m_s'``, else from the
  static one; otherwise the automata propose nothing (an auxiliary drafter may).

specdec's ``sam`` drafter does not draft the paper's chain: it drafts the occurrence tree
below (:func:`sam_tree` is its oracle), whose tree for a match with one occurrence is that
chain. The chain rule stays here as the paper states it, the oracle of the static
automaton's ``draft`` (``StaticSuffixAutomaton.draft``, ``DynamicSam.draft``).

The occurrence tree (specdec's rule, :func:`occurrence_tree`)
-------------------------------------------------------------
The paper drafts one chain, from one occurrence, and only when the match is long. specdec
drafts the **trie of the continuations of every occurrence** of the match, which the
automaton already is: the strings ``x`` of a state ``v`` occur ``occurrences(v) =
|endpos(v)|`` times, and ``x`` followed by ``t`` occurs ``occurrences(next[t])`` times. A
node of the tree is a path ``t_1 .. t_d`` after the match; its **occurrences** are those of
``x t_1 .. t_d``; its **recency** is where the latest of those occurrences of ``x`` ends,
``last_endpos(state) - d`` (``last_endpos(v) = max(endpos(v))``). Several automata (the
sequence's own text, a store of earlier sequences, a corpus) are *sources*; each has a
match (a cursor), a **bias** subtracted from its match length before sources are compared,
and a **rank** (more recent text ranks higher), and the rule reads:

1. **No fallback while the match continues.** A source's match whose state has no
   transition (every occurrence ends its text) moves to its suffix link until one has;
   the root means no match.
2. **The longest match.** Only the sources whose biased match length is the largest take
   part (ties: all of them); a node's occurrences are summed over them, and its recency is
   the largest ``(rank, end)`` over them.
3. **Best first.** A node offers as candidates its ``max_children`` children of most
   occurrences (then most recent, then lowest token). The tree grows by taking the
   candidate of the largest **weight**, ``occurrences / 2**depth`` (then most recent, then
   shallowest, then first offered), until ``max_nodes`` nodes (root included); nothing
   deeper than ``max_depth`` is offered. The halving per level says that a continuation
   one token deeper needs twice the evidence to come first: every level is one more token
   that must be accepted (measured: docs/algorithms/sam.md, "Choosing the tree rule").

4. **Size by evidence** (optional, off by default: the budget planner cuts trees in a
   ``Generator``). With ``match_factor > 0`` the tree has at most ``match_factor *
   best + match_offset`` nodes besides the root, ``best`` the biased match length of
   rule 2: a long match has predicted its continuation well so far, a short one has not
   (Arctic Inference's suffix decoding caps its drafts the same way). With ``min_share >
   0`` no node with fewer than ``min_share`` of the root's occurrences is offered: a
   continuation few occurrences took is unlikely to be the model's. Both keep small trees
   for the steps whose evidence is strong, which is what pays when few nodes a step may
   be verified (docs/algorithms/sam.md, "Small trees").

A child never has more occurrences than its parent and is one level deeper, so its weight
is at most half its parent's: parents come first and every prefix of the tree is the tree
of a smaller budget. With one occurrence the tree is the paper's chain (from the latest
occurrence rather than the earliest: measured to matter by +-0.01 MAT); with many it
ranks the continuations by how often they followed, REST's frequency trie, read from the
automaton instead of a suffix array.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass
class State:
    """One state; see the module docstring for the meaning of each field."""

    length: int
    link: int
    min_endpos: int
    next: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Cursor:
    """A match: the longest suffix of the query seen so far that occurs in the text.

    ``length`` tokens long, in ``state``; ``(0, 0)`` is no match.
    """

    state: int = 0
    length: int = 0


class SuffixAutomaton:
    """A (generalized) suffix automaton over one or more documents, built online.

    >>> sam = SuffixAutomaton.from_documents([[1, 2, 3, 1, 2, 4]])
    >>> cursor = sam.match([9, 1, 2])      # "1 2" occurs; "9 1 2" does not
    >>> cursor.length, sam.states[cursor.state].min_endpos
    (2, 1)
    >>> sam.draft(cursor, 3)               # what followed the earliest "1 2"
    [3, 1, 2]
    """

    def __init__(self) -> None:
        self.states: list[State] = [State(length=0, link=-1, min_endpos=-1)]
        self.tokens: list[int] = []
        self.document_starts: list[int] = []  # position of each document's first token
        self.last = 0  # the state of the current document's whole prefix
        self.prefix_states: list[int] = []  # per position: the state of its document's prefix ending there
        self._draft_endpos: list[int] | None = None  # computed on demand, dropped by extend
        self._occurrences: list[int] | None = None  # |endpos(v)|, on demand, dropped by extend
        self._last_endpos: list[int] | None = None  # max(endpos(v)), on demand, dropped by extend
        # The state the last extend split and the clone it made (-1: none); an online
        # user keeps its cursor canonical with them (the dynamic automaton's cursor).
        self.split = -1
        self.clone = -1

    @classmethod
    def from_documents(cls, documents: Iterable[Sequence[int]]) -> SuffixAutomaton:
        """The generalized automaton of ``documents``, each kept apart from the others."""
        automaton = cls()
        for document in documents:
            automaton.add_document(document)
        return automaton

    # -- construction ---------------------------------------------------------------------
    def start_document(self) -> None:
        """Begin a new document: its prefixes restart at the root."""
        self.document_starts.append(len(self.tokens))
        self.last = 0

    def add_document(self, document: Sequence[int]) -> None:
        self.start_document()
        for token in document:
            self.extend(token)

    def _new_state(self, length: int, link: int, min_endpos: int, next_: dict[int, int] | None = None) -> int:
        self.states.append(State(length, link, min_endpos, dict(next_ or {})))
        return len(self.states) - 1

    def _split(self, p: int, token: int, q: int) -> int:
        """Case 3: clone ``q`` at length ``length(p) + 1`` and redirect ``p``'s chain to it."""
        states = self.states
        clone = self._new_state(states[p].length + 1, states[q].link, states[q].min_endpos, states[q].next)
        while p != -1 and states[p].next.get(token) == q:
            states[p].next[token] = clone
            p = states[p].link
        states[q].link = clone
        self.split, self.clone = q, clone
        return clone

    def extend(self, token: int) -> None:
        """Append ``token`` to the current document (the module docstring's cases 1-3)."""
        if not self.document_starts:
            self.start_document()
        states = self.states
        position = len(self.tokens)
        self.tokens.append(token)
        self.split = self.clone = -1
        self._draft_endpos = self._occurrences = self._last_endpos = None
        last = self.last
        # Generalized case: the document's prefix + token already occurred in an earlier document.
        if token in states[last].next:
            q = states[last].next[token]
            self.last = q if states[q].length == states[last].length + 1 else self._split(last, token, q)
            self.prefix_states.append(self.last)
            return
        cur = self._new_state(states[last].length + 1, -1, position)
        p = last
        while p != -1 and token not in states[p].next:
            states[p].next[token] = cur
            p = states[p].link
        if p == -1:  # case 1
            states[cur].link = 0
        else:
            q = states[p].next[token]
            if states[q].length == states[p].length + 1:  # case 2
                states[cur].link = q
            else:  # case 3
                states[cur].link = self._split(p, token, q)
        self.last = cur
        self.prefix_states.append(cur)

    # -- matching -------------------------------------------------------------------------
    def step(self, cursor: Cursor, token: int) -> Cursor:
        """The cursor after one more query token (amortized O(1))."""
        state, length = cursor.state, cursor.length
        states = self.states
        while state != 0 and token not in states[state].next:
            state = states[state].link
            length = states[state].length
        if token in states[state].next:
            return Cursor(states[state].next[token], length + 1)
        return Cursor(0, 0)

    def match(self, query: Iterable[int], cursor: Cursor = Cursor()) -> Cursor:
        """Advance ``cursor`` over every token of ``query``."""
        for token in query:
            cursor = self.step(cursor, token)
        return cursor

    # -- drafting -------------------------------------------------------------------------
    def document_end(self, position: int) -> int:
        """One past the last position of the document holding ``position``."""
        index = bisect_right(self.document_starts, position)
        return self.document_starts[index] if index < len(self.document_starts) else len(self.tokens)

    def draft_endpos(self, state: int) -> int:
        """The end of the occurrence of ``state``'s strings with the most tokens after it in
        its document; ties go to the earliest (so one text gives ``min_endpos``).

        ``endpos(state)`` is every position whose document prefix's state has ``state`` on
        its suffix-link path, so one pass over the positions and one over the states,
        longest first, each offering its best to its link, finds every state's (O(n log n)).
        """
        if self._draft_endpos is None:
            states = self.states
            best = [-1] * len(states)

            def after(position: int) -> int:
                return self.document_end(position) - position - 1 if position >= 0 else -1

            def better(a: int, b: int) -> bool:
                return after(a) > after(b) or (after(a) == after(b) and 0 <= a < b)

            for position, prefix_state in enumerate(self.prefix_states):
                if better(position, best[prefix_state]):
                    best[prefix_state] = position
            for index in sorted(range(1, len(states)), key=lambda i: -states[i].length):
                link = states[index].link
                if better(best[index], best[link]):
                    best[link] = best[index]
            best[0] = -1
            self._draft_endpos = best
        return self._draft_endpos[state]

    def _count_occurrences(self) -> None:
        """``occurrences`` and ``last_endpos`` of every state: each position counts for the state
        of its document prefix, and ``endpos(link(v))`` contains ``endpos(v)``, so totals flow
        to suffix links, longest states first. O(n log n)."""
        states = self.states
        counts, last = [0] * len(states), [-1] * len(states)
        for position, prefix_state in enumerate(self.prefix_states):
            counts[prefix_state] += 1
            last[prefix_state] = max(last[prefix_state], position)
        for index in sorted(range(1, len(states)), key=lambda i: -states[i].length):
            link = states[index].link
            counts[link] += counts[index]
            last[link] = max(last[link], last[index])
        counts[0], last[0] = 0, -1
        self._occurrences, self._last_endpos = counts, last

    def occurrences(self, state: int) -> int:
        """``|endpos(state)|``: how many times the state's strings occur (0 for the root)."""
        if self._occurrences is None:
            self._count_occurrences()
        assert self._occurrences is not None
        return self._occurrences[state]

    def last_endpos(self, state: int) -> int:
        """``max(endpos(state))``: where the latest occurrence of the state's strings ends."""
        if self._last_endpos is None:
            self._count_occurrences()
        assert self._last_endpos is not None
        return self._last_endpos[state]

    def continuation(self, state: int) -> list[int]:
        """The tokens after ``draft_endpos(state)`` up to the end of its document."""
        end = self.draft_endpos(state)
        return self.tokens[end + 1 : self.document_end(end)]

    def draft(self, cursor: Cursor, num_tokens: int) -> list[int]:
        """Up to ``num_tokens`` tokens that followed the match's earliest occurrence.

        When fewer remain before the document's end, move to the suffix link while the
        state's link is not the root (the reference's ``to_anc``), and draft from there.
        """
        state = cursor.state
        if state == 0 or num_tokens < 1:
            return []
        states = self.states
        while len(self.continuation(state)) < num_tokens and states[state].link > 0:
            state = states[state].link
        return self.continuation(state)[:num_tokens]

    # -- invariants -----------------------------------------------------------------------
    def check(self) -> None:
        """Assert every invariant (O(sum of state lengths)): for tests."""
        states = self.states
        assert states[0].length == 0 and states[0].link == -1, "the root must have length 0 and no link"
        for index, state in enumerate(states[1:], 1):
            link = states[state.link]
            assert 0 <= state.link < len(states), f"state {index}: link {state.link} out of range"
            assert link.length < state.length, f"state {index}: link length {link.length} >= length {state.length}"
            end = state.min_endpos
            start = end - state.length + 1
            assert start >= 0 and end < len(self.tokens), f"state {index}: min_endpos {end} out of range"
            assert self.document_end(start) == self.document_end(end), f"state {index}: crosses a document end"
            # The longest string, read at its earliest occurrence, leads from the root to this state.
            walk = 0
            for token in self.tokens[start : end + 1]:
                walk = states[walk].next[token]
            assert walk == index, f"state {index}: its longest string leads to state {walk}"
            end = self.draft_endpos(index)
            walk = 0
            for token in self.tokens[end - state.length + 1 : end + 1]:
                walk = states[walk].next.get(token, -1)
                if walk == -1:
                    break
            assert walk == index, f"state {index}: draft_endpos {end} is not an occurrence of it"
            for token, target in state.next.items():
                assert states[target].length >= state.length + 1, f"state {index}: short edge on {token}"


def select_source(m_dynamic: int, m_static: int, l_bias: int, l_threshold: int) -> str | None:
    """Algorithm 2: ``"dynamic"``, ``"static"`` or None (the match is too short to draft).

    >>> select_source(6, 9, 5, 5), select_source(3, 12, 5, 5), select_source(4, 8, 5, 5)
    ('dynamic', 'static', None)
    """
    m_static -= l_bias
    if max(m_dynamic, m_static) < l_threshold:
        return None
    return "dynamic" if m_dynamic >= m_static else "static"


@dataclass(frozen=True)
class Match:
    """One source of an occurrence tree: an automaton and the cursor of the context in it.

    ``bias`` is subtracted from the match length before sources are compared (SAM-Decoding's
    ``l_bias`` for a corpus); ``rank`` orders sources by recency (larger: more recent text).
    """

    automaton: SuffixAutomaton
    cursor: Cursor
    bias: int = 0
    rank: int = 0


@dataclass(frozen=True)
class OccurrenceTree:
    """A draft tree (``tokens[0]`` is the pending token, ``parents[0] == -1``), each node's
    occurrences (the root's: the match's), the ranks of the sources that hold each node, and
    the length of the match it continues (0: no draft)."""

    tokens: list[int]
    parents: list[int]
    occurrences: list[int]
    ranks: list[frozenset[int]]
    match_length: int


def occurrence_tree(
    matches: Sequence[Match], pending: int, *, max_nodes: int, max_depth: int, max_children: int = 4,
    min_share: float = 0.0, match_factor: float = 0.0, match_offset: float = 0.0,
) -> OccurrenceTree:
    """The occurrence tree of the module docstring (rules 1-4), rooted at ``pending``.

    >>> sam = SuffixAutomaton.from_documents([[1, 2, 3, 1, 2, 4, 1, 2, 3, 5]])
    >>> tree = occurrence_tree([Match(sam, sam.match([1, 2]))], 2, max_nodes=4, max_depth=3)
    >>> tree.tokens, tree.parents, tree.occurrences   # "1 2" is followed by 3 twice, by 4 once
    ([2, 3, 4, 5], [-1, 0, 0, 1], [3, 2, 1, 1])
    """
    # Rule 1: a match with no continuation moves to its suffix link.
    live: list[tuple[Match, int, int]] = []  # (match, state, length)
    for match in matches:
        sam, state, length = match.automaton, match.cursor.state, match.cursor.length
        while state > 0 and not sam.states[state].next:
            state = sam.states[state].link
            length = sam.states[state].length
        if state > 0:
            live.append((match, state, length))
    if not live or max_nodes < 2 or max_depth < 1:
        return OccurrenceTree([pending], [-1], [0], [frozenset()], 0)
    # Rule 2: the longest (biased) match; ties all take part.
    best = max(length - match.bias for match, _, length in live)
    kept = [(match, state, length) for match, state, length in live if length - match.bias == best]
    tokens, parents = [pending], [-1]
    occurrences = [sum(match.automaton.occurrences(state) for match, state, _ in kept)]
    ranks = [frozenset(match.rank for match, _, _ in kept)]
    match_length = max(length for _, _, length in kept)
    # Rule 4: size by evidence.
    if match_factor > 0:
        max_nodes = min(max_nodes, int(1.0 + match_factor * max(best, 0) + match_offset))
        if max_nodes < 2:
            return OccurrenceTree(tokens, parents, occurrences, ranks, match_length)
    min_occurrences = min_share * occurrences[0]

    # Rule 3: best first. A candidate: (sort key, parent node, token, occurrences, ranks, states by source).
    candidates: list[tuple[tuple[float, ...], int, int, int, frozenset[int], dict[int, int]]] = []
    offered = 0

    def offer(node: int, states: dict[int, int], depth: int) -> None:
        """Offer the ``max_children`` best children of a node whose state in source i is ``states[i]``."""
        nonlocal offered
        if depth >= max_depth:
            return
        children: dict[int, tuple[int, tuple[int, int], frozenset[int], dict[int, int]]] = {}
        for i, state in states.items():
            match = kept[i][0]
            sam = match.automaton
            for token, target in sam.states[state].next.items():
                count, recency, holders, targets = children.get(token, (0, (-1, -1), frozenset(), {}))
                end = sam.last_endpos(target) - (depth + 1)  # where that occurrence of the match ends
                children[token] = (count + sam.occurrences(target), max(recency, (match.rank, end)),
                                   holders | {match.rank}, {**targets, i: target})
        children = {token: child for token, child in children.items() if child[0] >= min_occurrences}
        ranked = sorted(children.items(), key=lambda item: (-item[1][0], tuple(-r for r in item[1][1]), item[0]))
        for token, (count, recency, holders, targets) in ranked[:max_children]:
            weight = count / 2 ** (depth + 1)  # exact: a power of two scales a float without rounding
            key = (-weight, -recency[0], -recency[1], depth + 1, offered)
            heapq.heappush(candidates, (key, node, token, count, holders, targets))
            offered += 1

    offer(0, {i: state for i, (_, state, _) in enumerate(kept)}, 0)
    depths = [0]
    while candidates and len(tokens) < max_nodes:
        _, parent, token, count, holders, targets = heapq.heappop(candidates)
        tokens.append(token)
        parents.append(parent)
        occurrences.append(count)
        ranks.append(holders)
        depths.append(depths[parent] + 1)
        offer(len(tokens) - 1, targets, depths[-1])
    return OccurrenceTree(tokens, parents, occurrences, ranks, match_length)


def sam_tree(
    committed: Sequence[int],
    pending: int,
    *,
    static: SuffixAutomaton | None = None,
    store: Sequence[Sequence[Sequence[int]]] = (),
    num_nodes: int = 40,
    max_children: int = 4,
    chain_length: int = 40,
    l_bias: int = 5,
    store_bias: int = 0,
    min_share: float = 0.0,
    match_factor: float = 0.0,
    match_offset: float = 0.0,
) -> OccurrenceTree:
    """The ``sam`` drafter's tree after ``pending``, from scratch: the oracle of the drafter.

    Sources, most recent first: the dynamic automaton of ``committed`` (rank 3); the shared
    store's generations, ``store`` as lists of finished sequences, oldest generation first
    (the youngest ranks 2, an older one 1; biased by ``store_bias``); the static corpus
    (rank 0, biased by ``l_bias``). Each matches the context ``committed + [pending]``.
    """
    context = [*committed, pending]
    dynamic = SuffixAutomaton.from_documents([committed])
    matches = [Match(dynamic, dynamic.match(context), 0, 3)]
    for rank, generation in zip((2, 1), reversed(store), strict=False):
        automaton = SuffixAutomaton.from_documents(generation)
        matches.append(Match(automaton, automaton.match(context), store_bias, rank))
    if static is not None:
        matches.append(Match(static, static.match(context), l_bias, 0))
    return occurrence_tree(matches, pending, max_nodes=num_nodes, max_depth=chain_length - 1, max_children=max_children,
                           min_share=min_share, match_factor=match_factor, match_offset=match_offset)
