"""Sliding-window models (Mistral with a window, Gemma 2, Gemma 3, gpt-oss) verify losslessly on the
dynamic cache, with their sliding layers' memory bounded by the window (specdec/backends/sliding.py),
and on the fixed-shape buckets, whose sliding layers are rings of window - 1 + the largest bucket slots
(specdec/backends/slot_cache.py) with window masks per layer type built from the slots the rings hold.

Tiny fp64 models (tests/tiny_models.py) whose window (8) is far shorter than the prompts and the
generations, so every run crosses several windows, and trees are deeper than the window: identity
with ``model.generate`` is demanded with no tolerance. Hybrid models (linear attention, state-space
layers) are refused with a clear error, as are sliding-window models on the native forward.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from conftest import IDENTITY_COUNTS
from oracle_drafter import OracleTreeDrafter, random_tree
from test_lossless import hf_greedy
from tiny_models import SLIDING_ARCHITECTURES, VOCAB, WINDOW, tiny_model

import specdec
from specdec.backends import auto_engine, make_verifier, sliding
from specdec.backends.hf import windows as hf_windows
from specdec.backends.verifier import ModelVerifier
from specdec.errors import UnsupportedModelError
from specdec.types import DraftTree

# Gemma 2 (attention softcapping) and gpt-oss (attention sinks) run eager attention only: the additive mask path.
ATTENTION = {"mistral-swa": "sdpa", "gemma2": "eager", "gemma3_text": "sdpa", "gpt_oss": "eager"}
DRAFTERS = ["none", "pld", "sam", "sam+recycling"]


def model_of(arch: str) -> Any:
    return tiny_model(arch, ATTENTION[arch])


def repeating_prompt(rng: random.Random, period: int, length: int) -> list[int]:
    """``length`` tokens repeating a random stretch of ``period``: lookup drafters find matches."""
    stretch = [rng.randrange(2, VOCAB) for _ in range(period)]
    return [stretch[i % period] for i in range(length)]


def some_prompt(rng: random.Random, model: Any, case: int) -> list[int]:
    """Longer than the window: random text ``X``; for every case but the first followed by the model's
    continuation ``G`` of it and ``X`` again, after which lookup drafters propose ``G``
    (test_speculation_happens_on_a_repetitive_prompt)."""
    text = [rng.randrange(2, VOCAB) for _ in range(rng.randrange(WINDOW + 2, 4 * WINDOW))]
    if case == 0:
        return text
    return text + hf_greedy(model, text, rng.randrange(WINDOW, 3 * WINDOW)) + text


RING = WINDOW - 1 + 128  # a sliding layer's ring on the buckets (the largest bucket: 128 nodes)


def filler(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(2, VOCAB) for _ in range(length)]


def past_the_ring(rng: random.Random, prompt: list[int], extra: int = WINDOW) -> list[int]:
    """``prompt`` after random tokens, ``RING + extra`` in all: longer than the ring, within the tiny models'
    256 positions with a generation of a few windows."""
    return filler(rng, max(0, RING + extra - len(prompt))) + prompt


def test_the_models_are_sliding_window_ones() -> None:
    """The premise: every layer's cache is Hugging Face's sliding-window layer, or some are (mixed)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicSlidingWindowLayer

    for arch in SLIDING_ARCHITECTURES:
        layers = DynamicCache(config=model_of(arch).config).layers
        kinds = [type(layer) is DynamicSlidingWindowLayer for layer in layers]
        assert any(kinds), arch
        assert all(kinds) == (arch == "mistral-swa"), arch


@pytest.mark.parametrize("arch", SLIDING_ARCHITECTURES)
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_drafters_match_generate(arch: str, drafter: str) -> None:
    """Three prompts each, generations of 3 to 8 windows; drafts must have been accepted (none: never)."""
    model = model_of(arch)
    rng = random.Random(f"{arch}-{drafter}")
    accepted = sum(identical_to_generate(model, some_prompt(rng, model, case), drafter, rng.randrange(3, 8) * WINDOW,
                                         f"{arch}/{drafter}") for case in range(3))  # fmt: skip
    assert (accepted > 0) == (drafter != "none"), f"{arch}/{drafter}: {accepted} draft tokens accepted"


