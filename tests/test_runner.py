"""specdec's own decoder forward (``specdec.backends.specdec_engine.model_runner``) and its verifier
(``engine="specdec"``).

Checked: the runner's logits equal the model's own ``sdpa`` forward on tiny fp64 models of every
architecture it knows (prefill and a tree step after it), and it refuses the others naming why;
with specdec's CPU kernels, segments verified together give bitwise the logits they give alone,
and a tree node's logits are bitwise those of the same token in a plain step after its
ancestors (float64, float32 and bfloat16); whole generations through ``engine="specdec"`` are
token-identical to Hugging Face's greedy ``generate`` with random trees around the truth and
with real drafters, with the CPU kernels and without; and the user's model is not touched
while it runs.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from conftest import IDENTITY_COUNTS, native_or_skip
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle_drafter import OracleTreeDrafter
from test_lossless import hf_greedy, random_prompt
from tiny_models import ARCHITECTURES, VOCAB, own_tiny_model, tiny_model

import specdec
from specdec.backends.slot_cache import StaticKVCache
from specdec.backends.specdec_engine import cpu_kernels
from specdec.backends.specdec_engine import forward as specdec_forward
from specdec.backends.specdec_engine.forward import (
    CPU_KERNEL_MAX_ROWS,
    PLAIN_TRIAL_STEPS,
    PlainStepTrial,
    SpecdecForward,
    _forced_kernels,
    specdec_verifier,
)
from specdec.backends.specdec_engine.model_runner import ARCHITECTURES as RUNNER_ARCHITECTURES
from specdec.backends.specdec_engine.model_runner import PLAIN, DecoderRunner, Kernels, Segment, unsupported_reason
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
    model = own_tiny_model(arch).to(dtype)
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


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", KNOWN)
def test_a_tree_nodes_logits_are_a_plain_steps_bits(arch: str, dtype: torch.dtype, kernels: Kernels) -> None:
    """Batch invariance end to end: node 3 of the tree (path 0 -> 1 -> 3) against plain steps 0, 1, 3."""
    model = own_tiny_model(arch).to(dtype)
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


@pytest.mark.parametrize("arch", KNOWN)
@pytest.mark.parametrize("variant", ["default", "cpu", "cpu-attention", "cpu-blocks"])
def test_native_generations_equal_plain_greedy(arch: str, variant: str, kernels: Kernels) -> None:
    model = tiny_model(arch)
    if variant == "cpu-blocks" and cpu_kernels.cpu_isa() not in cpu_kernels.BLOCKS_ISAS:
        pytest.skip(f"kernel path {cpu_kernels.cpu_isa()!r}: 'cpu-blocks' runs 'cpu' there (tested as 'cpu')")
    rng = random.Random(f"native-{arch}-{variant}")
    for seed in range(3):
        prompt = random_prompt(rng)
        truth = hf_greedy(model, prompt, 40)
        oracle = OracleTreeDrafter(truth, VOCAB, seed=seed, size=20, depth=7)
        for drafter in (oracle, "none", "pld", "sam+recycling"):
            generator = specdec.Generator(model, drafter=drafter, engine="specdec", budget="full")
            verifier = generator.verifier
            assert isinstance(verifier.forward, SpecdecForward)
            verifier.use_kernels(KernelChoice.uniform(variant))
            expected = {"cpu": verifier.forward.cpu_kernels, "cpu-attention": verifier.forward.cpu_attention,
                        "cpu-blocks": verifier.forward.cpu_blocks}.get(variant, PLAIN)  # fmt: skip
            assert expected is not None and all(verifier.forward._kernels_for(rows) is expected for rows in (1, 7, 40))
            if variant == "cpu-blocks":  # computes otherwise than "cpu", not a second run of it
                assert verifier.forward.cpu_blocks is not verifier.forward.cpu_kernels
            result = generator.generate(prompt, max_new_tokens=40)
            assert result.tokens == truth, f"{arch}/{drafter}: prompt {prompt}"
            names = {"cpu": "cpu-kernels", "cpu-attention": "torch-linear+tree-attention",
                     "cpu-blocks": "cpu-kernels-blocks"}  # fmt: skip
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

    generator = specdec.Generator(model, drafter="pld", engine="specdec", budget="full")
    generator.verifier.use_kernels(KernelChoice.uniform("cpu"))
    generator.generate([3, 4, 5, 3, 4, 5, 3, 4], max_new_tokens=20, on_tokens=watch)
    assert seen and not any(seen)
    assert [p._version for p in model.parameters()] == versions


@pytest.fixture(scope="module")
def one_call(kernels: Kernels) -> Kernels:
    """The CPU kernels with every field: the layer loop in one call (``decoder_layers``) where it fits."""
    return Kernels(
        cpu_kernels.skinny_linear, cpu_kernels.tree_attention, cpu_kernels.skinny_linears,
        cpu_kernels.tree_attention_segments, cpu_kernels.write_segments, cpu_kernels.decoder_layers,
    )  # fmt: skip


def _looped(kernels: Kernels) -> Kernels:
    """The same kernels without the one-call layer loop."""
    return Kernels(kernels.linear, kernels.attention, kernels.linears, kernels.attention_segments,
                   kernels.write_segments)  # fmt: skip


def _caches_equal(first: StaticKVCache, second: StaticKVCache) -> bool:
    assert first.keys is not None and second.keys is not None and first.values and second.values
    pairs = zip([*first.keys, *first.values], [*second.keys, *second.values], strict=True)
    return all(torch.equal(a, b) for a, b in pairs)


def _random_tree(rng: random.Random, size: int) -> DraftTree:
    parents = [-1, *(rng.randrange(node) for node in range(1, size))]
    return DraftTree(tuple(rng.sample(range(VOCAB), size)), tuple(parents))  # distinct: siblings never repeat


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", KNOWN)
def test_the_layer_loop_in_one_call_gives_the_loops_bits(arch: str, dtype: torch.dtype, one_call: Kernels) -> None:
    """``decoder_layers`` (C++) against the loop written out in Python with the same kernels: the same
    logits and the same cache contents, bit for bit, for a tree, a chain, a plain step and a batch of
    segments; Qwen3 (per-head query/key norms) is refused by the runner and keeps the loop."""
    model = own_tiny_model(arch).to(dtype)
    runner = DecoderRunner(model)
    fits = arch != "qwen3"
    assert runner.layers_in_one_call(one_call) is fits
    assert (runner.layer_weights is None) is not fits
    rng = random.Random(f"one-call-{arch}-{dtype}")
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randrange(2, 30))] for _ in range(3)]
    shapes = [[_random_tree(rng, 9)], [DraftTree.chain(4, [5, 6, 7])], [DraftTree.single(8)],
              [_random_tree(rng, 5), DraftTree.single(9), _random_tree(rng, 3)]]  # fmt: skip
    with torch.inference_mode():
        for trees in shapes:
            results = []
            for kernels in (one_call, _looped(one_call)):
                caches = [prefill(runner, prompt) for prompt in prompts[: len(trees)]]
                segments = [tree_segment(cache, len(prompt), tree)
                            for cache, prompt, tree in zip(caches, prompts, trees, strict=False)]  # fmt: skip
                results.append((runner.forward(segments, kernels), caches))
            (fused, fused_caches), (looped, looped_caches) = results
            assert all(torch.equal(a, b) for a, b in zip(fused, looped, strict=True)), f"{arch} {trees}"
            assert all(_caches_equal(a, b) for a, b in zip(fused_caches, looped_caches, strict=True))


@settings(max_examples=25, deadline=None)
@given(
    data=st.data(),
    arch=st.sampled_from([arch for arch in KNOWN if arch != "qwen3"]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_one_call_against_the_loop_on_random_batches(
    data: st.DataObject, arch: str, dtype: torch.dtype, one_call: Kernels
) -> None:
    """Random batches of random trees after random prompts: ``decoder_layers`` bitwise the Python loop."""
    model = own_tiny_model(arch).to(dtype)
    runner = DecoderRunner(model)
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    count = data.draw(st.integers(1, 4))
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randrange(1, 40))] for _ in range(count)]
    trees = [_random_tree(rng, rng.randrange(1, 12)) for _ in range(count)]
    _assert_one_call_is_the_loop(runner, one_call, prompts, trees)


def _assert_one_call_is_the_loop(
    runner: DecoderRunner, kernels: Kernels, prompts: list[list[int]], trees: list[DraftTree]
) -> None:
    """``decoder_layers`` through ``kernels`` against the loop written out with them, each prompt's tree on its
    own cache: logits and caches bit for bit."""
    with torch.inference_mode():
        outputs = []
        for chosen in (kernels, _looped(kernels)):
            caches = [prefill(runner, prompt) for prompt in prompts]
            segments = [tree_segment(cache, len(prompt), tree)
                        for cache, prompt, tree in zip(caches, prompts, trees, strict=True)]  # fmt: skip
            outputs.append((runner.forward(segments, chosen), caches))
    (fused, fused_caches), (looped, looped_caches) = outputs
    assert all(torch.equal(a, b) for a, b in zip(fused, looped, strict=True))
    assert all(_caches_equal(a, b) for a, b in zip(fused_caches, looped_caches, strict=True))


def test_a_layer_the_op_does_not_write_out_keeps_the_loop(one_call: Kernels) -> None:
    """The probe: a model whose activation is not SiLU (the op's) is run by the loop, and a norm with a
    hook is never handed to the op; either way the tokens are the model's own greedy ones."""
    from tiny_models import _configs
    from transformers import AutoModelForCausalLM

    config = _configs()["llama"]
    config.hidden_act = "gelu"
    torch.manual_seed(0)
    gelu = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32).eval()
    runner = DecoderRunner(gelu)
    assert runner.layer_weights is not None  # the layout fits: only the probe can tell the activation apart
    assert not runner.layers_in_one_call(one_call)
    prompt = [3, 4, 5, 6, 3, 4, 5]
    generator = specdec.Generator(gelu, drafter="pld", engine="specdec", budget="full")
    generator.verifier.use_kernels(KernelChoice.uniform("cpu"))
    assert generator.generate(prompt, max_new_tokens=12).tokens == hf_greedy(gelu, prompt, 12)

    hooked = tiny_model("llama", seed=3)
    handle = hooked.model.layers[1].post_attention_layernorm.register_forward_hook(lambda *args: None)
    try:
        assert DecoderRunner(hooked).layer_weights is None
    finally:
        handle.remove()
    assert DecoderRunner(hooked).layers_in_one_call(one_call)


