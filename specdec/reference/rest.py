"""REST (retrieval-based speculative decoding), the reference.

He, Zhong, Cai, Lee, He, *REST: Retrieval-Based Speculative Decoding* (NAACL 2024,
github.com/FasterDecoding/REST): text a model writes often continues the way some text in a
large corpus continued, so the corpus's most frequent continuations of the context's
ending make a draft tree.

Symbols:

- the **datastore** is a list of *documents*, each a list of token ids; nothing is drawn
  across a document's end;
- the **context** is the committed tokens plus the pending token (last);
- the **query** for a length ``s`` is the context's last ``s`` tokens;
- a **match** of a query is an occurrence of it in a document followed by at least one more
  token of that document; its **continuation** is the up to ``max_depth`` tokens after it;
- matches are listed in **suffix order**: by the document text from the match's start,
  where a document's end sorts after every token (what a suffix array of the documents,
  each followed by a separator larger than every id, lists).

Rule, in five steps:

1. for ``s`` from ``min(max_query, len(context))`` down to ``min_query``, the first query
   with matches wins; no query with matches means no draft (not a dummy token);
2. of its ``n`` matches, take ``m = min(n, max_matches)``: row ``j`` is the match at
   suffix-order index ``j * n // m``, an evenly spread (stratified) sample, since suffix
   order groups matches by continuation;
3. a trie counts, for every continuation prefix, the sampled matches it starts;
4. rank the prefixes by count (descending), then length (ascending), then their token ids
   compared lexicographically (ascending): a total order, so the draft is deterministic;
5. the draft is the first ``num_draft`` prefixes of that ranking. A prefix's parent (one
   token shorter) counts at least as much and is shorter, so it ranks earlier: the draft
   is prefix-closed, lists parents before children, and each leading part of it is the
   most frequent prefix-closed set of its size.

Where the REST paper's code differs (we follow the rule above): it breaks ties in no fixed
order, lets continuations run into the next document, stores ids in 16 bits, and prunes its
64 nodes with a heuristic; which 5,000 of many matches it takes is not a stratified sample.

This oracle sorts every suffix with a Python key, O(N * L log N) to build (L =
``max_query + max_depth``) and O(L * N) memory: meant for corpora of up to ~10^5 tokens.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

# A document's end: compares above every token id, as the separator does in a suffix array.
END = float("inf")

Key = tuple[float, ...]


@dataclass(frozen=True)
class ReferenceRetrieval:
    """What the rule produces for one context.

    ``matches`` are ``(document, offset)`` of every match of the winning query, in suffix
    order; ``sampled`` the continuations of the sampled rows. Draft node ``k`` carries
    ``tokens[k]``, its parent is tree node ``parents[k]`` (0: the root, the pending token;
    ``j + 1``: draft node ``j``) and ``counts[k]`` sampled continuations start with its prefix.
    """

    match_length: int
    matches: list[tuple[int, int]]
    sampled: list[tuple[int, ...]]
    tokens: list[int]
    parents: list[int]
    counts: list[int]


class ReferenceRestIndex:
    """All suffixes of ``documents`` in suffix order, for queries up to ``max_query`` tokens.

    Suffixes are sorted by their first ``max_query + max_depth`` tokens (plus :data:`END` at a
    document's end). Two suffixes that agree that far are interchangeable for every query
    and continuation this index answers, so the order among them does not matter.

    >>> index = ReferenceRestIndex([[1, 2, 3, 1, 2, 4], [1, 2, 3]], max_query=4, max_depth=2)
    >>> found = index.retrieve([9, 1, 2], min_query=2)
    >>> found.match_length, found.matches, found.sampled
    (2, [(0, 0), (1, 0), (0, 3)], [(3, 1), (3,), (4,)])
    >>> found.tokens, found.parents, found.counts
    ([3, 4, 1], [0, 0, 1], [2, 1, 1])
    """

    def __init__(self, documents: Sequence[Sequence[int]], max_query: int = 16, max_depth: int = 10) -> None:
        self.documents = [list(document) for document in documents]
        self.max_query = max_query
        self.max_depth = max_depth
        key_length = max_query + max_depth
        suffixes = [(d, offset) for d, document in enumerate(self.documents) for offset in range(len(document))]
        self.keys_by_suffix = {suffix: self._key(suffix, key_length) for suffix in suffixes}
        self.suffixes = sorted(suffixes, key=self.keys_by_suffix.__getitem__)
        self.keys = [self.keys_by_suffix[suffix] for suffix in self.suffixes]

    def _key(self, suffix: tuple[int, int], length: int) -> Key:
        document, offset = suffix
        text = self.documents[document][offset : offset + length]
        return (*text, END) if offset + length >= len(self.documents[document]) else tuple(text)

    def matches(self, query: Sequence[int]) -> list[tuple[int, int]]:
        """Every match of ``query`` (followed by a token of its document), in suffix order.

        Keys starting with ``query`` lie in ``[bisect_left(query), ...)``; among them, the
        ones whose document ends right after the query hold END next and sort last, so
        the matches end where ``query + (END,)`` would be inserted.
        """
        assert 1 <= len(query) <= self.max_query, (len(query), self.max_query)
        prefix: Key = tuple(query)
        lo = bisect_left(self.keys, prefix)
        hi = bisect_left(self.keys, (*prefix, END))
        return self.suffixes[lo:hi]

    def continuation(self, match: tuple[int, int], match_length: int) -> tuple[int, ...]:
        document, offset = match
        start = offset + match_length
        return tuple(self.documents[document][start : start + self.max_depth])

    def retrieve(
        self, context: Sequence[int], min_query: int = 2, max_matches: int = 5000, num_draft: int = 64
    ) -> ReferenceRetrieval:
        """Steps 1 to 5 of the module docstring for ``context`` (committed tokens + pending)."""
        # 1. the longest query with matches, trying the longest first
        for s in range(min(self.max_query, len(context)), min_query - 1, -1):
            found = self.matches(context[len(context) - s :])
            if found:
                break
        else:
            return ReferenceRetrieval(0, [], [], [], [], [])
        # 2. an evenly spread sample of at most max_matches matches
        n = len(found)
        m = min(n, max_matches)
        sampled = [self.continuation(found[j * n // m], s) for j in range(m)]
        # 3. count every continuation prefix
        counts: Counter[tuple[int, ...]] = Counter()
        for continuation in sampled:
            for depth in range(1, len(continuation) + 1):
                counts[continuation[:depth]] += 1
        # 4. rank: most frequent first, then shorter, then lexicographically smaller
        ranked = sorted(counts, key=lambda prefix: (-counts[prefix], len(prefix), prefix))
        # 5. the best num_draft prefixes, as tree nodes (root = 0, draft node j = j + 1)
        draft = ranked[:num_draft]
        tree_index = {(): 0} | {prefix: k + 1 for k, prefix in enumerate(draft)}
        return ReferenceRetrieval(
            match_length=s,
            matches=found,
            sampled=sampled,
            tokens=[prefix[-1] for prefix in draft],
            parents=[tree_index[prefix[:-1]] for prefix in draft],
            counts=[counts[prefix] for prefix in draft],
        )
