"""The ``arctic`` drafter: Arctic Inference's suffix decoding, as a peer to measure ``sam`` against.

Oliaro et al., *SuffixDecoding: Extreme Speculative Decoding for Emerging AI Applications*
(NeurIPS 2025), as shipped in Snowflake's ``arctic-inference`` (``pip install
arctic-inference==0.3.0``; an optional dependency, built from source, needs numpy). Its
``SuffixDecodingCache`` keeps a suffix tree of each request's prompt and, optionally, a
global suffix tree of earlier responses shared by all requests (evicted first in, first
out by request count). Each step it matches every suffix length of the context, drafts
from each a tree of continuations ranked by their empirical probability (count ratios,
pruned below ``min_token_prob``, at most ``max_spec_factor * match_length +
max_spec_offset`` tokens), and keeps the draft of the highest score (sum of probabilities).

Here it is one more drafter: its draft (token ids with a parent index each, ``-1`` for
the pending token) becomes our :class:`~specdec.types.DraftTree` and our verifier checks
it, so its output is exactly plain decoding's, like every drafter's. Per request by
default (the prompt and the request's own output); with ``shared=True`` the factory's
drafters share one cache, each adding its output as it is committed and ending its
request in :meth:`ArcticDrafter.finish` (``Generator`` calls it).

Registered as ``arctic`` only where ``arctic_inference`` is installed (:func:`installed`).
Node features for the budget planner: Arctic's own probability of the node, in tenths.
"""

from __future__ import annotations

import importlib.util
import itertools
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdec.drafters.base import DrafterContext, Factory, parse_options, require_positive
from specdec.errors import SpecDecError
from specdec.types import DrafterFactory, DraftTree, Feedback

INSTALL_HINT = "pip install arctic-inference==0.3.0 (builds from source; needs numpy)"


def installed() -> bool:
    """Whether Arctic Inference is installed here (found, not imported: the registry asks at import)."""
    return importlib.util.find_spec("arctic_inference") is not None


@dataclass(frozen=True)
class ArcticConfig:
    """Options, named as Arctic's ``SuffixDecodingCache.speculate`` names them (its defaults).

    ``num_nodes``: nodes of a draft, root included (Arctic's ``max_spec_tokens`` + 1; the
    engine's ``max_nodes`` cuts it further). ``max_tree_depth``: depth of its suffix trees
    (and context it matches). ``shared``: one cache for all of the factory's sequences
    (earlier responses drafted from); ``max_cached_requests``: responses it keeps (-1: all).
    ``use_tree_spec``: draft a tree (True; we verify trees) or Arctic's single path.
    """

    num_nodes: int = 40
    max_tree_depth: int = 64
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1
    use_tree_spec: bool = True
    shared: bool = False
    max_cached_requests: int = -1

    def __post_init__(self) -> None:
        require_positive("arctic", num_nodes=self.num_nodes, max_tree_depth=self.max_tree_depth)
        for key in ("max_spec_factor", "max_spec_offset", "min_token_prob"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise SpecDecError(f"drafter 'arctic': {key} must be a number >= 0, got {value!r}")
        if not isinstance(self.shared, bool) or not isinstance(self.use_tree_spec, bool):
            raise SpecDecError("drafter 'arctic': shared and use_tree_spec must be True or False")
        cached = self.max_cached_requests
        if isinstance(cached, bool) or not isinstance(cached, int) or cached < -1 or cached == 0:
            raise SpecDecError(f"drafter 'arctic': max_cached_requests must be -1 (all) or >= 1, got {cached!r}")


def new_cache(config: ArcticConfig) -> Any:
    """An Arctic ``SuffixDecodingCache``: with a global (shared) tree when ``config.shared``."""
    try:
        from arctic_inference.suffix_decoding import (  # type: ignore[import-not-found,import-untyped,unused-ignore]
            SuffixDecodingCache,
        )
    except ImportError as error:
        raise SpecDecError(f"drafter 'arctic' needs Arctic Inference: {INSTALL_HINT} ({error})") from None
    return SuffixDecodingCache(config.max_tree_depth, config.max_cached_requests if config.shared else 0)


def arctic_tree(pending: int, token_ids: Sequence[int], parents: Sequence[int], probs: Sequence[float],
                source: str = "arctic") -> DraftTree:
    """Arctic's draft as our tree: its node ``i`` is our node ``i + 1``, its parent ``-1`` our root.

    Arctic emits a node after its parent, so the order is already ours. Feature: the node's
    probability in tenths (0..10).

    >>> arctic_tree(7, [8, 9, 5], [-1, 0, -1], [0.9, 0.5, 0.1]).parents
    (-1, 0, 1, 0)
    """
    tokens = (pending, *map(int, token_ids))
    tree_parents = (-1, *(int(p) + 1 for p in parents))
    features = (10, *(min(10, max(0, int(10 * float(p)))) for p in probs))
    return DraftTree(tokens, tree_parents, source, None, features)


class ArcticDrafter:
    """One request in an Arctic ``SuffixDecodingCache`` (its own, or the factory's shared one)."""

    name = "arctic"
    feedback_topk = 0
    _ids = itertools.count()

    def __init__(self, config: ArcticConfig | None = None, cache: Any = None, lock: threading.Lock | None = None
                 ) -> None:
        self.config = config or ArcticConfig()
        self._shared_cache = cache
        self._cache: Any = None
        self._lock = lock or threading.Lock()
        self._request: int | None = None
        self._context: list[int] = []

    def reset(self, prompt: Sequence[int], feedback: Feedback | None = None) -> None:
        self.finish()
        self._cache = self._shared_cache if self._shared_cache is not None else new_cache(self.config)
        self._request = next(self._ids)
        self._context = [int(t) for t in prompt]
        with self._lock:
            self._cache.start_request(self._request, self._context)

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        budget = min(self.config.num_nodes, max_nodes) - 1
        if budget < 1 or self._request is None:
            return DraftTree.single(pending, self.name)
        config = self.config
        context = [*self._context[-(config.max_tree_depth - 1):], pending]
        with self._lock:
            draft = self._cache.speculate(
                self._request, context, max_spec_tokens=budget, max_spec_factor=config.max_spec_factor,
                max_spec_offset=config.max_spec_offset, min_token_prob=config.min_token_prob,
                use_tree_spec=config.use_tree_spec,
            )
        if not draft.token_ids:
            return DraftTree.single(pending, self.name)
        return arctic_tree(pending, draft.token_ids, draft.parents, draft.probs, self.name)

    def update(self, accepted: Sequence[int], feedback: Feedback | None) -> None:
        tokens = [int(t) for t in accepted]
        self._context += tokens
        if self._request is not None:
            with self._lock:
                self._cache.add_active_response(self._request, tokens)

    def finish(self) -> None:
        """End the request: its prompt tree is freed; its output stays in a shared cache."""
        if self._request is not None:
            with self._lock:
                self._cache.stop_request(self._request)
            self._request = None


def arctic_factory(options: Mapping[str, Any], context: DrafterContext) -> DrafterFactory:
    """The ``arctic`` factory; with ``shared=True`` one cache (and lock) serves all its drafters."""
    config = parse_options(ArcticConfig, "arctic", options)
    cache = new_cache(config) if config.shared else None
    if not config.shared:
        new_cache(config)  # fail now, not mid-generation, when Arctic is missing
    lock = threading.Lock()
    return Factory("arctic", lambda: ArcticDrafter(config, cache, lock))
