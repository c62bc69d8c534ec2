"""Composite drafters "A+B": Algorithm 2, merged trees, attribution, parsing, losslessness.

Layers: hand cases with scripted part drafters (which source serves a step, how a merged
tree is ordered and labelled, what feedback each part receives); properties of
``merge_trees``; registry parsing and its errors; token identity with plain greedy
decoding on tiny fp64 models for every registered retrieval drafter with ``recycling``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest
from conftest import IDENTITY_COUNTS
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle_drafter import random_tree
from test_lossless import hf_greedy, random_prompt
from tiny_models import ARCHITECTURES, tiny_model

import specdec
from specdec.drafters import make_factory
from specdec.drafters.composite import CompositeConfig, CompositeDrafter, merge_trees
from specdec.errors import SpecDecError
from specdec.types import DraftTree, Feedback, GenerationStats, StepRecord

RETRIEVAL = ["pld", "sam"]  # retrieval drafters paired with recycling


class ScriptedRetrieval:
    """A retrieval drafter that drafts a given chain with a given match length."""

    name = "ret"

    def __init__(self, chain: Sequence[int] = (), match: int = 0, feedback_topk: int = 0) -> None:
        self.chain, self.match, self.feedback_topk = list(chain), match, feedback_topk
        self.updates: list[Feedback | None] = []

    def reset(self, prompt: Sequence[int], feedback: Feedback | None = None) -> None:
        self.updates.append(feedback)

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        return DraftTree.chain(pending, self.chain[: max_nodes - 1], self.name)

    def match_length(self) -> int:
        return self.match if self.chain else 0

    def update(self, accepted: Sequence[int], feedback: Feedback | None) -> None:
        self.updates.append(feedback)


class ScriptedTree(ScriptedRetrieval):
    """An auxiliary drafter that drafts a given tree (under whatever root)."""

    name = "aux"

    def __init__(self, tokens: Sequence[int], parents: Sequence[int], feedback_topk: int = 0) -> None:
        super().__init__((), 0, feedback_topk)
        self.tokens, self.parents = list(tokens), list(parents)

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        return DraftTree((pending, *self.tokens[1:]), tuple(self.parents), self.name).prefix(max_nodes)


AUX = ScriptedTree([0, 5, 6, 7], [-1, 0, 0, 1])  # root -> 5 -> 7, root -> 6


def composite(chain: Sequence[int], match: int, mode: str = "either", threshold: int = 3) -> CompositeDrafter:
    return CompositeDrafter(ScriptedRetrieval(chain, match), AUX, CompositeConfig(mode, threshold))


# -- Algorithm 2 and merging, by hand --------------------------------------------------------
def test_either_mode_picks_the_chain_only_on_a_long_match() -> None:
    assert composite([5, 9], match=3).propose(1, 10).tokens == (1, 5, 9)
    assert composite([5, 9], match=3).propose(1, 10).source == "ret"
    assert composite([5, 9], match=2).propose(1, 10).tokens == (1, 5, 6, 7)
    assert composite([5, 9], match=2).propose(1, 10).source == "aux"
    assert composite([], match=9).propose(1, 10).source == "aux"  # nothing to draft: the tree


def test_merge_mode_grafts_the_chain_sharing_prefixes() -> None:
    trusted = composite([5, 7, 8], match=3, mode="merge").propose(1, 10)
    assert trusted.tokens == (1, 5, 7, 8, 6)  # the chain first, then the tree's new nodes
    assert trusted.parents == (-1, 0, 1, 2, 0)
    assert trusted.node_sources == ("ret&aux", "ret&aux", "ret&aux", "ret", "aux")
    assert trusted.source == "ret+aux"
    untrusted = composite([5, 7, 8], match=1, mode="merge").propose(1, 10)
    assert untrusted.tokens == (1, 5, 6, 7, 8)  # the tree first, then the chain's new node
    assert untrusted.node_sources == ("ret&aux", "ret&aux", "aux", "ret&aux", "ret")
    assert composite([5, 7, 8], match=3, mode="merge").propose(1, 3).tokens == (1, 5, 7)  # budget: a prefix
    assert composite([], match=0, mode="merge").propose(1, 10).source == "aux"


def test_merged_steps_credit_accepted_tokens_to_node_sources() -> None:
    stats = GenerationStats(
        records=[
            StepRecord(5, 3, "ret+aux", 0.0, 0.0, ("ret&aux", "ret", "ret")),
            StepRecord(5, 0, "ret+aux", 0.0, 0.0, ()),
            StepRecord(4, 2, "aux", 0.0, 0.0),
        ]
    )
    assert stats.accepted_by_source == {"ret&aux": 1, "ret": 2, "aux": 2}
    assert stats.steps_by_source == {"ret+aux": 2, "aux": 1}


def test_each_part_gets_the_feedback_it_asked_for() -> None:
    retrieval, auxiliary = ScriptedRetrieval(feedback_topk=0), ScriptedTree([0], [-1], feedback_topk=2)
    drafter = CompositeDrafter(retrieval, auxiliary)
    assert drafter.feedback_topk == 2
    fb = Feedback(np.array([4, 5]), np.array([[1, 2], [3, 4]]), (0, 1))
    drafter.reset([4], fb)
    drafter.update([4, 5], fb)
    assert retrieval.updates == [None, None]
    assert auxiliary.updates == [fb, fb]
    narrow = ScriptedTree([0], [-1], feedback_topk=1)
    CompositeDrafter(ScriptedRetrieval(feedback_topk=2), narrow).update([4], fb)
    received = narrow.updates[-1]
    assert received is not None and received.topk.tolist() == [[1], [3]] and received.accepted_nodes == (0, 1)


def test_default_thresholds() -> None:
    pld_recycling = make_factory("pld+recycling").create()
    assert isinstance(pld_recycling, CompositeDrafter) and pld_recycling.threshold == 2
    assert pld_recycling.name == "pld+recycling" and pld_recycling.feedback_topk == 8
    chosen = make_factory("pld+recycling", {"threshold": 1, "mode": "merge"}).create()
    assert isinstance(chosen, CompositeDrafter) and chosen.threshold == 1 and chosen.config.mode == "merge"


# -- merge_trees properties -------------------------------------------------------------------
def root_paths(tree: DraftTree) -> set[tuple[int, ...]]:
    return {tuple(tree.tokens[i] for i in tree.path_to(node)[1:]) for node in range(tree.size)}


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**6), a=st.integers(1, 20), b=st.integers(1, 20), first=st.booleans())
def test_merged_tree_is_the_union_of_paths(seed: int, a: int, b: int, first: bool) -> None:
    rng = random.Random(seed)
    retrieved, auxiliary = random_tree(rng, 3, 5, a), random_tree(rng, 3, 5, b)
    merged = merge_trees(retrieved, auxiliary, ("r", "x"), "m", retrieved_first=first)
    paths_r, paths_x = root_paths(retrieved), root_paths(auxiliary)
    assert root_paths(merged) == paths_r | paths_x
    assert merged.size == len(paths_r | paths_x)
    leading = retrieved if first else auxiliary
    assert merged.tokens[: leading.size] == leading.tokens  # the leading tree keeps its order
    assert merged.node_sources is not None
    for node in range(1, merged.size):
        path = tuple(merged.tokens[i] for i in merged.path_to(node)[1:])
        expected = {(True, True): "r&x", (True, False): "r", (False, True): "x"}[(path in paths_r, path in paths_x)]
        assert merged.node_sources[node] == expected


def test_merged_tree_keeps_part_labels_and_features() -> None:
    retrieved = DraftTree((1, 2, 3, 4), (-1, 0, 1, 0), "sam", ("sam-dynamic", "sam-dynamic", "sam-store", "sam-store"),
                          (0, 7, 5, 2))
    auxiliary = DraftTree((1, 2, 9), (-1, 0, 1), "recycling")
    merged = merge_trees(retrieved, auxiliary, ("sam", "recycling"), "sam+recycling")
    assert merged.tokens == (1, 2, 3, 4, 9)
    assert merged.node_sources == ("sam-dynamic&recycling", "sam-dynamic&recycling", "sam-store", "sam-store",
                                   "recycling")
    assert merged.node_features == (0, 7, 5, 2, 0)  # the retrieval part's; 0 where only recycling drafted


def test_merged_tree_cut_by_a_budget_is_ordered_by_expected_acceptance() -> None:
    """When max_nodes cuts a merged tree, the caller's acceptance model decides what stays."""
    from specdec.budget.acceptance import AcceptanceModel, node_keys

    model = AcceptanceModel(memory=1.0)
    for _ in range(50):  # the auxiliary's nodes were always accepted, the retrieval's never
        tree = merge_trees(DraftTree.chain(1, [5, 8, 9], "ret"), DraftTree((1, 6, 7), (-1, 0, 1), "aux"),
                           ("ret", "aux"), "ret+aux")
        model.observe(tree, node_keys(tree), accepted_nodes=(0, 4, 5))
    drafter = CompositeDrafter(ScriptedRetrieval([5, 8, 9], match=9), ScriptedTree([0, 6, 7], [-1, 0, 1]),
                               CompositeConfig("merge"), model)
    assert drafter.propose(1, 10).tokens == (1, 5, 8, 9, 6, 7)  # no cut: the trusted retrieval first
    assert drafter.propose(1, 3).tokens == (1, 6, 7)  # cut: the nodes the model expects accepted
    unordered = CompositeDrafter(ScriptedRetrieval([5, 8, 9], match=9), ScriptedTree([0, 6, 7], [-1, 0, 1]),
                                 CompositeConfig("merge"))
    assert unordered.propose(1, 3).tokens == (1, 5, 8)  # no model: the trusted retrieval first


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), a=st.integers(1, 20), b=st.integers(1, 20))
def test_merged_tree_accepts_at_least_either_part(seed: int, a: int, b: int) -> None:
    """Never below either part: on the same step, the merged tree accepts at least as many
    tokens as each part's tree would (the walk can follow any path either part drafted)."""
    from specdec.bench.stream_replay import judge

    rng = random.Random(seed)
    retrieved, auxiliary = random_tree(rng, 3, 5, a), random_tree(rng, 3, 5, b)
    stream = [retrieved.tokens[0]] + [rng.randrange(5) for _ in range(8)]
    merged = merge_trees(retrieved, auxiliary, ("r", "x"), "m", retrieved_first=rng.random() < 0.5)
    accepted = {name: len(judge(tree, stream, 0, 10, 0)[0]) for name, tree in
                (("r", retrieved), ("x", auxiliary), ("m", merged))}
    assert accepted["m"] >= max(accepted["r"], accepted["x"])


