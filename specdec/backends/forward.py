"""The parts a verifier is composed of, and what they share (:mod:`specdec.backends.verifier`).

:class:`Forward` is what runs the model's forward and keeps the KV cache it writes (one per
engine: :class:`~specdec.backends.hf.forward.HFForward`,
:class:`~specdec.backends.specdec_engine.forward.SpecdecForward`,
:class:`~specdec.backends.buckets.forward.BucketForward`, :class:`~specdec.backends.buckets.rows.RowsForward`);
:class:`KVState` is a sequence's state, the same for every forward; :class:`Target` is what every
part reads of the model (:func:`check_model` refuses the models verification would get wrong).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from specdec.errors import UnsupportedModelError
from specdec.models import SUPPORTED_ATTENTION, cache_keyword
from specdec.sampling import Greedy
from specdec.types import DEFAULT_KERNEL, DraftTree, KernelChoice, TokenChooser


@dataclass
class KVState:
    """Per-sequence verifier state: the KV cache, how many committed tokens it holds, and
    how this sequence's tokens are decided (chooser, repetition penalty).

    ``presence`` (bool ``[V]``, only with a repetition penalty) marks every committed token;
    ``seat``: where the sequence sits in its forward's cache (:class:`Forward`: the number of the
    prefill that made it on a one-sequence static cache, its place on a batch's shared one; else 0).
    """

    cache: Any  # the forward's: a transformers DynamicCache, or a StaticKVCache; None once released
    committed_len: int
    chooser: TokenChooser = field(default_factory=Greedy)
    repetition_penalty: float = 1.0
    presence: torch.Tensor | None = None
    seat: int = 0


def attention_shape(config: Any) -> tuple[int, int | None, int, int] | None:
    """``(layers, query heads, KV heads, head dim)`` from a model's config (the head dim, where the config
    does not give it, is the hidden size over the query heads); None where it does not say the layers, the
    KV heads or the head dim. The query heads are None where only the KV heads are given."""
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None)
    hidden = getattr(config, "hidden_size", None)
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads
    if not (isinstance(layers, int) and isinstance(kv_heads, int) and isinstance(head_dim, int)):
        return None
    return layers, heads if isinstance(heads, int) else None, kv_heads, head_dim


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int | None:
    """Bytes of keys and values one token holds in every layer, from the model's config; None if it does not say."""
    shape = attention_shape(config)
    if shape is None:
        return None
    layers, _, kv_heads, head_dim = shape
    itemsize = torch.empty((), dtype=dtype).element_size()
    return max(layers, 0) * 2 * max(kv_heads, 0) * max(head_dim, 0) * itemsize


def check_model(model: Any) -> None:
    """Refuse models whose verification would be silently wrong; the message says what to use."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "forward"):
        raise UnsupportedModelError(f"expected a Hugging Face causal LM, got {type(model).__name__}")
    implementation = getattr(config, "_attn_implementation", None) or "eager"
    if implementation not in SUPPORTED_ATTENTION:
        raise UnsupportedModelError(
            f"attention implementation {implementation!r} ignores the 4D tree-attention mask that verification "
            "needs; load the model with attn_implementation='sdpa' (or 'eager'), or call "
            "model.set_attn_implementation('sdpa')"
        )
    if getattr(model, "training", False):
        raise UnsupportedModelError(
            "the model is in training mode (dropout would change its outputs): call model.eval()"
        )
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            "encoder-decoder models are not supported: specdec verifies decoder-only causal LMs"
        )


@dataclass(frozen=True)
class Target:
    """What every part of a verifier reads of the model it runs (:meth:`of` checks the model first).

    ``cache_keyword``: ``"cache"`` or ``"past_key_values"``, as this transformers names it;
    ``additive_dtype``: the mask dtype eager attention adds to its scores (None: sdpa takes bool masks).
    """

    model: Any
    device: torch.device
    dtype: torch.dtype
    cache_keyword: str
    additive_dtype: torch.dtype | None

    @classmethod
    def of(cls, model: Any) -> Target:
        check_model(model)
        parameter = next(model.parameters())
        implementation = getattr(model.config, "_attn_implementation", None) or "eager"
        # Eager attention adds the mask to its scores, so it needs the additive form; sdpa takes bool.
        additive = parameter.dtype if implementation == "eager" else None
        return cls(model, parameter.device, parameter.dtype, cache_keyword(model), additive)


class ForwardFacts(Protocol):
    """What a :class:`Forward` is: fixed when it is made, or read off its state (the verifier's description,
    calibration keys and the batch planner read them from ``verifier.forward``)."""

    target: Target

    @property
    def engine(self) -> str:
        """What runs the forward (:data:`specdec.backends.ENGINES`)."""
        ...

    @property
    def cache_kind(self) -> str:
        """The forward's kind in calibration keys."""
        ...

    @property
    def max_tree_nodes(self) -> int | None:
        """The most nodes one tree may have (None: no limit of its own)."""
        ...

    @property
    def buckets(self) -> tuple[int, ...] | None:
        """The tree sizes with a forward of their own (None: every size)."""
        ...

    @property
    def live_limit(self) -> int | None:
        """How many sequences it holds at once (None: no limit of its own)."""
        ...

    @property
    def fallback_reason(self) -> str | None:
        """Why compiled or captured forwards gave way to eager ones (None: they did not, or there are none)."""
        ...

    def identity(self) -> dict[str, str]:
        """What a forward's cost depends on beyond the model's identity (added to it)."""
        ...

    def row_bytes(self, tokens: int) -> int | None:
        """Peak KV-cache bytes one sequence of ``tokens`` tokens adds (None: unknown, or nothing per sequence)."""
        ...


