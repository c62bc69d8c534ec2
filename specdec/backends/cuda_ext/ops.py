"""The extension's three ops (and ``check_status``), as typed Python calls, and their fake implementations.

The ops are registered in C++ (``csrc/tree_ops.cpp``) as ``torch.ops.specdec.*`` with
schemas, CPU kernels and (when built with CUDA) CUDA kernels; the kernel runs on the
device its tensors live on. The fake implementations here give the output shapes from the
input shapes alone, which is what ``torch.compile`` traces with. Layouts (``csrc/tree_ops.h``):
B trees of N nodes (padded), verified with every tree at cache slot ``tree_start``;
sequence b's committed slots are ``[0, committed_lens[b])``.

**Bad values** (a parent that does not precede its child, a token outside the vocabulary, a
path that is not increasing or leaves the cache...) raise a ``RuntimeError`` naming the first
one, on either device (``csrc/faults.h`` lists them). On the CPU they raise at once. On CUDA
the values are checked on the device; each op takes an optional ``status`` (:func:`new_status`,
int64 ``[8]`` on the op's device) that decides when the verdict reaches the host:

- without ``status`` the op reads the verdict back before launching its kernels: one host
  synchronization per call, and a fault raises from the call itself;
- with ``status`` the op records the first fault there (a fault already recorded stands) and
  returns without waiting; the caller reports it at the synchronization it makes anyway, by
  passing the status, or its host copy, to :func:`check_status`, and zeroes it before reuse.
  Meanwhile the kernels stay in bounds whatever the values, and ``compact_kv`` moves nothing
  while the status records a fault. This is the fast path (``ExtTreeOps``): no extra sync. It
  is also the only way to call the ops under CUDA graph capture, which cannot synchronize.

Call :func:`specdec.backends.cuda_ext.build.load` first: the ops exist once the extension is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from specdec.native import register_meta

STATUS_WORDS = 8  # a status tensor's length (layout: csrc/faults.h)


def new_status(device: torch.device | str) -> torch.Tensor:
    """A zeroed status, int64 ``[STATUS_WORDS]`` on ``device``, for the ops' ``status`` argument."""
    return torch.zeros(STATUS_WORDS, dtype=torch.int64, device=device)


def check_status(status: torch.Tensor) -> None:
    """Raise the ``RuntimeError`` naming the bad value ``status`` records; return if it records none.

    ``status`` int64 ``[STATUS_WORDS]`` on any device: a CUDA one is copied to the host first
    (a synchronization), so a caller on the fast path passes the host copy it already made.
    The status itself is not changed: zero it before passing it to the ops again.
    """
    torch.ops.specdec.check_status(status)


class TreeAcceptResult(NamedTuple):
    """What :func:`tree_accept` returns, all int64 on the logits' device."""

    choices: torch.Tensor  # [B, N]: the model's token at every node
    path: torch.Tensor  # [B, N]: accepted node indices, root first, -1 past path_len
    path_len: torch.Tensor  # [B]: accepted nodes, root included (>= 1)
    bonus: torch.Tensor  # [B]: the model's token after the path's last node (the new pending)
    topk_ids: torch.Tensor  # [B, N, k]: value descending, ties to the lower id


