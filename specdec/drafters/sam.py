"""The ``sam`` drafter: SAM-Decoding's suffix automata and its adaptive selection (Algorithm 2).

Hu et al., *SAM Decoding: Speculative Decoding via Suffix Automaton* (2024,
arXiv:2411.10666). Two automata find the longest suffix of the context (committed tokens
plus the pending one) that occurred before:

- the **dynamic** automaton, one per sequence, over the prompt and the generated text
  (C++, incremental: for each committed token the cursor advances first and the automaton
  is extended second, so a match always points to an earlier occurrence);
- the **static** automaton over a corpus (:class:`~specdec.datastores.sam.StaticSuffixAutomaton`,
  a memory-mapped datastore shared by every sequence; here only a cursor per sequence).

With match lengths ``m_d`` and ``m_s``, ``m_s' = m_s - l_bias``: if ``max(m_d, m_s') >=
l_threshold`` the step drafts a chain from the dynamic automaton when ``m_d >= m_s'``, else
from the static one; otherwise it drafts nothing (a composite such as ``sam+recycling``
verifies its auxiliary tree instead). A chain is the tokens after the earliest occurrence
of the match (its ``min_endpos``), moving to the suffix link while fewer than wanted remain
(:mod:`specdec.reference.suffix_automaton` is the oracle, ``docs/algorithms/sam.md`` the
walk-through). Unlike the reference, chains are never padded, and a static draft stops at
the end of its document.

Cost per step: O(1) amortized per committed token (cursor steps and automaton extension,
in C++) plus O(k) for a k-token chain; about 10 us in all on this project's CPU, most of
it Python (the ``DraftTree``). Memory: ~100 bytes per context token for the dynamic automaton.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdec.budget.acceptance import length_feature
from specdec.datastores.sam import Cursor, StaticSuffixAutomaton, native
from specdec.drafters.base import DrafterContext, Factory, parse_options, require_positive
from specdec.errors import SpecDecError
from specdec.types import DrafterFactory, DraftTree, Feedback

SOURCE_DYNAMIC = "sam-dynamic"
SOURCE_STATIC = "sam-static"


@dataclass(frozen=True)
class SamConfig:
    """Options of the ``sam`` drafter (paper defaults).

    ``chain_length``: nodes of a drafted chain, root (the pending token) included, as the
    reference's ``n_predicts`` (40: up to 39 draft tokens); the engine's ``max_nodes`` cuts it
    further. ``l_bias``: subtracted from the static match length before comparing (the
    corpus is less specific to this sequence than its own text). ``l_threshold``: the
    shortest (biased) match worth a chain. ``datastore``: a static automaton file built by
    ``specdec datastore build --kind sam`` (None: the dynamic automaton alone).
    """

    chain_length: int = 40
    l_bias: int = 5
    l_threshold: int = 5
    datastore: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        require_positive("sam", chain_length=self.chain_length)
        for key in ("l_bias", "l_threshold"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecDecError(f"drafter 'sam': {key} must be an int >= 0, got {value!r}")
        if self.datastore is not None and not isinstance(self.datastore, (str, os.PathLike)):
            raise SpecDecError(f"drafter 'sam': datastore must be a file path, got {self.datastore!r}")


class SamDrafter:
    """Per-sequence state (the dynamic automaton, the static cursor) over a shared static automaton.

    Implements :class:`~specdec.types.RetrievalDrafter`: :meth:`match_length` is
    ``max(m_d, m_s - l_bias)`` of the last proposal, Algorithm 2's selection length.
    """

    name = "sam"
    feedback_topk = 0

    def __init__(self, config: SamConfig | None = None, static: StaticSuffixAutomaton | None = None) -> None:
        self.config = config or SamConfig()
        self.static = static
        self._static_view = static.native_view if static is not None else None
        self._module = native()
        self._dynamic = self._module.DynamicSam()
        self._static_cursor: Cursor = (0, 0)
        self.m_dynamic = 0  # match lengths behind the last proposal (pending token included)
        self.m_static = 0
        self.last_source: str | None = None  # SOURCE_DYNAMIC, SOURCE_STATIC, or None: no chain

    def reset(self, prompt: Sequence[int], feedback: Feedback | None = None) -> None:
        tokens = list(prompt)
        self._dynamic = self._module.DynamicSam()
        self._dynamic.commit(tokens)
        self._static_cursor = (0, 0)
        if self._static_view is not None:
            self._static_cursor = self._static_view.advance(self._static_cursor, tokens)
        self.m_dynamic = self.m_static = 0
        self.last_source = None

    def match_length(self) -> int:
        """``max(m_d, m_s - l_bias, 0)`` behind the last proposal, whatever the node budget."""
        return max(self.m_dynamic, self.m_static - self.config.l_bias, 0)

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        config = self.config
        dynamic_state, self.m_dynamic = self._dynamic.peek(pending)
        static_state = self.m_static = 0
        if self._static_view is not None:
            static_state, self.m_static = self._static_view.step(self._static_cursor, pending)
        biased = self.m_static - config.l_bias
        self.last_source = None
        wanted = min(config.chain_length, max_nodes) - 1
        if wanted < 1 or max(self.m_dynamic, biased) < config.l_threshold:
            return DraftTree.single(pending, source=self.name)
        if self.m_dynamic >= biased:
            self.last_source, draft = SOURCE_DYNAMIC, self._dynamic.draft(dynamic_state, wanted)
        else:
            assert self._static_view is not None, "a static match needs a static automaton"
            self.last_source, draft = SOURCE_STATIC, self._static_view.draft(static_state, wanted)
        # The match length behind the chain (bucketed) is what the budget planner learns acceptance by.
        match = self.m_dynamic if self.last_source == SOURCE_DYNAMIC else self.m_static
        return DraftTree.chain(pending, draft, source=self.last_source, feature=length_feature(match))

    def update(self, accepted: Sequence[int], feedback: Feedback | None) -> None:
        tokens = list(accepted)
        self._dynamic.commit(tokens)
        if self._static_view is not None:
            self._static_cursor = self._static_view.advance(self._static_cursor, tokens)

    # -- introspection (tests, benchmarks) ------------------------------------------------
    @property
    def dynamic(self) -> Any:
        """The C++ dynamic automaton (``check()``, ``cursor``, ``num_states``)."""
        return self._dynamic

    @property
    def static_cursor(self) -> Cursor:
        return self._static_cursor


def sam_factory(options: Mapping[str, Any], context: DrafterContext) -> DrafterFactory:
    """The ``sam`` factory: loads the static automaton once (checked against the model's
    tokenizer, or its vocabulary size without one) and builds the C++ extension now, so a
    bad file or a missing compiler fails at construction, not mid-generation."""
    config = parse_options(SamConfig, "sam", options)
    static = None
    if config.datastore is not None:
        static = StaticSuffixAutomaton.load(
            config.datastore, tokenizer=context.tokenizer_identity(), vocab_size=context.vocab_size
        )
    native()
    return Factory("sam", lambda: SamDrafter(config, static))
