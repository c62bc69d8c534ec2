"""A batch's rows on one static cache (``specdec.backends.buckets.rows``): one forward per step, every row lossless.

Checked on tiny fp64 models of every architecture (``engine="buckets"``: the same buckets,
buffers and self-check as the compiled and captured modes): every row's tokens equal its lone
plain decoding, greedy (random trees around the truth, real drafters, ragged prompts, rows
ending at different steps, more prompts than places) and sampled with the row's seed; the
steps really verified several rows per forward; each row's verification equals its lone one
(path, bonus, top ids); trees that add up to more than the largest bucket go in several
forwards; a long prompt joining mid-batch moves every live row's region; places are taken,
given back and refused when full; calibration and warm-up leave live rows alone. On CUDA (a
GPU lease): the same rows on captured graphs.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch
from conftest import IDENTITY_COUNTS
from oracle_drafter import OracleTreeFactory, random_tree
from test_batch import MAX_NEW, alone, frequent_token, ragged_prompts
from tiny_models import ARCHITECTURES, VOCAB, own_tiny_model, tiny_model

import specdec
from specdec.backends.buckets.forward import BucketForward, bucket_verifier
from specdec.backends.buckets.rows import RowsForward, rows_bucket_verifier
from specdec.errors import SpecDecError
from specdec.sampling import PositionKeyedSampler, SamplingParams
from specdec.types import DraftTree

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def watch_rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many rows each forward of every rows verifier verified (appended per forward)."""
    seen: list[int] = []
    forward = RowsForward._rows_forward

    def counted(self: RowsForward, states: Sequence[Any], trees: Sequence[DraftTree]) -> Any:
        seen.append(len(states))
        return forward(self, states, trees)

    monkeypatch.setattr(RowsForward, "_rows_forward", counted)
    return seen


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_rows_on_one_static_cache_equal_their_lone_plain_decoding(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model(arch)
    prompts = ragged_prompts(f"rows-{arch}", 7)
    eos = frequent_token(alone(model, prompts, "hf", max_new_tokens=MAX_NEW))
    truth = alone(model, prompts, "hf", max_new_tokens=MAX_NEW, eos_token_id=eos)
    assert len({len(t) for t in truth}) > 1  # rows end at different steps
    oracle = OracleTreeFactory({tuple(p): t for p, t in zip(prompts, truth, strict=True)}, VOCAB, size=20, depth=7)
    seen = watch_rows(monkeypatch)
    accepted = 0
    for drafter in (oracle, "none", "pld", "sam+recycling"):
        generator = specdec.Generator(model, drafter=drafter, engine="buckets", budget="full")
        assert isinstance(generator.verifier.forward, BucketForward) and generator.verifier.live_limit == 1
        results = generator.generate_batch(prompts, batch_size=3, max_new_tokens=MAX_NEW, eos_token_id=eos)
        for result, expected, prompt in zip(results, truth, prompts, strict=True):
            assert result.tokens == expected, f"{arch}/{drafter}: prompt {prompt}"
            IDENTITY_COUNTS[f"{arch}/static rows/{getattr(drafter, 'name', drafter)}"] += 1
        if drafter is oracle:
            accepted = sum(r.stats.emitted_by_steps - r.stats.steps for r in results)
        generator.close()
    assert accepted > 20  # the oracle's trees were accepted: deep paths, scattered slots, compaction per region
    assert max(seen) == 3 and seen.count(3) > 10  # three rows per forward while three were live


def test_sampled_rows_on_one_static_cache_equal_lone_sampling_with_the_rows_seed() -> None:
    model = tiny_model("llama")
    prompts = ragged_prompts("rows-sampled", 5)
    options: dict[str, Any] = {"max_new_tokens": MAX_NEW, "do_sample": True, "temperature": 0.9, "top_k": 40}
    truth = alone(model, prompts, "hf", seed=11, **options)
    generator = specdec.Generator(model, drafter="sam+recycling", engine="buckets", budget="full")
    assert [r.tokens for r in generator.generate_batch(prompts, batch_size=2, seed=11, **options)] == truth


def lone_and_rows(places: int, buckets: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128)) -> tuple[Any, Any]:
    model = tiny_model("qwen2")
    return (bucket_verifier(model, engine="buckets", buckets=buckets),
            rows_bucket_verifier(model, engine="buckets", buckets=buckets, places=places))  # fmt: skip


