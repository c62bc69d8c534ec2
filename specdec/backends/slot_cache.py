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

**Rings** (sliding-window models, :func:`~specdec.backends.buckets.windows.setup_rings`): a sliding layer
of window ``W`` keeps, instead of ``S`` slots, a ring of ``R = W - 1 + the largest bucket`` slots
per place (``places`` regions of ``span`` slots cut a cache that a batch's rows share, then
``scratch`` slots for their padding nodes: :mod:`specdec.backends.buckets.rows`; one sequence: one
place, no scratch). Slot ``s`` (offset ``k`` in place ``p``) lives at ring slot ``p R + k mod R``
(:meth:`StaticKVCache.ring_of`; a scratch slot after the places' rings), and ``ring_ids`` (a device
tensor, ``-1`` where nothing was written) says which slot each ring slot holds now, so the
forward's mask knows which ring slots hold committed keys and at which positions
(:func:`~specdec.backends.buckets.windows.ring_allowed`). Why nothing a node needs is overwritten: a
forward writes at most ``B <= R - W + 1`` consecutive offsets ``C .. C + B - 1`` of a place
(padding included), whose ring slots are those of offsets ``C + i - R <= C - W``, while the
nodes (positions ``>= C``) need the committed keys ``> C - W`` only. The full-attention layers
of a mixed model keep every token, as above. The committed tokens of each place are logged on
the host (:meth:`StaticKVCache.log_prompt`, :meth:`log_writes`, :meth:`compact`), so a rewind
past what the ring still holds recomputes them (:func:`~specdec.backends.buckets.windows.bucket_rewind`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from specdec.errors import SpecDecError, UnsupportedModelError

MIN_CAPACITY = 256  # the cache's first slot count; it grows to the next power of two (each growth recompiles)


def capacity_for(needed: int) -> int:
    """Slots for ``needed`` tokens: a power of two, at least :data:`MIN_CAPACITY`.

    Compiled forwards and CUDA graphs are specialised to the capacity, so each growth
    recompiles or recaptures every bucket; growing geometrically bounds that to a few
    times per verifier however requests vary (256, 512, ..., 4096 slots: five growths),
    at the price of attending over at most twice the slots a request needs.

    >>> capacity_for(1), capacity_for(256), capacity_for(257), capacity_for(3000)
    (256, 256, 512, 4096)
    """
    return max(MIN_CAPACITY, 1 << max(needed - 1, 0).bit_length())


def _cache_base() -> type[Any]:
    return Cache


def _layer_base() -> type[Any]:
    return CacheLayerMixin


@dataclass
class RingState:
    """What :meth:`StaticKVCache.ring_state` keeps of the rings (tensors cloned, logs copied)."""

    tensors: list[torch.Tensor]
    ids: torch.Tensor
    tokens: dict[int, list[int]]
    high: dict[int, int]


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
        # A sliding-window model's (window, mixed) (specdec.backends.buckets.windows.setup_rings), which the forward's
        # masks read; None: every layer is full attention. Its sliding layers are rings (set_ring).
        self.sliding: tuple[int, bool] | None = None
        # The rings of the sliding layers (module docstring; set_ring): which layers, slots per place.
        self.ring_layers: tuple[bool, ...] = ()
        self.ring = 0
        self.places = 1
        self.scratch = 0
        self.ring_ids: torch.Tensor | None = None  # int64 [places * ring + scratch]: the slot each ring slot holds
        # Host logs per place: its committed tokens, the highest offset written since its prefill, and the last
        # forward's writes (first offset, tokens), from which compaction takes the accepted tokens.
        self._tokens: dict[int, list[int]] = {}
        self._high: dict[int, int] = {}
        self._written: dict[int, tuple[int, list[int]]] = {}

    def set_ring(self, layers: Sequence[bool], ring: int, places: int = 1, scratch: int = 0) -> None:
        """Make the layers flagged in ``layers`` rings of ``ring`` slots per place (module docstring); ``places``
        regions and ``scratch`` slots cut the cache (a batch's rows). No flag set: no ring."""
        setting = (tuple(layers), ring if any(layers) else 0, places, scratch)
        if setting == (self.ring_layers, self.ring, self.places, self.scratch):
            return
        if any(layers) and (len(layers) != self.num_layers or ring < 1):
            raise SpecDecError(f"rings of {ring} slots for {len(layers)} of {self.num_layers} layers")
        self.ring_layers, self.ring, self.places, self.scratch = setting
        self.keys = self.values = None  # the next write allocates the new layout
        self.ring_ids = None
        if self.ring:  # here, not at the first write: the first forward's mask reads it before any layer writes
            self.ring_ids = torch.full((self.ring_slots,), -1, dtype=torch.int64, device=self.device)
        self.generation += 1

    @property
    def span(self) -> int:
        """Slots per place of the full-attention layers."""
        return (self.capacity - self.scratch) // self.places

    @property
    def ring_slots(self) -> int:
        """Slots of a ring layer: a ring per place, then the scratch slots."""
        return self.places * self.ring + self.scratch

    def is_ring(self, index: int) -> bool:
        return self.ring > 0 and self.ring_layers[index]

    def ring_of(self, slots: torch.Tensor) -> torch.Tensor:
        """The ring slots int64 of ``slots`` int64 (module docstring): tensor operations, traced in the forward."""
        span, ring, places = self.span, self.ring, self.places
        place = torch.div(slots, span, rounding_mode="floor").clamp(max=places)
        return torch.where(place < places, place * ring + (slots - place * span) % ring,
                           places * ring + slots - places * span)  # fmt: skip

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
        shapes = [(self.batch, heads, self.ring_slots if self.is_ring(i) else self.capacity, dim)
                  for i in range(self.num_layers)]  # fmt: skip
        self.keys = [torch.zeros(shape, dtype=keys.dtype, device=self.device) for shape in shapes]
        self.values = [torch.zeros(shape, dtype=values.dtype, device=self.device) for shape in shapes]
        self.generation += 1

    def grow(self, capacity: int) -> None:
        """Reallocate to ``capacity`` slots (> the present one), keeping the committed slots' contents."""
        if capacity > self.capacity:
            self.regrow_regions(capacity, [(0, 0, self.committed_len)])

    def regrow_regions(self, capacity: int, regions: list[tuple[int, int, int]]) -> None:
        """Reallocate to ``capacity`` slots, copying each ``(source, target, length)`` run of slots over;
        every other slot starts at zero (the batch of rows that shares one cache moves its regions apart:
        :mod:`specdec.backends.buckets.rows`; :meth:`grow` keeps one region, the committed slots). A ring stays
        as it is (a slot's ring slot depends on its place and offset only): ``ring_ids`` follow the moves, and
        ring slots of slots outside them are marked empty."""
        old_keys, old_values = self.keys, self.values
        self.capacity = capacity
        if old_keys is None or old_values is None:
            return
        self.generation += 1
        if self.ring_ids is not None:
            ids = torch.full_like(self.ring_ids, -1)
            for source, target, length in regions:
                inside = (self.ring_ids >= source) & (self.ring_ids < source + length)
                ids = torch.where(inside, self.ring_ids - source + target, ids)
            self.ring_ids.copy_(ids)
        self.keys, self.values = [], []
        for old, new in ((old_keys, self.keys), (old_values, self.values)):
            for index, tensor in enumerate(old):
                if self.is_ring(index):
                    new.append(tensor)
                    continue
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

    def writer(self, slots: torch.Tensor, prompt: bool = False) -> Any:
        """A Hugging Face ``Cache`` whose layers write new keys and values at ``slots`` int64 ``[T]``.

        ``slots`` is read at every forward, so a compiled or captured forward that holds
        this object picks up new slots when the tensor's contents change. ``prompt``: the forward
        is a sequence's prompt (nothing committed before it), which a ring layer may attend to
        alone when it is longer than the ring.
        """
        return _writer_class()(self, slots, prompt)

    def compact(self, committed_len: int, path: list[int] | tuple[int, ...]) -> None:
        """Keep an accepted path: slot ``committed_len + path[i]`` moves to ``committed_len + i``.

        ``path`` is increasing and starts at 0 (the root, already in place); nodes before the
        first one that moved stay where they are, so a chain (every accepted node in place)
        costs nothing. A gather and a scatter per layer and tensor: O(L * H * moved * D).
        A ring layer moves the same nodes between their ring slots (:meth:`ring_of`), and the place's
        log of committed tokens takes the accepted ones.
        """
        if self.ring:
            self._log_accepted(committed_len, path)
        first = next((i for i, node in enumerate(path) if node != i), None)
        if first is None:
            return
        assert self.keys is not None and self.values is not None
        moved = len(path) - first
        sources = torch.tensor([committed_len + node for node in path[first:]], dtype=torch.int64)
        targets = torch.arange(committed_len + first, committed_len + first + moved, dtype=torch.int64)
        ring_moves: tuple[torch.Tensor, ...] | None = None
        if self.ring:  # the same moves between ring slots, and the slots the targets' ring slots then hold
            ring_moves = (self.ring_of(sources), self.ring_of(targets), targets)
        if self.device.type != "cpu":  # pinned, non-blocking: the host queues the copy and moves on
            sources, targets = _to_device(self.device, sources, targets)
            if ring_moves is not None:
                ring_moves = _to_device(self.device, *ring_moves)
        # Gather first (a copy), then scatter: sources and targets may overlap.
        for index, (keys, values) in enumerate(zip(self.keys, self.values, strict=True)):
            if ring_moves is not None and self.ring_layers[index]:
                ring_sources, ring_targets = ring_moves[0], ring_moves[1]
                keys.index_copy_(2, ring_targets, keys.index_select(2, ring_sources))
                values.index_copy_(2, ring_targets, values.index_select(2, ring_sources))
            else:
                keys.index_copy_(2, targets, keys.index_select(2, sources))
                values.index_copy_(2, targets, values.index_select(2, sources))
        if ring_moves is not None and self.ring_ids is not None:
            self.ring_ids.index_copy_(0, ring_moves[1], ring_moves[2])

    # -- the rings' host logs (module docstring) -------------------------------------------------
    def _place(self, slot: int) -> tuple[int, int]:
        """``(place, offset)`` of ``slot``."""
        span = self.span
        return slot // span, slot % span

    def log_prompt(self, input_ids: torch.Tensor, base: int) -> None:
        """A prompt ``input_ids`` ``[1, L]`` was written at slots ``base ..`` (offsets ``0 ..`` of its place)."""
        if self.ring:
            place, _ = self._place(base)
            self._tokens[place] = [int(t) for t in input_ids[0].tolist()]
            self._high[place] = len(self._tokens[place]) - 1
            self._written.pop(place, None)

    def log_writes(self, tokens: np.ndarray, slots: np.ndarray) -> None:
        """A forward writes ``tokens`` at ``slots`` (int64 ``[T]``, each place's slots consecutive)."""
        if not self.ring:
            return
        span = self.span
        places = slots // span
        for place in np.unique(places[places < self.places]).tolist():
            offsets = slots[places == place] - place * span
            if self.sliding is not None and len(offsets) > self.ring - self.sliding[0] + 1:
                raise SpecDecError(f"{len(offsets)} nodes of one sequence in one forward overflow its sliding layers' "
                                   f"ring of {self.ring} slots (window {self.sliding[0]})")  # fmt: skip
            self._written[place] = (int(offsets[0]), tokens[places == place].tolist())
            self._high[place] = max(self._high.get(place, -1), int(offsets[-1]))

    def _log_accepted(self, committed_len: int, path: Sequence[int]) -> None:
        place, committed = self._place(committed_len)
        first, tokens = self._written.get(place, (committed, []))
        log = self._tokens.setdefault(place, [])
        del log[committed:]
        log.extend(tokens[committed + node - first] for node in path)

    def committed_tokens(self, place: int) -> list[int]:
        """The committed tokens logged for ``place`` (a prompt, then accepted paths)."""
        return self._tokens.get(place, [])

    def ring_keeps(self, place: int, committed_len: int, window: int) -> bool:
        """Whether ``place``'s ring still holds the keys a sequence rewound to ``committed_len`` tokens needs (the
        last ``window - 1``): none of their ring slots was written by a later offset since its prefill."""
        return max(0, committed_len - window + 1) > self._high.get(place, -1) - self.ring

    def truncate(self, place: int, committed_len: int) -> None:
        """Forget ``place``'s logged tokens past ``committed_len`` (a rewind)."""
        del self._tokens.get(place, [])[committed_len:]

    def rewritten(self, place: int, committed_len: int) -> None:
        """``place``'s committed tokens were written again by a prompt forward: its offsets start over."""
        self._high[place] = committed_len - 1

    def ring_state(self) -> RingState | None:
        """A copy of the rings and their logs (None: no ring, or nothing written yet)."""
        if not self.ring or self.keys is None or self.values is None or self.ring_ids is None:
            return None
        tensors = [t.clone() for i, t in enumerate((*self.keys, *self.values)) if self.is_ring(i % self.num_layers)]
        return RingState(tensors, self.ring_ids.clone(), {p: list(t) for p, t in self._tokens.items()},
                         dict(self._high))  # fmt: skip

    def restore_ring(self, state: RingState | None) -> None:
        """Put back what :meth:`ring_state` copied (the cache's layout unchanged since)."""
        if state is None or self.keys is None or self.values is None or self.ring_ids is None:
            return
        rings = [t for i, t in enumerate((*self.keys, *self.values)) if self.is_ring(i % self.num_layers)]
        for tensor, saved in zip(rings, state.tensors, strict=True):
            tensor.copy_(saved)
        self.ring_ids.copy_(state.ids)
        self._tokens, self._high = state.tokens, state.high
        self._written.clear()


def _to_device(device: torch.device, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Host int64 tensors on ``device``, pinned and non-blocking."""
    return tuple(t.pin_memory().to(device, non_blocking=True) for t in tensors)


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
        is_sliding = False  # specdec builds every mask itself (tree_forward): a ring layer's window is in its mask

        def __init__(self, owner: StaticKVCache, index: int, slots: torch.Tensor, prompt: bool) -> None:
            super().__init__()
            self.owner, self.index, self.slots, self.prompt = owner, index, slots, prompt
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
            if self.owner.is_ring(self.index):
                return self._ring_update(keys, values, key_states, value_states)
            keys.index_copy_(2, self.slots, key_states)
            values.index_copy_(2, self.slots, value_states)
            if self.owner.window is not None:  # attend over the leading slots only (views, no copy)
                width = self.owner.width
                return keys[:, :, :width], values[:, :, :width]
            return keys, values

        def _ring_update(
            self, keys: torch.Tensor, values: torch.Tensor, key_states: torch.Tensor, value_states: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            """A ring layer: write at the slots' ring slots and attend over the whole ring; a prompt longer than a
            place's ring writes its last ``ring`` keys only and attends over its own keys (nothing precedes it)."""
            ring = self.owner.ring
            if self.prompt and key_states.shape[2] > ring:
                tail = self.owner.ring_of(self.slots[-ring:])
                keys.index_copy_(2, tail, key_states[:, :, -ring:])
                values.index_copy_(2, tail, value_states[:, :, -ring:])
                return key_states, value_states
            ring_slots = self.owner.ring_of(self.slots)
            keys.index_copy_(2, ring_slots, key_states)
            values.index_copy_(2, ring_slots, value_states)
            return keys, values

        def get_seq_length(self, *args: Any) -> int:
            return 0  # see SlotCache.get_seq_length

        def get_mask_sizes(self, *args: Any) -> tuple[int, int]:
            if self.owner.is_ring(self.index):
                return self.owner.ring_slots, 0
            return self.owner.width, 0  # what the keys and values update() returns span

        def get_max_cache_shape(self, *args: Any) -> int:
            return self.owner.capacity

        def get_max_length(self) -> int:
            return self.owner.capacity

    class SlotCache(cache_base):  # type: ignore[misc, valid-type]
        """The Hugging Face face of a :class:`StaticKVCache` for one set of write slots."""

        def __init__(self, owner: StaticKVCache, slots: torch.Tensor, prompt: bool) -> None:
            super().__init__(layers=[SlotLayer(owner, i, slots, prompt) for i in range(owner.num_layers)])
            self.owner, self.prompt = owner, prompt

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
