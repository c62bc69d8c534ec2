"""Sliding-window attention in tree verification on the dynamic cache (Mistral, Gemma 2/3, gpt-oss).

A sliding-window layer of window ``W`` lets the token at position ``q`` attend to the keys at
positions ``q - W < k <= q`` (Hugging Face's ``sliding_window_overlay``). Hugging Face's own
cache for such a layer (``DynamicSlidingWindowLayer``) keeps only the last ``W - 1`` tokens:
after a tree forward the rejected nodes would sit among the kept ones, and the committed
tokens they pushed out are gone, so a tree cannot be rolled back from it. Here:

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

The fixed-shape buckets (``engine="buckets"``, ``"compiled"``, ``"graphs"``, ``"compiled-graphs"``)
run these models on their static cache, whose sliding layers are rings of ``window - 1 + the largest
bucket`` slots per sequence (:func:`setup_buckets`, :mod:`~specdec.backends.slot_cache`): bounded by
the window, as the model's own static cache is; the full layers of a mixed model keep every token.
The sliding layers' masks are built inside the bucket's forward from its device buffers and the
ring's record of which slot each ring slot holds (:func:`ring_allowed`, :func:`bucket_masks`), so
one compiled function or captured graph per bucket serves every step. A rewind past what a ring
still holds runs the committed tokens again (:func:`bucket_rewind`).

Not here: chunked attention (Llama 4: ``chunked_attention`` layers share the cache class but
not the mask), layers of several window sizes, and linear-attention / state-space layers
(their recurrent state cannot be cropped back to the accepted length): all refused with
:class:`~specdec.errors.UnsupportedModelError`. specdec's native forward does not run
sliding-window models (:func:`check_engine`); on a CPU ``engine='auto'`` picks the dynamic
cache for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from specdec.backends.tree import ancestor_matrix
from specdec.errors import UnsupportedModelError
from specdec.types import DraftTree

FULL = "full_attention"
SLIDING = "sliding_attention"
DEFAULT_SLACK = 64  # extra committed tokens a sliding layer keeps (at most its window): short rewinds crop


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if callable(get) else config


def _layer_types(config: Any, layers: Sequence[Any]) -> list[str]:
    """Each cache layer's type, as transformers dispatched it (``config.layer_types``, else inferred)."""
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs
    except ImportError:  # transformers 5.0.0: each cache layer's class says it (anything else is refused later)
        kinds: dict[type[Any], str] = {DynamicLayer: FULL, DynamicSlidingWindowLayer: SLIDING}
        return [kinds.get(type(layer), type(layer).__name__) for layer in layers]
    types, _ = get_layer_types_and_kwargs(_text_config(config))
    if len(types) != len(layers):
        raise UnsupportedModelError(
            f"the model's config names {len(types)} layer types for {len(layers)} cache layers: cannot tell which "
            "layers are sliding-window ones"
        )
    return list(types)


def _unsupported(layer: Any, kind: str) -> UnsupportedModelError:
    what = "linear attention or state-space" if "Linear" in type(layer).__name__ else kind
    return UnsupportedModelError(
        f"cache layer {type(layer).__name__} ({what}) is not supported: tree verification needs attention layers "
        "whose keys and values can be gathered and cropped back to the accepted tokens (full attention, or a "
        "sliding window)"
    )


class WindowedCache(DynamicCache):
    """A ``DynamicCache`` whose sliding-window layers keep what a rejected tree needs (module docstring).

    ``layer_types``: each layer's type (:data:`FULL` or :data:`SLIDING`); ``window``: the sliding
    layers' window; ``slack``: extra committed tokens they keep; ``tokens``: the committed tokens
    (a rewind past the kept ones recomputes from them); ``tree_tokens``: the last verified tree's.
    """

    def __init__(self, config: Any, layer_types: Sequence[str], window: int, slack: int) -> None:
        super().__init__(config=config)
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


