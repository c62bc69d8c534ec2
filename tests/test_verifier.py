"""Tree verification against a brute-force, path-by-path check on tiny fp64 models.

For a random tree after a random prompt, the tree forward's logits at node i must equal
a plain forward over ``prompt + path(i)``; acceptance must walk the argmax path those
logits define; and after compaction the KV cache must equal the cache of a plain
forward over ``prompt + accepted``.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle_drafter import random_tree
from tiny_models import ARCHITECTURES, VOCAB, tiny_model
from transformers import DynamicCache

from specdec.backends.tree import ancestor_matrix, tree_attention_inputs
from specdec.backends.verifier import ModelVerifier, TorchTreeOps
from specdec.models import cache_keyword
from specdec.types import DraftTree


def plain_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


def plain_cache(model: torch.nn.Module, ids: list[int]) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids]), use_cache=True, **{cache_keyword(model): cache})
    return cache


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 30))
def test_ancestor_matrix_matches_paths(seed: int, size: int) -> None:
    tree = random_tree(random.Random(seed), 0, 9, size)
    anc = ancestor_matrix(tree.parents)
    for i in range(tree.size):
        assert set(np.flatnonzero(anc[i]).tolist()) == set(tree.path_to(i))


def test_mask_layout_hand_case() -> None:
    tree = DraftTree((10, 11, 12, 13), (-1, 0, 0, 1))
    mask, positions = tree_attention_inputs(tree, 3, device=torch.device("cpu"))
    assert positions.tolist() == [[3, 4, 4, 5]]
    assert mask is not None and mask.shape == (1, 1, 4, 7)
    expected = [
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 1, 0],
        [1, 1, 1, 1, 1, 0, 1],
    ]
    assert mask[0, 0].int().tolist() == expected
    additive, _ = tree_attention_inputs(tree, 3, device=torch.device("cpu"), additive_dtype=torch.float32)
    assert additive is not None
    assert bool((additive[0, 0] == 0).eq(torch.tensor(expected, dtype=torch.bool)).all())
    assert tree_attention_inputs(DraftTree.single(1), 5, device=torch.device("cpu"))[0] is None


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_tree_forward_equals_path_by_path(arch: str, attn: str, seed: int) -> None:
    model = tiny_model(arch, attn)
    rng = random.Random(seed)
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 24))]
    tree = random_tree(rng, rng.randrange(VOCAB), VOCAB, rng.randrange(1, 20))
    verifier = ModelVerifier(model)
    state, _, _ = verifier.prefill(prompt)
    committed = state.committed_len
    mask, positions = TorchTreeOps().tree_inputs(tree, committed, torch.device("cpu"), verifier.additive_dtype)
    with torch.inference_mode():
        logits = model(
            input_ids=torch.tensor([tree.tokens]), attention_mask=mask, position_ids=positions,
            use_cache=True, **{cache_keyword(model): state.cache},
        ).logits[0]
    # Eager attention takes its softmax in fp32 even in an fp64 model, so it rounds at ~1e-7.
    atol = 1e-9 if attn == "sdpa" else 1e-5
    for i in range(tree.size):
        path = [tree.tokens[j] for j in tree.path_to(i)]
        expected = plain_logits(model, prompt + path)
        torch.testing.assert_close(logits[i], expected, rtol=0, atol=atol)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt_neox", "gpt2"])
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_acceptance_and_compaction(arch: str, seed: int) -> None:
    """Trees built around the model's own greedy path: the walk and the compacted KV are exact."""
    model = tiny_model(arch)
    rng = random.Random(seed)
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 16))]
    verifier = ModelVerifier(model)
    state, pending, _ = verifier.prefill(prompt)
    greedy = [pending]
    for _ in range(6):
        greedy.append(int(plain_logits(model, prompt + greedy).argmax()))
    keep = rng.randrange(1, 7)
    path = greedy[1:keep]
    if rng.random() < 0.5 and path:
        path[-1] = (path[-1] + 1) % VOCAB  # a wrong last token: the walk must stop before it
    tree = random_tree(rng, pending, VOCAB, rng.randrange(len(path) + 1, 24), path)
    result = verifier.verify(state, tree)

    # brute force walk: follow the child carrying the argmax of the node's path logits
    node, walked = 0, [0]
    children = tree.children()
    while True:
        choice = int(plain_logits(model, prompt + [tree.tokens[j] for j in tree.path_to(node)]).argmax())
        if choice not in children[node]:
            break
        node = children[node][choice]
        walked.append(node)
    assert list(result.accepted_nodes) == walked
    while len(greedy) <= len(walked):  # the random part of the tree may carry the greedy path further, by chance
        greedy.append(int(plain_logits(model, prompt + greedy).argmax()))
    assert list(result.accepted_tokens) == greedy[: len(walked)]
    assert result.bonus == greedy[len(walked)]
    assert state.committed_len == len(prompt) + len(walked)

    reference = plain_cache(model, prompt + list(result.accepted_tokens))
    for ours, theirs in zip(state.cache.layers, reference.layers, strict=True):
        torch.testing.assert_close(ours.keys, theirs.keys, rtol=0, atol=1e-9)
        torch.testing.assert_close(ours.values, theirs.values, rtol=0, atol=1e-9)


def test_topk_feedback_rows_follow_tree_nodes() -> None:
    model = tiny_model("llama")
    verifier = ModelVerifier(model)
    state, pending, prompt_feedback = verifier.prefill([1, 2, 3, 4], prompt_topk=3)
    assert prompt_feedback is not None
    assert prompt_feedback.topk.shape == (4, 3)
    assert prompt_feedback.topk[-1, 0] == pending  # greedy token is the top-1 after the last prompt token
    tree = DraftTree((pending, 5, 6), (-1, 0, 0))
    result = verifier.verify(state, tree, topk=4)
    assert result.feedback is not None
    assert result.feedback.tokens.tolist() == [pending, 5, 6]
    assert result.feedback.topk.shape == (3, 4)
    assert result.feedback.topk[result.accepted_nodes[-1], 0] == result.bonus