def test_the_one_call_op_refuses_what_does_not_add_up(one_call: Kernels) -> None:
    model = tiny_model("llama")
    runner = DecoderRunner(model)
    assert runner.layer_weights is not None
    weights = runner.layer_weights
    hidden = torch.zeros(1, 2, model.config.hidden_size, dtype=torch.float64)
    cos = sin = torch.zeros(1, 2, runner.head_dim, dtype=torch.float64)
    cache = prefill(runner, [3, 4, 5])
    layers = [[cache.layer(index)] for index in range(runner.num_layers)]
    heads = (runner.query_heads, runner.kv_heads)
    with pytest.raises(RuntimeError, match="7 per layer"):
        torch.ops.specdec_cpu.decoder_layers(
            hidden, cos, sin, weights.norms, weights.weights[:-1], weights.biases[:-1], weights.eps, *heads, True, 1.0,
            [k for layer in layers for k, _ in layer], [v for layer in layers for _, v in layer], [3], [2], [None],
        )  # fmt: skip
    with pytest.raises(RuntimeError, match="layer-major"):
        cpu_kernels.decoder_layers(hidden, cos, sin, weights, heads, True, 1.0, layers[:-1], [3], [2], [None])
    with pytest.raises(RuntimeError, match="one of each per segment"):
        cpu_kernels.decoder_layers(hidden, cos, sin, weights, heads, True, 1.0, layers, [3], [2], [None, None])
    with pytest.raises(RuntimeError, match="unknown isa 'sse9'"):  # the kernel path is passed through, checked
        cpu_kernels.decoder_layers(hidden, cos, sin, weights, heads, True, 1.0, layers, [3], [2], [None], isa="sse9")
    # Head counts that do not fit the projections (the views would read the wrong rows), checked before any work.
    wrong = (runner.query_heads * 2, runner.kv_heads)
    with pytest.raises(RuntimeError, match="do not fit"):
        cpu_kernels.decoder_layers(hidden, cos, sin, weights, wrong, True, 1.0, layers, [3], [2], [None])
    with pytest.raises(RuntimeError, match="a multiple of the second"):
        cpu_kernels.decoder_layers(hidden, cos, sin, weights, (runner.query_heads, runner.query_heads + 1), True, 1.0,
                                   layers, [3], [2], [None])  # fmt: skip
    with pytest.raises(RuntimeError, match=r"cos and sin must be \[1, R, D\]"):
        cpu_kernels.decoder_layers(hidden, cos[:, :1], sin[:, :1], weights, heads, True, 1.0, layers, [3], [2], [None])


