"""How the model's own token is chosen at a verified node.

Greedy decoding takes the argmax, ties to the lowest token id (``torch.argmax`` returns
the first maximal index), on the plain and the speculative path alike. A chooser sees
only the logits of a node and the absolute position of the token it chooses, never how
that position was reached, which is what makes speculative output equal plain output.
"""

from __future__ import annotations

import torch


class Greedy:
    """Argmax at every node; ties resolve to the lowest token id."""

    name = "greedy"

    def choose(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``logits`` float ``[N, V]``, ``positions`` int64 ``[N]`` -> int64 ``[N]``."""
        del positions  # greedy choices do not depend on where they happen
        return logits.argmax(dim=-1)