@pytest.mark.parametrize("buckets", [(1, 2, 4, 8, 16, 32, 64, 128), (1, 2, 4, 8)])
def test_verify_batch_on_one_static_cache_gives_each_row_its_lone_verification(buckets: tuple[int, ...]) -> None:
    """Three rows (with (1, 2, 4, 8): trees of 16 nodes in all, so three forwards) against each one alone,
    greedy and sampled (whose draws read the nodes' positions: each forward's must survive the next)."""
    lone, rows = lone_and_rows(3, buckets)
    rng = random.Random(5)
    prompts = ragged_prompts("rows-verify", 3)
    trees = [random_tree(rng, rng.randrange(VOCAB), VOCAB, size) for size in (1, 8, 7) if size <= buckets[-1]]
    forwards = []
    run = type(rows.forward).runner_class.run

    def counted(runner: Any) -> torch.Tensor:
        forwards.append(runner.filled)
        return run(runner)

    def sampler(row: int) -> Any:  # a sampled row's draws are keyed by its nodes' positions
        return PositionKeyedSampler(SamplingParams(temperature=0.9, top_k=40, seed=11 + row))

    for topk, sampled in ((0, False), (3, False), (0, True)):
        states = [rows.prefill(p, reserve=40, chooser=sampler(i) if sampled else None)[0]
                  for i, p in enumerate(prompts)]  # fmt: skip
        forwards.clear()
        type(rows.forward).runner_class.run = counted  # type: ignore[method-assign]
        try:
            together = rows.verify_batch(states, trees, topk)
        finally:
            type(rows.forward).runner_class.run = run  # type: ignore[method-assign]
        assert sum(forwards) == sum(t.size for t in trees) and len(forwards) == (1 if buckets[-1] >= 16 else 3)
        for row, (prompt, tree, a) in enumerate(zip(prompts, trees, together, strict=True)):
            state = lone.prefill(prompt, reserve=40, chooser=sampler(row) if sampled else None)[0]
            b = lone.verify(state, tree, topk)
            assert (a.accepted_nodes, a.accepted_tokens, a.bonus) == (b.accepted_nodes, b.accepted_tokens, b.bonus)
            # feedback on both sides or on neither (a one-sided skip hid a row that lost its feedback)
            assert (a.feedback is None) == (b.feedback is None) == (topk == 0), (row, topk)
            if a.feedback is not None and b.feedback is not None:
                assert np.array_equal(a.feedback.topk, b.feedback.topk)
        for state in states:
            rows.release(state)


def test_a_long_prompt_joining_moves_every_live_rows_region(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model("llama")
    rng = random.Random(9)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (12, 20, 110, 15)]  # 110 + 30 + 128 > 256 slots
    truth = alone(model, prompts, "hf", max_new_tokens=MAX_NEW)
    generator = specdec.Generator(model, drafter="pld", engine="buckets", budget="full")
    spans = []
    fit = RowsForward._fit

    def watched(self: RowsForward, needed: int) -> None:
        fit(self, needed)
        spans.append(self.span)

    monkeypatch.setattr(RowsForward, "_fit", watched)
    results = generator.generate_batch(prompts, batch_size=2, max_new_tokens=MAX_NEW)
    assert [r.tokens for r in results] == truth
    assert spans[0] == 256 and max(spans) == 512  # grew once, while the other place held a live row