def test_a_prompt_is_prefilled_by_the_kernels_chosen_for_the_largest_timed_tree(
    monkeypatch: pytest.MonkeyPatch, kernels: Kernels
) -> None:
    """Prompts up to ``PREFILL_MAX_ROWS`` tokens take the variant the kernel choice gives
    ``CPU_KERNEL_MAX_ROWS`` rows (the CPU kernels prefill ~2x faster here); longer ones torch's."""
    from specdec.backends.specdec_engine import forward as engine_forward

    model = tiny_model("llama")
    verifier = specdec_verifier(model)
    verifier.use_kernels(KernelChoice.uniform("cpu"))
    used: list[Kernels] = []
    inner = verifier.forward.runner.forward

    def forward(segments: list[Segment], kernels: Kernels) -> list[torch.Tensor]:
        used.append(kernels)
        return inner(segments, kernels)

    monkeypatch.setattr(verifier.forward.runner, "forward", forward)
    prompt = [random.Random(5).randrange(2, VOCAB) for _ in range(engine_forward.CPU_KERNEL_MAX_ROWS + 20)]
    verifier.prefill(prompt)
    assert used == [verifier.forward.cpu_kernels]
    monkeypatch.setattr(engine_forward, "PREFILL_MAX_ROWS", len(prompt) - 1)
    verifier.prefill(prompt)
    assert used[-1] is PLAIN
    verifier.use_kernels(KernelChoice.uniform("default"))
    monkeypatch.setattr(engine_forward, "PREFILL_MAX_ROWS", len(prompt))
    verifier.prefill(prompt[:10])
    assert used[-1] is PLAIN


