"""Sliding-window attention: which layers of a model slide, over what window (Mistral, Gemma 2/3, gpt-oss).

A sliding-window layer of window ``W`` lets the token at position ``q`` attend to the keys at
positions ``q - W < k <= q`` (Hugging Face's ``sliding_window_overlay``). What this module says of
a model is one value, :class:`SlidingWindow` (each layer's type and the window), or None for a
model of full-attention layers only; :func:`engine_window` gives it for an engine, refusing what
that engine cannot verify. The forwards that run such models take it as a constructor argument
and own what it takes:

- ``engine="hf"`` (:mod:`specdec.backends.hf.windows`): Hugging Face's ``DynamicCache`` with its
  sliding layers recording the past, compacted and trimmed after each acceptance, window masks for
  the tree, and rewinds past what a layer kept run again through a prefill;
- the fixed-shape buckets (:mod:`specdec.backends.buckets.windows`): a static cache whose sliding
  layers are rings of ``window - 1 + the largest tree`` slots per sequence, their masks built inside
  the bucket's forward, and a rewind past what a ring holds runs the committed tokens again.

Not here: chunked attention (Llama 4: ``chunked_attention`` layers share the cache class but
not the mask), layers of several window sizes, and linear-attention / state-space layers
(their recurrent state cannot be cropped back to the accepted length): all refused with
:class:`~specdec.errors.UnsupportedModelError`. specdec's own forward does not run
sliding-window models (:func:`engine_window`); on a CPU ``engine='auto'`` picks Hugging Face's
forward for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from specdec.errors import UnsupportedModelError

FULL = "full_attention"
SLIDING = "sliding_attention"


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


@dataclass(frozen=True)
class SlidingWindow:
    """A model's sliding-window layout: ``layer_types``, each layer's (:data:`FULL` or :data:`SLIDING`), and
    ``window``, the sliding layers' one window (tokens)."""

    layer_types: tuple[str, ...]
    window: int

    @property
    def mixed(self) -> bool:
        """Full-attention layers beside the sliding ones (Gemma 2/3, gpt-oss): the forward takes a dict of masks."""
        return FULL in self.layer_types

    @property
    def sliding_layers(self) -> list[bool]:
        """Whether each layer slides."""
        return [kind == SLIDING for kind in self.layer_types]


def window_of(model: Any) -> SlidingWindow | None:
    """``model``'s :class:`SlidingWindow`, or None when every layer is full attention (:func:`layout`)."""
    config = getattr(model, "config", None)
    found = None if config is None else layout(config)
    return None if found is None else SlidingWindow(tuple(found[0]), found[1])


# A forward's ``window=`` argument: a layout, None (full attention only), or "model": the model's own, checked for the
# forward's engine (engine_window), which is what every forward takes unless a test says otherwise.
WindowArg = SlidingWindow | None | Literal["model"]


def forward_window(window: WindowArg, model: Any, engine: str) -> SlidingWindow | None:
    """The layout a forward of ``engine`` runs ``model`` with: ``window`` as given, or for ``"model"`` the model's own
    (:func:`engine_window`, which refuses what the engine cannot verify)."""
    return engine_window(model, engine) if isinstance(window, str) else window


def engine_window(model: Any, engine: str) -> SlidingWindow | None:
    """``model``'s :class:`SlidingWindow` for a forward of ``engine`` (``"hf"``, ``"specdec"``, ``"buckets"``
    for every fixed-shape one), refusing with a clear error what that engine cannot verify: layers no cache
    here can roll back (linear attention, state-space: :func:`layout`), sliding-window layers on specdec's own
    forward (it runs full-attention layers only), and on Hugging Face's forward where this transformers'
    sliding layers cannot record the past (:func:`records_the_past`)."""
    window = window_of(model)
    reason = window_reason(model)
    if engine == "specdec" and reason is not None:
        raise UnsupportedModelError(
            f"engine={engine!r} does not run this model ({reason}): specdec's own forward holds full-attention "
            "layers only; use engine='hf' (what engine='auto' picks for this model on a CPU) or engine='buckets'"
        )
    if engine == "hf" and window is not None and not records_the_past():
        import transformers

        raise UnsupportedModelError(
            f"sliding-window models need a transformers whose sliding cache layers can record the past "
            f"(DynamicSlidingWindowLayer.activate_past_recording, in 5.24; not in 5.0.0), so that a rejected draft "
            f"can be taken back; this is transformers {transformers.__version__} (engine='buckets' runs these models "
            "on it: a static cache whose sliding layers keep a ring of the window plus the largest tree)"
        )
    return window