def test_merging_trees_with_different_roots_is_refused() -> None:
    with pytest.raises(SpecDecError, match="merged trees need one root, got tokens 1 and 2"):
        merge_trees(DraftTree.single(1), DraftTree.single(2), ("a", "b"), "c")


# -- parsing ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("recycling+pld", {}, "the first part must be a retrieval drafter .* and 'recycling' is not"),
        ("pld+recycling+none", {}, "join exactly two drafter names"),
        ("+recycling", {}, "join exactly two drafter names"),
        ("pld+", {}, "join exactly two drafter names"),
        ("foo+recycling", {}, "unknown drafter 'foo' in composite 'foo\\+recycling'; valid names: "),
        ("pld+bar", {}, "unknown drafter 'bar' in composite"),
        ("pld+pld", {}, "joins 'pld' with itself"),
        ("pld+recycling", {"mode": "both"}, "mode must be one of either, merge, got 'both'"),
        ("pld+recycling", {"threshold": -1}, "threshold must be an int >= 0, got -1"),
        ("pld+recycling", {"depth": 3}, "has no option 'depth'; valid options: mode, threshold, pld.OPTION"),
        ("pld+recycling", {"sam.k": 3}, "has no option 'sam.k'"),
        ("pld+recycling", {"recycling": 4}, "options of 'recycling' must be a dict, got 4"),
        ("pld+recycling", {"recycling.k": 0}, "drafter 'recycling': k must be a positive int, got 0"),
        ("pld+recycling", {"pld": {"num_draft": 0}}, "drafter 'pld': num_draft must be a positive int"),
    ],
)
def test_bad_composites_are_refused(name: str, options: dict[str, object], message: str) -> None:
    with pytest.raises(SpecDecError, match=message):
        make_factory(name, options)


