"""The device state of a fixed-shape engine's forward, lent from the model's pool.

A :class:`DeviceSet` (KV cache, bucket runners, windows, the graphs' memory pool) is held by one
forward at a time, through a :class:`Lease`; in the pooled modes a finished forward gives it back
(:func:`release`, :mod:`specdec.backends.buckets.shared`) and the model's next forward takes it,
captured graphs and all.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.backends.buckets import shared
from specdec.backends.buckets.runner import BucketHost, BucketRunner
from specdec.backends.buckets.sizes import POOLED_MODES
from specdec.backends.slot_cache import StaticKVCache
from specdec.errors import SpecDecError


@dataclass
class DeviceSet:
    """What a static verifier holds on the device: its KV cache, each bucket's runner (buffers, and the
    captured graph in the CUDA-graph modes), the window tensors and the graphs' memory pool, and the
    weights signature they were made for. Lent to one verifier at a time and, in :data:`POOLED_MODES`,
    given back to the model's pool when that verifier is done (:mod:`specdec.backends.buckets.shared`)."""

    cache: StaticKVCache
    weights: tuple[int, int]
    runners: dict[int, BucketRunner] = field(default_factory=dict)
    windows: dict[int, torch.Tensor] = field(default_factory=dict)
    graph_pool: Any = None

    def drop_runners(self) -> None:
        """Forget every bucket's runner (and graph), and the graphs' memory pool with them.

        The pool must go too: once its last graph is destroyed, the CUDA caching allocator keeps
        the pool's memory until it is freed but refuses new captures into it (torch 2.11:
        ``it->second->use_count > 0 INTERNAL ASSERT FAILED``, seen on an H200 when a grown
        cache was captured again), so the next capture takes a fresh pool, and the old pool's
        memory is handed back to the device (``empty_cache``: a dead pool's segments are freed only
        there), once per regrowth, weight change or fallback.
        """
        self.runners.clear()
        if self.graph_pool is not None:
            self.graph_pool = None
            torch.cuda.empty_cache()


def release(model: weakref.ReferenceType[Any], setting: Any, held: DeviceSet) -> None:
    """Give a finished verifier's device state back to the model's pool (a ``weakref.finalize`` callback:
    it must not refer to the verifier)."""
    shared.give_back(model, setting, held)


class Lease:
    """The :class:`DeviceSet` a forward (``owner``) holds: the model's idle one of ``setting`` (what a captured
    graph replays: dtype, device, mode, buckets, ...), else a new one of ``num_layers`` layers starting at
    ``first_capacity`` slots; in :data:`POOLED_MODES` it goes back to the model's pool when the owner is closed
    (:meth:`close`) or collected."""

    def __init__(self, owner: BucketHost, mode: str, setting: tuple[Any, ...], num_layers: int,
                 first_capacity: int) -> None:  # fmt: skip
        model = owner.model
        signature = shared.weights_signature(model)
        pooled = mode in POOLED_MODES
        held: DeviceSet | None = shared.take_idle(model, setting) if pooled else None
        if held is None:
            held = DeviceSet(StaticKVCache(num_layers, first_capacity, owner.device), signature)
        else:
            held.cache.committed_len = 0
            held.cache.window = None
            if held.weights != signature:  # the weights moved: graphs read the old addresses
                held.weights = signature
                held.drop_runners()
            for bucket, runner in list(held.runners.items()):
                if runner.mode != mode:  # a fallback's eager runner: decide again (and warn) at first use
                    del held.runners[bucket]
                else:
                    runner.bind(owner)
        self._held: DeviceSet | None = held
        # The callback must not refer to the owner (a weakref.finalize of it).
        self._finalizer = weakref.finalize(owner, release, weakref.ref(model), setting, held) if pooled else None

    @property
    def held(self) -> DeviceSet:
        if self._held is None:
            raise SpecDecError("this static-cache verifier was closed (its Generator was closed); make a new one")
        return self._held

    def close(self) -> None:
        """Done: the device state goes back to the model's pool (in :data:`POOLED_MODES`), once; :attr:`held`
        is an error afterwards."""
        if self._held is None:
            return
        self._held = None
        if self._finalizer is not None:
            self._finalizer()
