"""The extension's three ops, as typed Python calls, and their fake implementations.

The ops are registered in C++ (``csrc/tree_ops.cpp``) as ``torch.ops.specdec.*`` with
schemas, CPU kernels and (when built with CUDA) CUDA kernels; the kernel runs on the
device its tensors live on. The fake implementations here give the output shapes from the
input shapes alone, which is what ``torch.compile`` traces with. Layouts (``csrc/tree_ops.h``):
B trees of N nodes (padded), verified with every tree at cache slot ``tree_start``;
sequence b's committed slots are ``[0, committed_lens[b])``.

Call :func:`specdec.backends.cuda_ext.build.load` first: the ops exist once the extension is loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch


class TreeAcceptResult(NamedTuple):
    """What :func:`tree_accept` returns, all int64 on the logits' device."""

    choices: torch.Tensor  # [B, N]: the model's token at every node
    path: torch.Tensor  # [B, N]: accepted node indices, root first, -1 past path_len
    path_len: torch.Tensor  # [B]: accepted nodes, root included (>= 1)
    bonus: torch.Tensor  # [B]: the model's token after the path's last node (the new pending)
    topk_ids: torch.Tensor  # [B, N, k]: value descending, ties to the lower id


def tree_mask(
    parents: torch.Tensor, committed_lens: torch.Tensor, tree_start: int, additive_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention mask and position ids for B trees. O(B * N * (tree_start + N)).

    ``parents`` int64 ``[B, N]`` (-1 at node 0; -1 at a later node marks padding),
    ``committed_lens`` int64 ``[B]`` (each <= ``tree_start``) -> ``mask`` ``[B, 1, N,
    tree_start + N]`` (bool, True = attend; or ``additive_dtype`` with 0 / ``finfo.min``) and
    ``position_ids`` int64 ``[B, N]`` (``committed_lens[b] + depth``).
    """
    mask, positions = torch.ops.specdec.tree_mask(parents, committed_lens, tree_start, additive_dtype)
    return mask, positions


def tree_accept(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    topk: int = 0,
    choices: torch.Tensor | None = None,
) -> TreeAcceptResult:
    """Choose at every node, walk the tree, and list the top-k ids per node. O(B * N * V) reads.

    ``logits`` float ``[B, N, V]``; ``tokens``, ``parents`` int64 ``[B, N]``. Without
    ``choices`` the choice is the argmax, ties to the lowest id (greedy); a sampling chooser
    passes its own int64 ``[B, N]`` choices and the op walks them. Returns small tensors
    only: nothing of size V leaves the device.
    """
    out = torch.ops.specdec.tree_accept(logits, tokens, parents, topk, choices)
    return TreeAcceptResult(*out)


def compact_kv(
    cache: Sequence[torch.Tensor],
    path: torch.Tensor,
    path_len: torch.Tensor,
    dest_starts: torch.Tensor,
    tree_start: int,
) -> None:
    """Move the accepted nodes' keys and values into place, every tensor of ``cache`` in one call.

    ``cache``: ``[B, H, S, D]`` tensors (keys and values of all layers), edited in place;
    ``path`` int64 ``[B, P]`` (strictly increasing node indices, root first), ``path_len``
    and ``dest_starts`` int64 ``[B]``: slot ``tree_start + path[b, i]`` moves to
    ``dest_starts[b] + i`` for ``i < path_len[b]``. O(layers * B * H * accepted * D).
    """
    torch.ops.specdec.compact_kv(list(cache), path, path_len, dest_starts, tree_start)


# Shape-only implementations for torch.compile (FakeTensor tracing): outputs from input shapes.


def _tree_mask_fake(
    parents: torch.Tensor, committed_lens: torch.Tensor, tree_start: int, additive_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, nodes = parents.shape
    mask = parents.new_empty((batch, 1, nodes, tree_start + nodes), dtype=additive_dtype or torch.bool)
    return mask, parents.new_empty((batch, nodes))


def _tree_accept_fake(
    logits: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, topk: int, choices: torch.Tensor | None = None
) -> tuple[torch.Tensor, ...]:
    batch, nodes, _ = logits.shape
    shapes = ((batch, nodes), (batch, nodes), (batch,), (batch,), (batch, nodes, topk))
    return tuple(tokens.new_empty(shape) for shape in shapes)


def _compact_kv_fake(
    cache: list[torch.Tensor], path: torch.Tensor, path_len: torch.Tensor, dest_starts: torch.Tensor, tree_start: int
) -> None:
    return None


_FAKES_REGISTERED = False


def register_fakes() -> None:
    """Register the fake implementations once the ops exist (after the extension loads); idempotent."""
    global _FAKES_REGISTERED
    if not _FAKES_REGISTERED:
        torch.library.register_fake("specdec::tree_mask", _tree_mask_fake)
        torch.library.register_fake("specdec::tree_accept", _tree_accept_fake)
        torch.library.register_fake("specdec::compact_kv", _compact_kv_fake)
        _FAKES_REGISTERED = True
