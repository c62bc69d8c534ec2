"""A static KV cache that specdec owns: fixed shapes, slots chosen by a device tensor.

Why our own and not Hugging Face's ``StaticCache``: a tree verification writes its ``N``
nodes at slots ``C .. C+N-1`` while their *positions* are ``C + depth``, and compaction then
moves the accepted nodes' slots down; Hugging Face's static layers write at a running
counter of their own (5.x) or at positions, neither of which is a tree's slots. Here every
write goes to the slots held in one small int64 tensor, and only the contents of that
tensor change from step to step. So the forward has the same shapes and reads the same
buffers at every step: it can be compiled once per tree size (CPU) or captured into a
CUDA graph and replayed (GPU), which is the whole point (``docs/backends.md``).

Layout: per layer, one keys and one values tensor ``[B, H, S, D]`` (batch, KV heads, slots,
head dim), each **its own allocation**. One ``[L, B, H, S, D]`` tensor for all layers would
make compaction two ops instead of ``4 L``, but a compiled forward then writes through views
of one graph input, which inductor turns into a copy of the whole cache per layer (a thousand
times the cost of the compaction itself, docs/static-cache.md). Compaction happens
outside the forward and moves only the accepted nodes that are out of place, so its ``4 L``
small ops cost little, and nothing when the accepted path is a chain. ``B`` is 1 today (one
sequence per verifier); the batch axis is there so batching is a change of contents, not
of layout.

The tensors are allocated by the first write (a prefill), from the shapes and dtype the
model writes, so any architecture whose layers all keep ``[B, H, *, D]`` keys and values of
one shape can use it; a model whose layers differ is refused there with a clear error.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from specdec.errors import SpecDecError, UnsupportedModelError


def _cache_base() -> type[Any]:
    return Cache


def _layer_base() -> type[Any]:
    return CacheLayerMixin


class StaticKVCache:
    """Keys and values ``[B, H, S, D]`` of every layer (``L`` tensors each), and where the next forward writes.

    ``capacity`` is ``S``, the number of slots. ``committed_len`` is how many leading slots
    hold committed tokens (the verifier keeps it). Views for the model are made per set of
    write slots by :meth:`writer`.
    """

    def __init__(self, num_layers: int, capacity: int, device: torch.device, batch: int = 1) -> None:
        if capacity < 1:
            raise SpecDecError(f"a static cache needs at least one slot, got capacity {capacity}")
        self.num_layers = num_layers
        self.capacity = capacity
        self.device = device
        self.batch = batch
        self.keys: list[torch.Tensor] | None = None  # L x [B, H, S, D], allocated by the first write
        self.values: list[torch.Tensor] | None = None  # L x [B, H, S, D]
        self.committed_len = 0
        # When set, a zero-byte tensor [W, 0] whose length is how many leading slots the next forward
        # attends over: a tensor, not an int, so a compiled forward takes W as a dynamic size.
        self.window: torch.Tensor | None = None
        self.generation = 0  # bumped at every (re)allocation: compiled/captured forwards hold old buffers
        # A sliding-window model's (window, mixed) (specdec.backends.sliding.bucket_layout), which the forward's
        # masks read; None: every layer is full attention. Every layer keeps every token either way.
        self.sliding: tuple[int, bool] | None = None

    @property
    def allocated(self) -> bool:
        return self.keys is not None

    @property
    def width(self) -> int:
        """How many leading slots a forward attends over: the window's length, else the capacity."""
        return self.capacity if self.window is None else self.window.shape[0]

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return sum(t.nbytes for t in (*self.keys, *self.values))

    def allocate_like(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Allocate ``L`` x ``[B, H, S, D]`` from one layer's ``keys``/``values`` ``[B, H, T, D]`` (zeros)."""
        if keys.shape[0] != self.batch or keys.shape[:2] != values.shape[:2] or keys.shape[-1] != values.shape[-1]:
            raise UnsupportedModelError(
                f"static cache: keys {tuple(keys.shape)} and values {tuple(values.shape)} are not [B={self.batch}, "
                "H, T, D] of one shape; use engine='hf' for this model"
            )
        _, heads, _, dim = keys.shape
        shape = (self.batch, heads, self.capacity, dim)
        self.keys = [torch.zeros(shape, dtype=keys.dtype, device=self.device) for _ in range(self.num_layers)]
        self.values = [torch.zeros(shape, dtype=values.dtype, device=self.device) for _ in range(self.num_layers)]
        self.generation += 1

    def grow(self, capacity: int) -> None:
        """Reallocate to ``capacity`` slots (> the present one), keeping the committed slots' contents."""
        if capacity > self.capacity:
            self.regrow_regions(capacity, [(0, 0, self.committed_len)])

    def regrow_regions(self, capacity: int, regions: list[tuple[int, int, int]]) -> None:
        """Reallocate to ``capacity`` slots, copying each ``(source, target, length)`` run of slots over;
        every other slot starts at zero (the batch of rows that shares one cache moves its regions apart:
        :mod:`specdec.backends.static_rows`; :meth:`grow` keeps one region, the committed slots)."""
        old_keys, old_values = self.keys, self.values
        self.capacity = capacity
        if old_keys is None or old_values is None:
            return
        self.generation += 1
        self.keys, self.values = [], []
        for old, new in ((old_keys, self.keys), (old_values, self.values)):
            for tensor in old:
                moved = tensor.new_zeros((*tensor.shape[:2], capacity, tensor.shape[3]))
                for source, target, length in regions:
                    moved[:, :, target : target + length] = tensor[:, :, source : source + length]
                new.append(moved)

    def ensure(self, index: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s keys and values ``[B, H, S, D]``, allocated like ``keys``/``values`` ``[B, H, T, D]``
        if this is the cache's first write."""
        if self.keys is None:
            self.allocate_like(keys, values)
        return self.layer(index)

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s keys and values ``[B, H, S, D]``."""
        assert self.keys is not None and self.values is not None, "the static cache is not allocated yet"
        return self.keys[index], self.values[index]

    def writer(self, slots: torch.Tensor) -> Any:
        """A Hugging Face ``Cache`` whose layers write new keys and values at ``slots`` int64 ``[T]``.

        ``slots`` is read at every forward, so a compiled or captured forward that holds
        this object picks up new slots when the tensor's contents change.
        """
        return _writer_class()(self, slots)

    def compact(self, committed_len: int, path: list[int] | tuple[int, ...]) -> None:
        """Keep an accepted path: slot ``committed_len + path[i]`` moves to ``committed_len + i``.

        ``path`` is increasing and starts at 0 (the root, already in place); nodes before the
        first one that moved stay where they are, so a chain (every accepted node in place)
        costs nothing. A gather and a scatter per layer and tensor: O(L * H * moved * D).
        """
        first = next((i for i, node in enumerate(path) if node != i), None)
        if first is None:
            return
        assert self.keys is not None and self.values is not None
        moved = len(path) - first
        sources = torch.tensor([committed_len + node for node in path[first:]], dtype=torch.int64)
        targets = torch.arange(committed_len + first, committed_len + first + moved, dtype=torch.int64)
        if self.device.type != "cpu":  # pinned, non-blocking: the host queues the copy and moves on
            sources = sources.pin_memory().to(self.device, non_blocking=True)
            targets = targets.pin_memory().to(self.device, non_blocking=True)
        # Gather first (a copy), then scatter: sources and targets may overlap.
        for tensor in (*self.keys, *self.values):
            tensor.index_copy_(2, targets, tensor.index_select(2, sources))


_WRITER: type[Any] | None = None


def _writer_class() -> type[Any]:
    """The ``Cache`` subclass, made on first use so importing specdec does not import transformers."""
    global _WRITER
    if _WRITER is not None:
        return _WRITER
    cache_base, layer_base = _cache_base(), _layer_base()

    class SlotLayer(layer_base):  # type: ignore[misc, valid-type]
        """One layer of a :class:`StaticKVCache`, writing at the owner's slots."""

        is_compileable = True
        is_sliding = False  # every layer keeps every token; a sliding layer's window is in its mask (tree_forward)

        def __init__(self, owner: StaticKVCache, index: int, slots: torch.Tensor) -> None:
            super().__init__()
            self.owner, self.index, self.slots = owner, index, slots
            self.is_initialized = owner.allocated

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any) -> None:
            if not self.owner.allocated:
                self.owner.allocate_like(key_states, value_states)
            self.is_initialized = True

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            """Write ``[B, H, T, D]`` at the slots ``[T]``; return keys and values ``[B, H, W, D]``: views of
            the window's leading ``W`` slots (the owner's ``window``), or of all ``S`` slots without one."""
            if not self.owner.allocated:
                self.owner.allocate_like(key_states, value_states)
                self.is_initialized = True
            keys, values = self.owner.layer(self.index)
            if key_states.shape[1:] != (keys.shape[1], self.slots.shape[0], keys.shape[3]):
                raise UnsupportedModelError(
                    f"static cache: layer {self.index} writes keys {tuple(key_states.shape)}, the cache holds "
                    f"{tuple(keys.shape)} per layer; use engine='hf' for this model"
                )
            keys.index_copy_(2, self.slots, key_states)
            values.index_copy_(2, self.slots, value_states)
            if self.owner.window is not None:  # attend over the leading slots only (views, no copy)
                width = self.owner.width
                return keys[:, :, :width], values[:, :, :width]
            return keys, values

        def get_seq_length(self, *args: Any) -> int:
            return 0  # see SlotCache.get_seq_length

        def get_mask_sizes(self, *args: Any) -> tuple[int, int]:
            return self.owner.width, 0  # what the keys and values update() returns span

        def get_max_cache_shape(self, *args: Any) -> int:
            return self.owner.capacity

        def get_max_length(self) -> int:
            return self.owner.capacity

    class SlotCache(cache_base):  # type: ignore[misc, valid-type]
        """The Hugging Face face of a :class:`StaticKVCache` for one set of write slots."""

        def __init__(self, owner: StaticKVCache, slots: torch.Tensor) -> None:
            super().__init__(layers=[SlotLayer(owner, i, slots) for i in range(owner.num_layers)])
            self.owner = owner

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            result: tuple[torch.Tensor, torch.Tensor] = self.layers[layer_idx].update(key_states, value_states)
            return result

        def get_seq_length(self, layer_idx: int = 0) -> int:
            """Always 0: specdec passes positions and the 4D mask itself, so no forward needs the length.

            Some transformers versions still derive an unused ``cache_position`` from it; a
            constant keeps a compiled forward from specializing (recompiling) on a length
            that changes every step.
            """
            return 0

    _WRITER = SlotCache
    return SlotCache