def layout(config: Any, cache: Any = None) -> tuple[list[str], int] | None:
    """Each layer's type and the sliding layers' window, for a model with sliding-window layers of one window
    size; None when every layer is full attention; :class:`~specdec.errors.UnsupportedModelError` for any
    other layer (linear attention, state-space, chunked attention, several windows). ``cache``: a fresh
    ``DynamicCache(config=config)`` the caller already made (None: one is made here)."""
    layers = list(getattr(DynamicCache(config=config) if cache is None else cache, "layers", []))
    others = sorted(set(getattr(_text_config(config), "layer_types", None) or ()) - {FULL, SLIDING})
    if others:  # also where a transformers' DynamicCache does not know them (5.0.0 makes plain layers of them)
        stateful = any("attention" not in kind or "linear" in kind for kind in others)  # linear, hybrid, mamba
        what = "linear attention or state-space" if stateful else "an attention pattern not handled here"
        raise UnsupportedModelError(
            f"layers of type {', '.join(map(repr, others))} ({what}) are not supported: tree "
            "verification needs attention layers whose keys and values can be gathered and cropped back to the "
            "accepted tokens (full attention, or a sliding window)"
        )
    if all(type(layer) is DynamicLayer for layer in layers):
        return None
    types = _layer_types(config, layers)
    windows = set()
    for layer, kind in zip(layers, types, strict=True):
        if type(layer) is DynamicLayer and kind == FULL:
            continue
        if type(layer) is DynamicSlidingWindowLayer and kind == SLIDING:
            windows.add(int(layer.sliding_window))
            continue
        raise _unsupported(layer, f"layer type {kind!r}")
    if len(windows) != 1:
        raise UnsupportedModelError(f"sliding-window layers of several windows ({sorted(windows)}) are not supported")
    (window,) = windows
    if window < 1:
        raise UnsupportedModelError(f"sliding window {window} is not a positive number of tokens")
    if FULL in types and getattr(_text_config(config), "layer_types", None) is None:
        # Mixed models take a dict of masks keyed by config.layer_types; without it their forward builds one mask.
        raise UnsupportedModelError("a model mixing sliding-window and full layers without config.layer_types")
    return types, window


def records_the_past() -> bool:
    """Whether this transformers' sliding cache layers can keep what a rejected draft needs (5.24, not 5.0.0):
    without it, ``engine='hf'`` refuses sliding-window models and the buckets run them."""
    return hasattr(DynamicSlidingWindowLayer, "activate_past_recording")


def new_cache(config: Any, slack: int = DEFAULT_SLACK) -> Any:
    """The verifier's cache for a new sequence of a model with ``config``.

    A plain ``DynamicCache`` when every layer is full attention (as before); a
    :class:`WindowedCache` when some layers are sliding-window ones of one window size;
    :class:`~specdec.errors.UnsupportedModelError` for any other layer (:func:`layout`).
    """
    cache = DynamicCache(config=config)
    found = layout(config, cache)
    if found is None:
        return cache
    if not records_the_past():
        import transformers

        raise UnsupportedModelError(
            f"sliding-window models need a transformers whose sliding cache layers can record the past "
            f"(DynamicSlidingWindowLayer.activate_past_recording, in 5.24; not in 5.0.0), so that a rejected draft "
            f"can be taken back; this is transformers {transformers.__version__} (engine='buckets' runs these models "
            "on it: a static cache whose sliding layers keep a ring of the window plus the largest tree)"
        )
    types, window = found
    return WindowedCache(config, types, window, min(max(slack, 0), window))


