"""Verification of draft trees with a Hugging Face causal LM: one verifier, composed of parts.

:class:`ModelVerifier` is the :class:`~specdec.types.Verifier` of every engine. It does the
step (prefill, verify, commit, rewind, release; a batch's rows in :meth:`~ModelVerifier.verify_batch`)
by calling three parts:

- a :class:`Forward`: what runs the model's forward and the KV cache it writes (new sequence,
  tree forward, compaction, rewind, release, capacity): :class:`HFForward` (``engine="hf"``,
  Hugging Face's own forward on a ``DynamicCache``), :class:`~specdec.backends.runner_verifier.NativeForward`
  (``"specdec"``), :class:`~specdec.backends.static.BucketForward` (the fixed-shape buckets:
  ``"compiled"``, ``"graphs"``, ...) and :class:`~specdec.backends.static_rows.RowsForward` (the
  buckets with a batch's rows on one cache);
- :class:`TreeOps`: the three tree operations (inputs, acceptance, compaction), the compiled
  ``cuda_ext`` ones or :class:`TorchTreeOps`, the readable reference they are diffed against;
- a token chooser (greedy by default; sampling and a repetition penalty per sequence).

**Kernels**: the forward says which kernel variants it runs (:attr:`Forward.KERNELS`; the
model's own forward: the default only), and runs the :class:`~specdec.types.KernelChoice`
it is given (:meth:`ModelVerifier.use_kernels`).

**The user's model is never changed**: no layer, attention function or config entry of it is
swapped, not even for the length of one forward (another thread may be running the same
model), and nothing of it is wrapped or written to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from specdec.backends import sliding
from specdec.backends.identity import model_identity, weights_fingerprint
from specdec.backends.topk import topk_ids
from specdec.backends.tree import ancestor_matrix, tree_attention_inputs
from specdec.errors import SpecDecError, UnsupportedModelError
from specdec.models import SUPPORTED_ATTENTION, cache_keyword, context_length
from specdec.sampling import Greedy, apply_repetition_penalty, penalty_mask
from specdec.types import (
    DEFAULT_KERNEL,
    DraftTree,
    Feedback,
    KernelChoice,
    TokenChooser,
    Verification,
    VerifierDescription,
)


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


@dataclass(frozen=True)
class Acceptance:
    """What :meth:`TreeOps.accept` returns, all on the host.

    ``path``: accepted node indices, root first; ``bonus``: the model's token after the
    path's last node; ``topk``: int64 ``[N, k]`` top ids per node, value descending, ties to the
    lower id (:func:`~specdec.backends.topk.topk_ids`; None when k == 0).
    """

    path: tuple[int, ...]
    bonus: int
    topk: np.ndarray[Any, np.dtype[np.int64]] | None


class TreeOps(Protocol):
    """The three tree operations a verification step needs."""

    name: str

    def tree_inputs(
        self, tree: DraftTree, committed_len: int, device: torch.device, additive_dtype: torch.dtype | None
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """``(mask [1, 1, N, C+N] or None, position_ids int64 [1, N])``."""
        ...

    def accept(
        self, tree: DraftTree, logits: torch.Tensor, positions: torch.Tensor, chooser: TokenChooser, topk: int
    ) -> Acceptance:
        """Choose the model's token at every node (``logits`` float ``[N, V]``) and walk the tree."""
        ...

    def compact(self, cache: Any, committed_len: int, path: Sequence[int]) -> None:
        """Keep only the path's KV: slot ``committed_len + path[i]`` moves to ``committed_len + i``."""
        ...

    def accept_rows(
        self, trees: Sequence[DraftTree], logits: torch.Tensor, positions: torch.Tensor,
        choosers: Sequence[TokenChooser], topk: int,
    ) -> list[Acceptance]:
        """:meth:`accept` for ``B`` trees whose nodes are consecutive rows of ``logits`` float ``[R, V]``
        and ``positions`` int64 ``[R]`` (``R`` the sum of the trees' sizes), tree ``b`` decided by ``choosers[b]``."""
        ...


def accept_each(
    ops: TreeOps, trees: Sequence[DraftTree], logits: torch.Tensor, positions: torch.Tensor,
    choosers: Sequence[TokenChooser], topk: int,
) -> list[Acceptance]:
    """:meth:`TreeOps.accept_rows` as one :meth:`TreeOps.accept` per tree (the reference; O(R * V))."""
    acceptances = []
    offset = 0
    for tree, chooser in zip(trees, choosers, strict=True):
        rows = slice(offset, offset + tree.size)
        offset += tree.size
        acceptances.append(ops.accept(tree, logits[rows], positions[rows], chooser, topk))
    return acceptances


