"""The ``sam`` drafter: Algorithm 2 over the compiled automata against the reference; losslessness.

Layers: differential (every proposal along a token stream, committed in random chunks,
equals :func:`specdec.reference.suffix_automaton.sam_draft` computed from scratch, with and
without a static automaton, for several options and node budgets); bookkeeping (match
length, sources, budgets, sharing of the static automaton); bad options; token identity
with plain greedy decoding on tiny fp64 models (drafts accepted from both automata); and
(slow) the default model with a GSM8K static automaton.
"""

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
from specdec.budget.acceptance import length_feature
from specdec.datastores.sam import StaticSuffixAutomaton, build
from specdec.drafters import DrafterContext, make_factory
from specdec.drafters.sam import SOURCE_DYNAMIC, SOURCE_STATIC, SamConfig, SamDrafter
from specdec.errors import DatastoreError, SpecDecError
from specdec.reference.suffix_automaton import SuffixAutomaton, sam_draft
from specdec.types import RetrievalDrafter

# Every test here needs the compiled automata (skipped, or failed in CI, without them).
pytestmark = pytest.mark.usefixtures("sam_native")


def drafts_along(tokens: list[int], config: SamConfig, documents: list[list[int]] | None, split: int,
                 rng: random.Random) -> dict[str, int]:
    """Feed ``tokens`` in random commit sizes; every proposal must equal the reference's.

    Returns how many proposals came from each source (so callers can demand both).
    """
    static = StaticSuffixAutomaton.from_documents(documents) if documents is not None else None
    reference_static = SuffixAutomaton.from_documents(documents) if documents is not None else None
    drafter = SamDrafter(config, static)
    drafter.reset(tokens[:split])
    sources = {SOURCE_DYNAMIC: 0, SOURCE_STATIC: 0, "none": 0}
    position = split  # tokens[position] is the pending token
    while position < len(tokens):
        pending = tokens[position]
        for budget in (1, 2, 5, config.chain_length + 3):
            tree = drafter.propose(pending, budget)
            draft, m_dynamic, m_static, source = sam_draft(
                tokens[:position], pending, reference_static, chain_length=min(config.chain_length, budget),
                l_bias=config.l_bias, l_threshold=config.l_threshold)
            context = tokens[: position + 1]
            assert list(tree.tokens) == [pending, *draft], (context, budget)
            assert tree.is_chain and tree.size <= budget
            assert (drafter.m_dynamic, drafter.m_static) == (m_dynamic, m_static), context
            assert drafter.match_length() == max(m_dynamic, m_static - config.l_bias, 0)
            expected_source = {"dynamic": SOURCE_DYNAMIC, "static": SOURCE_STATIC}.get(source or "")
            assert drafter.last_source == (expected_source if budget > 1 else None)
            assert tree.source == (expected_source if budget > 1 and expected_source else "sam")
            if tree.source == SOURCE_DYNAMIC:  # the budget planner learns acceptance by match length
                assert tree.node_features == (length_feature(m_dynamic),) * tree.size
            elif tree.source == SOURCE_STATIC:
                assert tree.node_features == (length_feature(m_static),) * tree.size
        sources[drafter.last_source or "none"] += 1
        step = rng.randrange(1, 6)
        drafter.update(tokens[position : position + step], None)
        position += step
    assert drafter.dynamic.check() == ""
    return sources


@pytest.mark.parametrize(
    "config",
    [SamConfig(), SamConfig(chain_length=6, l_bias=0, l_threshold=1), SamConfig(chain_length=3, l_bias=2,
                                                                              l_threshold=3)],
    ids=["paper", "short-chain-no-bias", "tiny"],
)
@pytest.mark.parametrize("seed", range(3))
def test_equals_reference_with_and_without_static(config: SamConfig, seed: int) -> None:
    rng = random.Random(seed)
    documents = random_documents(rng, 6, 10, 60)
    # The stream copies from the corpus (static matches) and from itself (dynamic matches).
    stream: list[int] = []
    while len(stream) < 250:
        source = rng.choice(documents) if rng.random() < 0.5 or not stream else stream
        start = rng.randrange(len(source))
        stream += [*source[start : start + rng.randrange(1, 25)], rng.randrange(6)]
    split = rng.randrange(1, 60)
    drafts_along(stream, config, None, split, random.Random(seed))
    sources = drafts_along(stream, config, documents, split, random.Random(seed))
    assert sources[SOURCE_DYNAMIC] > 0 and sources[SOURCE_STATIC] > 0  # both automata were exercised