def window_reason(model: Any) -> str | None:
    """Why ``model`` needs this module's handling (its sliding-window or linear-attention layers), or None."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = _text_config(config)
    kinds = set(getattr(text, "layer_types", None) or ())
    windowed = getattr(text, "sliding_window", None) is not None and getattr(text, "use_sliding_window", True)
    if windowed and (not kinds or SLIDING in kinds):
        return "sliding-window attention"
    others = kinds - {FULL}
    if others:
        return f"{', '.join(sorted(others))} layers"
    return None


def check_engine(model: Any, engine: str) -> None:
    """Refuse, with a clear error, a model the ``engine`` (``"hf"``, ``"specdec"``, a bucket engine)
    cannot verify: layers no cache here can roll back (linear attention, state-space: :func:`layout`),
    and sliding-window layers on specdec's own forward (it runs full-attention layers only). Hugging
    Face's forward (:class:`WindowedCache`) and the fixed-shape buckets (:func:`bucket_layout`) run them."""
    config = getattr(model, "config", None)
    if config is None:
        return
    if engine == "hf":
        new_cache(config)  # raises for layers that cannot be verified, and for a transformers without past recording
        return
    layout(config)  # raises for layers that cannot be verified at all
    reason = window_reason(model)
    if engine == "specdec" and reason is not None:
        raise UnsupportedModelError(
            f"engine={engine!r} does not run this model ({reason}): specdec's own forward holds full-attention "
            "layers only; use engine='hf' (what engine='auto' picks for this model on a CPU) or engine='buckets'"
        )


# -- the fixed-shape buckets (specdec/backends/buckets/runner.py: tree_forward) ------------------------------


def bucket_layout(model: Any) -> tuple[int, bool] | None:
    """What the bucket engines' masks need of ``model``: ``(window, mixed)`` (``mixed``: full-attention layers
    beside the sliding ones, so the forward takes a dict of masks), or None when every layer is full attention.
    """
    config = getattr(model, "config", None)
    found = None if config is None else layout(config)
    if found is None:
        return None
    types, window = found
    return window, FULL in types


def ring_capacity(window: int, largest_tree: int) -> int:
    """Slots of a sliding layer's ring per place: ``window - 1`` committed keys and the largest tree a forward
    writes there (padding included), so a forward never overwrites a key one of its nodes needs
    (:mod:`specdec.backends.slot_cache`).

    >>> ring_capacity(4096, 128)
    4223
    """
    return window - 1 + largest_tree


def setup_buckets(verifier: Any) -> None:
    """A bucket engine's ``verifier`` (:class:`~specdec.backends.buckets.forward.StaticVerifier`, or its batch of rows:
    ``places`` and ``scratch``) on a sliding-window model: its cache's masks (:func:`bucket_layout`) and a ring
    of :func:`ring_capacity` slots per place for each sliding layer; nothing for a full-attention model."""
    cache = verifier.cache
    cache.sliding = bucket_layout(verifier.model)
    if cache.sliding is None:
        cache.set_ring((), 0)
        return
    types, window = layout(verifier.model.config) or ([], 0)
    # A lone sequence's forward writes its bucket's padding after its tree; a batch's rows write their trees only
    # (at most row_nodes each, the padding in scratch slots), and before row_nodes is set, the largest bucket.
    largest = getattr(verifier, "row_nodes", verifier.largest_bucket)
    cache.set_ring([kind == SLIDING for kind in types], ring_capacity(window, largest),
                   getattr(verifier, "places", 1), getattr(verifier, "scratch", 0))  # fmt: skip