def tree_mask(
    parents: torch.Tensor,
    committed_lens: torch.Tensor,
    tree_start: int,
    additive_dtype: torch.dtype | None = None,
    status: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention mask and position ids for B trees. O(B * N * (tree_start + N)).

    ``parents`` int64 ``[B, N]`` (-1 at node 0; -1 at a later node marks padding),
    ``committed_lens`` int64 ``[B]`` (each <= ``tree_start``) -> ``mask`` ``[B, 1, N,
    tree_start + N]`` (bool, True = attend; or ``additive_dtype`` with 0 / ``finfo.min``) and
    ``position_ids`` int64 ``[B, N]`` (``committed_lens[b] + depth``). ``status``: see the module
    docstring.
    """
    mask, positions = torch.ops.specdec.tree_mask(parents, committed_lens, tree_start, additive_dtype, status)
    return mask, positions


def tree_accept(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    topk: int = 0,
    choices: torch.Tensor | None = None,
    status: torch.Tensor | None = None,
) -> TreeAcceptResult:
    """Choose at every node, walk the tree, and list the top-k ids per node. O(B * N * V) reads.

    ``logits`` float ``[B, N, V]``; ``tokens``, ``parents`` int64 ``[B, N]``. Without
    ``choices`` the choice is the argmax, ties to the lowest id (greedy); a sampling chooser
    passes its own int64 ``[B, N]`` choices and the op walks them. Tokens and choices must be
    token ids in ``[0, V)``. Returns small tensors only: nothing of size V leaves the device.
    ``status``: see the module docstring.
    """
    out = torch.ops.specdec.tree_accept(logits, tokens, parents, topk, choices, status)
    return TreeAcceptResult(*out)


def compact_kv(
    cache: Sequence[torch.Tensor],
    path: torch.Tensor,
    path_len: torch.Tensor,
    dest_starts: torch.Tensor,
    tree_start: int,
    status: torch.Tensor | None = None,
) -> None:
    """Move the accepted nodes' keys and values into place, every tensor of ``cache`` in one call.

    ``cache``: ``[B, H, S, D]`` tensors (keys and values of all layers), edited in place;
    ``path`` int64 ``[B, P]`` (strictly increasing node indices, root first), ``path_len``
    and ``dest_starts`` int64 ``[B]``: slot ``tree_start + path[b, i]`` moves to
    ``dest_starts[b] + i`` for ``i < path_len[b]``. O(layers * B * H * accepted * D).
    ``status``: see the module docstring.
    """
    torch.ops.specdec.compact_kv(list(cache), path, path_len, dest_starts, tree_start, status)


# Shape-only implementations for torch.compile (FakeTensor tracing): outputs from input shapes.
# They also serve calls where one argument is a meta tensor (the dispatcher then picks the Meta
# kernel over the CPU one), so they refuse what they cannot shape: arguments on several devices,
# or a tensor of the wrong rank. The real kernels check everything else (checks.h).


def _check_fake_args(op: str, ranks: Mapping[str, tuple[torch.Tensor | None, int]]) -> None:
    """Every given tensor (None: an absent optional) on the first one's device, and of the listed rank."""
    given = [(name, tensor, rank) for name, (tensor, rank) in ranks.items() if tensor is not None]
    first_name, first, _ = given[0]
    for name, tensor, _ in given:
        if tensor.device != first.device:
            raise RuntimeError(f"specdec::{op}: {name} is on {tensor.device}, {first_name} on {first.device}")
    for name, tensor, rank in given:
        if tensor.dim() != rank:
            raise RuntimeError(f"specdec::{op}: {name} must have {rank} dimensions, got shape {list(tensor.shape)}")


def _tree_mask_fake(
    parents: torch.Tensor,
    committed_lens: torch.Tensor,
    tree_start: int,
    additive_dtype: torch.dtype | None = None,
    status: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    ranks = {"parents": (parents, 2), "committed_lens": (committed_lens, 1), "status": (status, 1)}
    _check_fake_args("tree_mask", ranks)
    batch, nodes = parents.shape
    mask = parents.new_empty((batch, 1, nodes, tree_start + nodes), dtype=additive_dtype or torch.bool)
    return mask, parents.new_empty((batch, nodes))


def _tree_accept_fake(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    topk: int,
    choices: torch.Tensor | None = None,
    status: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    _check_fake_args(
        "tree_accept",
        {
            "logits": (logits, 3),
            "tokens": (tokens, 2),
            "parents": (parents, 2),
            "choices": (choices, 2),
            "status": (status, 1),
        },
    )
    batch, nodes, _ = logits.shape
    shapes = ((batch, nodes), (batch, nodes), (batch,), (batch,), (batch, nodes, topk))
    return tuple(tokens.new_empty(shape) for shape in shapes)


def _compact_kv_fake(
    cache: list[torch.Tensor],
    path: torch.Tensor,
    path_len: torch.Tensor,
    dest_starts: torch.Tensor,
    tree_start: int,
    status: torch.Tensor | None = None,
) -> None:
    tensors = {"path": (path, 2), "path_len": (path_len, 1), "dest_starts": (dest_starts, 1), "status": (status, 1)}
    _check_fake_args("compact_kv", {**tensors, **{f"cache[{t}]": (kv, 4) for t, kv in enumerate(cache)}})


_FAKES_REGISTERED = False


def register_fakes() -> None:
    """Register the fake implementations (as Meta kernels: native.register_meta) once the ops exist; idempotent."""
    global _FAKES_REGISTERED
    if not _FAKES_REGISTERED:
        register_meta("specdec::tree_mask", _tree_mask_fake)
        register_meta("specdec::tree_accept", _tree_accept_fake)
        register_meta("specdec::compact_kv", _compact_kv_fake)
        _FAKES_REGISTERED = True
