"""The ``sam`` drafter: occurrence trees over the compiled automata against the reference; losslessness.

Layers: differential (every proposal along a token stream, committed in random chunks,
equals :func:`specdec.reference.suffix_automaton.sam_tree` computed from scratch, with the
dynamic automaton alone, with a static one, and with a shared store that grows and evicts
while the sequence runs, for several options and node budgets; labels and features too);
hand cases (trees, budgets as prefixes, sources merged and ranked, the store's options and
sharing); bad options; token identity with plain greedy decoding on tiny fp64 models of
every architecture (drafts accepted from the store and the corpus); and (slow) the default
model with a GSM8K static automaton."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import IDENTITY_COUNTS, shared_file
from test_suffix_automaton import identity, python_words, random_documents, sam_native  # noqa: F401
from tiny_models import ARCHITECTURES, VOCAB, tiny_model

import specdec
from specdec.datastores.sam import StaticSuffixAutomaton, build
from specdec.datastores.shared_store import SharedStore
from specdec.drafters import DrafterContext, make_factory
from specdec.drafters.sam import SOURCE_DYNAMIC, SOURCE_STATIC, SOURCE_STORE, SamConfig, SamDrafter, node_feature
from specdec.errors import DatastoreError, SpecDecError
from specdec.reference.suffix_automaton import SuffixAutomaton, sam_tree
from specdec.types import DraftTree, RetrievalDrafter

# Every test here needs the compiled automata (a failed build fails them: conftest.native_or_skip).
pytestmark = pytest.mark.usefixtures("sam_native")

LABELS = {3: SOURCE_DYNAMIC, 2: SOURCE_STORE, 1: SOURCE_STORE, 0: SOURCE_STATIC}


def expected_match(tokens: list[int], position: int, config: SamConfig, static: SuffixAutomaton | None,
                   store: list[list[list[int]]]) -> int:
    """``match_length()`` from scratch: the longest biased match of the context in any source."""
    context = tokens[: position + 1]
    lengths = [SuffixAutomaton.from_documents([tokens[:position]]).match(context).length]
    lengths += [SuffixAutomaton.from_documents(g).match(context).length - config.store_bias for g in store]
    if static is not None:
        lengths.append(static.match(context).length - config.l_bias)
    return max(0, *lengths)


def expected_tree(tokens: list[int], position: int, config: SamConfig, static: SuffixAutomaton | None,
                  store: list[list[list[int]]], budget: int) -> DraftTree:
    """The reference's tree as the drafter must return it: labels, features, the budget cut."""
    want = sam_tree(tokens[:position], tokens[position], static=static, store=store,
                    num_nodes=min(config.num_nodes, budget), max_children=config.max_children,
                    chain_length=config.chain_length, l_bias=config.l_bias, store_bias=config.store_bias,
                    min_share=config.min_share, match_factor=config.match_factor, match_offset=config.match_offset)
    if len(want.tokens) == 1:
        return DraftTree.single(tokens[position], "sam")
    features = [0] + [node_feature(want.match_length, want.occurrences[i], want.occurrences[want.parents[i]])
                      for i in range(1, len(want.tokens))]
    labels = tuple(LABELS[max(ranks)] for ranks in want.ranks)
    return DraftTree(tuple(want.tokens), tuple(want.parents), "sam", labels, tuple(features))