@pytest.mark.parametrize("isa", cpu_kernels.ISAS[1:])  # every forced path; "auto" is one of them
def test_the_one_call_layer_loop_gives_the_same_bits_on_every_instruction_set(isa: str, one_call: Kernels) -> None:
    """``decoder_layers`` with a forced kernel path (AVX-512, AVX2, portable: what a CPU without AVX-512 runs)
    against another path: the portable one (plain C++ loops), or for the portable path itself the best other
    16-lane path this CPU has. The kernels' paths compute the same bits, and the op adds only ATen
    operations. ``isa="auto"`` runs :func:`~specdec.backends.specdec_engine.cpu_kernels.cpu_isa`'s path, one of
    these, so
    it is no path of its own.
    The AVX2 paths (``"avx2"``, ``"avx2-blocks"``), whose skinny linear keeps an 8-lane contract of its own, are
    held instead to the loop written out in Python with their own kernels: logits and caches bit for bit."""
    best = cpu_kernels.cpu_isa()
    if isa not in cpu_kernels.supported_isas():
        pytest.skip(f"this CPU has no {isa}")
    model = own_tiny_model("qwen2").to(torch.float32)  # biases on q/k/v: every argument of the op in use
    runner = DecoderRunner(model)
    assert runner.layer_weights is not None
    rng = random.Random(isa)
    prompts = [[rng.randrange(VOCAB) for _ in range(12)], [rng.randrange(VOCAB) for _ in range(20)]]
    trees = [_random_tree(rng, 6), _random_tree(rng, 3)]
    if isa in ("avx2", "avx2-blocks"):
        forced = _forced_kernels(isa)
        assert runner.layers_in_one_call(forced)
        _assert_one_call_is_the_loop(runner, forced, prompts, trees)
        return
    others = [name for name in ("avx512", "avx2-lanes16") if name in cpu_kernels.supported_isas()]
    if isa == "portable" and not others:
        pytest.skip(f"one 16-lane kernel path here ({best!r}): nothing to compare the portable path with")
    reference = "portable" if isa != "portable" else others[0]
    outputs = []
    with torch.inference_mode():
        for forced in (reference, isa):
            caches = [prefill(runner, prompt) for prompt in prompts]
            segments = [tree_segment(cache, len(prompt), tree)
                        for cache, prompt, tree in zip(caches, prompts, trees, strict=True)]  # fmt: skip
            hidden = runner.embed(torch.cat([segment.tokens for segment in segments], dim=1))
            cos, sin = runner.rotary(hidden, torch.cat([segment.positions for segment in segments], dim=1))
            layers = [[cache.layer(index) for cache in caches] for index in range(runner.num_layers)]
            outputs.append(cpu_kernels.decoder_layers(
                hidden, cos, sin, runner.layer_weights, (runner.query_heads, runner.kv_heads),
                runner.rotary_together, runner.scaling, layers, [len(p) for p in prompts],
                [tree.size for tree in trees], [segment.ancestors for segment in segments], isa=forced,
            ))  # fmt: skip
    assert torch.equal(outputs[0], outputs[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_blocked_variant_is_offered_where_it_differs_and_gives_the_streams_bits(
    dtype: torch.dtype, kernels: Kernels
) -> None:
    """``"cpu-blocks"``: timed by the calibration only for 1-3 rows (where it computes otherwise than ``"cpu"``) and
    only on the AVX-512 and AVX2 paths (each blocks its own kernels: ``cpu_kernels.BLOCKS_ISAS``); a forward of 1, 2
    and 3 rows through it gives ``"cpu"``'s logits bit for bit."""
    model = own_tiny_model("llama").to(dtype)
    verifier = specdec_verifier(model)
    blocked = cpu_kernels.cpu_isa() in cpu_kernels.BLOCKS_ISAS
    assert (verifier.forward.cpu_blocks is not None) == blocked
    for rows in (1, 3):
        assert ("cpu-blocks" in verifier.kernel_variants(rows)) == blocked
    assert "cpu-blocks" not in verifier.kernel_variants(4)
    if not blocked:
        pytest.skip(f"kernel path {cpu_kernels.cpu_isa()!r}: the blocked variant is the plain one")
    runner = DecoderRunner(model)
    prompt = list(range(3, 25))
    with torch.inference_mode():
        for tree in (DraftTree.single(5), DraftTree((5, 6), (-1, 0)), DraftTree((5, 6, 7), (-1, 0, 0))):
            streams, blocks = (
                runner.forward([tree_segment(prefill(runner, prompt), len(prompt), tree)], chosen)[0]
                for chosen in (verifier.forward.cpu_kernels, verifier.forward.cpu_blocks)
            )
            assert torch.equal(streams, blocks), tree


def test_the_avx2_variant_is_chosen_per_size_and_keyed_by_the_path(kernels: Kernels, monkeypatch: Any) -> None:
    """``"cpu-avx2"``: offered (up to 8 rows) only where ``"cpu"`` runs AVX-512; the calibration's choice runs it
    at the sizes it won and ``"cpu"`` at the others, with the logits of ``"cpu"`` bit for bit; the calibration's
    identity names the kernel path, so a table measured on one path is never read on another."""
    from specdec.budget.calibration import calibration_identity, choose_kernels

    model = own_tiny_model("llama")
    verifier = specdec_verifier(model)
    offered = cpu_kernels.cpu_isa() == "avx512"
    for rows in (1, 4, 8):
        assert ("cpu-avx2" in verifier.kernel_variants(rows)) == offered
    assert "cpu-avx2" not in verifier.kernel_variants(9)
    # Timings where AVX2 wins at 1 and 8 rows and AVX-512 at 2-4: the choice follows each size.
    sizes = (1, 2, 4, 8, 16)
    seconds = {"default": np.array([[9.0] * 5]), "cpu": np.array([[3.0, 3.0, 3.0, 5.0, 6.0]]),
               "cpu-avx2": np.array([[2.0, 4.0, 4.0, 4.0, 7.0]])}  # fmt: skip
    choice = choose_kernels(sizes, seconds)
    assert [choice.variant_for(n) for n in sizes] == ["cpu-avx2", "cpu", "cpu", "cpu-avx2", "cpu"]
    verifier.use_kernels(choice)
    forward = verifier.forward
    avx2 = forward._kernels_for(1)
    assert forward._kernels_for(2) is forward.cpu_kernels and forward._kernels_for(8) is avx2
    assert (avx2 is not forward.cpu_kernels) == offered  # off AVX-512 "cpu" already is the AVX2 (or portable) path
    runner = DecoderRunner(model)
    prompt = list(range(3, 25))
    with torch.inference_mode():
        for tree in (DraftTree.single(5), DraftTree((5, 6, 7, 8), (-1, 0, 0, 1))):
            base, other = (
                runner.forward([tree_segment(prefill(runner, prompt), len(prompt), tree)], chosen)[0]
                for chosen in (forward.cpu_kernels, avx2)
            )
            assert torch.equal(base, other), tree
    # The key: the path "cpu" runs is part of the calibration's identity (every path this CPU runs: x86-64 has 2+).
    identities = {}
    try:
        for isa in cpu_kernels.supported_isas():
            monkeypatch.setenv(cpu_kernels.ISA_ENV, isa)
            identities[isa] = calibration_identity(verifier)["kernels_build"]
    finally:
        monkeypatch.undo()
        cpu_kernels.load()  # auto back to what it ran before
    assert len(set(identities.values())) == len(cpu_kernels.supported_isas())


def test_a_plain_step_trial_keeps_the_variant_whose_quickest_step_was_quickest() -> None:
    """The candidates take turns; one slow first step (a process's first pays one-time costs) does not lose a
    variant the trial; no verdict before every candidate has run its steps."""
    trial = PlainStepTrial(("cpu", "cpu-blocks", "cpu-avx2"), steps=2)
    times = {"cpu": [0.024, 0.023], "cpu-blocks": [0.025, 0.024], "cpu-avx2": [0.090, 0.020]}
    verdicts = []
    for _ in range(6):
        variant = trial.next_variant()
        verdicts.append(trial.record(variant, times[variant].pop(0)))
    assert verdicts == [None] * 5 + ["cpu-avx2"]


def test_plain_steps_time_their_variants_until_a_kernel_choice_is_set(kernels: Kernels, monkeypatch: Any) -> None:
    """Where ``"cpu"`` runs AVX-512 and no calibration chose (a generator that never drafts never calibrates), the
    first plain steps take the one-token variants in turn and the fastest runs every later one, with plain greedy
    decoding's output throughout (the variants' bits are the same); a kernel choice set from outside ends the
    trial unused. On the AVX2 path the candidates are the stream and the blocks; on the portable path one-token
    forwards have one variant: no trial."""
    from specdec.budget import calibration_cache

    monkeypatch.setattr(calibration_cache, "cached_table", lambda verifier: None)  # as on a fresh machine
    monkeypatch.setattr(specdec_forward, "PLAIN_VERDICTS", {})  # as in a fresh process
    model = own_tiny_model("llama")
    prompt = list(range(3, 25))
    truth = hf_greedy(model, prompt, 24)
    generator = specdec.Generator(model, drafter="none", engine="specdec")
    forward = generator.verifier.forward
    assert isinstance(forward, SpecdecForward)
    candidates = {"avx512": ("cpu", "cpu-blocks", "cpu-avx2"), "avx2": ("cpu", "cpu-blocks")}.get(cpu_kernels.cpu_isa())
    if candidates is None:
        assert forward.plain_trial is None and forward.kernels == KernelChoice(((CPU_KERNEL_MAX_ROWS, "cpu"),))
        pytest.skip(f"kernel path {cpu_kernels.cpu_isa()!r}: one variant for one token, nothing to time")
    trial = forward.plain_trial
    assert trial is not None and trial.candidates == candidates
    assert generator.generate(prompt, max_new_tokens=24).tokens == truth
    assert forward.plain_trial is None
    assert all(len(trial.seconds[name]) == PLAIN_TRIAL_STEPS for name in trial.candidates)
    winner = min(trial.candidates, key=lambda name: min(trial.seconds[name]))
    assert forward.kernels.variant_for(1) == winner and forward.kernels.variant_for(2) == "cpu"
    assert generator.generate(prompt, max_new_tokens=24).tokens == truth  # on the winner alone
    again = specdec.Generator(model, drafter="none", engine="specdec")  # the process's verdict: no second trial
    assert again.verifier.forward.plain_trial is None and again.verifier.forward.kernels == forward.kernels
    assert again.generate(prompt, max_new_tokens=24).tokens == truth
    chosen = specdec.Generator(model, drafter="none", engine="specdec")
    chosen.verifier.use_kernels(KernelChoice.uniform("cpu"))
    assert chosen.verifier.forward.plain_trial is None
    assert chosen.generate(prompt, max_new_tokens=24).tokens == truth
    assert chosen.verifier.forward.kernels == KernelChoice.uniform("cpu")
