"""The tree operations of a verification step: mask and positions, acceptance, compaction.

A :class:`~specdec.backends.verifier.ModelVerifier` takes them from a :class:`TreeOps` table, so
the compiled ops (``cuda_ext``: :class:`~specdec.backends.cuda_ext.ExtTreeOps`) swap in while the
rest of the step stays one piece of code. :class:`TorchTreeOps` is the readable reference those
ops are diffed against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from specdec.backends.topk import topk_ids
from specdec.backends.tree import tree_attention_inputs
from specdec.types import DraftTree, TokenChooser


@dataclass(frozen=True)
class Acceptance:
    """What :meth:`TreeOps.accept` returns, all on the host.

    ``path``: accepted node indices, root first; ``bonus``: the model's token after the
    path's last node; ``topk``: int64 ``[N, k]`` top ids per node, value descending, ties to the
    lower id (:func:`~specdec.backends.topk.topk_ids`; None when k == 0).
    """

    path: tuple[int, ...]
    bonus: int
    topk: np.ndarray[Any, np.dtype[np.int64]] | None


class TreeOps(Protocol):
    """The three tree operations a verification step needs."""

    name: str

    def tree_inputs(
        self, tree: DraftTree, committed_len: int, device: torch.device, additive_dtype: torch.dtype | None
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """``(mask [1, 1, N, C+N] or None, position_ids int64 [1, N])``."""
        ...

    def accept(
        self, tree: DraftTree, logits: torch.Tensor, positions: torch.Tensor, chooser: TokenChooser, topk: int
    ) -> Acceptance:
        """Choose the model's token at every node (``logits`` float ``[N, V]``) and walk the tree."""
        ...

    def compact(self, cache: Any, committed_len: int, path: Sequence[int]) -> None:
        """Keep only the path's KV: slot ``committed_len + path[i]`` moves to ``committed_len + i``."""
        ...

    def accept_rows(
        self, trees: Sequence[DraftTree], logits: torch.Tensor, positions: torch.Tensor,
        choosers: Sequence[TokenChooser], topk: int,
    ) -> list[Acceptance]:
        """:meth:`accept` for ``B`` trees whose nodes are consecutive rows of ``logits`` float ``[R, V]``
        and ``positions`` int64 ``[R]`` (``R`` the sum of the trees' sizes), tree ``b`` decided by ``choosers[b]``."""
        ...


def accept_each(
    ops: TreeOps, trees: Sequence[DraftTree], logits: torch.Tensor, positions: torch.Tensor,
    choosers: Sequence[TokenChooser], topk: int,
) -> list[Acceptance]:
    """:meth:`TreeOps.accept_rows` as one :meth:`TreeOps.accept` per tree (the reference; O(R * V))."""
    acceptances = []
    offset = 0
    for tree, chooser in zip(trees, choosers, strict=True):
        rows = slice(offset, offset + tree.size)
        offset += tree.size
        acceptances.append(ops.accept(tree, logits[rows], positions[rows], chooser, topk))
    return acceptances


class TorchTreeOps:
    """Reference tree operations in plain PyTorch/NumPy; the oracle for compiled ops."""

    name = "torch"

    def tree_inputs(
        self, tree: DraftTree, committed_len: int, device: torch.device, additive_dtype: torch.dtype | None
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        return tree_attention_inputs(tree, committed_len, device=device, additive_dtype=additive_dtype)

    def accept(
        self, tree: DraftTree, logits: torch.Tensor, positions: torch.Tensor, chooser: TokenChooser, topk: int
    ) -> Acceptance:
        # positions[i] is node i's position; the token chosen there sits one further.
        choices: list[int] = chooser.choose(logits, positions + 1).tolist()  # host sync: the walk needs them
        path = tree.walk(choices)
        top = None
        if topk > 0:
            top = topk_ids(logits, topk).cpu().numpy()  # value descending, ties to the lower id
        return Acceptance(path, choices[path[-1]], top)

    def compact(self, cache: Any, committed_len: int, path: Sequence[int]) -> None:
        keep = committed_len + len(path)
        first_moved = next((i for i, node in enumerate(path) if node != i), None)
        for layer in cache.layers:
            if first_moved is not None:
                # Accepted nodes that are not already in place: gather their slots, write them down.
                device = layer.keys.device
                src = torch.tensor([committed_len + node for node in path[first_moved:]], device=device)
                dst = slice(committed_len + first_moved, keep)
                layer.keys[:, :, dst] = layer.keys.index_select(2, src)
                layer.values[:, :, dst] = layer.values.index_select(2, src)
            layer.keys = layer.keys[:, :, :keep]
            layer.values = layer.values[:, :, :keep]

    def accept_rows(
        self, trees: Sequence[DraftTree], logits: torch.Tensor, positions: torch.Tensor,
        choosers: Sequence[TokenChooser], topk: int,
    ) -> list[Acceptance]:
        return accept_each(self, trees, logits, positions, choosers, topk)