def drafts_along(tokens: list[int], config: SamConfig, documents: list[list[int]] | None, split: int,
                 rng: random.Random, store: SharedStore | None = None,
                 others: list[list[int]] | None = None) -> Counter[str]:
    """Feed ``tokens`` in random commit sizes; every proposal must equal the reference's tree.

    ``others``: sequences that finish (enter the store) while this one runs, one every few
    steps, so the drafter's store cursors must follow the store's changes. Returns the
    labels of the proposed nodes (so callers can demand every source).
    """
    static = StaticSuffixAutomaton.from_documents(documents) if documents is not None else None
    reference_static = SuffixAutomaton.from_documents(documents) if documents is not None else None
    drafter = SamDrafter(config, static, store)
    drafter.reset(tokens[:split])
    labels: Counter[str] = Counter()
    pending_others = list(others or [])
    position = split  # tokens[position] is the pending token
    while position < len(tokens):
        pending = tokens[position]
        generations = [] if store is None else [[list(d) for d in g.documents()] for g in store.generations()]
        for budget in (1, 2, 5, config.num_nodes + 3):
            tree = drafter.propose(pending, budget)
            want = expected_tree(tokens, position, config, reference_static, generations, budget)
            context = tokens[: position + 1]
            assert (tree.tokens, tree.parents) == (want.tokens, want.parents), (context, budget)
            assert (tree.node_sources, tree.node_features) == (want.node_sources, want.node_features), context
            assert tree.size <= max(1, min(budget, config.num_nodes)) and tree.max_depth < config.chain_length
        assert drafter.match_length() == expected_match(tokens, position, config, reference_static, generations)
        labels.update(tree.node_sources or ())
        step = rng.randrange(1, 6)
        drafter.update(tokens[position : position + step], None)
        position += step
        if store is not None and pending_others and rng.random() < 0.3:
            store.add(pending_others.pop())
    assert drafter.dynamic.check() == ""
    return labels


def stream_from(rng: random.Random, documents: list[list[int]], length: int, alphabet: int) -> list[int]:
    """A stream that copies from the documents (corpus or store matches) and from itself (dynamic)."""
    stream: list[int] = []
    while len(stream) < length:
        source = rng.choice(documents) if rng.random() < 0.5 or not stream else stream
        start = rng.randrange(len(source))
        stream += [*source[start : start + rng.randrange(1, 25)], rng.randrange(alphabet)]
    return stream


@pytest.mark.parametrize(
    "config",
    [SamConfig(store=False),
     SamConfig(num_nodes=6, max_children=1, chain_length=4, l_bias=0, store_bias=0, store=False),
     SamConfig(num_nodes=25, max_children=2, l_bias=2, store_bias=2, store=False),
     SamConfig(num_nodes=8, match_factor=1, match_offset=1, min_share=0.4, l_bias=1, store=False)],
    ids=["default", "narrow-shallow-no-bias", "biased", "sized-by-evidence"],
)
@pytest.mark.parametrize("seed", range(3))
def test_equals_reference_with_every_source(config: SamConfig, seed: int) -> None:
    rng = random.Random(seed)
    documents = random_documents(rng, 6, 10, 60)  # the corpus
    others = random_documents(rng, 6, 12, 40)  # earlier sequences, for the store
    stream = stream_from(rng, documents + others, 250, 6)
    split = rng.randrange(1, 60)
    drafts_along(stream, config, None, split, random.Random(seed))
    labels = drafts_along(stream, config, documents, split, random.Random(seed))
    assert labels[SOURCE_DYNAMIC] > 0 and labels[SOURCE_STATIC] > 0  # both automata were exercised
    # A store that grows (and evicts: 120 tokens, generations of 60) while the sequence runs.
    store = SharedStore(max_tokens=120)
    store.add(others[0])
    labels = drafts_along(stream, config, documents, split, random.Random(seed), store, others[1:])
    assert labels[SOURCE_STORE] > 0 and store.evicted_sequences > 0


def test_equals_reference_on_real_text() -> None:
    """Python source as words: the corpus is a module cut into top-level blocks, the stream the
    same module with every 25th word changed (an edited copy: static and dynamic repeats)."""
    documents = python_words(random)
    words = [t for d in documents for t in d]
    stream = [t if i % 25 else t + 1 for i, t in enumerate(words[:900])]
    labels = drafts_along(stream, SamConfig(l_bias=2, store=False), documents, 100, random.Random(0))
    assert labels[SOURCE_DYNAMIC] > 0 and labels[SOURCE_STATIC] > 0