def test_equals_reference_on_real_text() -> None:
    """Python source as words: the corpus is a module cut into top-level blocks, the stream the
    same module with every 25th word changed (an edited copy: static and dynamic repeats)."""
    documents = python_words(random)
    words = [t for d in documents for t in d]
    stream = [t if i % 25 else t + 1 for i, t in enumerate(words[:900])]
    sources = drafts_along(stream, SamConfig(l_bias=2, l_threshold=2), documents, 100, random.Random(0))
    assert sources[SOURCE_DYNAMIC] > 0 and sources[SOURCE_STATIC] > 0


def test_no_match_means_no_draft_and_prefix_budgets() -> None:
    drafter = SamDrafter(SamConfig(l_threshold=2))
    drafter.reset([1, 2, 3, 4, 5, 6, 7, 8])
    tree = drafter.propose(9, 40)
    assert tree.size == 1 and drafter.match_length() == 0 and drafter.last_source is None
    drafter.update([9, 1, 2], None)
    full = drafter.propose(3, 40)  # "1 2 3" matched: the rest of the prompt, then "9 1 2"
    assert full.tokens == (3, 4, 5, 6, 7, 8, 9, 1, 2) and drafter.match_length() == 3
    for budget in range(1, 10):  # budgets cut the same chain (its continuation is long enough)
        assert drafter.propose(3, budget).tokens == full.tokens[:budget]
    assert isinstance(drafter, RetrievalDrafter)


def test_static_automaton_is_shared_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "corpus.sam"
    build([np.array([1, 2, 3, 4, 5, 6, 7, 8, 9])], path, identity(20), progress=False)
    context = DrafterContext(vocab_size=20)
    factory = make_factory("sam", {"datastore": str(path), "l_bias": 0, "l_threshold": 2}, context)
    first, second = factory.create(), factory.create()
    assert isinstance(first, SamDrafter) and isinstance(second, SamDrafter)
    assert first.static is second.static  # one memory map for every sequence
    assert make_factory("sam", {"datastore": path}, context).create().static is first.static  # and every factory
    first.reset([7, 1, 2])
    second.reset([5, 5])
    assert first.propose(3, 5).tokens == (3, 4, 5, 6, 7) and first.last_source == SOURCE_STATIC
    assert second.propose(3, 5).size == 1  # per-sequence cursors: the other sequence is unaffected
    with pytest.raises(DatastoreError, match="past this model's vocabulary of 10"):
        make_factory("sam", {"datastore": str(path)}, DrafterContext(vocab_size=10))
    with pytest.raises(DatastoreError, match="no datastore file"):
        make_factory("sam", {"datastore": str(tmp_path / "absent.sam")}, context)


def test_bad_options_are_refused() -> None:
    with pytest.raises(SpecDecError, match="no option 'chain'; valid options: chain_length, l_bias, l_threshold"):
        make_factory("sam", {"chain": 3})
    with pytest.raises(SpecDecError, match="chain_length must be a positive int, got 0"):
        make_factory("sam", {"chain_length": 0})
    with pytest.raises(SpecDecError, match="l_bias must be an int >= 0, got -1"):
        make_factory("sam", {"l_bias": -1})
    with pytest.raises(SpecDecError, match="l_threshold must be an int >= 0, got 2.5"):
        make_factory("sam", {"l_threshold": 2.5})
    with pytest.raises(SpecDecError, match="datastore must be a file path, got 3"):
        make_factory("sam", {"datastore": 3})


# -- losslessness on tiny fp64 models ----------------------------------------------------------


