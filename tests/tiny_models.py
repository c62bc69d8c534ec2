"""Tiny randomly initialised causal LMs of several architectures, for exact (fp64) tests.

In float64 the rounding differences between a batched tree forward and one-token
forwards (~1e-15) cannot flip an argmax unless two logits tie to the last bits, so tests
on these models demand token identity with no tolerance at all.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

VOCAB = 96

_COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=256, bos_token_id=0, eos_token_id=1)


def _configs() -> dict[str, Any]:
    from transformers import (
        GemmaConfig,
        GPT2Config,
        GPTNeoXConfig,
        LlamaConfig,
        MistralConfig,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
    )

    return {
        "llama": LlamaConfig(**_COMMON, num_key_value_heads=2),
        "qwen2": Qwen2Config(**_COMMON, num_key_value_heads=2, use_sliding_window=False),
        "qwen3": Qwen3Config(**_COMMON, num_key_value_heads=2, head_dim=8),
        "mistral": MistralConfig(**_COMMON, num_key_value_heads=2, sliding_window=None),
        "phi3": Phi3Config(**_COMMON, num_key_value_heads=2, pad_token_id=0),
        "gemma": GemmaConfig(**_COMMON, num_key_value_heads=1, head_dim=8),
        "gpt_neox": GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, max_position_embeddings=256, bos_token_id=0, eos_token_id=1),
        "gpt2": GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=256, bos_token_id=0,
                           eos_token_id=1),
    }


ARCHITECTURES = tuple(_configs())

WINDOW = 8  # the sliding window of the sliding-window models: prompts and generations span several


def _sliding_configs() -> dict[str, Any]:
    """Sliding-window models (tests/test_sliding_window.py): all layers sliding (Mistral), or sliding and
    full layers alternating (Gemma 2, Gemma 3, gpt-oss); 4 layers, so both kinds appear twice."""
    from transformers import Gemma2Config, Gemma3TextConfig, GptOssConfig, MistralConfig

    common = {**_COMMON, "num_hidden_layers": 4, "num_key_value_heads": 2, "sliding_window": WINDOW}
    return {
        "mistral-swa": MistralConfig(**common),
        "gemma2": Gemma2Config(**common, head_dim=8),
        "gemma3_text": Gemma3TextConfig(**common, head_dim=8, sliding_window_pattern=2),
        "gpt_oss": GptOssConfig(**{**common, "intermediate_size": 32}, head_dim=8, num_local_experts=4,
                                num_experts_per_tok=2),
        # every layer sliding (its random weights repeat a repeated text, the mixed one's do not)
        "gpt_oss-swa": GptOssConfig(**{**common, "intermediate_size": 32}, head_dim=8, num_local_experts=4,
                                    num_experts_per_tok=2, layer_types=["sliding_attention"] * 4),
    }


SLIDING_ARCHITECTURES = ("mistral-swa", "gemma2", "gemma3_text", "gpt_oss")


_CACHED: dict[tuple[str, str, int], Any] = {}  # (arch, attn, seed) -> the session's model


def tiny_model(arch: str, attn: str = "sdpa", seed: int = 0) -> Any:
    """An fp64 model of ``arch`` with weights drawn from ``seed``, cached per arguments and shared by
    every test: read it, never change it (:func:`own_tiny_model` gives a copy to change)."""
    key = (arch, attn, seed)
    if key not in _CACHED:
        _CACHED[key] = _build(arch, attn, seed)
    return _CACHED[key]


def _build(arch: str, attn: str, seed: int) -> Any:
    from transformers import AutoModelForCausalLM

    config = {**_configs(), **_sliding_configs()}[arch]
    config._attn_implementation = attn
    torch.manual_seed(seed)
    # gpt-oss's grouped expert matmul takes no fp64: its eager experts do
    experts = {"experts_implementation": "eager"} if arch.startswith("gpt_oss") else {}
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float64, **experts)
    # Larger weights than the default init make the model's choices depend on its context
    # (a near-uniform model repeats one token), which exercises drafts and acceptance.
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, 0.3)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.eval()
    return model


def own_tiny_model(arch: str, attn: str = "sdpa", seed: int = 0) -> Any:
    """A private copy of :func:`tiny_model`'s model, for a test that casts, moves or edits it.

    The cached model is shared by every test of the session: a test that cast it to bf16 and back
    left rounded weights for the tests after it (and a file run alone then tested other weights).
    The session's check (``conftest.py``, ``tiny_models_untouched``) fails a test that changes it.
    """
    return copy.deepcopy(tiny_model(arch, attn, seed))


def fingerprints() -> dict[tuple[Any, ...], tuple[tuple[str, torch.dtype, str, int], ...]]:
    """Every cached model's parameters and buffers (name, dtype, device, a hash of the bytes), by arguments."""
    prints = {}
    for args, model in _CACHED.items():
        prints[args] = tuple(
            (name, tensor.dtype, str(tensor.device), hash(tensor.detach().cpu().contiguous().reshape(-1)
                                                          .view(torch.uint8).numpy().tobytes()))
            for name, tensor in (*model.named_parameters(), *model.named_buffers())
        )
    return prints