class TorchTreeOps:
    """Reference tree operations in plain PyTorch/NumPy; the oracle for compiled ops."""

    name = "torch"

    def tree_inputs(
        self, tree: DraftTree, committed_len: int, device: torch.device, additive_dtype: torch.dtype | None
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        return tree_attention_inputs(tree, committed_len, device=device, additive_dtype=additive_dtype)

    def accept(
        self, tree: DraftTree, logits: torch.Tensor, positions: torch.Tensor, chooser: TokenChooser, topk: int
    ) -> Acceptance:
        # positions[i] is node i's position; the token chosen there sits one further.
        choices: list[int] = chooser.choose(logits, positions + 1).tolist()  # host sync: the walk needs them
        path = tree.walk(choices)
        top = None
        if topk > 0:
            top = topk_ids(logits, topk).cpu().numpy()  # value descending, ties to the lower id
        return Acceptance(path, choices[path[-1]], top)

    def compact(self, cache: Any, committed_len: int, path: Sequence[int]) -> None:
        keep = committed_len + len(path)
        first_moved = next((i for i, node in enumerate(path) if node != i), None)
        for layer in cache.layers:
            if first_moved is not None:
                # Accepted nodes that are not already in place: gather their slots, write them down.
                device = layer.keys.device
                src = torch.tensor([committed_len + node for node in path[first_moved:]], device=device)
                dst = slice(committed_len + first_moved, keep)
                layer.keys[:, :, dst] = layer.keys.index_select(2, src)
                layer.values[:, :, dst] = layer.values.index_select(2, src)
            layer.keys = layer.keys[:, :, :keep]
            layer.values = layer.values[:, :, :keep]

    def accept_rows(
        self, trees: Sequence[DraftTree], logits: torch.Tensor, positions: torch.Tensor,
        choosers: Sequence[TokenChooser], topk: int,
    ) -> list[Acceptance]:
        return accept_each(self, trees, logits, positions, choosers, topk)


def _decision_precision(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits are decided in float32, as ``generate`` does; fp32/fp64 stay as they are."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int | None:
    """Bytes of keys and values one token holds in every layer, from the model's config; None if it does not say."""
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None)
    hidden = getattr(config, "hidden_size", None)
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads
    if not (isinstance(layers, int) and isinstance(kv_heads, int) and isinstance(head_dim, int)):
        return None
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


class Forward(Protocol):
    """What runs the model's forward for a :class:`ModelVerifier`, and the KV cache it writes.

    One per engine: Hugging Face's own forward on a ``DynamicCache`` (:class:`HFForward`),
    specdec's own (:class:`~specdec.backends.runner_verifier.NativeForward`), the fixed-shape
    buckets on one static cache (:class:`~specdec.backends.static.BucketForward`) and on a cache
    shared by a batch's rows (:class:`~specdec.backends.static_rows.RowsForward`). A state's
    ``cache`` is the forward's: it makes it (:meth:`prefill`), writes it and compacts it.
    """

    target: Target
    kernels: KernelChoice  # the kernel choice in force (the verifier checks it against KERNELS)

    @property
    def KERNELS(self) -> tuple[str, ...]:
        """The kernel variants it can run."""
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
    def engine(self) -> str:
        """What runs the forward (:data:`specdec.backends.ENGINES`)."""
        ...

    @property
    def cache_kind(self) -> str:
        """The forward's kind in calibration keys."""
        ...

    @property
    def kernel_path(self) -> str:
        """The CPU kernels' path its forwards take (``"-"``: not specdec's CPU kernels)."""
        ...

    @property
    def fallback_reason(self) -> str | None:
        """Why compiled or captured forwards gave way to eager ones (None: they did not, or there are none)."""
        ...

    @property
    def live_limit(self) -> int | None:
        """How many sequences it holds at once (None: no limit of its own)."""
        ...

    def identity(self) -> dict[str, str]:
        """What a forward's cost depends on beyond the model's identity (added to it)."""
        ...

    def kernel_variants(self, rows: int) -> tuple[str, ...]:
        """The kernel variants a forward over ``rows`` tokens can run (``"default"`` first)."""
        ...

    def kernels_build(self) -> str:
        """The build of the CPU kernels it runs and their path (``"-"``: none; a calibration key)."""
        ...

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

    def preserving(self) -> AbstractContextManager[None]:
        """A block whose prefills and verifications leave every live sequence as it was."""
        ...

    def row_bytes(self, tokens: int) -> int | None:
        """Peak KV-cache bytes one sequence of ``tokens`` tokens adds (None: unknown, or nothing per sequence)."""
        ...

    def close(self) -> None:
        """Done with the forward: what it holds on the device may go back to the model's pool."""
        ...


class ModelVerifier:
    """Runs the target model: prefill and tree verification, one sequence or a batch of rows at a time.

    Its parts: a :class:`Forward` (what runs the model's forward and keeps the KV cache;
    :class:`HFForward`, Hugging Face's own, by default), ``ops`` (:class:`TreeOps`: mask and
    positions, acceptance, compaction; reference or compiled) and ``chooser``, the default way
    of deciding the model's token at each node (greedy); :meth:`prefill` can set another per
    sequence (sampling, a repetition penalty). The step (prefill, verify, commit, rewind,
    release) is this class's; everything that differs between engines is the forward's.
    """

    def __init__(
        self, model: Any, ops: TreeOps | None = None, chooser: TokenChooser | None = None, *,
        forward: Forward | None = None,
    ) -> None:  # fmt: skip
        self.ops: TreeOps = ops or TorchTreeOps()
        self.forward: Forward = forward or HFForward(Target.of(model), self.ops)
        if self.forward.target.model is not model:
            raise SpecDecError("the forward was made for another model")
        self.model = model
        self.chooser: TokenChooser = chooser or Greedy()
        self.device = self.forward.target.device
        self.dtype = self.forward.target.dtype
        self.cache_keyword = self.forward.target.cache_keyword
        self.additive_dtype = self.forward.target.additive_dtype
        self.context_length = context_length(model)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])

    # -- what the verifier is ------------------------------------------------------------------
    @property
    def cache_kind(self) -> str:
        """The forward's kind in calibration keys (``"dynamic"``, ``"native"``, ``"static-<mode>"``)."""
        return self.forward.cache_kind

    @property
    def engine(self) -> str:
        """What runs the forward (:data:`specdec.backends.ENGINES`)."""
        return self.forward.engine

    @property
    def name(self) -> str:
        return self.ops.name

    @property
    def kernel_path(self) -> str:
        """The CPU kernels' path this verifier's forwards take (``"-"``: the model's own forward)."""
        return self.forward.kernel_path

    @property
    def max_tree_nodes(self) -> int | None:
        """The most nodes one verification takes (None: no limit of the verifier's own)."""
        return self.forward.max_tree_nodes

    @property
    def buckets(self) -> tuple[int, ...] | None:
        """The tree sizes with a forward of their own (None: every tree size runs a forward of its own)."""
        return self.forward.buckets

    @property
    def fallback_reason(self) -> str | None:
        """Why compiled or captured forwards gave way to eager ones (None: they did not)."""
        return self.forward.fallback_reason

    @property
    def description(self) -> VerifierDescription:
        """What this verifier is (:class:`~specdec.types.VerifierDescription`), as it is now."""
        return VerifierDescription(self.engine, self.name, self.device, self.dtype, self.vocab_size,
                                   self.context_length, self.max_tree_nodes, self.kernel_path)  # fmt: skip

    def identity(self) -> dict[str, str]:
        """What a verification's cost depends on (:func:`~specdec.backends.identity.model_identity`, and the
        forward's own part of it)."""
        identity = model_identity(self.model, dtype=self.dtype, device=self.device, backend=self.name,
                                  cache=self.cache_kind)  # fmt: skip
        identity.update(self.forward.identity())
        return identity

    def weights_fingerprint(self) -> str:
        """A hash of the model's weights (:func:`~specdec.backends.identity.weights_fingerprint`)."""
        return weights_fingerprint(self.model)

    # -- kernels -------------------------------------------------------------------------------
    @property
    def KERNELS(self) -> tuple[str, ...]:
        """The kernel variants this verifier's forward can run."""
        return self.forward.KERNELS

    @property
    def kernels(self) -> KernelChoice:
        """The kernel choice in force (module docstring)."""
        return self.forward.kernels

    def kernel_variants(self, rows: int) -> tuple[str, ...]:
        """The variants a forward over ``rows`` tokens can run (``("default",)``: the model's own forward)."""
        return self.forward.kernel_variants(rows)

    def kernels_build(self) -> str:
        """The build and path of the CPU kernels the forward runs, ``"-"`` where none (part of the calibration's
        identity: :func:`~specdec.budget.calibration.calibration_identity`)."""
        return self.forward.kernels_build()

    def use_kernels(self, choice: KernelChoice) -> None:
        """Run each later forward with the variant ``choice`` names for its size.

        A variant this verifier knows (:attr:`KERNELS`) but does not offer for a size, or on
        this model, runs the default kernels; a name it does not know is an error.
        """
        unknown = [v for v in choice.variants() if v not in self.KERNELS]
        if unknown:
            known = ", ".join(self.KERNELS)
            raise SpecDecError(f"unknown kernel variant {unknown[0]!r}; this verifier runs {known}")
        self.forward.kernels = choice

    # -- the step ------------------------------------------------------------------------------
    def _check_tokens(self, tokens: Sequence[int]) -> None:
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise SpecDecError(f"token id {bad[0]} is outside the model's vocabulary [0, {self.vocab_size})")

    def _check_prompt(self, prompt: Sequence[int]) -> None:
        if len(prompt) == 0:
            raise SpecDecError("the prompt is empty: give at least one token")
        self._check_tokens(prompt)
        if self.context_length is not None and len(prompt) > self.context_length:
            raise SpecDecError(
                f"the prompt has {len(prompt)} tokens, past the model's context length of {self.context_length}"
            )

    def prefill(
        self,
        prompt: Sequence[int],
        prompt_topk: int = 0,
        *,
        chooser: TokenChooser | None = None,
        repetition_penalty: float = 1.0,
        reserve: int = 0,
    ) -> tuple[KVState, int, Feedback | None]:
        """Run the prompt; return the state, the first pending token and optional per-position feedback.

        Only the last position's logits are computed unless ``prompt_topk`` asks for the
        model's top ids after every prompt token (Token Recycling's warm start).
        ``chooser`` and ``repetition_penalty`` decide this sequence's tokens from here on.
        ``reserve``: how many more tokens the sequence may grow by (a static cache sizes
        itself for them; the dynamic cache grows as it goes and ignores it).
        """
        self._check_prompt(prompt)
        input_ids = torch.tensor([list(prompt)], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            cache, logits = self.forward.prefill(input_ids, keep_all=prompt_topk > 0, reserve=reserve)
            logits = _decision_precision(logits)  # [L or 1, V]
            state = KVState(cache, len(prompt), chooser or self.chooser, float(repetition_penalty))
            self.forward.opened(state)
            last = logits[-1:]
            if state.repetition_penalty != 1.0:
                state.presence = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
                state.presence[input_ids[0]] = True
                last = apply_repetition_penalty(last, state.presence.unsqueeze(0), state.repetition_penalty)
            position = torch.tensor([len(prompt)], device=self.device)
            pending = int(state.chooser.choose(last, position)[0])
            feedback = None
            if prompt_topk:
                top = topk_ids(logits, prompt_topk).cpu().numpy()
                feedback = Feedback(np.asarray(prompt, dtype=np.int64), top)
        return state, pending, feedback

    def verify(self, state: KVState, tree: DraftTree, topk: int = 0) -> Verification:
        """One forward over ``tree`` after ``state.committed_len`` tokens; commits the accepted path."""
        self._check_row(state, tree)
        with torch.inference_mode():
            logits, positions = self.forward.tree(state, tree)  # [N, V], int64 [N]
            (acceptance,) = self._accept([state], [tree], logits, positions, topk)
            return self._commit(state, tree, acceptance)

    @property
    def live_limit(self) -> int | None:
        """How many sequences this verifier holds at once (None: each sequence owns its cache)."""
        return self.forward.live_limit

    def verify_batch(self, states: Sequence[KVState], trees: Sequence[DraftTree], topk: int = 0) -> list[Verification]:
        """Every row's tree, then each row's choices, walk and compaction in its own cache or region.

        Where the forward verifies many rows in one call (:meth:`Forward.rows`), one forward over
        all of them; else :meth:`verify` for every row, one row after another (the model's own
        forward takes one sequence per cache: each row's result is exactly its own verification).
        """
        self._check_rows(states, trees)
        with torch.inference_mode():
            joint = self.forward.rows(states, trees)
            if joint is not None:
                logits, positions = joint
                acceptances = self._accept(states, trees, logits, positions, topk)
                return [self._commit(s, t, a) for s, t, a in zip(states, trees, acceptances, strict=True)]
        return [self.verify(state, tree, topk) for state, tree in zip(states, trees, strict=True)]

    def row_bytes(self, tokens: int) -> int | None:
        """Peak KV-cache bytes one sequence of ``tokens`` tokens adds (:meth:`Forward.row_bytes`)."""
        return self.forward.row_bytes(tokens)

    def _check_row(self, state: KVState, tree: DraftTree) -> None:
        if state.cache is None:
            raise SpecDecError("this sequence was released: it cannot be verified any more")
        self._check_tokens(tree.tokens)

    def _check_rows(self, states: Sequence[KVState], trees: Sequence[DraftTree]) -> None:
        if len(states) != len(trees):
            raise SpecDecError(f"verify_batch: {len(states)} states but {len(trees)} trees")
        if len({id(state) for state in states}) != len(states):
            raise SpecDecError("verify_batch: a sequence appears twice in one batch")
        for state, tree in zip(states, trees, strict=True):
            self._check_row(state, tree)

    def _accept(
        self, states: Sequence[KVState], trees: Sequence[DraftTree], logits: torch.Tensor, positions: torch.Tensor,
        topk: int,
    ) -> list[Acceptance]:
        """Each row's choices and walk: tree ``b``'s nodes are consecutive rows of ``logits`` float ``[R, V]``
        and ``positions`` int64 ``[R]``; a row's repetition penalty applies to its own rows only."""
        logits = _decision_precision(logits)
        if any(state.presence is not None for state in states):
            parts, offset = [], 0
            for state, tree in zip(states, trees, strict=True):
                part = logits[offset : offset + tree.size]  # [N_b, V]
                offset += tree.size
                if state.presence is not None:
                    mask = penalty_mask(state.presence, tree.tokens, ancestor_matrix(tree.parents))
                    part = apply_repetition_penalty(part, mask, state.repetition_penalty)
                parts.append(part)
            logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        return self.ops.accept_rows(trees, logits, positions, [state.chooser for state in states], topk)

    def _commit(self, state: KVState, tree: DraftTree, acceptance: Acceptance) -> Verification:
        """Keep the accepted path's KV and count it committed (inside ``inference_mode``: ``presence`` is
        an inference tensor)."""
        committed = state.committed_len
        self.forward.compact(state, committed, acceptance.path)
        if state.presence is not None:
            state.presence[torch.tensor([tree.tokens[i] for i in acceptance.path], device=self.device)] = True
        state.committed_len = committed + len(acceptance.path)
        feedback = None
        if acceptance.topk is not None:
            feedback = Feedback(np.asarray(tree.tokens, dtype=np.int64), acceptance.topk, acceptance.path)
        accepted_tokens = tuple(tree.tokens[i] for i in acceptance.path)
        return Verification(acceptance.path, accepted_tokens, acceptance.bonus, feedback)

    def rewind(self, state: KVState, committed_len: int) -> None:
        """Forget the committed tokens past ``committed_len`` (calibration reuses one prefill for many steps)."""
        if not 0 <= committed_len <= state.committed_len:
            raise SpecDecError(f"cannot rewind {state.committed_len} committed tokens to {committed_len}")
        self.forward.rewind(state, committed_len)
        state.committed_len = committed_len

    def release(self, state: KVState) -> None:
        """The sequence is over: its KV cache is dropped (verifying it again is an error)."""
        self.forward.release(state)
        state.cache = None

    def close(self) -> None:
        """Done with this verifier: its forward's device state may go back to the model's pool (a static
        cache's; using the verifier afterwards is then an error)."""
        self.forward.close()

    def warm_up(self, max_tokens: int, on_bucket: Callable[[int], None] | None = None) -> None:
        """Pay the one-time costs of verifying sequences of up to ``max_tokens`` tokens now.

        Nothing to do where every tree size runs a forward of its own, as it comes
        (:attr:`buckets` None). Else every bucket's forward is compiled or captured: the cache
        is grown to the capacity those sequences need (so no later request of that length
        regrows it and recompiles), and each bucket runs once on a throw-away sequence; a live
        sequence is kept (:meth:`preserving`). Compiled code is cached on disk by inductor
        (:mod:`specdec.backends.compile_cache`), so a later process pays much less than the
        first. ``on_bucket(size)`` is called after each bucket (progress).
        """
        if self.buckets is None:
            return
        if max_tokens < 1:
            raise SpecDecError(f"warm_up needs a positive token count, got {max_tokens}")
        with self.preserving(), torch.inference_mode():
            state, pending, _ = self.prefill([0], reserve=max_tokens)
            for size in self.buckets:
                self.verify(state, DraftTree.chain(pending, [pending] * (size - 1)))
                self.rewind(state, 1)
                if on_bucket is not None:
                    on_bucket(size)

    @contextmanager
    def preserving(self) -> Iterator[None]:
        """A block whose prefills and verifications leave every live sequence as it was (nothing to keep
        where each sequence owns its cache; a static cache keeps its live sequence or rows)."""
        with self.forward.preserving():
            yield


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


class HFForward(ModelKernels):
    """``engine="hf"``: Hugging Face's own forward (``model(...)``), eager, a ``DynamicCache`` per
    sequence (a sliding-window model's: :class:`~specdec.backends.sliding.WindowedCache`), with the
    default kernels; masks and compaction by the verifier's tree ops."""

    engine = "hf"
    cache_kind = "dynamic"  # a Hugging Face DynamicCache per sequence, eager forwards
    fallback_reason = None
    live_limit = None  # each sequence owns its cache
    max_tree_nodes: int | None = None
    buckets: tuple[int, ...] | None = None  # every tree size runs a forward of its own

    def __init__(self, target: Target, ops: TreeOps) -> None:
        self.target = target
        self.model = target.model
        self.device = target.device
        self.ops = ops
        self.kernels = KernelChoice()  # the default kernels everywhere

    def identity(self) -> dict[str, str]:
        return {}

    def new_cache(self) -> Any:
        """A new sequence's cache (module sliding)."""
        # [sliding hook] full-attention layers: a DynamicCache; sliding-window ones: sliding.WindowedCache; else refused
        return sliding.new_cache(self.model.config)

    def prefill(self, input_ids: torch.Tensor, *, keep_all: bool, reserve: int) -> tuple[Any, torch.Tensor]:
        del reserve  # the dynamic cache grows as it goes
        cache = self.new_cache()
        keep = 0 if keep_all else 1
        out = self.model(input_ids=input_ids, use_cache=True, logits_to_keep=keep,
                         **{self.target.cache_keyword: cache})  # fmt: skip
        sliding.after_prefill(cache, input_ids[0].tolist())  # [sliding hook] trims sliding-window layers
        return cache, out.logits[0]

    def opened(self, state: KVState) -> None:
        """Nothing to record: the state holds its own cache."""

    def tree(self, state: KVState, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
        committed = state.committed_len
        additive = self.target.additive_dtype
        mask, position_ids = self.ops.tree_inputs(tree, committed, self.device, additive)
        input_ids = torch.tensor([tree.tokens], dtype=torch.long, device=self.device)
        masks = sliding.tree_mask(state.cache, tree, committed, mask, additive)  # [sliding hook]
        out = self.model(
            input_ids=input_ids,
            attention_mask=masks,
            position_ids=position_ids,
            use_cache=True,
            **{self.target.cache_keyword: state.cache},
        )
        return out.logits[0], position_ids[0]

    def rows(self, states: Sequence[KVState], trees: Sequence[DraftTree]) -> None:
        """None: one row at a time (the model's own forward takes one sequence per cache)."""
        del states, trees

    def compact(self, state: KVState, committed_len: int, path: Sequence[int]) -> None:
        if not sliding.compact(self.ops, state.cache, committed_len, path):  # [sliding hook]
            self.ops.compact(state.cache, committed_len, path)

    def rewind(self, state: KVState, committed_len: int) -> None:
        if committed_len < state.committed_len and not sliding.rewind(self, state, committed_len):  # [sliding hook]
            state.cache.crop(-(state.committed_len - committed_len))

    def release(self, state: KVState) -> None:
        """Nothing to give back: the cache goes with the state."""

    @contextmanager
    def preserving(self) -> Iterator[None]:
        """Each sequence owns its cache: nothing to keep."""
        yield

    def row_bytes(self, tokens: int) -> int | None:
        """Keys and values of every layer, twice (a ``DynamicCache`` step concatenates into new tensors while
        the old ones live); None where the config does not say the layer count, KV heads and head size."""
        per_token = kv_bytes_per_token(self.model.config, self.target.dtype)
        return None if per_token is None else 2 * per_token * tokens

    def close(self) -> None:
        """Nothing to give back."""