def identical_to_generate(model: Any, prompt: list[int], drafter: Any, max_new: int, case: str) -> int:
    """specdec's greedy output equals ``generate``'s (counted in the identity summary); the draft tokens accepted."""
    result = specdec.run(model, prompt, drafter, max_new_tokens=max_new, budget="full", engine="hf")
    assert result.tokens == hf_greedy(model, prompt, max_new), f"{case}: prompt {prompt}"
    IDENTITY_COUNTS[case] += 1
    return sum(r.accepted for r in result.stats.records)


@pytest.mark.parametrize("arch", SLIDING_ARCHITECTURES)
def test_trees_deeper_than_the_window(arch: str) -> None:
    """Random trees around the truth, up to 40 nodes and 2.5 windows deep: far ancestors fall out of a node's
    window, and a long accepted path pushes the whole window past the last committed token."""
    model = model_of(arch)
    rng = random.Random(arch)
    deepest = accepted = 0
    for seed in range(3):
        prompt = some_prompt(rng, model, seed)
        truth = hf_greedy(model, prompt, 6 * WINDOW)
        drafter = OracleTreeDrafter(truth, VOCAB, seed=seed, size=40, depth=WINDOW * 5 // 2)
        result = specdec.run(model, prompt, drafter, max_new_tokens=len(truth), budget="full", engine="hf")
        assert result.tokens == truth, arch
        IDENTITY_COUNTS[f"{arch}/oracle-tree"] += 1
        deepest = max(deepest, *(r.accepted for r in result.stats.records))
        accepted += sum(r.accepted for r in result.stats.records)
    assert deepest >= WINDOW  # some step accepted a path as long as the window
    assert accepted > 3 * WINDOW


@pytest.mark.parametrize("arch", SLIDING_ARCHITECTURES)
def test_sampling_equals_plain_sampling(arch: str) -> None:
    model = model_of(arch)
    rng = random.Random(f"sample-{arch}")
    for case, options in enumerate(({"temperature": 1.0}, {"temperature": 0.7, "top_p": 0.9},
                                    {"temperature": 0.5, "top_k": 20, "repetition_penalty": 1.2})):
        options = dict(options, seed=rng.randrange(2**40))
        prompt = repeating_prompt(rng, rng.randrange(3, 7), 3 * WINDOW)
        expected = specdec.run(model, prompt, "none", max_new_tokens=5 * WINDOW, engine="hf", **options).tokens
        for drafter in ("pld", OracleTreeDrafter(expected, VOCAB, seed=case, size=24, depth=12)):
            result = specdec.run(model, prompt, drafter, max_new_tokens=5 * WINDOW, engine="hf", budget="full",
                                 **options)  # fmt: skip
            assert result.tokens == expected, (arch, options, drafter)
            IDENTITY_COUNTS[f"{arch}/sampling/{getattr(drafter, 'name', drafter)}"] += 1


@pytest.mark.parametrize("arch", [*SLIDING_ARCHITECTURES[:3], "gpt_oss-swa"])
@pytest.mark.parametrize("drafter", ["pld", "sam+recycling"])
def test_speculation_happens_on_a_repetitive_prompt(arch: str, drafter: str) -> None:
    """A text that repeats itself: ``X + G + X`` with ``G`` the model's own continuation of ``X``. The model
    continues the second ``X`` with ``G`` again (its sliding layers see only the last windows, at the same
    relative positions), so lookup drafters find it: more than 1.5 tokens per step. gpt-oss runs here with
    every layer sliding (``gpt_oss-swa``): the random weights of the mixed one do not repeat their context."""
    model = tiny_model(arch, "sdpa" if arch in ("mistral-swa", "gemma3_text") else "eager")
    text = [random.Random(6).randrange(2, VOCAB) for _ in range(4 * WINDOW)]
    continuation = hf_greedy(model, text, 8 * WINDOW)
    prompt = text + continuation + text
    result = specdec.run(model, prompt, drafter, max_new_tokens=8 * WINDOW, budget="full", engine="hf")
    assert result.tokens == hf_greedy(model, prompt, 8 * WINDOW)
    assert result.stats.mat > 1.5, (arch, drafter, result.stats.mat)


def _layer_tokens(cache: Any) -> list[tuple[bool, int]]:
    """Each layer's (sliding?, tokens its keys hold)."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    return [(isinstance(layer, DynamicSlidingWindowLayer), int(layer.keys.shape[-2])) for layer in cache.layers]


@pytest.mark.parametrize("arch", SLIDING_ARCHITECTURES)
def test_sliding_layers_stay_bounded_by_the_window(arch: str) -> None:
    """After 8 windows of verified trees, a sliding layer holds at most window - 1 + slack tokens (the model's
    own cache holds window - 1 there) and a full layer holds the context, as ``generate``'s cache does."""
    model = model_of(arch)
    prompt = repeating_prompt(random.Random(2), 5, 2 * WINDOW)
    steps = 8 * WINDOW
    truth = hf_greedy(model, prompt, steps + 1)
    ids = torch.tensor([prompt])
    # steps + 1 new tokens: generate's cache then holds the prompt and ``steps`` of them, as ours will
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps + 1, do_sample=False,
                         return_dict_in_generate=True)  # fmt: skip
    theirs = _layer_tokens(out.past_key_values)
    verifier = ModelVerifier(model)
    state, pending, _ = verifier.prefill(prompt)
    done = 0
    rng = random.Random(3)
    while done < steps:
        depth = min(rng.randrange(1, 2 * WINDOW), steps - done)
        tree = DraftTree.chain(pending, truth[done + 1 : done + depth])
        result = verifier.verify(state, tree)
        assert list(result.accepted_tokens) == truth[done : done + depth]
        done += depth
        pending = result.bonus
        for is_sliding, held in _layer_tokens(state.cache):
            assert held <= (state.cache.kept if is_sliding else len(prompt) + done)
    assert pending == truth[steps]
    ours = _layer_tokens(state.cache)
    assert [s for s, _ in ours] == [s for s, _ in theirs]
    for (is_sliding, held), (_, held_by_generate) in zip(ours, theirs, strict=True):
        if is_sliding:
            assert held_by_generate == WINDOW - 1
            assert held == WINDOW - 1 + state.cache.slack
        else:
            assert held == held_by_generate == len(prompt) + steps


