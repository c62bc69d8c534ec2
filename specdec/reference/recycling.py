"""Token Recycling, the reference: a dict of candidate lists and a template walked path by path.

Luo et al., *Turning Trash into Treasure: Accelerating Inference of Large Language Models
with Token Recycling* (ACL 2025). Symbols: ``M[x]`` is the list of the ``k`` tokens the
model most recently ranked most likely after token ``x``; a template is a list of rank
paths ``(r_1, ..., r_d)`` (best first, parents first); the node of path ``p + (j,)``
carries ``M[t][j]`` where ``t`` is the token of node ``p``, and the root carries the
pending token.

Rules the production drafter (:mod:`specdec.drafters.recycling`) must follow exactly:

- **Writing**: rows are written in the order given, then the rows of the accepted path
  again, so when a token occurs at several verified nodes the last writer wins and the
  accepted path's rows beat rejected ones.
- **Drafting**: a node whose parent was left out, or whose parent's token has no row,
  is left out, and so is its subtree; the remaining nodes keep their template order.

This module imports nothing from specdec but :mod:`specdec.types`, so it can judge the
production code without sharing it.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdec.types import DraftTree


class ReferenceRecycling:
    """The matrix as a dict ``token -> candidates``, the draft as a walk over rank paths."""

    def __init__(self, paths: Sequence[Sequence[int]], k: int = 8) -> None:
        self.paths = [tuple(p) for p in paths]
        self.k = k
        self.matrix: dict[int, list[int]] = {}

    def write(self, tokens: Sequence[int], topk: Sequence[Sequence[int]], accepted: Sequence[int] = ()) -> None:
        """``M[tokens[m]] = topk[m][:k]`` for every row in order, then for the accepted rows again."""
        for m in [*range(len(tokens)), *accepted]:
            self.matrix[int(tokens[m])] = [int(t) for t in topk[m][: self.k]]

    def draft(self, pending: int, num_nodes: int) -> DraftTree:
        """The first ``num_nodes - 1`` template paths that can be filled, under a root carrying ``pending``.

        >>> ref = ReferenceRecycling([[0], [1], [0, 0]], k=2)
        >>> ref.write([5, 6], [[6, 7], [8, 9]])
        >>> ref.draft(5, 4).tokens
        (5, 6, 7, 8)
        """
        node_of: dict[tuple[int, ...], int] = {(): 0}
        tokens, parents = [pending], [-1]
        for path in self.paths[: max(num_nodes - 1, 0)]:
            parent = node_of.get(path[:-1])
            if parent is None:
                continue  # the parent was left out: so is this node
            row = self.matrix.get(tokens[parent])
            if row is None:
                continue  # the parent's token was never seen: nothing to recycle
            node_of[path] = len(tokens)
            tokens.append(row[path[-1]])
            parents.append(parent)
        return DraftTree(tuple(tokens), tuple(parents))
