"""The device state of a fixed-shape engine's verifier, lent from the model's pool.

A :class:`DeviceSet` (KV cache, bucket runners, windows, the graphs' memory pool) is held by one
verifier at a time; in the pooled modes a finished verifier gives it back
(:func:`release`, :mod:`specdec.backends.buckets.shared`) and the model's next verifier takes it,
captured graphs and all.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.backends.buckets import shared
from specdec.backends.buckets.runner import BucketRunner
from specdec.backends.slot_cache import StaticKVCache


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