def test_trees_by_hand_and_prefix_budgets() -> None:
    drafter = SamDrafter(SamConfig(store=False))
    drafter.reset([1, 2, 3, 4, 5, 6, 7, 8])
    tree = drafter.propose(9, 40)
    assert tree.size == 1 and drafter.match_length() == 0  # 9 never occurred: no draft
    drafter.update([9, 1, 2], None)
    full = drafter.propose(3, 40)  # "1 2 3" once: its continuation, the rest of the prompt, then "9 1 2"
    assert full.tokens == (3, 4, 5, 6, 7, 8, 9, 1, 2) and full.is_chain and drafter.match_length() == 3
    assert set(full.node_sources or ()) == {SOURCE_DYNAMIC}
    for budget in range(1, 10):  # a budget cuts a prefix of the same tree (best first)
        assert drafter.propose(3, budget).tokens == full.tokens[:budget]
    # A short match drafts too (the paper's standalone rule drafted nothing below l_threshold=5).
    drafter.update([3, 4, 5, 6, 7, 8, 9, 1], None)
    branched = drafter.propose(2, 40)  # "1 2" is followed by 3 twice ("3 4 ..."), and "9 1 2" by 3
    assert branched.tokens[:2] == (2, 3) and drafter.match_length() >= 1
    assert isinstance(drafter, RetrievalDrafter)


def test_static_automaton_is_shared_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "corpus.sam"
    build([np.array([1, 2, 3, 4, 5, 6, 7, 8, 9])], path, identity(20), progress=False)
    context = DrafterContext(vocab_size=20)
    factory = make_factory("sam", {"datastore": str(path), "l_bias": 0, "store": False}, context)
    first, second = factory.create(), factory.create()
    assert isinstance(first, SamDrafter) and isinstance(second, SamDrafter)
    assert first.static is second.static  # one memory map for every sequence
    assert make_factory("sam", {"datastore": path}, context).create().static is first.static  # and every factory
    first.reset([7, 1, 2])
    second.reset([5, 5])
    tree = first.propose(3, 5)
    assert tree.tokens == (3, 4, 5, 6, 7) and tree.node_sources == (SOURCE_STATIC,) * 5
    assert first.match_length() == 3  # "1 2 3"
    second.propose(3, 5)
    assert second.match_length() == 1  # per-sequence cursors: "5 5 3" only matches "3"
    assert second.propose(11, 5).size == 1  # 11 never occurred: no draft
    with pytest.raises(DatastoreError, match="past this model's vocabulary of 10"):
        make_factory("sam", {"datastore": str(path)}, DrafterContext(vocab_size=10))
    with pytest.raises(DatastoreError, match="no datastore file"):
        make_factory("sam", {"datastore": str(tmp_path / "absent.sam")}, context)


def test_store_options_and_sharing() -> None:
    """True (default): one store per factory, shared by its drafters; False: none; an int sizes it;
    an object is used as given; a caller's context store (a Generator's) wins over the default."""
    factory = make_factory("sam", {"store_bias": 0})  # store matches as long as their own text's count
    first, second = factory.create(), factory.create()
    assert isinstance(first, SamDrafter) and isinstance(second, SamDrafter)
    assert first.store is not None and first.store is second.store
    assert make_factory("sam").create().store is not first.store  # another factory, another store
    assert make_factory("sam").create().config.store_bias == 1  # the default
    assert make_factory("sam", {"store": False}).create().store is None
    assert make_factory("sam", {"store": 1000}).create().store.max_tokens == 1000
    mine = SharedStore(500)
    assert make_factory("sam", {"store": mine}).create().store is mine
    assert make_factory("sam", {}, DrafterContext(store=mine)).create().store is mine
    assert make_factory("sam", {}, DrafterContext(store=False)).create().store is None
    # finish() hands the output (not the prompt, by default) to the store, once.
    first.reset([1, 2, 3])
    first.update([4, 5, 6], None)
    first.finish()
    first.finish()
    assert first.store.num_sequences == 1 and first.store.num_tokens == 3
    # "4 5" is followed by 9 in the second sequence's own text and by 6 in the store: both
    # drafted (5 occurs twice after 4), its own text ranked more recent than the store's.
    second.reset([4, 5, 9])
    second.update([4], None)
    tree = second.propose(5, 10)
    assert tree.tokens == (5, 9, 6, 4) and tree.parents == (-1, 0, 0, 1)  # shallower first
    assert tree.node_sources == (SOURCE_DYNAMIC, SOURCE_DYNAMIC, SOURCE_STORE, SOURCE_DYNAMIC)
    assert second.propose(4, 10).tokens == (4, 5, 9, 6, 4)  # "4": then 5 in both sources (twice)
    # A longer match in one source wins over a shorter one in another: "9 4 4" only occurs in the store now.
    first.reset([0])
    first.update([9, 4, 4, 8], None)
    first.finish()
    assert second.propose(4, 10).tokens == (4, 8) and second.match_length() == 3  # "9 4 4"
    prompts = SharedStore(include_prompts=True)
    third = SamDrafter(SamConfig(), store=prompts)
    third.reset([7, 7])
    third.update([8], None)
    third.reset([1])  # a reused drafter hands its previous sequence over at reset
    assert prompts.num_tokens == 3