def test_part_options_nested_or_dotted() -> None:
    nested = make_factory("pld+recycling", {"recycling": {"num_nodes": 5}, "pld": {"num_draft": 4}}).create()
    dotted = make_factory("PLD+Recycling", {"recycling.num_nodes": 5, "pld.num_draft": 4}).create()
    for drafter in (nested, dotted):
        assert isinstance(drafter, CompositeDrafter)
        assert getattr(drafter.auxiliary, "num_nodes", None) == 5
        assert getattr(drafter.retrieval, "config", None) is not None and drafter.retrieval.config.num_draft == 4


# -- losslessness ------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_composites_match_plain_greedy(arch: str) -> None:
    """Every retrieval drafter with recycling, either and merged, against one reference per prompt."""
    names = [f"{r}+recycling" for r in RETRIEVAL]  # every one registered: tests/test_registry.py
    model = tiny_model(arch)
    rng = random.Random(f"composite-{arch}")
    accepted = dict.fromkeys(names, 0)
    for i in range(3):
        prompt = random_prompt(rng)
        max_new = rng.randrange(1, 60) if i else 60
        expected = hf_greedy(model, prompt, max_new)
        for name in names:
            for mode in ("either", "merge"):
                result = specdec.run(
                    model, prompt, name, max_new_tokens=max_new, drafter_options={"mode": mode, "threshold": 1},
                    prompt_feedback=bool(i % 2), budget=rng.choice(["full", 6]),
                )
                assert result.tokens == expected, f"{arch}/{name}/{mode}: prompt {prompt}"
                IDENTITY_COUNTS[f"{arch}/{name}/{mode}"] += 1
                stats = result.stats
                # attribution adds up: every step has one source, every accepted token one label
                assert sum(stats.steps_by_source.values()) == stats.steps
                assert sum(stats.accepted_by_source.values()) == sum(r.accepted for r in stats.records)
                accepted[name] += sum(r.accepted for r in stats.records)
    assert all(accepted.values()), accepted  # regression guard: each composite's drafts were accepted


def test_sam_composite() -> None:
    """sam+recycling merges by default; pld+recycling takes either."""
    drafter = make_factory("sam+recycling").create()  # merged by default (docs/algorithms/sam.md)
    assert isinstance(drafter, CompositeDrafter) and drafter.threshold == 5 and drafter.mode == "merge"
    assert make_factory("sam+recycling", {"mode": "either"}).create().mode == "either"
    pld_recycling = make_factory("pld+recycling").create()
    assert isinstance(pld_recycling, CompositeDrafter) and pld_recycling.mode == "either"
