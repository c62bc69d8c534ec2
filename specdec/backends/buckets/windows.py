"""Sliding-window layers on the fixed-shape engines' static cache: rings bounded by the window.

The bucket engines (``engine="buckets"``, ``"compiled"``, ``"graphs"``, ``"compiled-graphs"``) run
a model with a :class:`~specdec.backends.sliding.SlidingWindow` on their static cache, whose
sliding layers are rings of ``window - 1 + the largest bucket`` slots per sequence
(:func:`setup_rings`, :mod:`~specdec.backends.slot_cache`): bounded by the window, as the model's
own static cache is; the full layers of a mixed model keep every token. The sliding layers' masks
are built inside the bucket's forward from its device buffers and the ring's record of which slot
each ring slot holds (:func:`ring_allowed`, :func:`bucket_masks`), so one compiled function or
captured graph per bucket serves every step. A rewind past what a ring still holds runs the
committed tokens again (:func:`bucket_rewind`).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from specdec.backends.sliding import FULL, SLIDING, SlidingWindow
from specdec.backends.slot_cache import StaticKVCache


class PromptForwards(Protocol):
    """What :func:`bucket_rewind` needs of the forward: its cache, device and prompt forward."""

    device: torch.device

    @property
    def cache(self) -> StaticKVCache: ...

    def prompt_forward(
        self, input_ids: torch.Tensor, keep_all: bool, base: int = 0, bounds: torch.Tensor | None = None
    ) -> torch.Tensor: ...


def ring_capacity(window: int, largest_tree: int) -> int:
    """Slots of a sliding layer's ring per place: ``window - 1`` committed keys and the largest tree a forward
    writes there (padding included), so a forward never overwrites a key one of its nodes needs
    (:mod:`specdec.backends.slot_cache`).

    >>> ring_capacity(4096, 128)
    4223
    """
    return window - 1 + largest_tree


def setup_rings(cache: StaticKVCache, window: SlidingWindow | None, largest_tree: int, places: int = 1,
                scratch: int = 0) -> None:  # fmt: skip
    """A bucket engine's ``cache`` for a model of ``window`` (None: full attention only, no rings): the masks'
    ``(window, mixed)`` and a ring of :func:`ring_capacity` slots per place for each sliding layer;
    ``largest_tree``: the most nodes one sequence's forward writes (a lone sequence's bucket, padding included;
    a batch row's tree, its padding in the ``scratch`` slots after the ``places`` regions)."""
    if window is None:
        cache.sliding = None
        cache.set_ring((), 0)
        return
    cache.sliding = (window.window, window.mixed)
    cache.set_ring(window.sliding_layers, ring_capacity(window.window, largest_tree), places, scratch)


def ring_allowed(
    cache: Any,
    window: int,
    slots: torch.Tensor,
    positions: torch.Tensor,
    ancestors: torch.Tensor,
    bounds: torch.Tensor | None,
    prompt: bool = False,
) -> torch.Tensor:
    """Bool ``[T, R]``: which slots of a sliding layer's ring (:mod:`~specdec.backends.slot_cache`) each node
    attends to: a committed key or an ancestor, inside the node's window (key position > node position -
    ``window``, as ``sliding_window_overlay`` of Hugging Face's masks has it). Records the nodes' slots in the
    cache's ``ring_ids`` first (the forward writes them there).

    Traced inside the buckets' forward (tensor operations only). ``slots`` int64 ``[T]`` (where the nodes'
    keys go; ``slots[0]`` is the committed length for one sequence); ``positions`` int64 ``[1, T]``;
    ``ancestors`` bool ``[T, T]``; ``bounds`` int64 ``[2, T]`` or None (as ``tree_forward`` takes them): node
    ``i``'s committed slots are ``bounds[0, i] <= s < bounds[1, i]``, at positions ``s - bounds[0, i]``. A
    ``prompt`` (nothing committed before it) longer than a place's ring attends over its own keys: ``[T, T]``.
    (A batch's forward may hold more nodes than a ring, each row's at most ``ring - window + 1``.)
    """
    query = positions[0]  # [T]
    ring = cache.ring
    if prompt and slots.shape[0] > ring:  # the layer attends over the prompt's own keys (_ring_update)
        tail = slots[-ring:]
        cache.ring_ids.index_copy_(0, cache.ring_of(tail), tail)
        return ancestors & (query.unsqueeze(0) > (query - window).unsqueeze(1))
    ring_slots = cache.ring_of(slots)  # [T]
    ids = cache.ring_ids.index_copy_(0, ring_slots, slots).unsqueeze(0)  # [1, R]: the slot each ring slot holds
    low, high = (torch.zeros_like(slots[:1]), slots[:1]) if bounds is None else (bounds[0], bounds[1])
    committed = (ids >= low.unsqueeze(1)) & (ids < high.unsqueeze(1))  # [1 or T, R]
    tree = torch.zeros((slots.shape[0], ids.shape[1]), dtype=torch.bool, device=slots.device)
    tree = tree.index_copy(1, ring_slots, ancestors)  # [T, R]: the ancestors' ring slots
    tree_positions = torch.zeros_like(ids[0]).index_copy(0, ring_slots, query)  # [R]
    keys = torch.where(committed, ids - low.unsqueeze(1), tree_positions.unsqueeze(0))  # [T, R]: key positions
    allowed: torch.Tensor = (committed | tree) & (keys > (query - window).unsqueeze(1))
    return allowed


def bucket_masks(mixed: bool, full: Any, windowed: Any) -> Any:
    """The ``attention_mask`` of a bucket's forward: the sliding layers' mask alone when every layer is sliding
    (Mistral), else a dict keyed by layer type, which the mixed models' forwards take as their masks."""
    return {FULL: full, SLIDING: windowed} if mixed else windowed


def bucket_rewind(forward: PromptForwards, place: int, committed_len: int) -> None:
    """The sequence at ``place`` (0 for a lone sequence; a batch row's seat) of a bucket engine's ``forward``
    rewinds to ``committed_len`` tokens: when its place's ring no longer holds the keys the shorter sequence
    needs (a later forward wrote over them), its committed tokens run again through a prompt forward into the
    same place (exact: what a fresh prefill of the shorter sequence writes)."""
    cache = forward.cache
    if not cache.ring:
        return
    cache.truncate(place, committed_len)
    if committed_len == 0 or cache.sliding is None or cache.ring_keeps(place, committed_len, cache.sliding[0]):
        return
    tokens = cache.committed_tokens(place)
    if len(tokens) != committed_len:
        raise AssertionError(f"a ring's log holds {len(tokens)} of the {committed_len} committed tokens")
    base = place * cache.span
    input_ids = torch.tensor([tokens], dtype=torch.long, device=forward.device)
    bounds = None if base == 0 else torch.full((2, committed_len), base, dtype=torch.int64, device=forward.device)
    window, cache.window = cache.window, None  # every slot: the prompt's attention spans all its tokens
    try:
        with torch.inference_mode():
            forward.prompt_forward(input_ids, False, base, bounds)
    finally:
        cache.window = window
    cache.rewritten(place, committed_len)
