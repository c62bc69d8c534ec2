"""Suffix automaton microbenchmarks: building, loading, and the per-token operations.

The static automaton is the suite's shared one (``datastore_for("sam")``: ~1.3 MB of
standard-library source); the stream is ``textwrap.py`` (not in the corpus). The
drafter's whole step (propose + update) for every drafter is in ``test_drafter_step.py``;
the figures for a 10M-token automaton come from ``specdec bench costs --kind sam``.

    flock /tmp/specdec-bench.lock python -m pytest benchmarks/test_sam_bench.py --benchmark-only
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import per_item_us

from specdec.cachefiles import TokenizerIdentity
from specdec.datastores.sam import StaticSuffixAutomaton, build, native


@pytest.fixture(scope="module")
def static(datastore_for: Callable[[str], str]) -> StaticSuffixAutomaton:
    return StaticSuffixAutomaton.load(datastore_for("sam"))


def test_build(benchmark: Any, static: StaticSuffixAutomaton, tokenizer: Any, tmp_path: Path) -> None:
    """The whole ``build``: C++ construction, CSR export and the file write."""
    starts = static.arrays["doc_starts"]
    tokens = np.asarray(static.arrays["tokens"], dtype=np.int64)
    documents = [tokens[starts[i] : starts[i + 1]] for i in range(static.num_documents)]
    identity = TokenizerIdentity.of(tokenizer)
    report = benchmark.pedantic(lambda: build(documents, tmp_path / "b.sam", identity, progress=False),
                                rounds=3, warmup_rounds=1)
    benchmark.extra_info.update(tokens=static.num_tokens, documents=static.num_documents,
                                bytes_per_token=report["bytes_per_token"],
                                us_per_token=per_item_us(benchmark, static.num_tokens, 3))


@pytest.mark.parametrize("verify", [True, False], ids=["checksums", "no-checksums"])
def test_load(benchmark: Any, static: StaticSuffixAutomaton, verify: bool) -> None:
    """A first load in a process (the cache cleared each round): header checks, CRC-32, maps."""
    from specdec.datastores import sam

    def load() -> StaticSuffixAutomaton:
        sam._CACHE.clear()
        return StaticSuffixAutomaton.load(static.path or "", verify=verify)

    benchmark.pedantic(load, rounds=10, warmup_rounds=1)
    benchmark.extra_info.update(tokens=static.num_tokens, mapped_bytes=static.nbytes)


def test_dynamic_commit_per_token(benchmark: Any, code_stream: list[int]) -> None:
    """The dynamic automaton over a fresh sequence: cursor step + extension per token."""
    module = native()

    def commit() -> int:
        dynamic = module.DynamicSam()
        dynamic.commit(code_stream)
        return int(dynamic.num_states)

    states = benchmark.pedantic(commit, rounds=10, warmup_rounds=1)
    benchmark.extra_info.update(tokens=len(code_stream), states=states,
                                us_per_token=per_item_us(benchmark, len(code_stream), 3))


def test_static_cursor_per_token(benchmark: Any, static: StaticSuffixAutomaton, code_stream: list[int]) -> None:
    """The static cursor over the stream, one call per token as ``update`` makes for 1-token steps."""
    view = static.native_view

    def walk() -> int:
        cursor = (0, 0)
        matched = 0
        for token in code_stream:
            cursor = view.step(cursor, token)
            matched += cursor[1] > 0
        return matched

    matched = benchmark.pedantic(walk, rounds=10, warmup_rounds=1)
    benchmark.extra_info.update(tokens=len(code_stream), matched_fraction=round(matched / len(code_stream), 3),
                                us_per_token=per_item_us(benchmark, len(code_stream), 3))


@pytest.mark.parametrize("length", [8, 39])
def test_static_draft(benchmark: Any, static: StaticSuffixAutomaton, code_stream: list[int], length: int) -> None:
    """Extracting a chain of ``length`` tokens at every matched position of the stream."""
    view = static.native_view
    states, cursor = [], (0, 0)
    for token in code_stream:
        cursor = view.step(cursor, token)
        if cursor[1] >= 5:
            states.append(cursor[0])

    def drafts() -> int:
        return sum(len(view.draft(state, length)) for state in states)

    total = benchmark.pedantic(drafts, rounds=10, warmup_rounds=1)
    benchmark.extra_info.update(drafts=len(states), mean_tokens=round(total / max(len(states), 1), 2),
                                us_per_draft=per_item_us(benchmark, max(len(states), 1), 3))