class ForwardKernels(Protocol):
    """Which kernels a :class:`Forward` runs: the variants it has, the choice in force (the verifier checks
    it against :attr:`KERNELS`) and the build behind them."""

    kernels: KernelChoice

    @property
    def KERNELS(self) -> tuple[str, ...]:
        """The kernel variants it can run."""
        ...

    @property
    def kernel_path(self) -> str:
        """The CPU kernels' path its forwards take (``"-"``: not specdec's CPU kernels)."""
        ...

    def kernel_variants(self, rows: int) -> tuple[str, ...]:
        """The kernel variants a forward over ``rows`` tokens can run (``"default"`` first)."""
        ...

    def kernels_build(self) -> str:
        """The build of the CPU kernels it runs and their path (``"-"``: none; a calibration key)."""
        ...


class ForwardSteps(Protocol):
    """A sequence's steps through a :class:`Forward`: its prefill, each tree's forward, the accepted path's
    compaction, rewinds and its end. A state's ``cache`` is the forward's: it makes it (:meth:`prefill`),
    writes it and compacts it."""

    def prefill(self, input_ids: torch.Tensor, *, keep_all: bool, reserve: int) -> tuple[Any, torch.Tensor]:
        """Run ``input_ids`` ``[1, L]`` into a new sequence's cache: ``(cache, logits [L or 1, V])``;
        ``reserve``: how many more tokens the sequence may grow by."""
        ...

    def opened(self, state: KVState) -> None:
        """``state`` is the new sequence the latest :meth:`prefill` made."""
        ...

    def tree(self, state: KVState, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward over ``tree`` after the state's committed tokens: logits ``[N, V]``, positions int64
        ``[N]``; its KV written."""
        ...

    def rows(self, states: Sequence[KVState], trees: Sequence[DraftTree]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Every row's tree in one call: logits ``[R, V]`` and positions int64 ``[R]``, tree after tree
        (``R = sum N_b``); None: it verifies one row at a time (:meth:`tree`)."""
        ...

    def compact(self, state: KVState, committed_len: int, path: Sequence[int]) -> None:
        """Keep only the accepted path's KV (slot ``committed_len + path[i]`` to ``committed_len + i``)."""
        ...

    def rewind(self, state: KVState, committed_len: int) -> None:
        """Forget the state's committed tokens past ``committed_len`` (checked by the verifier)."""
        ...

    def release(self, state: KVState) -> None:
        """The sequence is over (its ``cache`` is dropped by the verifier afterwards)."""
        ...


@runtime_checkable
class FeatureForward(Protocol):
    """A forward that can also hand over the model's **features**: its last hidden state after the final
    norm (the LM head's input), float ``[rows, H]`` in the model's dtype. What feature-reading drafters
    (the EAGLE head) draft from; a forward without these methods hands over none.

    Implemented by :class:`~specdec.backends.hf.forward.HFForward` and
    :class:`~specdec.backends.specdec_engine.forward.SpecdecForward`; the fixed-shape buckets return logits
    only (their compiled functions and captured graphs have one output).
    """

    def prefill_features(
        self, input_ids: torch.Tensor, *, keep_all: bool, reserve: int
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """:meth:`ForwardSteps.prefill`, and the features of every prompt position ``[L, H]``."""
        ...

    def tree_features(self, state: KVState, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`ForwardSteps.tree`, and the features of every node ``[N, H]``."""
        ...


class ForwardLifecycle(Protocol):
    """A :class:`Forward`'s life beyond one sequence: blocks that must leave the live sequences as they were,
    and its end."""

    def preserving(self) -> AbstractContextManager[None]:
        """A block whose prefills and verifications leave every live sequence as it was."""
        ...

    def close(self) -> None:
        """Done with the forward: what it holds on the device may go back to the model's pool."""
        ...


class Forward(ForwardFacts, ForwardKernels, ForwardSteps, ForwardLifecycle, Protocol):
    """What runs the model's forward for a :class:`~specdec.backends.verifier.ModelVerifier`, and the KV
    cache it writes: its facts, its kernels, a sequence's steps and its lifecycle, each a protocol of its own.

    One per engine: Hugging Face's own forward on a ``DynamicCache``
    (:class:`~specdec.backends.hf.forward.HFForward`), specdec's own
    (:class:`~specdec.backends.specdec_engine.forward.SpecdecForward`), the fixed-shape
    buckets on one static cache (:class:`~specdec.backends.buckets.forward.BucketForward`) and on a cache
    shared by a batch's rows (:class:`~specdec.backends.buckets.rows.RowsForward`).
    """


class ModelKernels:
    """The kernels of a forward that calls the model's own modules: the default ones only."""

    KERNELS: tuple[str, ...] = (DEFAULT_KERNEL,)
    kernel_path = "-"  # not specdec's CPU kernels

    def kernel_variants(self, rows: int) -> tuple[str, ...]:
        """``("default",)`` at every size."""
        del rows
        return (DEFAULT_KERNEL,)

    def kernels_build(self) -> str:
        """``"-"``: no CPU kernels of specdec's."""
        return "-"
