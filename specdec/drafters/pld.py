"""Prompt lookup decoding, the production drafter.

Same rule as :mod:`specdec.reference.pld` (earliest earlier occurrence of the longest
matching n-gram suffix, ``n`` from ``max_ngram`` down to ``min_ngram``), but O(max_ngram)
per step instead of a scan of the whole context: a hash map from each n-gram to the end
index of its *first* occurrence is extended as tokens are committed. Only committed
positions are indexed, so a hit always ends before the pending token, exactly the
reference's "ends before the last position". Memory: ``max_ngram - min_ngram + 1``
map entries per context token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specdec.drafters.base import require_positive
from specdec.errors import SpecDecError
from specdec.types import DraftTree, Feedback


@dataclass(frozen=True)
class PLDConfig:
    """``max_ngram``/``min_ngram``: suffix lengths tried, longest first; ``num_draft``: draft length."""

    max_ngram: int = 3
    min_ngram: int = 1
    num_draft: int = 10

    def __post_init__(self) -> None:
        require_positive("pld", max_ngram=self.max_ngram, min_ngram=self.min_ngram, num_draft=self.num_draft)
        if self.min_ngram > self.max_ngram:
            raise SpecDecError(f"drafter 'pld': min_ngram {self.min_ngram} exceeds max_ngram {self.max_ngram}")


class PromptLookupDrafter:
    """Drafts the continuation of the earliest earlier occurrence of the context's ending."""

    name = "pld"
    feedback_topk = 0

    def __init__(self, config: PLDConfig | None = None) -> None:
        self.config = config or PLDConfig()
        self._tokens: list[int] = []
        self._first_end: dict[tuple[int, ...], int] = {}
        self._match_length = 0

    def reset(self, prompt: Sequence[int], feedback: Feedback | None = None) -> None:
        self._tokens = []
        self._first_end = {}
        self._extend(prompt)

    def _extend(self, committed: Sequence[int]) -> None:
        tokens, first_end = self._tokens, self._first_end
        lo, hi = self.config.min_ngram, self.config.max_ngram
        for token in committed:
            tokens.append(int(token))
            end = len(tokens) - 1
            for n in range(lo, min(hi, end + 1) + 1):
                first_end.setdefault(tuple(tokens[end - n + 1 :]), end)

    def find(self, pending: int, num_draft: int) -> list[int]:
        """The draft after ``pending`` (up to ``num_draft`` tokens), possibly empty."""
        tokens, config = self._tokens, self.config
        context_len = len(tokens) + 1
        self._match_length = 0
        for n in range(min(config.max_ngram, context_len - 1), config.min_ngram - 1, -1):
            end = self._first_end.get((*tokens[len(tokens) - n + 1 :], pending))
            if end is None:
                continue
            self._match_length = n
            draft = tokens[end + 1 : end + 1 + num_draft]
            if len(draft) < num_draft:  # the continuation runs into the pending token itself
                draft.append(pending)
            return draft
        return []

    def match_length(self) -> int:
        """The n-gram length behind the last proposal (0: none, or the budget allowed no draft)."""
        return self._match_length

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        self._match_length = 0
        draft = self.find(pending, min(self.config.num_draft, max_nodes - 1)) if max_nodes > 1 else []
        # The n-gram length is what PLD knows of its draft's quality: the budget planner learns
        # acceptance per n (a 3-gram match predicts a longer accepted run than a 1-gram one).
        return DraftTree.chain(pending, draft, source=self.name, feature=self._match_length)

    def update(self, accepted: Sequence[int], feedback: Feedback | None) -> None:
        self._extend(accepted)
