"""Host cost per step of ``sam`` and ``sam+recycling`` (draft + update) at 11, 40 and 80 nodes.

The default model's recorded greedy outputs (the run directories under
``benchmarks/data/sam_streams/``: the held-out-style prompts, then Spec-Bench, 128 new
tokens; docs/algorithms/sam.md, "Choosing the tree rule", has the commands that record
them) are replayed through each drafter (:mod:`specdec.bench.stream_replay`, no model), every call is
recorded, and the calls are then replayed inside the timer on fresh drafters, so the timed
work is exactly ``propose(pending, N)`` plus ``update(accepted, feedback)`` over every step
of every prompt (``reset``, indexing the prompt, is a per-sequence cost and not timed).
``store``: the shared store holds the outputs of the prompts before each one, as a
``Generator`` running them in order would have it (``sam+recycling`` runs with it). Every
other recorded prompt is used (~2,000 steps). ``extra_info`` has the steps, the
replay's MAT, the mean nodes a step and the mean microseconds per step.

    python -m pytest --benchmark benchmarks/test_sam_tree_cost.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import per_item_us
from test_drafter_step import Recorder

from specdec.bench.results import load_results
from specdec.bench.stream_replay import Stream, recorded_streams, replay
from specdec.types import Drafter

RUNS = [Path(__file__).resolve().parent / "data" / "sam_streams" / name for name in ("heldout", "spec_bench")]
VOCAB = 49152  # the default model's


def streams() -> list[Stream]:
    """The recorded outputs, held-out prompts first, as ``specdec bench replay`` reads them."""
    absent = [str(run) for run in RUNS if not (run / "results.json").is_file()]
    if absent:
        pytest.skip(f"no recorded outputs at {absent[0]}: record them as docs/algorithms/sam.md says")
    return [stream for run in RUNS for stream in recorded_streams(load_results(run))]


def make(name: str, nodes: int, store: Any) -> Drafter:
    from specdec.drafters import DrafterContext, make_factory

    options: dict[str, Any] = {"num_nodes": nodes} if name == "sam" else {
        "sam.num_nodes": nodes, "recycling.num_nodes": nodes}
    return make_factory(name, options, DrafterContext(vocab_size=VOCAB, store=store)).create()


def filled_store(records: list[Stream], upto: int, enabled: bool) -> Any:
    """A store holding the outputs of ``records[:upto]`` (what a Generator would have), or False."""
    from specdec.datastores.shared_store import SharedStore

    if not enabled:
        return False
    store = SharedStore()
    for record in records[:upto]:
        store.add(record.output[:-1])  # the last token is never committed to a drafter
    return store


CASES = [(name, nodes, store) for nodes in (11, 40, 80) for name, store in
         (("sam", False), ("sam", True), ("sam+recycling", True))]


@pytest.mark.parametrize(("name", "nodes", "store"), CASES,
                         ids=[f"{n}-{k}-{'store' if s else 'own-text'}" for n, k, s in CASES])
def test_draft_and_update_per_step(benchmark: Any, name: str, nodes: int, store: bool) -> None:
    records = streams()[::2]  # every other prompt: ~2,000 steps, enough for a mean, light for CI's smoke run
    recorded = []
    steps = emitted = tree_nodes = 0
    for index, record in enumerate(records):  # recorded_streams keeps outputs of 2 tokens or more
        recorder = Recorder(make(name, nodes, filled_store(records, index, store)))
        stream = record.prompt + record.output
        stats = replay(recorder, stream, len(record.prompt), vocab_size=VOCAB, max_nodes=nodes).stats
        recorded.append((index, record, recorder))
        steps, emitted = steps + stats.steps, emitted + stats.emitted_by_steps
        tree_nodes += sum(r.tree_size for r in stats.records)

    def setup() -> tuple[tuple[list[tuple[Drafter, Recorder]]], dict[str, Any]]:
        drafters = []
        for index, record, recorder in recorded:
            drafter = make(name, nodes, filled_store(records, index, store))
            drafter.reset(record.prompt, recorder.prompt_feedback)
            drafters.append((drafter, recorder))
        return (drafters,), {}

    def run(drafters: list[tuple[Drafter, Recorder]]) -> None:
        for drafter, recorder in drafters:
            for pending, accepted, feedback in recorder.steps:
                drafter.propose(pending, nodes)
                drafter.update(accepted, feedback)

    benchmark.pedantic(run, setup=setup, rounds=3, warmup_rounds=1)
    benchmark.extra_info.update(steps=steps, replay_mat=round(emitted / max(steps, 1), 3),
                                mean_tree_size=round(tree_nodes / max(steps, 1), 2),
                                us_per_step=per_item_us(benchmark, steps, 2))

