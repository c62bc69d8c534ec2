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
"""

from __future__ import annotations

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
        self._draft_endpos = None
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


def sam_draft(
    committed: Sequence[int],
    pending: int,
    static: SuffixAutomaton | None,
    *,
    chain_length: int = 40,
    l_bias: int = 5,
    l_threshold: int = 5,
) -> tuple[list[int], int, int, str | None]:
    """SAM-Decoding's draft after ``pending``, computed from scratch: the oracle of the drafter.

    The dynamic automaton is built over ``committed``; the cursor matches the context
    ``committed + [pending]`` (the longest suffix of it that occurs in ``committed``,
    which is what advancing before extending yields online). Returns the draft (at most
    ``chain_length - 1`` tokens after the pending one), ``m_d``, ``m_s`` and the source.
    """
    dynamic = SuffixAutomaton.from_documents([committed])
    context = [*committed, pending]
    cursor_dynamic = dynamic.match(context)
    cursor_static = static.match(context) if static is not None else Cursor()
    source = select_source(cursor_dynamic.length, cursor_static.length, l_bias, l_threshold)
    draft: list[int] = []
    if source == "dynamic":
        draft = dynamic.draft(cursor_dynamic, chain_length - 1)
    elif source == "static" and static is not None:
        draft = static.draft(cursor_static, chain_length - 1)
    return draft, cursor_dynamic.length, cursor_static.length, source
