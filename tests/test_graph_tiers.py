"""CUDA-graph attention widths in tiers (specdec.backends.buckets.forward, ``BucketForward._window_for``).

A captured graph replays the shapes it was captured with, so the ``cudagraphs`` mode once
attended over the whole cache at every step. A cache only grows: after one long prompt, or
after the budget's calibration (which prefills 1,024 tokens into the verifier's cache, whose
device state ``run`` then hands to every later call), every short sequence attended over
2,048 slots. On an H200 a one-off ``run`` verified in 10 ms a step where a warmed Generator,
whose cache had never grown, took 4.5 (docs/bench/gpu-h200-2026-11-27).

Now each bucket captures a graph per power-of-two width tier it meets. These tests run on the
CPU with a stand-in for ``torch.cuda.CUDAGraph`` that does what the verifier relies on: the
replay reruns the captured forward at the width it was captured at (it fails if the cache's
width is another), and writes its logits into the tensor the capture returned. What is under
test is the verifier's bookkeeping (which graph a step replays, at which width, which graph
was checked), not CUDA; ``tests/test_static_shared.py`` has the CUDA tests for a lease.
"""

from __future__ import annotations

import copy
import random
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from oracle_drafter import OracleTreeDrafter
from test_lossless import hf_greedy
from tiny_models import VOCAB, tiny_model

from specdec.backends.buckets import runner as bucket_runner
from specdec.backends.buckets.forward import bucket_verifier
from specdec.decoding import DecodingConfig, StopRules
from specdec.engine import decode


class FakeGraph:
    """A captured forward on the CPU: each replay reruns it into the captured output, at the captured width."""

    def __init__(self, runner: bucket_runner.BucketRunner, forward: Callable[[], torch.Tensor], output: torch.Tensor,
                 corrupt: bool) -> None:  # fmt: skip
        self.runner, self.forward, self.output, self.corrupt = runner, forward, output, corrupt
        self.width = runner.verifier.cache.width

    def replay(self) -> None:
        width = self.runner.verifier.cache.width
        assert width == self.width, f"a graph captured at width {self.width} replayed at {width}"
        logits = self.forward()
        self.output.copy_(logits + 100.0 * torch.rand_like(logits) if self.corrupt else logits)


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """``(bucket, width)`` of every capture; ``BucketRunner._capture`` replaced by :class:`FakeGraph`
    (a graph captured at a width in ``corrupt_widths`` writes wrong logits)."""
    made: list[tuple[int, int]] = []

    def capture(self: bucket_runner.BucketRunner, forward: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
        width = self.verifier.cache.width
        made.append((self.size, width))
        output = forward().clone()
        return FakeGraph(self, forward, output, width in CORRUPT_WIDTHS), output

    monkeypatch.setattr(bucket_runner.BucketRunner, "_capture", capture)
    CORRUPT_WIDTHS.clear()
    yield made
    CORRUPT_WIDTHS.clear()


CORRUPT_WIDTHS: set[int] = set()


def graph_verifier(model: Any) -> Any:
    """A static verifier in the ``cudagraphs`` mode on a CPU model (its constructor refuses that mode off
    CUDA, so it is made eager and switched, engine and mode, before its first forward; nothing was captured yet)."""
    verifier = bucket_verifier(model, engine="buckets")
    verifier.forward.engine, verifier.forward.mode = "graphs", "cudagraphs"
    return verifier


def long_context_model(seed: int) -> Any:
    """A tiny fp64 Llama of its own, with room for a prompt that grows the cache past 256 slots."""
    model = copy.deepcopy(tiny_model("llama", seed=seed))
    model.config.max_position_embeddings = 4096  # rotary positions: any length runs
    return model


def oracle_decode(verifier: Any, model: Any, prompt: list[int], new_tokens: int, seed: int) -> None:
    truth = hf_greedy(model, prompt, new_tokens)
    drafter = OracleTreeDrafter(truth, VOCAB, seed=seed, size=12, depth=5)
    assert decode(verifier, drafter, prompt, DecodingConfig(StopRules(new_tokens))).tokens == truth


def test_a_short_sequence_after_a_long_one_replays_graphs_of_its_own_tier(captured: list[tuple[int, int]]) -> None:
    model = long_context_model(seed=3)
    rng = random.Random(3)
    verifier = graph_verifier(model)
    assert verifier.identity()["graph_widths"] == "tiers"  # cost tables measured on whole-cache graphs are not read
    assert "graph_widths" not in bucket_verifier(model, engine="buckets").identity()
    oracle_decode(verifier, model, [rng.randrange(VOCAB) for _ in range(700)], 20, seed=1)
    assert verifier.forward.cache.capacity == 1024  # 700 + 20 + the largest bucket (128)
    long_widths = {width for _, width in captured}
    assert long_widths == {1024}  # past 512 slots: the whole cache
    captured.clear()
    oracle_decode(verifier, model, [rng.randrange(VOCAB) for _ in range(30)], 40, seed=2)
    assert verifier.forward.cache.capacity == 1024  # the cache never shrinks ...
    assert captured and {width for _, width in captured} == {256}  # ... but the short sequence attends over 256
    assert len(captured) == len(set(captured))  # one graph per bucket and tier
    for runner in verifier.forward.held.runners.values():
        assert set(runner.captured_widths) <= {256, 1024}
    second = set(captured)
    captured.clear()
    oracle_decode(verifier, model, [rng.randrange(VOCAB) for _ in range(30)], 40, seed=3)
    assert not second & set(captured)  # a third short sequence replays the second's graphs
    assert {width for _, width in captured} <= {256}


def test_a_sequence_crossing_a_tier_moves_to_the_wider_graphs(captured: list[tuple[int, int]]) -> None:
    model = long_context_model(seed=4)
    rng = random.Random(4)
    verifier = graph_verifier(model)
    oracle_decode(verifier, model, [rng.randrange(VOCAB) for _ in range(200)], 120, seed=4)
    widths = [width for _, width in captured]
    assert widths and set(widths) == {256, 512}  # 200 + a tree fits 256; the last steps need 512
    assert widths.index(512) > widths.index(256)


def test_each_tier_is_checked_at_its_first_replay(captured: list[tuple[int, int]]) -> None:
    """A wrong graph at a tier new to a bucket is caught, though the bucket's graphs at other tiers were
    checked already: the check is per graph."""
    model = long_context_model(seed=5)
    rng = random.Random(5)
    verifier = graph_verifier(model)
    oracle_decode(verifier, model, [rng.randrange(VOCAB) for _ in range(700)], 20, seed=5)  # capacity 1024
    oracle_decode(verifier, model, [rng.randrange(VOCAB) for _ in range(20)], 30, seed=6)  # width 256
    assert verifier.forward.fallback_reason is None and verifier.forward.cache.capacity == 1024
    checked_before = {size for size, _ in captured}
    CORRUPT_WIDTHS.add(512)
    captured.clear()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        oracle_decode(verifier, model, [rng.randrange(VOCAB) for _ in range(300)], 30, seed=7)  # width 512
    assert captured[0][1] == 512 and captured[0][0] in checked_before  # a bucket checked at other widths
    messages = [str(w.message) for w in record if "engine='graphs'" in str(w.message)]
    assert len(messages) == 1 and "disagree with the eager forward" in messages[0]
    assert verifier.forward.fallback_reason is not None
