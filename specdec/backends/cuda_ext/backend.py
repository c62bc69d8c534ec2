"""``ExtTreeOps``: the verifier's three tree operations on the compiled kernels.

It implements :class:`~specdec.backends.verifier.TreeOps` exactly as
:class:`~specdec.backends.verifier.TorchTreeOps` (the reference) does, and is diffed
against it op by op and generation by generation (``tests/test_cuda_ext.py``). Per step:

- :meth:`tree_inputs`: one small upload (parents), one kernel for mask and positions;
- :meth:`accept`: one small upload (tokens and parents), the choice/top-k and walk kernels,
  then the step's **one host synchronization**: path, its length, the bonus and the top-k
  ids come back together in one copy (a few hundred bytes, never the logits);
- :meth:`compact`: one small upload (the path), one call for every layer's keys and values,
  then a crop, which is a view (no copy, no wait);
- :meth:`accept_rows` (batched decoding, many sequences' trees in one forward): when every
  tree has the same size ``N`` (plain batched steps, fixed trees) the rows' logits ``[B * N, V]``
  are the ``[B, N, V]`` layout of the batched op as they are, so one call walks every tree and one
  host synchronization brings every row's path home; ragged trees would need their logits
  padded into that layout (a copy of ``B * N_max * V`` values, more than the per-row calls cost
  on a CPU), so they are accepted one tree after another.

On a CUDA device the uploads come from pinned memory with ``non_blocking=True``, so the host
queues them without waiting for the device.

Bad values: every op gets this backend's ``status`` on the device (``ops`` module docstring),
so on CUDA the ops check their values on the device without a sync of their own, and the
status travels home in :meth:`accept`'s one copy (8 more int64 values). A fault raises there,
naming the bad value, and the status is zeroed for the next step. A fault of :meth:`compact`
(whose path is this backend's own, so none is expected) is reported by the next step's
:meth:`accept`; until then the kernels have moved nothing. On the CPU the ops raise at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from specdec.backends.cuda_ext import ops
from specdec.backends.cuda_ext.build import BackendUnavailableError, load
from specdec.backends.tree_ops import Acceptance, accept_each
from specdec.sampling import Greedy
from specdec.types import DraftTree, TokenChooser

SUPPORTED_DEVICES = ("cpu", "cuda")


def upload(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """int64 ``[len(values)]`` on ``device``; to a GPU through pinned memory, so the host does not wait."""
    host = torch.tensor(values, dtype=torch.int64)
    if device.type == "cpu":
        return host
    # The caching host allocator keeps the pinned block alive until the copy has run.
    return host.pin_memory().to(device, non_blocking=True)


def _on_host(status: torch.Tensor, out: ops.TreeAcceptResult) -> np.ndarray[Any, np.dtype[np.int64]]:
    """``status`` and ``tree_accept``'s results in one int64 host array: the status words, path lengths
    ``[B]``, bonuses ``[B]``, paths ``[B * N]``, top ids ``[B * N * k]`` (a copy: ``status`` is reused).

    On a GPU one packed copy (one sync); on the CPU the tensors are read in place and joined by NumPy: a
    torch op costs ~10-50 us right after a forward here (``specdec bench step``), and a plain step would pay
    for two (the packing and ``.cpu()``) that copy what is on the host already."""
    parts = (status, out.path_len, out.bonus, out.path.view(-1), out.topk_ids.view(-1))
    if status.device.type == "cpu":
        return np.concatenate([part.numpy() for part in parts])
    host: np.ndarray[Any, np.dtype[np.int64]] = torch.cat(parts).cpu().numpy()
    return host


class ExtTreeOps:
    """Tree operations on the ``cuda_ext`` kernels, for models on the CPU or on a CUDA device.

    Construction builds (or loads from the cache) the extension: a build failure raises
    :class:`~specdec.native.NativeBuildError` with the compiler's output, and a device this
    build has no kernels for raises :class:`BackendUnavailableError`.
    """

    name = "cuda_ext"

    def __init__(self, device: torch.device | str = "cpu") -> None:
        device = torch.device(device)
        if device.type not in SUPPORTED_DEVICES:
            raise BackendUnavailableError(
                f"the cuda_ext backend has CPU and CUDA kernels; the model is on {device.type!r}: use tree_ops='torch'"
            )
        module = load()
        if device.type == "cuda" and not module.has_cuda_kernels():
            raise BackendUnavailableError(
                "the cuda_ext extension was built without its CUDA kernels (no CUDA toolkit or no CUDA device "
                "when it was built); the model is on a CUDA device: use tree_ops='torch' or install the CUDA toolkit"
            )
        self._status: dict[torch.device, torch.Tensor] = {}  # per device: int64 [8], zero while no fault

    def _status_on(self, device: torch.device) -> torch.Tensor:
        """This backend's status on ``device`` (a tensor's own device, index included), made on first use."""
        status = self._status.get(device)
        if status is None:
            status = self._status[device] = ops.new_status(device)
        return status

    def tree_inputs(
        self, tree: DraftTree, committed_len: int, device: torch.device, additive_dtype: torch.dtype | None
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """``(mask [1, 1, N, C+N] or None, position_ids int64 [1, N])``, as the reference gives them."""
        if tree.size == 1:  # one query that sees everything: no mask, the model's own decoding path
            return None, torch.full((1, 1), committed_len, dtype=torch.int64, device=device)
        staged = upload([committed_len, *tree.parents], device)  # [1 + N]: committed_lens, then parents
        status = self._status_on(staged.device)
        return ops.tree_mask(staged[1:].view(1, -1), staged[:1], committed_len, additive_dtype, status)

    def accept(
        self, tree: DraftTree, logits: torch.Tensor, positions: torch.Tensor, chooser: TokenChooser, topk: int
    ) -> Acceptance:
        """Choose at every node of ``logits`` float ``[N, V]`` and walk; only small results reach the host."""
        n = tree.size
        staged = upload([*tree.tokens, *tree.parents], logits.device).view(2, n)  # [2, N]: tokens, parents
        choices = None
        if type(chooser) is not Greedy:  # greedy is fused into the kernel; any other chooser decides first
            # positions[i] is node i's position; the token chosen there sits one further.
            choices = chooser.choose(logits, positions + 1).to(torch.int64).view(1, n)
        status = self._status_on(logits.device)
        out = ops.tree_accept(logits.unsqueeze(0), staged[0:1], staged[1:2], topk, choices, status)
        host = _on_host(status, out)  # the step's one host sync: [8 + 2 + N + N * k] int64
        if host[0] != 0:  # a fault recorded on the device, by this step's ops or the last compaction
            status.zero_()
            ops.check_status(torch.from_numpy(host[: ops.STATUS_WORDS].copy()))  # raises, naming the bad value
        head = ops.STATUS_WORDS
        length, bonus = int(host[head]), int(host[head + 1])
        path = tuple(int(node) for node in host[head + 2 : head + 2 + length])
        top = host[head + 2 + n :].reshape(n, topk).astype(np.int64, copy=True) if topk > 0 else None
        return Acceptance(path, bonus, top)

    def accept_rows(
        self, trees: Sequence[DraftTree], logits: torch.Tensor, positions: torch.Tensor,
        choosers: Sequence[TokenChooser], topk: int,
    ) -> list[Acceptance]:
        """:meth:`accept` for ``B`` trees whose nodes are consecutive rows of ``logits`` float ``[R, V]``.

        Trees of one size ``N``: one batched ``tree_accept`` over the ``[B, N, V]`` view (no copy)
        and one host sync for all rows; otherwise one :meth:`accept` per tree (module docstring).
        """
        sizes = {tree.size for tree in trees}
        if len(trees) < 2 or len(sizes) != 1 or not logits.is_contiguous():
            return accept_each(self, trees, logits, positions, choosers, topk)
        batch, n = len(trees), sizes.pop()
        flat = [*(t for tree in trees for t in tree.tokens), *(p for tree in trees for p in tree.parents)]
        staged = upload(flat, logits.device).view(2, batch, n)  # [2, B, N]: tokens, parents
        choices = None
        if any(type(chooser) is not Greedy for chooser in choosers):  # each row's chooser decides its rows
            # positions[i] is node i's position; the token chosen there sits one further.
            choices = torch.stack([
                chooser.choose(logits[b * n : (b + 1) * n], positions[b * n : (b + 1) * n] + 1).to(torch.int64)
                for b, chooser in enumerate(choosers)
            ])  # fmt: skip  # [B, N]
        status = self._status_on(logits.device)
        out = ops.tree_accept(logits.view(batch, n, -1), staged[0], staged[1], topk, choices, status)
        host = _on_host(status, out)  # the batch's one host sync: [8 + 2B + BN + BNk] int64
        if host[0] != 0:
            status.zero_()
            ops.check_status(torch.from_numpy(host[: ops.STATUS_WORDS].copy()))  # raises, naming the bad value
        head = ops.STATUS_WORDS
        lengths, bonuses = host[head : head + batch], host[head + batch : head + 2 * batch]
        paths = host[head + 2 * batch : head + 2 * batch + batch * n].reshape(batch, n)
        tops = host[head + 2 * batch + batch * n :].reshape(batch, n, topk)
        return [
            Acceptance(
                tuple(int(node) for node in paths[b, : int(lengths[b])]), int(bonuses[b]),
                tops[b].astype(np.int64, copy=True) if topk > 0 else None,
            )
            for b in range(batch)
        ]  # fmt: skip

    def compact(self, cache: Any, committed_len: int, path: Sequence[int]) -> None:
        """Keep the path's KV: slot ``committed_len + path[i]`` moves to ``committed_len + i``, then crop."""
        keep = committed_len + len(path)
        layers = cache.layers
        if any(node != i for i, node in enumerate(path)):  # else the path is in place already: crop only
            tensors = [t for layer in layers for t in (layer.keys, layer.values)]
            staged = upload([len(path), committed_len, *path], tensors[0].device)  # path_len, dest, path
            status = self._status_on(staged.device)
            ops.compact_kv(tensors, staged[2:].view(1, -1), staged[0:1], staged[1:2], committed_len, status)
        for layer in layers:
            layer.keys = layer.keys.narrow(2, 0, keep)
            layer.values = layer.values.narrow(2, 0, keep)
