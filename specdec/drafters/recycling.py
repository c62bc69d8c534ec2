"""Token Recycling: draft from the model's own recent top-k predictions.

Luo et al., *Turning Trash into Treasure: Accelerating Inference of Large Language Models
with Token Recycling* (ACL 2025). Every verification computes the model's distribution at
every tree node, rejected nodes included; its top-k tokens are usually thrown away. Token
Recycling keeps them: the **matrix** ``M`` (``[vocab, k]``, ``k = 8``) holds, for each token
``x``, the ``k`` tokens the model most recently ranked most likely after ``x``. A draft is a
fixed tree **template** (:mod:`specdec.drafters.recycling_templates`) filled breadth-first from ``M``:
the root carries the pending token, and the child of rank ``j`` of a node carrying ``x``
carries ``M[x][j]``.

After each step every verified node's row is rewritten from its top-k (``Feedback``). Two
nodes of one tree may carry the same token; then the last one in tree order wins, except
that the accepted path's rows are written last, so that a token's row comes from the
committed context when it occurs there (measured: see docs/algorithms/recycling.md).
With ``prompt_feedback=True`` the prompt's positions also write their rows at reset
(later positions win).

**State lifetime.** ``reset`` starts a new sequence and keeps the matrix, so a drafter
object reused across requests keeps learning (as SAM-Decoding's code does). A drafter named
by a string reads and writes the matrix its model shares in the process, saved across
processes (:mod:`specdec.drafters.recycling_state`), unless the learned-state cache is off
(``planner_cache=False``, ``SPECDEC_PLANNER_CACHE=0``): then it is fresh for every request,
as the Token Recycling benchmark fixes do. :meth:`RecyclingDrafter.clear` forgets it.

Costs: ``propose`` O(N) NumPy work for an ``N``-node template (one fancy-index per tree
level) plus building the :class:`~specdec.types.DraftTree`; ``update`` O(N k). Memory:
``4 k`` bytes per vocabulary entry (int32), 1.5 MiB for a 49k vocabulary at ``k = 8``.
Rows never written are ``-1`` (unknown): a node whose token has no row gets no children.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from specdec.drafters.base import require_positive
from specdec.drafters.recycling_state import RecyclingMatrix
from specdec.drafters.recycling_templates import TreeTemplate, resolve_template
from specdec.errors import SpecDecError
from specdec.types import DraftTree, Feedback

IntArray = npt.NDArray[np.int64]
MatrixArray = npt.NDArray[np.int32]


@dataclass(frozen=True)
class RecyclingConfig:
    """Options of the ``recycling`` drafter.

    ``k``: candidates kept per token (the matrix's width; the model's top-k at every node).
    ``template``: ``"default"`` (measured on the default model, shipped in specdec/data),
    ``"breadth-first-N"``, a template JSON file, or a list of rank paths.
    ``num_nodes``: nodes per draft, root included; None takes the template's
    ``default_nodes`` (or all of it). The engine's ``max_nodes`` caps it further.
    """

    k: int = 8
    template: str | os.PathLike[str] | Sequence[Sequence[int]] | TreeTemplate = "default"
    num_nodes: int | None = None

    def __post_init__(self) -> None:
        require_positive("recycling", k=self.k)
        if self.num_nodes is not None:
            require_positive("recycling", num_nodes=self.num_nodes)


def check_template(template: TreeTemplate, k: int) -> None:
    """Refuse a template that asks for a rank the matrix does not keep."""
    if template.max_rank >= k:
        raise SpecDecError(
            f"drafter 'recycling': template {template.name!r} uses rank {template.max_rank}, "
            f"but the matrix keeps only k={k} candidates per token (ranks 0..{k - 1})"
        )


class RecyclingDrafter:
    """Fills a tree template from the matrix of recycled top-k predictions.

    ``state``: the matrix to read and write, shared with other drafters of the same model
    (:func:`specdec.drafters.recycling_state.SharedMatrices.get`); None: a matrix of its own.
    """

    name = "recycling"

    def __init__(
        self,
        config: RecyclingConfig | None = None,
        vocab_size: int | None = None,
        template: TreeTemplate | None = None,
        state: RecyclingMatrix | None = None,
    ) -> None:
        self.config = config or RecyclingConfig()
        self.template = template if template is not None else resolve_template(self.config.template, self.config.k)
        check_template(self.template, self.config.k)
        self.num_nodes = min(self.config.num_nodes or self.template.default_nodes or self.template.size,
                             self.template.size)
        self.feedback_topk = self.config.k
        # Rows 0..V-1 are tokens; one extra last row of UNKNOWN is the sentinel that index -1
        # (an unknown parent) reads, so unknown subtrees need no branch in the fill loop.
        if state is not None and state.k != self.config.k:
            raise SpecDecError(f"drafter 'recycling': a shared matrix of k={state.k} for k={self.config.k}")
        self.state = state if state is not None else RecyclingMatrix(self.config.k, vocab_size)
        self._parents: list[int] = self.template.parents.tolist()
        self._parent_tuple = tuple(self._parents)
        self._ranks: list[int] = self.template.ranks.tolist()
        self.last_nodes: list[int] = [0]  # the template node of each node of the last draft

    # -- the matrix ---------------------------------------------------------------------
    @property
    def matrix(self) -> MatrixArray:
        """The recycled candidates, int32 ``[V, k]`` (a view; ``-1`` = never written)."""
        return self.state.array[:-1]

    def clear(self) -> None:
        """Forget every recycled candidate (the next sequence starts cold; a shared matrix for everyone)."""
        self.state.clear()

    def write(self, tokens: IntArray, topk: IntArray, last: Sequence[int] = ()) -> None:
        """Set ``M[tokens[m]] = topk[m, :k]``; among repeated tokens the row written last wins.

        ``tokens`` int64 ``[N]``, ``topk`` int64 ``[N, >= k]``. Rows are written in order, then
        the rows indexed by ``last`` again (the accepted path), so those win repeats. O(N k).
        """
        k = self.config.k
        if topk.ndim != 2 or topk.shape[0] != tokens.shape[0] or topk.shape[1] < k:
            raise SpecDecError(
                f"drafter 'recycling' needs top-{k} feedback for {tokens.shape[0]} tokens, got shape {topk.shape}"
            )
        if tokens.size == 0:
            return
        # Which row each distinct token takes: a dict keeps the last writer (a plain Python
        # loop over <= a few hundred ids beats np.unique's sort at these sizes).
        token_list = tokens.tolist()
        source = {token: m for m, token in enumerate(token_list)}
        for m in last:
            source[token_list[m]] = m
        self.state.grow(max(source))  # the vocabulary may be unknown at construction: amortized doubling
        self.state.array[list(source)] = topk[list(source.values()), :k]
        self.state.changed = True

    # -- the drafter protocol -----------------------------------------------------------
    def reset(self, prompt: Sequence[int], feedback: Feedback | None = None) -> None:
        """A new sequence: the matrix is kept; prompt feedback (when given) writes its rows."""
        if feedback is not None:
            self.write(feedback.tokens, feedback.topk)

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        """Fill the first ``min(num_nodes, max_nodes)`` template nodes; drop nodes whose token is unknown.

        A plain loop over nodes in template order (parents first): per node one list lookup
        in its parent's row, each row read from the matrix once. For the <= ~100 nodes of a
        draft this beats per-level NumPy fancy indexing, whose fixed cost is ~5 us a call.
        """
        n = min(self.num_nodes, max_nodes)
        if n <= 1:
            self.last_nodes = [0]
            return DraftTree.single(pending, self.name)
        matrix, rows_known = self.state.array, self.state.rows
        parents, ranks = self._parents, self._ranks
        rows: dict[int, list[int]] = {}
        tokens = [pending]
        for i in range(1, n):
            parent_token = tokens[parents[i]]
            row = rows.get(parent_token)
            if row is None:
                # Unknown tokens (-1, or past a matrix that grows on demand) read the sentinel row.
                row = rows[parent_token] = matrix[parent_token if parent_token < rows_known else -1].tolist()
            tokens.append(row[ranks[i]])
        if min(tokens) >= 0:
            self.last_nodes = list(range(n))
            return DraftTree(tuple(tokens), self._parent_tuple[:n], self.name)
        # Unknown nodes have unknown descendants (the sentinel row), so the known set is a tree.
        kept = [i for i in range(n) if tokens[i] >= 0]
        new_index = {old: new for new, old in enumerate(kept)}
        self.last_nodes = kept
        return DraftTree(
            tuple(tokens[i] for i in kept), (-1, *(new_index[parents[i]] for i in kept[1:])), self.name
        )

    def update(self, accepted: Sequence[int], feedback: Feedback | None) -> None:
        """Recycle the top-k of every verified node (the accepted path's rows win repeats)."""
        if feedback is not None:
            self.write(feedback.tokens, feedback.topk, feedback.accepted_nodes)