@pytest.mark.parametrize("arch", ["mistral-swa", "gemma3_text"])
def test_rewind_within_and_past_what_was_kept(arch: str) -> None:
    """A rewind inside the kept slack crops; past it the committed tokens run again: either way the next
    verification is the one a fresh prefill of the shorter sequence gives."""
    model = model_of(arch)
    prompt = repeating_prompt(random.Random(4), 7, 3 * WINDOW)
    truth = hf_greedy(model, prompt, 6 * WINDOW)
    verifier = ModelVerifier(model)
    state, pending, _ = verifier.prefill(prompt)
    done = 0
    while done < 5 * WINDOW:
        result = verifier.verify(state, DraftTree.chain(pending, truth[done + 1 : done + 6]))
        done += len(result.accepted_tokens)
        pending = result.bonus
    for back in (3, state.cache.slack + WINDOW, 4 * WINDOW):
        target = len(prompt) + done - back
        verifier.rewind(state, target)
        assert state.committed_len == target
        position = target - len(prompt)
        result = verifier.verify(state, DraftTree.chain(truth[position], truth[position + 1 : position + 9]))
        assert list(result.accepted_tokens) == truth[position : position + 9]
        done = position + 9


def test_rewind_to_nothing_is_an_empty_cache() -> None:
    from specdec.backends.verifier import KVState

    model = model_of("gemma2")
    prompt = repeating_prompt(random.Random(7), 5, 3 * WINDOW)
    verifier = ModelVerifier(model)
    state, _, _ = verifier.prefill(prompt)
    verifier.rewind(state, 0)
    fresh = KVState(verifier.forward.new_cache(), 0)
    chain = DraftTree.chain(prompt[0], prompt[1 : 2 * WINDOW])
    assert verifier.verify(state, chain) == verifier.verify(fresh, chain)
    assert state.committed_len == fresh.committed_len > 0


