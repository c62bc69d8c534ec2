"""Bucket arithmetic of the fixed-shape engines: tree-size buckets, cache capacities, modes.

A tree of ``N`` nodes runs the forward of the smallest bucket ``T >= N`` (:func:`bucket_for`);
a static cache holds :func:`~specdec.backends.slot_cache.capacity_for` slots (a power of two), attention reads a
window of
:data:`WINDOW_STEP`-slot multiples; each engine of :data:`STATIC_ENGINES` names its mode.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.backends.slot_cache import capacity_for
from specdec.errors import SpecDecError

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
MODES = ("eager", "inductor", "cudagraphs", "inductor-cudagraphs")
# The engines (specdec.backends.ENGINES) that are a static cache, and each one's mode.
STATIC_ENGINES = {"buckets": "eager", "compiled": "inductor", "graphs": "cudagraphs",
                  "compiled-graphs": "inductor-cudagraphs"}  # fmt: skip
# Modes whose device state (cache, buffers, captured graphs) a finished verifier gives back for the model's
# next verifier (shared.give_back): capturing costs more than a short generation; the others rebuild
# their buffers in microseconds and share their compiled functions already.
POOLED_MODES: tuple[str, ...] = ("cudagraphs", "inductor-cudagraphs")
WINDOW_STEP = 64  # attention windows are multiples of this many slots (module docstring)


def bucket_for(size: int, buckets: Sequence[int] = BUCKETS) -> int:
    """The smallest bucket that holds ``size`` nodes.

    >>> bucket_for(1), bucket_for(3), bucket_for(16), bucket_for(17)
    (1, 4, 16, 32)
    """
    for bucket in buckets:
        if bucket >= size:
            return bucket
    raise SpecDecError(f"a tree of {size} nodes exceeds the largest bucket ({buckets[-1]}) of the static cache")


def window_width(mode: str, needed: int, capacity: int, device: torch.device) -> int | None:
    """The slots attention reads in a forward of ``mode`` that writes up to slot ``needed - 1`` of a cache of
    ``capacity`` slots; None: all of them.

    Eager forwards take windows anywhere, compiled ones on the CPU (where they were measured
    and tested; a compiled CUDA forward with a dynamic width is untested): :data:`WINDOW_STEP`
    multiples. A captured graph replays one shape, so ``cudagraphs`` takes a power-of-two tier of at
    least :data:`~specdec.backends.slot_cache.MIN_CAPACITY` slots (each bucket captures a graph per
    tier it meets, a handful at most); ``inductor-cudagraphs`` never takes one.

    >>> cpu = torch.device("cpu")
    >>> [window_width(mode, 70, 512, cpu) for mode in ("eager", "cudagraphs", "inductor-cudagraphs")]
    [128, 256, None]
    >>> window_width("eager", 600, 512, cpu), window_width("cudagraphs", 300, 512, cpu)
    (512, None)
    """
    if mode == "cudagraphs":
        width = capacity_for(needed)
        return None if width >= capacity else width
    if mode == "inductor-cudagraphs" or (mode != "eager" and device.type != "cpu"):
        return None
    return min(capacity, -(-needed // WINDOW_STEP) * WINDOW_STEP)