def test_places_are_taken_given_back_and_refused_when_full() -> None:
    _, rows = lone_and_rows(2)
    first, _, _ = rows.prefill([1, 2, 3])
    second, _, _ = rows.prefill([4, 5, 6, 7])
    assert {first.seat, second.seat} == {0, 1} and rows.live_limit == 2
    with pytest.raises(SpecDecError, match="all 2 places"):
        rows.prefill([8, 9])
    rows.release(first)
    with pytest.raises(SpecDecError, match="released"):
        rows.verify_batch([first], [DraftTree.single(3)])
    third, _, _ = rows.prefill([8, 9])
    assert third.seat == first.seat
    del third  # dropped without release: its place is free again
    gc.collect()
    fourth, _, _ = rows.prefill([1, 1])
    other, _, _ = lone_and_rows(2)[1].prefill([1, 2])
    with pytest.raises(SpecDecError, match="does not belong"):
        rows.verify_batch([fourth, other], [DraftTree.single(1), DraftTree.single(2)])
    assert rows.row_bytes(100) == rows.row_bytes(256) < rows.row_bytes(257)
    with pytest.raises(SpecDecError, match="places must be a positive int"):
        rows_bucket_verifier(tiny_model("llama"), places=0)
    wide = rows_bucket_verifier(tiny_model("llama"), places=2)  # every row's tree in one forward, each row's within 128
    assert (wide.forward.largest_bucket, wide.forward.max_tree_nodes) == (512, 128)
    with pytest.raises(SpecDecError, match="row_nodes must be an int from 1 to the largest bucket"):
        rows_bucket_verifier(tiny_model("llama"), places=2, row_nodes=600)


def test_the_memory_check_counts_every_place_as_large_as_the_largest_row() -> None:
    from specdec.batching import check_memory
    from specdec.decoding import DecodingConfig, StopRules
    from specdec.engine import BatchRequest

    _, rows = lone_and_rows(3)
    config = DecodingConfig(StopRules(20))
    requests = [BatchRequest(i, [1] * n, config) for i, n in enumerate((10, 10, 300, 10))]
    largest = rows.row_bytes(300 + 20 + rows.forward.max_tree_nodes)
    assert largest > rows.row_bytes(10 + 20 + rows.forward.max_tree_nodes)
    assert check_memory(rows, requests, 3, None) == 3 * largest
    with pytest.raises(SpecDecError, match="pass batch_size=2"):
        check_memory(rows, requests, 3, int(2.5 * largest / 0.8))


def test_warm_up_and_calibration_leave_the_live_rows_alone() -> None:
    from specdec.budget.calibration import calibrate

    model = tiny_model("llama")
    rows = rows_bucket_verifier(model, engine="buckets", places=2)
    prompt = ragged_prompts("rows-warm", 1)[0]
    truth = alone(model, [prompt], "hf", max_new_tokens=12)[0]
    state, pending, _ = rows.prefill(prompt, reserve=12)
    rows.warm_up(64)
    calibrate(rows, contexts=(16, 32), repeats=1)
    out = [pending]
    while len(out) < 12:
        result = rows.verify(state, DraftTree.single(out[-1]))
        out.append(result.bonus)
    assert out == truth
    assert [rows.forward._owner(p) is not None for p in range(2)].count(True) == 1  # the warm-ups' rows were released


@cuda
def test_rows_on_cuda_graphs_equal_their_lone_plain_decoding() -> None:
    model = own_tiny_model("llama").to("cuda")  # a copy: the cached model stays on the CPU
    try:
        prompts = ragged_prompts("rows-cuda", 6)
        truth = alone(model, prompts, "hf", max_new_tokens=MAX_NEW)
        for drafter in ("none", "sam+recycling"):
            generator = specdec.Generator(model, drafter=drafter, engine="graphs", budget="full")
            results = generator.generate_batch(prompts, batch_size=4, max_new_tokens=MAX_NEW)
            assert [r.tokens for r in results] == truth
            rows = generator._rows.get(4)
            assert isinstance(rows.forward, RowsForward) and rows.forward.fallback_reason is None
            assert all(runner.mode == "cudagraphs" for runner in rows.forward.held.runners.values())
            generator.close()
            IDENTITY_COUNTS[f"llama/static rows on cuda graphs/{drafter}"] += len(prompts)
    finally:
        model.to("cpu")