@pytest.mark.parametrize("arch", SLIDING_ARCHITECTURES)
def test_a_prompt_shorter_than_the_window(arch: str) -> None:
    """Three prompt tokens: the first trees see fewer committed tokens than the window, later ones cross it."""
    model = model_of(arch)
    prompt = [5, 17, 42]
    truth = hf_greedy(model, prompt, 5 * WINDOW)
    for engine in ("hf", "buckets"):
        result = specdec.run(model, prompt, OracleTreeDrafter(truth, VOCAB, seed=1, size=12, depth=WINDOW),
                             max_new_tokens=len(truth), budget="full", engine=engine)  # fmt: skip
        assert result.tokens == truth, engine
        assert sum(r.accepted for r in result.stats.records) > WINDOW, engine


def test_window_mask_of_a_chain_is_transformers_own() -> None:
    """For a chain (a plain multi-token forward) the sliding layers' mask is the one transformers builds."""
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

    model = model_of("gemma3_text")
    window = sliding.window_of(model)
    assert window is not None
    cache = hf_windows.new_cache(model.config, window, slack=3)
    assert isinstance(cache, hf_windows.WindowedCache)
    for committed in (0, 3, WINDOW - 1, WINDOW, 5 * WINDOW):
        tree = DraftTree.chain(5, [6] * (2 * WINDOW))
        full = torch.ones((1, 1, tree.size, committed + tree.size), dtype=torch.bool)
        masks = hf_windows.tree_mask(cache, tree, committed, full, None)
        assert masks["full_attention"] is full
        visible = min(committed, WINDOW - 1)
        expected = sdpa_mask(batch_size=1, q_length=tree.size, kv_length=visible + tree.size, q_offset=committed,
                             kv_offset=committed - visible, mask_function=sliding_window_causal_mask_function(WINDOW),
                             allow_is_causal_skip=False)  # fmt: skip
        assert torch.equal(masks["sliding_attention"], expected), committed


# -- the fixed-shape buckets (engine="buckets"; "compiled" and the CUDA graphs run the same forward) ----------


