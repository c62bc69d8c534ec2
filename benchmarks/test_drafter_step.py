"""Drafter costs per step: propose + update, and reset (indexing the prompt), for every drafter.

The calls are recorded once from a replay (:mod:`specdec.bench.stream_replay`: the real loop over
a known token stream, no model), then replayed on a fresh drafter inside the timer, so
the timed work is exactly the drafter's: ``propose(pending, max_nodes)`` and
``update(accepted, feedback)`` for every step of a 512-token continuation of
``textwrap.py`` after a 1024-token prompt. A drafter is deterministic, so it proposes the
same trees as in the recording, and the recorded acceptances stay right.
``extra_info`` holds the steps, the replay's MAT and the mean time per step.

    python -m pytest benchmarks/test_drafter_step.py --benchmark-only
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import drafter_specs, per_item_us

from specdec.bench.stream_replay import ReplayVerifier, replay
from specdec.types import Drafter, Feedback

PROMPT_TOKENS = 1024
NEW_TOKENS = 512
MAX_NODES = 64  # the engine's cap in these runs: larger than every drafter's default tree but REST's


class Recorder:
    """Wraps a drafter and keeps every call's arguments (and the prompt feedback)."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter
        self.name, self.feedback_topk = drafter.name, drafter.feedback_topk
        self.prompt_feedback: Feedback | None = None
        self.steps: list[tuple[int, tuple[int, ...], Feedback | None]] = []
        self._pending = -1

    def reset(self, prompt: Any, feedback: Feedback | None = None) -> None:
        self.prompt_feedback = feedback
        self.drafter.reset(prompt, feedback)

    def propose(self, pending: int, max_nodes: int) -> Any:
        self._pending = pending
        return self.drafter.propose(pending, max_nodes)

    def update(self, accepted: Any, feedback: Feedback | None) -> None:
        self.steps.append((self._pending, tuple(accepted), feedback))
        self.drafter.update(accepted, feedback)


def record(factory: Any, stream: list[int], vocab_size: int) -> tuple[Recorder, Any]:
    recorder = Recorder(factory.create())
    result = replay(recorder, stream[: PROMPT_TOKENS + NEW_TOKENS], PROMPT_TOKENS, vocab_size=vocab_size,
                    max_nodes=MAX_NODES)
    return recorder, result.stats


@pytest.mark.parametrize("spec", drafter_specs())
def test_propose_and_update(benchmark: Any, spec: str, make_drafter_factory: Callable[[str], Any],
                            code_stream: list[int], vocab_size: int) -> None:
    factory = make_drafter_factory(spec)
    recorder, stats = record(factory, code_stream, vocab_size)
    prompt = code_stream[:PROMPT_TOKENS]

    def setup() -> tuple[tuple[Drafter], dict[str, Any]]:
        drafter = factory.create()
        drafter.reset(prompt, recorder.prompt_feedback)
        return (drafter,), {}

    def steps(drafter: Drafter) -> None:
        for pending, accepted, feedback in recorder.steps:
            drafter.propose(pending, MAX_NODES)
            drafter.update(accepted, feedback)

    benchmark.pedantic(steps, setup=setup, rounds=10, warmup_rounds=1)
    benchmark.extra_info.update(steps=stats.steps, replay_mat=round(stats.mat, 3),
                                mean_tree_size=round(stats.mean_tree_size, 2),
                                us_per_step=per_item_us(benchmark, stats.steps, 2))


@pytest.mark.parametrize("spec", drafter_specs())
def test_reset_on_a_prompt(benchmark: Any, spec: str, make_drafter_factory: Callable[[str], Any],
                           code_stream: list[int], vocab_size: int) -> None:
    """A new sequence: the drafter indexes a 1024-token prompt (per-sequence automata, n-gram maps)."""
    factory = make_drafter_factory(spec)
    prompt = code_stream[:PROMPT_TOKENS]
    _, _, feedback = ReplayVerifier(code_stream, vocab_size).prefill(prompt, factory.create().feedback_topk)

    def setup() -> tuple[tuple[Drafter], dict[str, Any]]:
        return (factory.create(),), {}

    benchmark.pedantic(lambda drafter: drafter.reset(prompt, feedback), setup=setup, rounds=20, warmup_rounds=1)
