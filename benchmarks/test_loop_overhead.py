"""The loop's own cost per step: :func:`specdec.engine.decode` around a verifier that costs nothing.

The verifier is :class:`specdec.bench.stream_replay.ReplayVerifier` (a known token stream; a
step costs microseconds), so what is timed is the engine: stop rules, tree pruning, stats
records, and the drafter's calls. With ``none`` (one-node trees, a drafter that does
nothing) that is the loop's overhead per step, the figure issue #2 holds under 2 ms; with
``pld`` it adds pruning and bookkeeping of real drafts. ``extra_info`` has the steps and
``other_s`` per step as the stats measure it.

    python -m pytest benchmarks/test_loop_overhead.py --benchmark-only
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import per_item_us

from specdec.bench.stream_replay import replay
from specdec.drafters import make_factory

PROMPT_TOKENS = 256
NEW_TOKENS = 512


@pytest.mark.parametrize("drafter", ["none", "pld"])
def test_loop_overhead(benchmark: Any, drafter: str, code_stream: list[int], vocab_size: int) -> None:
    stream = code_stream[: PROMPT_TOKENS + NEW_TOKENS]
    factory = make_factory(drafter)
    result = benchmark.pedantic(
        lambda: replay(factory.create(), stream, PROMPT_TOKENS, vocab_size=vocab_size), rounds=10, warmup_rounds=1
    )
    stats = result.stats
    benchmark.extra_info.update(
        steps=stats.steps,
        us_per_step=per_item_us(benchmark, stats.steps, 2),
        other_us_per_step=round(1e6 * stats.other_s / stats.steps, 2),
        draft_us_per_step=round(1e6 * stats.draft_s / stats.steps, 2),
    )