def verify_every_draft(model: Any, prompt: list[int], drafter: Any, max_new_tokens: int,
                       eos: frozenset[int] = frozenset()) -> Any:
    """The engine's loop with every draft verified whole (no budget planner): what the drafter
    proposes, and only that, decides what is accepted."""
    from specdec.backends import make_verifier
    from specdec.engine import StopRules, decode

    return decode(make_verifier(model), drafter, prompt, StopRules(max_new_tokens, eos))


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    return [int(t) for t in out[0, len(prompt) :]]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_sam_matches_plain_greedy(arch: str, tmp_path: Path) -> None:
    """Dynamic and static chains, accepted and rejected, leave the output exactly plain greedy's.

    The static corpus holds the true continuations of some prompts (long accepted chains)
    and random documents (rejected ones); the dynamic automaton drafts from repeats.
    """
    model = tiny_model(arch)
    rng = random.Random(arch)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randrange(3, 20))] for _ in range(3)]
    truths = [hf_greedy(model, prompt, 32) for prompt in prompts]
    corpus = [np.array(p + t) for p, t in zip(prompts[:2], truths[:2], strict=True)]
    corpus += [np.array(d) for d in random_documents(rng, VOCAB, 5, 40)]
    build(corpus, tmp_path / "c.sam", identity(VOCAB), progress=False)
    accepted = {SOURCE_DYNAMIC: 0, SOURCE_STATIC: 0}
    context = DrafterContext(vocab_size=VOCAB)
    for options in ({"l_threshold": 1}, {"datastore": str(tmp_path / "c.sam"), "l_threshold": 2, "l_bias": 1}):
        factory = make_factory("sam", options, context)
        for prompt, truth in zip(prompts, truths, strict=True):
            result = verify_every_draft(model, prompt, factory.create(), 32)
            assert result.tokens == truth, f"{arch}: prompt {prompt}, options {options}"
            IDENTITY_COUNTS[f"{arch}/sam"] += 1
            for source, count in result.stats.accepted_by_source.items():
                if source in accepted:
                    accepted[source] += count
    assert accepted[SOURCE_STATIC] > 15  # regression guard: static chains were accepted


@pytest.mark.slow
def test_default_model_with_a_gsm8k_automaton(
    tmp_path: Path, default_model: tuple[Any, Any], spec_bench_prompts: dict[str, list[list[int]]]
) -> None:
    """Real tokens end to end: a GSM8K static automaton, output equal to plain decoding."""
    from specdec.datastores.corpus import iter_texts, tokenize_documents
    from specdec.datastores.format import TokenizerIdentity
    from specdec.testing import compare_outputs

    model, tokenizer = default_model
    texts = iter_texts([shared_file("corpora", "gsm8k_train.jsonl")], fields=["question", "answer"])
    documents = tokenize_documents(tokenizer, texts, max_tokens=100_000, progress=False)
    build(documents, tmp_path / "gsm8k.sam", TokenizerIdentity.of(tokenizer), progress=False)
    plain = specdec.Generator(model, tokenizer, drafter="none")
    # Thresholds lower than the paper's, so that 40 tokens of two questions surely draft.
    factory = make_factory("sam", {"datastore": tmp_path / "gsm8k.sam", "l_threshold": 2, "l_bias": 2}, plain.context)
    prompts = [spec_bench_prompts["math_reasoning"][0], spec_bench_prompts["translation"][0]]
    accepted, sources = 0, Counter[str]()
    for prompt in prompts:
        theirs = plain.generate(prompt, max_new_tokens=40)
        result = verify_every_draft(model, prompt, factory.create(), 40, frozenset(plain.context.eos_token_ids))
        comparison = compare_outputs(model, prompt, result.tokens, theirs.tokens)
        assert comparison.acceptable, comparison.describe()
        IDENTITY_COUNTS[f"default/sam ({comparison.describe()})"] += 1
        accepted += sum(r.accepted for r in result.stats.records)
        sources.update(result.stats.steps_by_source)
    assert accepted > 5  # regression guard: something was drafted and accepted
    assert sources[SOURCE_STATIC] > 0  # and the corpus automaton served some steps
