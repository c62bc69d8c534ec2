"""DraftTree invariants: hand cases and properties."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle_drafter import random_tree

from specdec.errors import InvalidDraftTreeError
from specdec.types import DraftTree


def test_chain_and_single() -> None:
    chain = DraftTree.chain(5, [6, 7, 8])
    assert chain.parents == (-1, 0, 1, 2)
    assert chain.depths == (0, 1, 2, 3)
    assert chain.is_chain and chain.size == 4
    single = DraftTree.single(3)
    assert single.size == 1 and single.max_depth == 0


@pytest.mark.parametrize(
    ("tokens", "parents", "message"),
    [
        ((), (), "at least the root"),
        ((1, 2), (-1,), "parents has 1"),
        ((1, 2), (0, 0), "parents\\[0\\] must be -1"),
        ((1, 2), (-1, 1), "must precede"),
        ((1, 2, 3), (-1, 0, 5), "must precede"),
        ((1, 2, 2), (-1, 0, 0), "repeats token 2"),
        ((1, -2), (-1, 0), "negative"),
    ],
)
def test_invalid_trees_are_refused(tokens: tuple[int, ...], parents: tuple[int, ...], message: str) -> None:
    with pytest.raises(InvalidDraftTreeError, match=message):
        DraftTree(tokens, parents)


def test_same_token_under_different_parents_is_fine() -> None:
    tree = DraftTree((1, 2, 3, 2), (-1, 0, 0, 2))
    assert tree.depths == (0, 1, 1, 2)
    assert tree.children() == [{2: 1, 3: 2}, {}, {2: 3}, {}]
    assert tree.path_to(3) == [0, 2, 3]


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 40), cut=st.integers(1, 40), depth=st.integers(0, 10))
def test_every_prefix_and_pruning_is_a_valid_tree(seed: int, size: int, cut: int, depth: int) -> None:
    tree = random_tree(random.Random(seed), 0, 7, size)
    prefix = tree.prefix(cut)
    assert prefix.size == min(cut, tree.size)
    assert prefix.tokens == tree.tokens[: prefix.size]
    pruned = tree.pruned(cut, depth)
    assert pruned.max_depth <= depth
    kept = [i for i in range(prefix.size) if prefix.depths[i] <= depth]
    # pruning keeps exactly the shallow nodes of the prefix, same tokens along the same paths
    assert pruned.size == len(kept)
    for new, old in enumerate(kept):
        assert [pruned.tokens[i] for i in pruned.path_to(new)] == [prefix.tokens[i] for i in prefix.path_to(old)]


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 40))
def test_depths_equal_path_lengths(seed: int, size: int) -> None:
    tree = random_tree(random.Random(seed), 0, 5, size)
    for i in range(tree.size):
        assert tree.depths[i] == len(tree.path_to(i)) - 1


def test_the_loops_own_time_leaves_out_calibration() -> None:
    """A calibration inside a run is one-time work, not the loop's overhead per step (it once read as 35 ms/step)."""
    from specdec.types import GenerationStats

    stats = GenerationStats(steps=10, prefill_s=0.5, draft_s=0.25, verify_s=2.0, total_s=21.0, calibration_s=18.0)
    assert stats.other_s == pytest.approx(0.25)
    assert GenerationStats(total_s=1.0, prefill_s=0.5, calibration_s=0.75).other_s == 0.0  # never negative
