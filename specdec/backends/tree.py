"""Tree layout: positions, slots and the tree-attention mask, all derived from ``parents``.

This is the one place where a draft tree becomes model inputs. For a tree of ``N`` nodes
verified after ``C`` committed tokens:

- node ``i`` sits at **position** ``C + depth(i)`` (what rotary embeddings see);
- its keys and values are written to **slot** ``C + i`` (the cache appends nodes in order);
- its attention row sees every committed slot ``[0, C)`` plus the slots of its ancestors
  and itself: ``mask[i, C + j] = j is an ancestor-or-self of i``.

Since ``parents[i] < i``, the ancestor-or-self row of node ``i`` is its parent's row plus
``i`` itself, so one pass in node order fills the matrix: O(N^2) bits, N <= a few hundred.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from specdec.types import DraftTree


def ancestor_matrix(parents: tuple[int, ...] | list[int]) -> npt.NDArray[np.bool_]:
    """``anc[i, j]`` is True when node j is node i or one of its ancestors. Shape ``[N, N]``, bool."""
    n = len(parents)
    anc = np.zeros((n, n), dtype=np.bool_)
    for i in range(n):
        if i:
            anc[i] = anc[parents[i]]
        anc[i, i] = True
    return anc


def tree_positions(tree: DraftTree, committed_len: int) -> npt.NDArray[np.int64]:
    """Absolute positions ``committed_len + depth(i)``, int64 ``[N]``."""
    return committed_len + np.asarray(tree.depths, dtype=np.int64)


def tree_attention_inputs(
    tree: DraftTree,
    committed_len: int,
    *,
    device: torch.device,
    additive_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The 4D attention mask and position ids for verifying ``tree``.

    Returns ``(mask, position_ids)``: ``mask`` is ``[1, 1, N, C + N]``, bool (True =
    attend) or, when ``additive_dtype`` is given (eager attention adds its mask to the
    scores), 0 / dtype-min floats; ``position_ids`` is int64 ``[1, N]``. A one-node tree
    needs no mask at all (one query that sees everything), so ``mask`` is None there: the
    model then takes its ordinary decoding path, exactly as plain decoding does.
    """
    positions = torch.from_numpy(tree_positions(tree, committed_len)).to(device).unsqueeze(0)
    if tree.size == 1:
        return None, positions
    n = tree.size
    allowed = np.ones((n, committed_len + n), dtype=np.bool_)
    allowed[:, committed_len:] = ancestor_matrix(tree.parents)
    mask = torch.from_numpy(allowed).to(device)
    if additive_dtype is not None:
        additive = torch.zeros(mask.shape, dtype=additive_dtype, device=device)
        additive.masked_fill_(~mask, torch.finfo(additive_dtype).min)
        return additive[None, None], positions
    return mask[None, None], positions