def test_bad_options_are_refused() -> None:
    with pytest.raises(SpecDecError, match="no option 'chain'; valid options: num_nodes, max_children, chain_length"):
        make_factory("sam", {"chain": 3})
    with pytest.raises(SpecDecError, match="chain_length must be a positive int, got 0"):
        make_factory("sam", {"chain_length": 0})
    with pytest.raises(SpecDecError, match="max_children must be a positive int, got 0"):
        make_factory("sam", {"max_children": 0})
    with pytest.raises(SpecDecError, match="l_bias must be an int >= 0, got -1"):
        make_factory("sam", {"l_bias": -1})
    with pytest.raises(SpecDecError, match="l_threshold must be an int >= 0, got 2.5"):
        make_factory("sam", {"l_threshold": 2.5})
    with pytest.raises(SpecDecError, match="datastore must be a file path, got 3"):
        make_factory("sam", {"datastore": 3})
    with pytest.raises(SpecDecError, match="store must be True .*, got 'yes'"):
        make_factory("sam", {"store": "yes"})
    with pytest.raises(SpecDecError, match="store must be True .*, got 1"):
        make_factory("sam", {"store": 1})
    with pytest.raises(SpecDecError, match=r"min_share must be a number in \[0, 1\], got 1.5"):
        make_factory("sam", {"min_share": 1.5})
    with pytest.raises(SpecDecError, match="match_factor must be a finite number >= 0, got -1"):
        make_factory("sam", {"match_factor": -1})
    with pytest.raises(SpecDecError, match="match_offset must be a finite number >= 0, got inf"):
        make_factory("sam", {"match_offset": float("inf")})
    with pytest.raises(SpecDecError, match="match_factor must be a finite number >= 0, got 'x'"):
        make_factory("sam", {"match_factor": "x"})


# -- losslessness on tiny fp64 models ----------------------------------------------------------


