"""Sliding-window layers on ``engine="hf"``'s ``DynamicCache``: what a rejected tree needs is kept.

Hugging Face's own cache for a sliding layer (``DynamicSlidingWindowLayer``) keeps only the last
``W - 1`` tokens: after a tree forward the rejected nodes would sit among the kept ones, and the
committed tokens they pushed out are gone, so a tree cannot be rolled back from it. Here
(:class:`~specdec.backends.hf.forward.HFForward` with a :class:`~specdec.backends.sliding.SlidingWindow`):

- **the cache** (:class:`WindowedCache`) is Hugging Face's ``DynamicCache`` with its sliding
  layers in *past-recording* mode (``activate_past_recording``: a forward appends without
  dropping anything); after each acceptance :func:`compact` moves the accepted path's keys and
  values into place, as for a full-attention layer, and then trims the layer to its last
  ``W - 1 + slack`` committed tokens. A sliding layer therefore holds at most
  ``W - 1 + slack + tree`` tokens, whatever the context: bounded by the window, as the model's
  own cache is. ``slack`` (:data:`DEFAULT_SLACK`, at most the window) lets a short
  :meth:`~specdec.backends.verifier.ModelVerifier.rewind` (the budget's calibration rewinds by
  one step's tokens) crop instead of recomputing;
- **the mask** (:func:`tree_mask`): a full-attention layer takes the tree mask as it is
  (every committed token plus the node's ancestors); a sliding layer sees the last
  ``min(C, W - 1)`` committed tokens and the node's ancestors, each kept only when it lies
  inside the node's window (``key position > node position - W``; a tree deeper than the
  window masks its own far ancestors too). A model whose layers are all sliding (Mistral)
  takes that mask as one tensor; a model that mixes them (Gemma 2/3, gpt-oss) takes a dict
  keyed by layer type, which their forwards accept in place of the masks they would build;
- **rewinds** past what a sliding layer kept run the committed tokens (the cache records them)
  through a fresh prefill: exact, at the cost of a prefill.

One-node trees need no mask: the model builds its own window mask from the layer's lengths,
which the trimming keeps as Hugging Face's layer would have them.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, Protocol

import numpy as np
import torch
from transformers import DynamicCache

from specdec.backends.forward import KVState
from specdec.backends.sliding import FULL, SLIDING, SlidingWindow
from specdec.backends.tree import ancestor_matrix
from specdec.types import DraftTree

DEFAULT_SLACK = 64  # extra committed tokens a sliding layer keeps (at most its window): short rewinds crop


class Prefills(Protocol):
    """What :func:`rewind` needs of the forward: a fresh prefill on its device."""

    device: torch.device

    def prefill(self, input_ids: torch.Tensor, *, keep_all: bool, reserve: int) -> tuple[Any, torch.Tensor]: ...


class WindowedCache(DynamicCache):
    """A ``DynamicCache`` whose sliding-window layers keep what a rejected tree needs (module docstring).

    ``layer_types``: each layer's type (:data:`FULL` or :data:`SLIDING`); ``window``: the sliding
    layers' window; ``slack``: extra committed tokens they keep; ``tokens``: the committed tokens
    (a rewind past the kept ones recomputes from them); ``tree_tokens``: the last verified tree's.
    """

    def __init__(self, config: Any, layer_types: Sequence[str], window: int, slack: int) -> None:
        super().__init__(config=config)
        self.config = config  # a rewind to nothing starts a new one
        self.layer_types = tuple(layer_types)
        self.window = window
        self.slack = slack
        self.tokens: list[int] = []
        self.tree_tokens: tuple[int, ...] = ()
        for layer in self.sliding_layers():
            layer.activate_past_recording()  # forwards append; compact() trims

    def sliding_layers(self) -> list[Any]:
        return [layer for layer, kind in zip(self.layers, self.layer_types, strict=True) if kind == SLIDING]

    def full_layers(self) -> list[Any]:
        return [layer for layer, kind in zip(self.layers, self.layer_types, strict=True) if kind == FULL]

    @property
    def kept(self) -> int:
        """The most committed tokens a sliding layer holds between forwards: ``W - 1 + slack``."""
        return self.window - 1 + self.slack

    def trim(self, committed_len: int) -> None:
        """Sliding layers: keep the last ``min(committed_len, kept)`` of their slots, count ``committed_len``."""
        keep = min(committed_len, self.kept)
        for layer in self.sliding_layers():
            if layer.is_initialized and layer.keys.shape[-2] > keep:
                layer.keys = layer.keys[:, :, layer.keys.shape[-2] - keep :]
                layer.values = layer.values[:, :, layer.values.shape[-2] - keep :]
            layer.cumulative_length = committed_len


def new_cache(config: Any, window: SlidingWindow, slack: int = DEFAULT_SLACK) -> WindowedCache:
    """A new sequence's cache for a model of ``config`` whose layers ``window`` describes."""
    return WindowedCache(config, window.layer_types, window.window, min(max(slack, 0), window.window))


