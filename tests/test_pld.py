"""PLD: the production drafter against the reference, on random and real token streams."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.drafters import make_factory
from specdec.drafters.pld import PLDConfig, PromptLookupDrafter
from specdec.errors import SpecDecError
from specdec.reference.pld import find_draft


def test_reference_hand_cases() -> None:
    assert find_draft([1, 2, 3, 9, 1, 2], max_ngram=3, num_draft=2) == [3, 9]
    assert find_draft([1, 2, 3, 9, 2, 3, 7, 3], max_ngram=3, num_draft=3) == [9, 2, 3]  # earliest "3" wins
    assert find_draft([4, 4], num_draft=5) == [4]  # the continuation may run into the last token
    assert find_draft([1, 2, 3], num_draft=5) == []


def drafts_along(tokens: list[int], config: PLDConfig, split: int, step_sizes: random.Random) -> None:
    """Feed ``tokens`` to the drafter in random commit sizes; every draft must equal the reference's."""
    drafter = PromptLookupDrafter(config)
    drafter.reset(tokens[:split])
    position = split  # tokens[position] is the pending token
    while position < len(tokens):
        for budget in (1, 3, config.num_draft + 1):
            tree = drafter.propose(tokens[position], budget)
            expected = find_draft(tokens[: position + 1], config.max_ngram, config.min_ngram, min(config.num_draft,
                                                                                                  budget - 1))
            assert list(tree.tokens[1:]) == (expected if budget > 1 else []), (tokens[: position + 1], budget)
        step = step_sizes.randrange(1, 5)
        drafter.update(tokens[position : position + step], None)
        position += step


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 5), min_size=1, max_size=80),
    max_ngram=st.integers(1, 4),
    min_ngram=st.integers(1, 4),
    num_draft=st.integers(1, 12),
    data=st.data(),
)
def test_production_equals_reference_small_alphabet(
    tokens: list[int], max_ngram: int, min_ngram: int, num_draft: int, data: st.DataObject
) -> None:
    min_ngram = min(min_ngram, max_ngram)
    split = data.draw(st.integers(1, len(tokens)))
    drafts_along(tokens, PLDConfig(max_ngram, min_ngram, num_draft), split, random.Random(len(tokens)))


@settings(max_examples=100, deadline=None)
@given(tokens=st.lists(st.integers(0, 50_000), min_size=1, max_size=60), seed=st.integers(0, 1000))
def test_production_equals_reference_large_alphabet(tokens: list[int], seed: int) -> None:
    rng = random.Random(seed)
    tokens = tokens + tokens[rng.randrange(len(tokens)) :] + tokens  # repeats so that matches exist
    drafts_along(tokens, PLDConfig(), rng.randrange(1, len(tokens) + 1), rng)


def test_production_equals_reference_on_real_text() -> None:
    """Python's own source, split into whitespace words mapped to ids: a real repetitive stream."""
    import inspect

    words = inspect.getsource(random).split()
    vocab: dict[str, int] = {}
    tokens = [vocab.setdefault(w, len(vocab)) for w in words[:1500]]
    drafts_along(tokens, PLDConfig(), 200, random.Random(0))


def test_bad_options_are_refused() -> None:
    with pytest.raises(SpecDecError, match="no option 'ngram'; valid options: max_ngram, min_ngram, num_draft"):
        make_factory("pld", {"ngram": 3})
    with pytest.raises(SpecDecError, match="num_draft must be a positive int"):
        make_factory("pld", {"num_draft": 0})
    with pytest.raises(SpecDecError, match="min_ngram 3 exceeds max_ngram 2"):
        make_factory("pld", {"max_ngram": 2, "min_ngram": 3})
