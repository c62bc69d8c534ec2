"""REST datastore microbenchmarks: the build, and one retrieval (search + trie + ranking) per step.

The datastore is the suite's shared one (``datastore_for("rest")``: ~1.3 MB of standard-library
source); the steps are every position of ``textwrap.py`` (not in the corpus), each querying
the 16 tokens ending there, as the ``rest`` drafter does. The figures for a >10M-token
store come from ``specdec bench costs --kind rest``.

    flock /tmp/specdec-bench.lock python -m pytest benchmarks/test_rest_datastore.py --benchmark-only
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import per_item_us

from specdec.datastores import rest


@pytest.fixture(scope="module")
def store(datastore_for: Callable[[str], str]) -> rest.RestDatastore:
    return rest.load(datastore_for("rest"))


def test_build(benchmark: Any, store: rest.RestDatastore, tmp_path: Path) -> None:
    documents = [np.asarray(store.document(i), dtype=np.int64) for i in range(store.num_documents)]
    report = benchmark.pedantic(lambda: rest.build(documents, tmp_path / "b.rest", store.tokenizer, progress=False),
                                rounds=3, warmup_rounds=1)
    benchmark.extra_info.update(tokens=store.num_tokens, documents=store.num_documents,
                                bytes_per_token=report["bytes_per_token"],
                                us_per_token=per_item_us(benchmark, store.num_tokens, 3))


@pytest.mark.parametrize("max_matches", [5000, 500])
def test_retrieve_per_step(benchmark: Any, store: rest.RestDatastore, code_stream: list[int], max_matches: int) -> None:
    queries = [code_stream[max(0, i - 15) : i + 1] for i in range(1, len(code_stream))]

    def steps() -> int:
        drafted = 0
        for query in queries:
            drafted += store.retrieve(query, max_matches=max_matches).match_length > 0
        return drafted

    drafted = benchmark.pedantic(steps, rounds=5, warmup_rounds=1)
    benchmark.extra_info.update(steps=len(queries), matched_fraction=round(drafted / len(queries), 3),
                                us_per_step=per_item_us(benchmark, len(queries), 2))
