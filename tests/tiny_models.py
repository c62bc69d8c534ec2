"""Tiny randomly initialised causal LMs of several architectures, for exact (fp64) tests.

In float64 the rounding differences between a batched tree forward and one-token
forwards (~1e-15) cannot flip an argmax unless two logits tie to the last bits, so tests
on these models demand token identity with no tolerance at all.
"""

from __future__ import annotations

from functools import cache
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


@cache
def tiny_model(arch: str, attn: str = "sdpa", seed: int = 0) -> Any:
    """A fresh fp64 model of ``arch`` with weights drawn from ``seed`` (cached per arguments)."""
    from transformers import AutoModelForCausalLM

    config = _configs()[arch]
    config._attn_implementation = attn
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float64)
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
