"""The ``none`` drafter: a one-node tree every step, i.e. plain autoregressive decoding.

It runs through the same loop and verifier as every speculative drafter, so it is both
the baseline and a check that the loop itself adds nothing but its overhead.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdec.types import DraftTree, Feedback


class NoDrafter:
    """Drafts nothing: each step verifies only the pending token (MAT is exactly 1.0)."""

    name = "none"
    feedback_topk = 0

    def reset(self, prompt: Sequence[int], feedback: Feedback | None = None) -> None:
        del prompt, feedback

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        return DraftTree.single(pending, source=self.name)

    def update(self, accepted: Sequence[int], feedback: Feedback | None) -> None:
        del accepted, feedback
