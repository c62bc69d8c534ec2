"""The ``rest`` drafter: draft trees of a corpus's most frequent continuations (REST).

Per sequence it keeps only the last ``max_query - 1`` committed tokens; each step it asks
the shared, read-only :class:`~specdec.datastores.rest.RestDatastore` for the draft after
those tokens plus the pending one (rules: :mod:`specdec.reference.rest`). Nodes come best
first, so the engine's node budget keeps the most frequent prefix-closed set that fits.
With no match there is no draft: a one-node tree, a plain step.

Usage: ``specdec.run(model, prompt, "rest", datastore="corpus.rest")``; build the file
with ``specdec datastore build --kind rest --input FILES... -o corpus.rest``.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specdec.datastores.rest import RestDatastore, load
from specdec.drafters.base import DrafterContext, Factory, parse_options, require_positive
from specdec.errors import SpecDecError
from specdec.types import DrafterFactory, DraftTree, Feedback

# Node features: the conditional frequency of a node among its parent's continuations, in tenths.
FREQUENCY_BUCKETS = 10


@dataclass(frozen=True)
class RestConfig:
    """Options of the ``rest`` drafter (REST paper defaults).

    ``datastore``: path of a ``rest`` datastore file (required). Queries are the last
    ``max_query`` down to ``min_query`` tokens of the context (pending included);
    ``max_matches`` matches feed the trie; continuations have up to ``max_depth`` tokens;
    the draft has up to ``num_draft`` nodes besides the root. ``verify``: check the file's
    checksums when it is first loaded (a full read).
    """

    datastore: str | os.PathLike[str] | None = None
    max_query: int = 16
    min_query: int = 2
    max_matches: int = 5000
    max_depth: int = 10
    num_draft: int = 64
    verify: bool = True

    def __post_init__(self) -> None:
        require_positive("rest", max_query=self.max_query, min_query=self.min_query, max_matches=self.max_matches,
                         max_depth=self.max_depth, num_draft=self.num_draft)
        if self.min_query > self.max_query:
            raise SpecDecError(f"drafter 'rest': min_query {self.min_query} exceeds max_query {self.max_query}")
        if self.datastore is None:
            raise SpecDecError("drafter 'rest' needs a datastore: pass datastore=PATH (build one with "
                               "`specdec datastore build --kind rest --input FILES... -o PATH`)")
        if not isinstance(self.datastore, (str, os.PathLike)):
            raise SpecDecError(f"drafter 'rest': datastore must be a path, got {self.datastore!r}")
        if not isinstance(self.verify, bool):
            raise SpecDecError(f"drafter 'rest': verify must be True or False, got {self.verify!r}")


class RestDrafter:
    """Drafts the most frequent continuations of the context's ending in a shared datastore."""

    name = "rest"
    feedback_topk = 0

    def __init__(self, store: RestDatastore, config: RestConfig) -> None:
        self.store = store
        self.config = config
        # The committed tokens a query can reach (the pending token completes it).
        self._tail: deque[int] = deque(maxlen=config.max_query - 1)
        self._match_length = 0

    def reset(self, prompt: Sequence[int], feedback: Feedback | None = None) -> None:
        self._tail.clear()
        if self._tail.maxlen:
            self._tail.extend(int(t) for t in prompt[-self._tail.maxlen :])
        self._match_length = 0

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        self._match_length = 0
        budget = min(self.config.num_draft, max_nodes - 1)
        if budget < 1:
            return DraftTree.single(pending, source=self.name)
        config = self.config
        found = self.store.retrieve([*self._tail, pending], min_query=config.min_query,
                                    max_matches=config.max_matches, max_depth=config.max_depth, num_draft=budget)
        if found.match_length == 0:
            return DraftTree.single(pending, source=self.name)
        self._match_length = found.match_length
        # Each node's feature (for the budget planner's acceptance model) is the decile of its
        # frequency among its siblings' continuations: count / parent's count, which is the
        # corpus's estimate of P(node | parent); 9 is "nine in ten or more".
        parent_counts = np.where(found.parents == 0, found.sampled, found.counts[found.parents - 1])
        features = np.minimum(FREQUENCY_BUCKETS - 1, FREQUENCY_BUCKETS * found.counts // parent_counts)
        return DraftTree((pending, *found.tokens.tolist()), (-1, *found.parents.tolist()), self.name, None,
                         (FREQUENCY_BUCKETS - 1, *features.tolist()))

    def match_length(self) -> int:
        """The query length ``s`` behind the last proposal (0: no match, or no room for a draft)."""
        return self._match_length

    def update(self, accepted: Sequence[int], feedback: Feedback | None) -> None:
        self._tail.extend(accepted)


def rest_factory(options: Mapping[str, Any], context: DrafterContext) -> DrafterFactory:
    """Load (or reuse) the datastore once and check it against the target's tokenizer."""
    config = parse_options(RestConfig, "rest", options)
    assert config.datastore is not None  # checked by RestConfig
    store = load(config.datastore, tokenizer=context.tokenizer_identity(), vocab_size=context.vocab_size,
                 verify=config.verify)
    return Factory("rest", lambda: RestDrafter(store, config))
