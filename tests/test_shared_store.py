"""The store shared across requests: generations, eviction, readers, and how callers pass it.

Layers: hand cases of the two-generation eviction (what is kept, what goes, in which
order); a seeded stress of adds against the compiled checker; bad input; the store as
``Generator``, ``run`` and factories see it (on by default, off, sized, shared by object),
on a tiny model whose second identical prompt is drafted from the store; generators and
readers in threads sharing one store.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
from conftest import in_threads
from test_lossless import hf_greedy
from test_suffix_automaton import sam_native  # noqa: F401
from tiny_models import VOCAB, tiny_model

import specdec
from specdec.coercion import resolve_store
from specdec.datastores.shared_store import SharedStore
from specdec.errors import SpecDecError

# Every test here needs the compiled automata (a failed build fails them: conftest.native_or_skip).
pytestmark = pytest.mark.usefixtures("sam_native")

def stored(store: SharedStore) -> list[list[list[int]]]:
    return [[list(d) for d in g.documents()] for g in store.generations()]


def test_generations_evict_the_oldest_sequences() -> None:
    store = SharedStore(max_tokens=10)  # generations of up to 5 tokens
    assert store.num_tokens == 0 and store.version == 0
    store.add([1, 2, 3])
    store.add([4, 5])
    assert stored(store) == [[[1, 2, 3], [4, 5]]] and store.version == 2
    store.add([6])  # the young generation is full (5 + 1 > 5): it becomes the old one
    assert stored(store) == [[[1, 2, 3], [4, 5]], [[6]]]
    store.add([7, 8, 9, 10])
    assert stored(store) == [[[1, 2, 3], [4, 5]], [[6], [7, 8, 9, 10]]]
    store.add([11])  # the oldest generation goes: the three oldest sequences at once
    assert stored(store) == [[[6], [7, 8, 9, 10]], [[11]]]
    assert (store.evicted_sequences, store.evicted_tokens) == (2, 5)
    assert store.num_tokens == 6 and store.num_sequences == 3
    store.add([])  # nothing to store
    assert store.version == 5
    store.add(list(range(12)))  # longer than a generation: stored alone, the budget overshot by it
    assert stored(store)[-1] == [list(range(12))] and store.num_tokens == 13
    store.clear()
    assert store.num_tokens == 0 and store.version == 7


def test_stress_keeps_the_budget_and_the_invariants() -> None:
    rng = random.Random(11)
    store = SharedStore(max_tokens=300)
    longest = 0
    for _ in range(120):
        document = [rng.randrange(4) for _ in range(rng.randrange(1, 60))]
        longest = max(longest, len(document))
        store.add(document)
        assert store.num_tokens <= store.max_tokens + longest
    store.check()
    assert store.evicted_sequences > 0 and store.nbytes > 0
    assert store.num_tokens >= store.max_tokens // 2 - longest  # never emptied below half the budget


def test_bad_input_is_refused() -> None:
    for bad in (1, 0, True, 2.5, "1000"):
        with pytest.raises(SpecDecError, match="max_tokens must be an int >= 2"):
            SharedStore(max_tokens=bad)  # type: ignore[arg-type]
    with pytest.raises(SpecDecError, match="token ids >= 0, got -4"):
        SharedStore().add([3, -4])
    with pytest.raises(SpecDecError, match="store must be True, False, a token budget"):
        resolve_store("yes")
    assert resolve_store(True) is None and resolve_store(False) is False
    assert resolve_store(5000).max_tokens == 5000  # type: ignore[union-attr]


def test_generators_and_run_share_a_store_by_object() -> None:
    """On by default in a Generator; a SharedStore object carries what one caller generated to another."""
    model = tiny_model("llama")
    rng = random.Random(2)
    prompt = [rng.randrange(2, VOCAB) for _ in range(12)]
    first = specdec.Generator(model, drafter="sam", budget="full")
    cold = first.generate(prompt, max_new_tokens=24)
    warm = first.generate(prompt, max_new_tokens=24)  # its own store holds the first answer now
    assert warm.tokens == cold.tokens
    assert warm.stats.accepted_by_source.get("sam-store", 0) > 0 and warm.stats.steps < cold.stats.steps
    store = SharedStore()
    specdec.run(model, prompt, "sam", max_new_tokens=24, budget="full", store=store)
    # The output but its last token (the final bonus, decided but never committed to the drafter).
    assert store.num_sequences == 1 and store.num_tokens == len(cold.tokens) - 1
    again = specdec.run(model, prompt, "sam", max_new_tokens=24, budget="full", store=store)
    assert again.tokens == cold.tokens and again.stats.steps == warm.stats.steps
    off = specdec.Generator(model, drafter="sam", budget="full", store=False)
    off.generate(prompt, max_new_tokens=24)
    assert off.generate(prompt, max_new_tokens=24).stats.steps == cold.stats.steps  # nothing carried over
    composite = specdec.Generator(model, drafter="sam+recycling", budget="full", store=store)
    composite.generate(prompt, max_new_tokens=24)
    assert store.num_sequences == 3  # a composite hands its sam part's sequence over too


def test_generators_in_threads_share_one_store_consistently() -> None:
    """Four generators in four threads, one small store (evicting as they go), seeded prompts: every
    output is plain decoding's, every sequence entered the store once, and its invariants hold."""
    model = tiny_model("llama")
    rng = random.Random(29)
    prompts = [[rng.randrange(2, VOCAB) for _ in range(rng.randrange(5, 12))] * 2 for _ in range(16)]
    truth = [hf_greedy(model, prompt, 20) for prompt in prompts]
    store = SharedStore(max_tokens=120)

    def work(thread: int) -> list[tuple[int, Any]]:
        generator = specdec.Generator(model, drafter="sam", store=store, budget="full")
        return [(i, generator.generate(prompts[i], max_new_tokens=20)) for i in range(thread, len(prompts), 4)]

    results = [pair for chunk in in_threads(work, 4) for pair in chunk]
    assert sorted(i for i, _ in results) == list(range(len(prompts)))
    for i, result in results:
        assert result.tokens == truth[i], f"prompt {i}"
    store.check()
    assert store.num_sequences + store.evicted_sequences == len(prompts)  # each sequence added once
    assert store.evicted_sequences > 0 and store.num_tokens <= store.max_tokens + max(map(len, truth))
    assert sum(r.stats.accepted_by_source.get("sam-store", 0) for _, r in results) > 0  # drafted from the store


def test_adds_and_reads_from_threads_leave_the_store_sound() -> None:
    """One thread adds long sequences while two draft from the store (steps and re-matches): the
    compiled calls never overlap an add, so every read returns a valid cursor and the store checks out."""
    store = SharedStore(max_tokens=40_000)
    done = threading.Event()

    def add() -> None:
        rng = random.Random(1)
        try:
            for _ in range(60):
                store.add([rng.randrange(40) for _ in range(rng.randrange(200, 1500))])
        finally:
            done.set()

    def read(seed: int) -> int:
        rng = random.Random(seed)
        reads = 0
        while not done.is_set() or reads == 0:
            version, generations = store.snapshot()
            for generation in generations:
                cursor = generation.advance((0, 0), [rng.randrange(40) for _ in range(64)])
                for _ in range(32):
                    cursor = generation.step(cursor, rng.randrange(40))
                    assert 0 <= cursor[1] <= 64 + 32
            assert store.version >= version
            reads += 1
        return reads

    results = in_threads(lambda i: add() if i == 0 else read(i), 3)
    assert results[1] > 0 and results[2] > 0
    store.check()
    assert store.num_sequences + store.evicted_sequences == 60