@pytest.mark.parametrize("arch", SLIDING_ARCHITECTURES)
def test_buckets_match_generate(arch: str) -> None:
    """engine='buckets': every drafter, and random trees of up to 40 nodes 2.5 windows deep (past the
    window's slack: far ancestors and committed tokens fall out of a node's window), identical to
    ``generate`` after a prompt longer than the sliding layers' ring (the prefill keeps its last ``RING``
    keys; every tree then writes over ring slots of older tokens). Then a prompt shorter than the ring,
    generated past it with the random trees (trees' writes wrap around the ring)."""
    model = model_of(arch)
    rng = random.Random(f"buckets-{arch}")
    prompt = past_the_ring(rng, some_prompt(rng, model, 1))
    truth = hf_greedy(model, prompt, 6 * WINDOW)
    accepted = {}
    drafters: list[Any] = [*DRAFTERS, OracleTreeDrafter(truth, VOCAB, seed=1, size=40, depth=WINDOW * 5 // 2)]
    for drafter in drafters:
        name = getattr(drafter, "name", drafter)
        generator = specdec.Generator(model, drafter=drafter, engine="buckets", budget="full")
        result = generator.generate(prompt, max_new_tokens=len(truth))
        assert result.tokens == truth, f"{arch}/{name}: prompt {prompt}"
        IDENTITY_COUNTS[f"{arch}/buckets/{name}"] += 1
        accepted[name] = sum(r.accepted for r in result.stats.records)
        cache = generator.verifier.forward.cache
        assert cache.ring == RING and cache.ring_slots == RING, (cache.ring, cache.ring_slots)
        generator.close()
    # (the mixed gpt-oss's random weights barely repeat a text: pld finds nothing after this prompt)
    assert accepted["none"] == 0 and accepted["sam+recycling"] > 0, accepted
    assert accepted["pld"] > 0 or arch == "gpt_oss", accepted
    assert accepted["oracle"] > 3 * WINDOW, accepted
    prompt = some_prompt(rng, model, 1)
    assert len(prompt) < RING
    truth = hf_greedy(model, prompt, RING + 4 * WINDOW - len(prompt))
    drafter = OracleTreeDrafter(truth, VOCAB, seed=2, size=40, depth=WINDOW * 5 // 2)
    result = specdec.run(model, prompt, drafter, max_new_tokens=len(truth), budget="full", engine="buckets")
    assert result.tokens == truth, f"{arch}/oracle past the ring: prompt {prompt}"
    IDENTITY_COUNTS[f"{arch}/buckets/oracle past the ring"] += 1


def _sliding_slots(cache: Any) -> list[int]:
    """The slots each sliding layer's keys (and values) hold on a static cache."""
    assert cache.keys is not None and cache.values is not None
    sizes = []
    for index, (keys, values) in enumerate(zip(cache.keys, cache.values, strict=True)):
        if cache.is_ring(index):
            assert keys.shape[2] == values.shape[2]
            sizes.append(int(keys.shape[2]))
    return sizes


SMALL_RING = WINDOW - 1 + 16  # the ring of a static verifier whose largest bucket is 16 nodes


def _on_small_rings(arch: str, seed: str, new: int) -> tuple[Any, Any, int, list[int], list[int]]:
    """An eager static verifier with buckets up to 16 (rings of :data:`SMALL_RING`) after a prompt of 2 rings:
    ``(verifier, state, pending, prompt, truth)``, ``truth`` ``new`` tokens of ``generate``."""
    from specdec.backends.buckets.forward import bucket_verifier

    model = model_of(arch)
    prompt = filler(random.Random(seed), 2 * SMALL_RING)
    verifier = bucket_verifier(model, engine="buckets", buckets=(1, 2, 4, 8, 16))
    state, pending, _ = verifier.prefill(prompt)
    return verifier, state, pending, prompt, hf_greedy(model, prompt, new)


@pytest.mark.parametrize("arch", ["mistral-swa", "gemma3_text"])
def test_bucket_rings_are_bounded_by_the_window(arch: str) -> None:
    """Buckets up to 16 nodes: each sliding layer holds ``W - 1 + 16`` slots, whatever the context (2 to 10 rings),
    while a full layer holds the context; random trees of up to 16 nodes (the largest bucket, so the writes reach
    the ring's last slot) around the truth stay identical to ``generate``."""
    ring = SMALL_RING
    rng = random.Random(f"ring-{arch}")
    verifier, state, pending, _, truth = _on_small_rings(arch, f"ring-{arch}", 8 * ring)
    done = 0
    while done < len(truth) - 16:
        tree = random_tree(rng, pending, VOCAB, 16, truth[done + 1 : done + rng.randrange(2, 16)])
        result = verifier.verify(state, tree)
        assert list(result.accepted_tokens) == truth[done : done + len(result.accepted_tokens)], arch
        done += len(result.accepted_tokens)
        pending = result.bonus
        assert _sliding_slots(verifier.forward.cache) == [ring] * len(_sliding_slots(verifier.forward.cache)), arch
        assert verifier.forward.cache.capacity >= state.committed_len
    assert verifier.forward.cache.ring_layers.count(True) == (4 if arch == "mistral-swa" else 2)
    assert state.committed_len > 9 * ring


@pytest.mark.parametrize("arch", ["mistral-swa", "gemma2"])
def test_bucket_rewind_within_and_past_the_ring(arch: str) -> None:
    """A rewind by one step (the budget's calibration) finds its keys in the ring; a rewind past it runs the
    committed tokens again (a prompt forward): either way the next verification continues the truth."""
    ring = SMALL_RING
    verifier, state, pending, prompt, truth = _on_small_rings(arch, f"rewind-{arch}", 6 * ring)
    prompts: list[int] = []
    forward = verifier.forward.prompt_forward

    def counted(input_ids: torch.Tensor, *args: Any) -> torch.Tensor:
        prompts.append(input_ids.shape[1])
        return forward(input_ids, *args)

    done = 0
    targets = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(verifier.forward, "prompt_forward", counted)
        for back in (16, 3 * ring, 5):
            while done < 4 * ring:  # chains of 16: every one is accepted whole
                result = verifier.verify(state, DraftTree.chain(pending, truth[done + 1 : done + 16]))
                done += len(result.accepted_tokens)
                pending = result.bonus
            done -= back
            pending = truth[done]
            targets.append(len(prompt) + done)
            verifier.rewind(state, targets[-1])
            result = verifier.verify(state, DraftTree.chain(pending, truth[done + 1 : done + 16]))
            assert list(result.accepted_tokens) == truth[done : done + 16], (arch, back)
            done += 16
            pending = result.bonus
    assert prompts == [targets[1]]  # the far rewind only


def _bucket_tree_logits(model: Any, prompt: list[int], tree: DraftTree, windowed: bool = True) -> torch.Tensor:
    """The logits ``[N, V]`` of ``tree``'s nodes after ``prompt``, from one eager bucket forward; ``windowed``
    False: its forward made without the model's sliding-window layout (no rings, no window masks)."""
    from specdec.backends.buckets.forward import BucketForward
    from specdec.backends.forward import Target
    from specdec.backends.verifier import ModelVerifier

    forward = BucketForward(Target.of(model), engine="buckets", window="model" if windowed else None)
    verifier = ModelVerifier(model, forward=forward)
    state, _, _ = verifier.prefill(prompt)
    with torch.inference_mode():
        logits, _ = verifier.forward.tree(state, tree)
    return logits.clone()


def test_warm_up_keeps_a_live_sequences_rings() -> None:
    """warm_up (and calibration) run throw-away sequences on the verifier's one cache while a sequence is live:
    its rings are kept whole (BucketForward.preserving), so it goes on as if nothing had happened."""
    verifier, state, pending, _, truth = _on_small_rings("mistral-swa", "warm-up", 4 * SMALL_RING)
    done = 0
    for warm in (False, True, False):
        if warm:
            verifier.warm_up(3 * SMALL_RING)
        for _ in range(SMALL_RING // 8):
            result = verifier.verify(state, DraftTree.chain(pending, truth[done + 1 : done + 8]))
            assert list(result.accepted_tokens) == truth[done : done + 8], done
            done += 8
            pending = result.bonus


@pytest.mark.parametrize("arch", SLIDING_ARCHITECTURES)
def test_bucket_logits_are_the_models_own(arch: str) -> None:
    """After a prompt longer than the ring, each node of a 40-node tree 2.5 windows deep gets from the bucket forward
    the logits the model's own forward gives for the prompt and the node's path (fp64: to 1e-9). The control:
    the same forward without the window masks is far off (so the token tests above do check the masks)."""
    model = model_of(arch)
    rng = random.Random(f"logits-{arch}")
    prompt = filler(rng, RING + 3 * WINDOW)
    path = [rng.randrange(2, VOCAB) for _ in range(WINDOW * 5 // 2)]
    tree = random_tree(rng, rng.randrange(2, VOCAB), VOCAB, 40, path)
    expected = []
    with torch.inference_mode():
        for node in range(tree.size):
            tokens = []
            while node >= 0:
                tokens.append(tree.tokens[node])
                node = tree.parents[node]
            expected.append(model(torch.tensor([prompt + tokens[::-1]])).logits[0, -1])
    ours = _bucket_tree_logits(model, prompt, tree)
    # Gemma 2's eager attention takes its softmax in fp32 (modeling_gemma2.eager_attention_forward): fp32 rounding
    tolerance = 1e-5 if arch == "gemma2" else 1e-9
    off = (ours - torch.stack(expected)).abs().max()
    assert off < tolerance, (arch, off)
    unmasked = _bucket_tree_logits(model, prompt, tree, windowed=False)
    assert (unmasked - torch.stack(expected)).abs().max() > 1e-2, arch


@pytest.mark.parametrize("arch", ["mistral-swa", "gemma2"])
def test_rows_of_a_batch_on_the_buckets_match_generate(arch: str) -> None:
    """A batch on one static cache (specdec/backends/buckets/rows.py): each row's committed slots start at its
    region's base, so a slot's position is counted from there; each row has a ring of its own in the sliding
    layers. Prompts longer than the ring: the regions grow while other rows are live, and every tree's writes
    wrap around its row's ring."""
    model = model_of(arch)
    rng = random.Random(f"rows-{arch}")
    prompts = [past_the_ring(rng, some_prompt(rng, model, case), case * WINDOW + 1) for case in range(3)]
    generator = specdec.Generator(model, drafter="sam+recycling", engine="buckets", budget="full")
    results = generator.generate_batch(prompts, batch_size=3, max_new_tokens=4 * WINDOW)
    (rows,) = generator._rows.made.values()
    assert rows.forward.cache.ring == RING and _sliding_slots(rows.forward.cache)[0] == 3 * RING + rows.forward.scratch
    generator.close()
    for prompt, result in zip(prompts, results, strict=True):
        assert result.tokens == hf_greedy(model, prompt, 4 * WINDOW), arch
        IDENTITY_COUNTS[f"{arch}/static rows/sam+recycling"] += 1


@pytest.mark.parametrize("length", [5 * WINDOW, RING + 3])
def test_bucket_masks_of_a_chain_are_transformers_own(length: int) -> None:
    """The buckets' prefill (a chain at slots 0 ..) hands each layer the mask transformers builds for it: the full
    layers over the cache's leading slots; the sliding layers over their ring, whose first slots the prompt fills
    (the rest masked), or, for a prompt longer than the ring, over the prompt's own keys."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask, sliding_window_causal_mask_function

    from specdec.backends.buckets.forward import bucket_verifier

    model = model_of("gemma3_text")
    verifier = bucket_verifier(model, engine="buckets")
    seen: list[Any] = []
    forward = model.forward

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["attention_mask"])
        return forward(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model, "forward", spy)
        verifier.prefill([2 + i % (VOCAB - 2) for i in range(length)])
    (masks,) = seen
    for kind, function in (("full_attention", causal_mask_function),
                           ("sliding_attention", sliding_window_causal_mask_function(WINDOW))):  # fmt: skip
        mask = masks[kind]
        width = length if kind == "sliding_attention" else mask.shape[-1]
        expected = sdpa_mask(batch_size=1, q_length=length, kv_length=width, q_offset=0, kv_offset=0,
                             mask_function=function, allow_is_causal_skip=False)  # fmt: skip
        assert torch.equal(mask[..., :width], expected), kind
        assert not mask[..., width:].any(), kind
    assert masks["sliding_attention"].shape[-1] == (RING if length <= RING else length)


@pytest.mark.slow  # inductor compiles one bucket: 6-11 s with a warm inductor cache, 54 s cold on 2 busy vCPUs
def test_compiled_buckets_match_generate() -> None:
    """engine='compiled' (inductor) on a model that mixes sliding and full layers (its forward takes a dict of
    masks), one 4-node bucket: the window masks compile, and the compiled forward agrees with the eager one (no
    fallback). The eager buckets above run the same forward uncompiled."""
    model = model_of("gemma3_text")
    rng = random.Random("compiled")
    prompt = past_the_ring(rng, some_prompt(rng, model, 1))
    truth = hf_greedy(model, prompt, 4 * WINDOW)
    verifier = make_verifier(model, "compiled")
    state, pending, _ = verifier.prefill(prompt)
    done = 0
    while done < len(truth) - 1:
        tree = DraftTree.chain(pending, truth[done + 1 : done + 4])
        result = verifier.verify(state, tree)
        assert list(result.accepted_tokens) == truth[done : done + tree.size]
        done += tree.size
        pending = result.bonus
    assert verifier.forward.fallback_reason is None


def test_sampling_on_the_buckets_equals_plain_sampling() -> None:
    model = model_of("gemma2")
    rng = random.Random("buckets-sampling")
    options: dict[str, Any] = {"temperature": 0.8, "top_k": 30, "seed": rng.randrange(2**40)}
    prompt = repeating_prompt(rng, 5, RING + 3 * WINDOW)  # longer than the ring
    expected = specdec.run(model, prompt, "none", max_new_tokens=5 * WINDOW, engine="hf", **options).tokens
    for drafter in ("pld", OracleTreeDrafter(expected, VOCAB, seed=2, size=24, depth=12)):
        result = specdec.run(model, prompt, drafter, max_new_tokens=5 * WINDOW, engine="buckets", budget="full",
                             **options)  # fmt: skip
        assert result.tokens == expected, drafter
        IDENTITY_COUNTS[f"gemma2/buckets/sampling/{getattr(drafter, 'name', drafter)}"] += 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("arch", ["mistral-swa", "gemma3_text"])
def test_graphs_on_cuda_match_generate(arch: str) -> None:
    """engine='graphs' (what auto picks on CUDA): the buckets' window masks replayed from CUDA graphs, each graph
    checked against the eager forward at its first replay (no fallback may have happened). scripts/gpu_check.sh."""
    from tiny_models import own_tiny_model

    cpu_model = model_of(arch)
    model = own_tiny_model(arch, ATTENTION[arch]).to("cuda")
    rng = random.Random(f"graphs-{arch}")
    prompt = some_prompt(rng, cpu_model, 1)
    truth = hf_greedy(cpu_model, prompt, 6 * WINDOW)
    for drafter in ("pld", OracleTreeDrafter(truth, VOCAB, seed=3, size=40, depth=WINDOW * 5 // 2)):
        generator = specdec.Generator(model, drafter=drafter, engine="graphs", budget="full")
        assert generator.generate(prompt, max_new_tokens=len(truth)).tokens == truth, (arch, drafter)
        assert generator.verifier.forward.fallback_reason is None, generator.verifier.forward.fallback_reason
        generator.close()
        IDENTITY_COUNTS[f"{arch}/graphs/{getattr(drafter, 'name', drafter)}"] += 1


def test_native_forward_refuses_sliding_window_models() -> None:
    with pytest.raises(UnsupportedModelError, match="sliding-window attention.*engine='hf'"):
        make_verifier(model_of("mistral-swa"), "specdec")


def test_auto_runs_sliding_window_models_on_hugging_faces_forward_on_a_cpu() -> None:
    """On a CPU, Hugging Face's forward (its sliding layers bounded by the window); on CUDA the buckets' graphs."""
    for arch in SLIDING_ARCHITECTURES:
        assert auto_engine(model_of(arch), torch.device("cpu")) == "hf", arch
        assert auto_engine(model_of(arch), torch.device("cuda")) == "graphs", arch
    model = model_of("gemma3_text")
    prompt = repeating_prompt(random.Random(5), 4, 2 * WINDOW)
    assert specdec.run(model, prompt, "pld", max_new_tokens=30).tokens == hf_greedy(model, prompt, 30)


def _hybrid(kind: str) -> Any:
    from transformers import AutoModelForCausalLM, FalconH1Config, Qwen3NextConfig

    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=256)  # fmt: skip
    config = {
        "falcon_h1": lambda: FalconH1Config(**common, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8,
                                            mamba_d_state=8, mamba_n_groups=1, mamba_chunk_size=16),
        "qwen3_next": lambda: Qwen3NextConfig(**common, linear_num_value_heads=4, linear_num_key_heads=2,
                                              linear_key_head_dim=8, linear_value_head_dim=8, num_experts=4,
                                              num_experts_per_tok=2, moe_intermediate_size=16,
                                              shared_expert_intermediate_size=16,
                                              layer_types=["linear_attention", "full_attention"]),
    }[kind]()
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


@pytest.mark.parametrize("kind", ["falcon_h1", "qwen3_next"])
def test_hybrid_models_are_refused_clearly(kind: str) -> None:
    model = _hybrid(kind)
    with pytest.raises(UnsupportedModelError, match="linear attention or state-space"):
        specdec.run(model, [3, 4, 5, 3, 4, 5], "pld", max_new_tokens=4, engine="hf")
    for engine in ("buckets", "specdec", "auto"):
        with pytest.raises(UnsupportedModelError, match="linear attention or state-space"):
            make_verifier(model, engine)


def test_a_transformers_without_past_recording_is_refused_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Older releases (5.0.0) trim a sliding layer at every forward: a rejected draft could not be taken back on
    Hugging Face's cache, so engine='hf' refuses, naming the buckets, which auto then picks on a CPU."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    monkeypatch.delattr(DynamicSlidingWindowLayer, "activate_past_recording")
    model = model_of("mistral-swa")
    with pytest.raises(UnsupportedModelError, match="record the past.*this is transformers.*engine='buckets'"):
        specdec.run(model, [3, 4, 5, 3, 4, 5], "pld", max_new_tokens=4, engine="hf")
    assert auto_engine(model, torch.device("cpu")) == "buckets"
    prompt = repeating_prompt(random.Random(8), 5, 2 * WINDOW)
    assert specdec.run(model, prompt, "pld", max_new_tokens=3 * WINDOW).tokens == hf_greedy(model, prompt, 3 * WINDOW)
