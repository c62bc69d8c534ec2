"""Top-k token ids with an explicit tie rule: the reference for feedback to learning drafters.

Drafters that learn from the model (Token Recycling) read the model's k best next tokens at
every verified node. ``torch.topk`` leaves the order of tied values unspecified (it differs
between CPU and CUDA and between k), so the reference fixes one order, the same the
compiled kernels follow (``backends/cuda_ext/csrc/tree_ops.h``):

- larger value first;
- NaN counts as larger than every number, as ``torch.argmax`` and ``torch.topk`` treat it;
- equal values (and NaN against NaN) go to the lower token id.

The greedy choice (``argmax``, ties to the lowest id) is the first element of this order,
so ``topk_ids(logits, k)[:, 0] == logits.argmax(-1)`` on every row.
"""

from __future__ import annotations

import torch

from specdec.errors import SpecDecError


def topk_ids(logits: torch.Tensor, k: int) -> torch.Tensor:
    """int64 ``[R, k]``: the ``k`` best token ids of each row of ``logits`` float ``[R, V]``, best first.

    ``torch.topk(k + 1)`` decides *which values* make a row's top k (ties cannot change
    that) and, unless the k-th value is shared with entries left out, which ids too; the
    rows where it is shared take the lowest ids level with it (:func:`_lowest_ids_at_edge`).
    The k ids are then put in order: sorted by id, then stably by value, descending.
    O(R * V) for the top-k pass, plus O(R' * V) for the R' rows tied at the edge.

    >>> topk_ids(torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]]), 2).tolist()
    [[1, 2]]
    """
    rows, vocab = logits.shape
    if not 0 <= k <= vocab:
        raise SpecDecError(f"k must lie in [0, {vocab}] (the vocabulary), got {k}")
    if k == 0:
        return torch.empty((rows, 0), dtype=torch.int64, device=logits.device)
    values, ids = logits.topk(min(k + 1, vocab), dim=-1)  # [R, k or k + 1]
    top = ids[:, :k]
    if k < vocab:
        edge, beyond = values[:, k - 1], values[:, k]  # [R]: the k-th value and the next one
        tied = (edge == beyond) | (edge.isnan() & beyond.isnan())  # [R]: topk chose among tied ids
        if bool(tied.any()):  # host sync; real logits rarely tie here
            top = top.clone()
            top[tied] = _lowest_ids_at_edge(logits[tied], edge[tied].unsqueeze(-1), k)
    top = top.sort(dim=-1).values  # ascending ids, so that the stable sort below breaks ties by id
    order = logits.gather(-1, top).sort(dim=-1, descending=True, stable=True).indices  # NaN first
    return top.gather(-1, order)


def _lowest_ids_at_edge(logits: torch.Tensor, edge: torch.Tensor, k: int) -> torch.Tensor:
    """int64 ``[R, k]`` (ids ascending): each row's entries ahead of ``edge`` ``[R, 1]``, then the
    lowest ids level with it, k in all."""
    nan, edge_nan = logits.isnan(), edge.isnan()
    ahead = (logits > edge) | (nan & ~edge_nan)  # [R, V]: strictly ahead of the k-th value
    level = (logits == edge) | (nan & edge_nan)  # [R, V]: level with it
    room = k - ahead.sum(dim=-1, keepdim=True)  # [R, 1]: level entries to take, lowest ids first
    chosen = ahead | (level & (level.cumsum(dim=-1) <= room))  # exactly k per row
    return chosen.nonzero()[:, 1].view(-1, k)