def after_prefill(cache: Any, prompt: Sequence[int]) -> None:
    """The prompt ran into ``cache``: record it, and trim the sliding layers (prefill records every token)."""
    if isinstance(cache, WindowedCache):
        cache.tokens = [int(t) for t in prompt]
        cache.trim(len(cache.tokens))


def tree_mask(
    cache: Any, tree: DraftTree, committed_len: int, mask: torch.Tensor | None, additive_dtype: torch.dtype | None
) -> Any:
    """The ``attention_mask`` for verifying ``tree`` after ``committed_len`` tokens, given the full-attention
    tree mask ``mask`` ``[1, 1, N, C + N]`` (None for a one-node tree: the model builds its own masks).

    A plain cache takes ``mask``; a :class:`WindowedCache` the window mask (module docstring), as one
    tensor when every layer is sliding, else as ``{"full_attention": mask, "sliding_attention": window}``.
    """
    if not isinstance(cache, WindowedCache):
        return mask
    cache.tree_tokens = tuple(tree.tokens)
    if mask is None:
        return None
    window = cache.window
    visible = min(committed_len, window - 1)  # the committed tokens a sliding layer hands attention
    depths = np.asarray(tree.depths, dtype=np.int64)  # [N]
    query = committed_len + depths  # node positions
    committed_positions = np.arange(committed_len - visible, committed_len, dtype=np.int64)
    allowed = np.empty((tree.size, visible + tree.size), dtype=np.bool_)
    allowed[:, :visible] = committed_positions[None, :] > query[:, None] - window
    allowed[:, visible:] = ancestor_matrix(tree.parents) & (depths[:, None] - depths[None, :] < window)
    sliding = torch.from_numpy(allowed).to(mask.device)
    if additive_dtype is not None:
        additive = torch.zeros(sliding.shape, dtype=additive_dtype, device=mask.device)
        sliding = additive.masked_fill_(~sliding, torch.finfo(additive_dtype).min)
    sliding = sliding[None, None]
    if FULL not in cache.layer_types:
        return sliding
    return {FULL: mask, SLIDING: sliding}


def compact(ops: Any, cache: Any, committed_len: int, path: Sequence[int]) -> bool:
    """Keep only the accepted path's keys and values; False when ``cache`` is not a :class:`WindowedCache`
    (the caller compacts as before). ``ops``: the verifier's tree ops, whose ``compact`` moves slots."""
    if not isinstance(cache, WindowedCache):
        return False
    full = cache.full_layers()
    if full:
        ops.compact(SimpleNamespace(layers=full), committed_len, path)
    sliding = [layer for layer in cache.sliding_layers() if layer.is_initialized]
    if sliding:
        tree_size = len(cache.tree_tokens)
        base = sliding[0].keys.shape[-2] - tree_size  # the committed slots the layer held before the tree
        if any(layer.keys.shape[-2] - tree_size != base for layer in sliding):
            raise AssertionError("sliding layers of one cache hold different lengths")
        ops.compact(SimpleNamespace(layers=sliding), base, path)
    cache.tokens.extend(cache.tree_tokens[i] for i in path)
    cache.trim(committed_len + len(path))
    return True


def rewind(forward: Prefills, state: KVState, committed_len: int) -> bool:
    """Forget ``state``'s committed tokens past ``committed_len``; False when its cache is not a
    :class:`WindowedCache` (the caller crops as before). Sliding layers crop while they kept what the
    shorter sequence needs; past that the kept tokens are run again through a fresh prefill."""
    cache = state.cache
    if not isinstance(cache, WindowedCache):
        return False
    drop = state.committed_len - committed_len
    if drop == 0:
        return True
    if committed_len == 0:  # nothing is kept: an empty cache
        state.cache = new_cache(cache.config, SlidingWindow(cache.layer_types, cache.window), cache.slack)
        return True
    need = min(committed_len, cache.window - 1)
    sliding = [layer for layer in cache.sliding_layers() if layer.is_initialized]
    if all(layer.keys.shape[-2] - drop >= need for layer in sliding):
        for layer in cache.full_layers():
            layer.crop(-drop)
        for layer in sliding:
            end = layer.keys.shape[-2] - drop
            layer.keys = layer.keys[:, :, end - need : end]
            layer.values = layer.values[:, :, end - need : end]
            layer.cumulative_length = committed_len
        del cache.tokens[committed_len:]
        return True
    tokens = cache.tokens[:committed_len]
    input_ids = torch.tensor([tokens], dtype=torch.long, device=forward.device)
    with torch.inference_mode():
        fresh, _ = forward.prefill(input_ids, keep_all=False, reserve=0)  # records and trims (after_prefill)
    state.cache = fresh
    return True


