"""Grouped-query attention without the KV copy (``specdec.backends.gqa``).

The switch is on by default for CPU ``sdpa`` models with grouped heads, so every identity
test over those architectures already runs it; here: the logits of a tree verification
with and without it, which models get it, and that the model's attention setting is
restored after every forward, an exception included.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from oracle_drafter import random_tree
from test_lossless import random_prompt
from tiny_models import ARCHITECTURES, VOCAB, tiny_model

from specdec.backends import make_verifier
from specdec.backends.gqa import NAME, GroupedAttention, supports_grouped_attention

GROUPED = ["llama", "qwen2", "qwen3", "mistral", "phi3", "gemma"]  # num_key_value_heads < num_attention_heads


def test_which_models_get_it() -> None:
    assert sorted(a for a in ARCHITECTURES if supports_grouped_attention(tiny_model(a))) == sorted(GROUPED)
    assert not supports_grouped_attention(tiny_model("llama", "eager"))
    assert make_verifier(tiny_model("llama")).grouped is not None
    assert make_verifier(tiny_model("gpt2")).grouped is None


def _tree_logits(verifier: object, prompt: list[int], seed: int) -> torch.Tensor:
    """The logits of one random tree's verification, captured from the model's output."""
    rng = random.Random(seed)
    state, pending, _ = verifier.prefill(prompt)  # type: ignore[attr-defined]
    tree = random_tree(rng, pending, VOCAB, size=rng.randrange(2, 24))
    captured: list[torch.Tensor] = []
    handle = verifier.model.register_forward_hook(  # type: ignore[attr-defined]
        lambda module, args, output: captured.append(output.logits[0].clone())
    )
    try:
        verifier.verify(state, tree)  # type: ignore[attr-defined]
    finally:
        handle.remove()
    return captured[0]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("arch", GROUPED)
def test_tree_logits_equal_those_with_repeated_kv(arch: str, dtype: torch.dtype) -> None:
    model = copy.deepcopy(tiny_model(arch)).to(dtype)
    rng = random.Random(arch)
    for seed in range(4):
        prompt = random_prompt(rng)
        with_switch = make_verifier(model)
        without = make_verifier(model)
        without.grouped = None
        got, expected = _tree_logits(with_switch, prompt, seed), _tree_logits(without, prompt, seed)
        # The flash kernel reads the same numbers in the same order: equal, not just close.
        assert torch.equal(got, expected), (got - expected).abs().max()
        assert model.config._attn_implementation == "sdpa"


def test_the_setting_is_restored_after_an_exception() -> None:
    model = tiny_model("llama")
    switch = GroupedAttention(model)
    with pytest.raises(RuntimeError, match="boom"), switch.active():
        assert model.config._attn_implementation == NAME
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"
