"""specdec's own decoder forward (``specdec.backends.runner``) and its verifier (``cache="native"``).

Checked: the runner's logits equal the model's own ``sdpa`` forward on tiny fp64 models of every
architecture it knows (prefill and a tree step after it), and it refuses the others naming why;
with specdec's CPU kernels, segments verified together give bitwise the logits they give alone,
and a tree node's logits are bitwise those of the same token in a plain step after its
ancestors (float64, float32 and bfloat16); whole generations through ``cache="native"`` are
token-identical to Hugging Face's greedy ``generate`` with random trees around the truth and
with real drafters, with the CPU kernels and without; and the user's model is not touched
while it runs.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from conftest import IDENTITY_COUNTS, native_or_skip
from oracle_drafter import OracleTreeDrafter
from test_lossless import hf_greedy, random_prompt
from tiny_models import ARCHITECTURES, VOCAB, tiny_model

import specdec
from specdec.backends import cpu_kernels
from specdec.backends.runner import ARCHITECTURES as RUNNER_ARCHITECTURES
from specdec.backends.runner import PLAIN, DecoderRunner, Kernels, Segment, unsupported_reason
from specdec.backends.runner_verifier import RunnerVerifier
from specdec.backends.static_cache import StaticKVCache
from specdec.backends.tree import ancestor_matrix
from specdec.models import cache_keyword
from specdec.types import DraftTree, KernelChoice

CPU = torch.device("cpu")
KNOWN = [arch for arch in ARCHITECTURES if arch in RUNNER_ARCHITECTURES]
OTHERS = [arch for arch in ARCHITECTURES if arch not in RUNNER_ARCHITECTURES]


@pytest.fixture(scope="module")
def kernels() -> Kernels:
    native_or_skip("cpu_kernels", cpu_kernels.load)
    return Kernels(cpu_kernels.skinny_linear, cpu_kernels.tree_attention, cpu_kernels.skinny_linears)


def tree_segment(cache: StaticKVCache, committed: int, tree: DraftTree) -> Segment:
    positions = torch.tensor([tree.depths]) + committed
    ancestors = torch.from_numpy(ancestor_matrix(tree.parents))
    return Segment(torch.tensor([tree.tokens]), positions, cache, committed, ancestors)


def prefill(runner: DecoderRunner, prompt: list[int]) -> StaticKVCache:
    cache = StaticKVCache(runner.num_layers, 128, CPU)
    segment = Segment(torch.tensor([prompt]), torch.arange(len(prompt)).unsqueeze(0), cache, 0, last_only=True)
    runner.forward([segment], PLAIN)
    return cache


def test_every_test_architecture_is_either_run_or_refused() -> None:
    assert set(KNOWN) == {"llama", "qwen2", "qwen3", "mistral"}
    for arch in OTHERS:
        reason = unsupported_reason(tiny_model(arch))
        assert reason is not None and arch in reason
        with pytest.raises(ValueError, match="cannot run this model"):
            DecoderRunner(tiny_model(arch))
    assert "attention implementation 'eager'" in str(unsupported_reason(tiny_model("llama", "eager")))


@pytest.mark.parametrize("arch", KNOWN)
def test_logits_equal_the_models_own_forward(arch: str) -> None:
    from transformers import DynamicCache

    model = tiny_model(arch)
    runner = DecoderRunner(model)
    prompt = [random.Random(arch).randrange(VOCAB) for _ in range(23)]
    tree = DraftTree((5, 6, 7, 8, 9, 10), (-1, 0, 0, 1, 1, 3))
    with torch.inference_mode():
        cache = StaticKVCache(runner.num_layers, 64, CPU)
        ids = torch.tensor([prompt])
        (ours,) = runner.forward([Segment(ids, torch.arange(len(prompt)).unsqueeze(0), cache, 0)], PLAIN)
        theirs_cache = DynamicCache(config=model.config)
        theirs = model(input_ids=ids, use_cache=True, **{cache_keyword(model): theirs_cache}).logits[0]
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
        segment = tree_segment(cache, len(prompt), tree)
        (ours_tree,) = runner.forward([segment], PLAIN)
        mask, positions = segment.mask(), segment.positions
        theirs_tree = model(
            input_ids=torch.tensor([tree.tokens]), attention_mask=mask, position_ids=positions,
            use_cache=True, **{cache_keyword(model): theirs_cache},
        ).logits[0]  # fmt: skip
        torch.testing.assert_close(ours_tree, theirs_tree, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("arch", KNOWN)
def test_queries_and_keys_are_rotated_in_one_call_only_where_that_gives_the_same_bits(arch: str) -> None:
    model = tiny_model(arch)
    runner = DecoderRunner(model)
    assert runner.rotary_together  # every architecture the runner knows rotates queries and keys alike
    plain = runner.apply_rotary

    def keys_apart(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[Any, Any]:
        q_out, k_out = plain(q, k, cos, sin)
        return q_out, k_out * 2.0  # a rotary that treats keys unlike queries

    runner.apply_rotary = keys_apart
    assert not runner._rotary_works_on_heads_together(model)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", KNOWN)
def test_segments_together_give_the_bits_they_give_alone(arch: str, dtype: torch.dtype, kernels: Kernels) -> None:
    model = tiny_model(arch).to(dtype)
    try:
        runner = DecoderRunner(model)
        first, second = list(range(3, 20)), list(range(30, 41))
        tree = DraftTree((5, 6, 7, 8, 9), (-1, 0, 0, 1, 1))

        def segments() -> list[Segment]:
            return [
                tree_segment(prefill(runner, first), len(first), tree),
                tree_segment(prefill(runner, second), len(second), DraftTree.single(4)),
            ]

        with torch.inference_mode():
            alone = [runner.forward([segment], kernels)[0] for segment in segments()]
            together = runner.forward(segments(), kernels)
        assert torch.equal(together[0], alone[0]) and torch.equal(together[1], alone[1])
    finally:
        model.to(torch.float64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", KNOWN)
def test_a_tree_nodes_logits_are_a_plain_steps_bits(arch: str, dtype: torch.dtype, kernels: Kernels) -> None:
    """Batch invariance end to end: node 3 of the tree (path 0 -> 1 -> 3) against plain steps 0, 1, 3."""
    model = tiny_model(arch).to(dtype)
    try:
        runner = DecoderRunner(model)
        prompt = list(range(3, 25))
        tree = DraftTree((5, 6, 7, 8, 9), (-1, 0, 0, 1, 1))
        with torch.inference_mode():
            (tree_logits,) = runner.forward([tree_segment(prefill(runner, prompt), len(prompt), tree)], kernels)
            cache = prefill(runner, prompt)
            plain = []
            for depth, token in enumerate((5, 6, 8)):  # the path 0 -> 1 -> 3, one plain step at a time
                committed = len(prompt) + depth
                (step,) = runner.forward([tree_segment(cache, committed, DraftTree.single(token))], kernels)
                plain.append(step[0])
        for node, step in zip((0, 1, 3), plain, strict=True):
            assert torch.equal(tree_logits[node], step), f"node {node}"
    finally:
        model.to(torch.float64)


@pytest.mark.parametrize("arch", KNOWN)
@pytest.mark.parametrize("variant", ["default", "cpu", "cpu-attention"])
def test_native_generations_equal_plain_greedy(arch: str, variant: str, kernels: Kernels) -> None:
    model = tiny_model(arch)
    rng = random.Random(f"native-{arch}-{variant}")
    for seed in range(3):
        prompt = random_prompt(rng)
        truth = hf_greedy(model, prompt, 40)
        oracle = OracleTreeDrafter(truth, VOCAB, seed=seed, size=20, depth=7)
        for drafter in (oracle, "none", "pld", "sam+recycling"):
            generator = specdec.Generator(model, drafter=drafter, cache="native", budget="full")
            verifier = generator.verifier
            assert isinstance(verifier, RunnerVerifier)
            verifier.use_kernels(KernelChoice.uniform(variant))
            expected = {"cpu": verifier.cpu_kernels, "cpu-attention": verifier.cpu_attention}.get(variant, PLAIN)
            assert all(verifier._kernels_for(rows) is expected for rows in (1, 7, 40))  # the variant runs
            result = generator.generate(prompt, max_new_tokens=40)
            assert result.tokens == truth, f"{arch}/{drafter}: prompt {prompt}"
            names = {"cpu": "cpu-kernels", "cpu-attention": "torch-linear+tree-attention"}
            IDENTITY_COUNTS[f"{arch}/native/{names.get(variant, 'torch')}"] += 1
        assert result.stats.steps < 39  # sam+recycling's trees were accepted: speculation happened


def test_the_users_model_is_untouched(kernels: Kernels) -> None:
    model = tiny_model("llama")
    implementation = model.config._attn_implementation
    versions = [p._version for p in model.parameters()]
    seen: list[bool] = []

    def watch(tokens: list[int]) -> None:  # called mid-run: nothing of the model may be switched
        seen.append(any("forward" in module.__dict__ for module in model.modules()))
        assert model.config._attn_implementation == implementation

    generator = specdec.Generator(model, drafter="pld", cache="native", budget="full")
    generator.verifier.use_kernels(KernelChoice.uniform("cpu"))
    generator.generate([3, 4, 5, 3, 4, 5, 3, 4], max_new_tokens=20, on_tokens=watch)
    assert seen and not any(seen)
    assert [p._version for p in model.parameters()] == versions
