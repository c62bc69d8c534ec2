"""Grouped-query attention over a tree without copying the KV cache.

Why: with a 4D attention mask (every tree verification of more than one node passes one),
Hugging Face's ``sdpa`` attention repeats each layer's keys and values to the number of
query heads (``repeat_kv``) before calling ``scaled_dot_product_attention``, because on
CUDA a mask together with grouped heads would push SDPA onto its slow math kernel. On a
CPU the flash kernel takes both, so that copy is pure cost: for the default model (9 query
heads over 3 KV heads, 30 layers) it is 60 copies of the whole cache per verification,
~6 ms at a 260-token context and growing with the context, against ~55 ms for the forward.

:class:`GroupedAttention` switches the model, for one verification forward, to an
attention function that calls SDPA with ``enable_gqa=True`` instead; every case it does
not cover (no mask, no grouping, a position bias, a soft cap, another device) goes to
Hugging Face's own function unchanged. The switch is the model config's attention
implementation name, set on entry and restored on exit, so nothing changes outside the
block. The flash kernel reads the same numbers either way (the tests check the logits).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "specdec_sdpa_gqa"


def gqa_sdpa_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Hugging Face's ``sdpa`` attention, with grouped heads passed to SDPA instead of repeated."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    plain = kwargs.get("position_bias") is None and kwargs.get("softcap") is None and kwargs.get("cache") is None
    if attention_mask is None or not grouped or not plain or query.device.type != "cpu":
        out: tuple[torch.Tensor, None] = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
        return out
    attended = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=False, enable_gqa=True
    )
    return attended.transpose(1, 2).contiguous(), None


def _register() -> None:
    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, gqa_sdpa_attention)


def supports_grouped_attention(model: Any) -> bool:
    """CPU models with ``sdpa`` attention and fewer KV heads than query heads."""
    config = getattr(model, "config", None)
    parameter = next(model.parameters(), None)
    if config is None or parameter is None or parameter.device.type != "cpu":
        return False
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None)
    return isinstance(heads, int) and isinstance(kv_heads, int) and 0 < kv_heads < heads


class GroupedAttention:
    """Switches a model to :func:`gqa_sdpa_attention` for the duration of a block."""

    def __init__(self, model: Any) -> None:
        _register()
        self.config = model.config

    @contextmanager
    def active(self) -> Iterator[None]:
        kept = self.config._attn_implementation
        self.config._attn_implementation = NAME
        try:
            yield
        finally:
            self.config._attn_implementation = kept