def ring_allowed(
    cache: Any,
    window: int,
    slots: torch.Tensor,
    positions: torch.Tensor,
    ancestors: torch.Tensor,
    bounds: torch.Tensor | None,
    prompt: bool = False,
) -> torch.Tensor:
    """Bool ``[T, R]``: which slots of a sliding layer's ring (:mod:`~specdec.backends.slot_cache`) each node
    attends to: a committed key or an ancestor, inside the node's window (key position > node position -
    ``window``, as ``sliding_window_overlay`` of Hugging Face's masks has it). Records the nodes' slots in the
    cache's ``ring_ids`` first (the forward writes them there).

    Traced inside the buckets' forward (tensor operations only). ``slots`` int64 ``[T]`` (where the nodes'
    keys go; ``slots[0]`` is the committed length for one sequence); ``positions`` int64 ``[1, T]``;
    ``ancestors`` bool ``[T, T]``; ``bounds`` int64 ``[2, T]`` or None (as ``tree_forward`` takes them): node
    ``i``'s committed slots are ``bounds[0, i] <= s < bounds[1, i]``, at positions ``s - bounds[0, i]``. A
    ``prompt`` (nothing committed before it) longer than a place's ring attends over its own keys: ``[T, T]``.
    (A batch's forward may hold more nodes than a ring, each row's at most ``ring - window + 1``.)
    """
    query = positions[0]  # [T]
    ring = cache.ring
    if prompt and slots.shape[0] > ring:  # the layer attends over the prompt's own keys (_ring_update)
        tail = slots[-ring:]
        cache.ring_ids.index_copy_(0, cache.ring_of(tail), tail)
        return ancestors & (query.unsqueeze(0) > (query - window).unsqueeze(1))
    ring_slots = cache.ring_of(slots)  # [T]
    ids = cache.ring_ids.index_copy_(0, ring_slots, slots).unsqueeze(0)  # [1, R]: the slot each ring slot holds
    low, high = (torch.zeros_like(slots[:1]), slots[:1]) if bounds is None else (bounds[0], bounds[1])
    committed = (ids >= low.unsqueeze(1)) & (ids < high.unsqueeze(1))  # [1 or T, R]
    tree = torch.zeros((slots.shape[0], ids.shape[1]), dtype=torch.bool, device=slots.device)
    tree = tree.index_copy(1, ring_slots, ancestors)  # [T, R]: the ancestors' ring slots
    tree_positions = torch.zeros_like(ids[0]).index_copy(0, ring_slots, query)  # [R]
    keys = torch.where(committed, ids - low.unsqueeze(1), tree_positions.unsqueeze(0))  # [T, R]: key positions
    allowed: torch.Tensor = (committed | tree) & (keys > (query - window).unsqueeze(1))
    return allowed


def bucket_masks(mixed: bool, full: Any, windowed: Any) -> Any:
    """The ``attention_mask`` of a bucket's forward: the sliding layers' mask alone when every layer is sliding
    (Mistral), else a dict keyed by layer type, which the mixed models' forwards take as their masks."""
    return {FULL: full, SLIDING: windowed} if mixed else windowed


# -- the hooks ModelVerifier calls ---------------------------------------------------------------------------


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


def rewind(verifier: Any, state: Any, committed_len: int) -> bool:
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
        state.cache = new_cache(verifier.model.config, cache.slack)
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
    input_ids = torch.tensor([tokens], dtype=torch.long, device=verifier.device)
    with torch.inference_mode():
        fresh, _ = verifier.prefill(input_ids, keep_all=False, reserve=0)  # records and trims (after_prefill)
    state.cache = fresh
    return True


def bucket_rewind(verifier: Any, place: int, committed_len: int) -> None:
    """The sequence at ``place`` (0 for a lone sequence; a batch row's seat) of a bucket engine's ``verifier``
    rewinds to ``committed_len`` tokens: when its place's ring no longer holds the keys the shorter sequence
    needs (a later forward wrote over them), its committed tokens run again through a prompt forward into the
    same place (exact: what a fresh prefill of the shorter sequence writes)."""
    cache = verifier.cache
    if not cache.ring:
        return
    cache.truncate(place, committed_len)
    if committed_len == 0 or cache.sliding is None or cache.ring_keeps(place, committed_len, cache.sliding[0]):
        return
    tokens = cache.committed_tokens(place)
    if len(tokens) != committed_len:
        raise AssertionError(f"a ring's log holds {len(tokens)} of the {committed_len} committed tokens")
    base = place * cache.span
    input_ids = torch.tensor([tokens], dtype=torch.long, device=verifier.device)
    bounds = None if base == 0 else torch.full((2, committed_len), base, dtype=torch.int64, device=verifier.device)
    window, cache.window = cache.window, None  # every slot: the prompt's attention spans all its tokens
    try:
        with torch.inference_mode():
            verifier.prompt_forward(input_ids, False, base, bounds)
    finally:
        cache.window = window
    cache.rewritten(place, committed_len)