def verify_every_draft(model: Any, prompt: list[int], drafter: Any, max_new_tokens: int,
                       eos: frozenset[int] = frozenset()) -> Any:
    """The engine's loop with every draft verified whole (no budget planner): what the drafter
    proposes, and only that, decides what is accepted."""
    from specdec.backends import make_verifier
    from specdec.decoding import DecodingConfig, StopRules
    from specdec.engine import decode

    return decode(make_verifier(model), drafter, prompt, DecodingConfig(StopRules(max_new_tokens, eos)))


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    return [int(t) for t in out[0, len(prompt) :]]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_sam_matches_plain_greedy(arch: str, tmp_path: Path) -> None:
    """Trees from the sequence's own text, the shared store and a static corpus, accepted and
    rejected, leave the output exactly plain greedy's.

    One generator (its store shared by its sequences) runs the prompts in order, the last
    one again, so the store drafts its earlier answer; the static corpus holds the true
    continuations of some prompts (long accepted drafts) and random documents (rejected ones).
    """
    model = tiny_model(arch)
    rng = random.Random(arch)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randrange(3, 20))] for _ in range(3)]
    truths = [hf_greedy(model, prompt, 32) for prompt in prompts]
    corpus = [np.array(p + t) for p, t in zip(prompts[:2], truths[:2], strict=True)]
    corpus += [np.array(d) for d in random_documents(rng, VOCAB, 5, 40)]
    build(corpus, tmp_path / "c.sam", identity(VOCAB), progress=False)
    accepted: Counter[str] = Counter()
    shared = specdec.Generator(model, drafter="sam", budget="full")
    static = specdec.Generator(model, drafter="sam", datastore=tmp_path / "c.sam", budget="full", store=False)
    for generator, order in ((shared, [0, 1, 2, 2]), (static, [0, 1, 2])):
        for index in order:
            result = generator.generate(prompts[index], max_new_tokens=32)
            assert result.tokens == truths[index], f"{arch}: prompt {prompts[index]}"
            IDENTITY_COUNTS[f"{arch}/sam"] += 1
            accepted.update(result.stats.accepted_by_source)
    assert accepted[SOURCE_STATIC] > 15  # regression guards: static drafts were accepted,
    assert accepted[SOURCE_STORE] > 15  # and so were the store's (the repeated prompt's answer)


def test_an_empty_static_automaton_loses_nothing(tmp_path: Path) -> None:
    """A static automaton of one empty document, end to end (the sequence's own text still drafts)."""
    model = tiny_model("llama")
    build([np.array([], dtype=np.int64)], tmp_path / "empty.sam", identity(VOCAB), progress=False)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    result = specdec.run(model, prompt, "sam", datastore=tmp_path / "empty.sam", max_new_tokens=16, budget="full")
    truth = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                           max_new_tokens=16, do_sample=False)[0, len(prompt):].tolist()
    assert result.tokens == truth
    assert result.stats.accepted_by_source.get(SOURCE_STATIC, 0) == 0


@pytest.mark.slow
def test_default_model_with_a_gsm8k_automaton(
    tmp_path: Path, default_model: tuple[Any, Any], spec_bench_prompts: dict[str, list[list[int]]]
) -> None:
    """Real tokens end to end: a GSM8K static automaton, output equal to plain decoding."""
    from specdec.cachefiles import TokenizerIdentity
    from specdec.datastores.corpus_reader import iter_texts, tokenize_documents
    from specdec.testing import compare_outputs

    model, tokenizer = default_model
    texts = iter_texts([shared_file("corpora", "gsm8k_train.jsonl")], fields=["question", "answer"])
    documents = tokenize_documents(tokenizer, texts, max_tokens=100_000, progress=False)
    build(documents, tmp_path / "gsm8k.sam", TokenizerIdentity.of(tokenizer), progress=False)
    plain = specdec.Generator(model, tokenizer, drafter="none")
    # A bias lower than the paper's, so that the corpus wins some steps in 40 tokens of two questions.
    factory = make_factory("sam", {"datastore": tmp_path / "gsm8k.sam", "l_bias": 2, "store": False}, plain.context)
    prompts = [spec_bench_prompts["math_reasoning"][0], spec_bench_prompts["translation"][0]]
    accepted, sources = 0, Counter[str]()
    for prompt in prompts:
        theirs = plain.generate(prompt, max_new_tokens=40)
        result = verify_every_draft(model, prompt, factory.create(), 40, frozenset(plain.context.eos_token_ids))
        comparison = compare_outputs(model, prompt, result.tokens, theirs.tokens)
        assert comparison.acceptable, comparison.describe()
        IDENTITY_COUNTS[f"default/sam ({comparison.describe()})"] += 1
        accepted += sum(r.accepted for r in result.stats.records)
        sources.update(result.stats.accepted_by_source)
    assert accepted > 5  # regression guard: something was drafted and accepted
    assert sources[SOURCE_STATIC] > 0  # and the corpus automaton drafted some of it
