"""Drafter cost per step of ``recycling`` and ``pld+recycling``/``sam+recycling``, no model involved.

    python -m pytest benchmarks/test_recycling_step.py --benchmark-only

A step is ``propose`` then ``update`` with feedback for every node of the proposed tree,
as the engine calls them. The matrix is warmed with rows for the whole 49,152-token
vocabulary of the default model (every row known: the largest trees), and the token
stream is a real one: Python's own ``random.py`` split into words mapped to ids, so the
retrieval drafters find the repeats real text has.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from specdec.drafters import REGISTRY, make_factory
from specdec.drafters.recycling import RecyclingDrafter
from specdec.types import Drafter, Feedback

VOCAB = 49_152
K = 8


def token_stream(length: int = 4000) -> list[int]:
    words = inspect.getsource(random).split()
    ids: dict[str, int] = {}
    return [ids.setdefault(w, len(ids)) for w in words[:length]]


def warm(drafter: Any, rng: np.random.Generator) -> None:
    """Give every token a row of K distinct candidates."""
    target = drafter.auxiliary if hasattr(drafter, "auxiliary") else drafter
    assert isinstance(target, RecyclingDrafter)
    rows = (np.arange(VOCAB)[:, None] + rng.choice(VOCAB - 1, K, replace=False)[None, :] + 1) % VOCAB
    target.write(np.arange(VOCAB, dtype=np.int64), rows.astype(np.int64))


def stepper(name: str, options: dict[str, Any]) -> Callable[[], None]:
    drafter: Drafter = make_factory(name, options).create()
    rng = np.random.default_rng(0)
    warm(drafter, rng)
    stream = token_stream()
    drafter.reset(stream[:200])
    position = [200]

    def step() -> None:
        i = position[0]
        if i + 8 >= len(stream):
            drafter.reset(stream[:200])
            i = 200
        tree = drafter.propose(stream[i], 512)
        accepted = stream[i : i + 1 + int(rng.integers(0, 3))]
        tokens = np.asarray(tree.tokens, dtype=np.int64)
        # distinct ids per row, as a real top-k is
        topk = (tokens[:, None] + 1 + rng.choice(VOCAB - 1, K, replace=False)[None, :]) % VOCAB
        drafter.update(accepted, Feedback(tokens, topk, (0,)))
        position[0] = i + len(accepted)

    return step


@pytest.mark.parametrize("num_nodes", [16, 32, 81])
def test_recycling_step(benchmark: Any, num_nodes: int) -> None:
    benchmark(stepper("recycling", {"num_nodes": num_nodes}))


@pytest.mark.parametrize("mode", ["either", "merge"])
@pytest.mark.parametrize("retrieval", ["pld", "sam"])
def test_composite_step(benchmark: Any, retrieval: str, mode: str) -> None:
    if retrieval not in REGISTRY:
        pytest.skip(f"drafter {retrieval!r} is not registered in this checkout")
    benchmark(stepper(f"{retrieval}+recycling", {"mode": mode}))
