"""Verification of draft trees with a Hugging Face causal LM: one verifier, composed of parts.

:class:`ModelVerifier` is the :class:`~specdec.types.Verifier` of every engine. It does the
step (prefill, verify, commit, rewind, release; a batch's rows in :meth:`~ModelVerifier.verify_batch`)
by calling three parts:

- a :class:`~specdec.backends.forward.Forward`: what runs the model's forward and the KV cache it
  writes (new sequence, tree forward, compaction, rewind, release, capacity):
  :class:`~specdec.backends.hf.forward.HFForward` (``engine="hf"``,
  Hugging Face's own forward on a ``DynamicCache``), :class:`~specdec.backends.specdec_engine.forward.SpecdecForward`
  (``"specdec"``), :class:`~specdec.backends.buckets.forward.BucketForward` (the fixed-shape buckets:
  ``"compiled"``, ``"graphs"``, ...) and :class:`~specdec.backends.buckets.rows.RowsForward` (the
  buckets with a batch's rows on one cache);
- :class:`~specdec.backends.tree_ops.TreeOps`: the three tree operations (inputs, acceptance,
  compaction), the compiled ``cuda_ext`` ones or :class:`~specdec.backends.tree_ops.TorchTreeOps`,
  the readable reference they are diffed against;
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
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from specdec.backends.forward import FeatureForward, Forward, KVState, Target, check_model, kv_bytes_per_token
from specdec.backends.hf.forward import HFForward
from specdec.backends.identity import model_identity, weights_fingerprint
from specdec.backends.topk import topk_ids
from specdec.backends.tree import ancestor_matrix
from specdec.backends.tree_ops import Acceptance, TorchTreeOps, TreeOps, accept_each
from specdec.errors import SpecDecError
from specdec.models import context_length
from specdec.sampling import Greedy, apply_repetition_penalty, penalty_mask
from specdec.types import (
    DraftTree,
    Feedback,
    KernelChoice,
    TokenChooser,
    Verification,
    VerifierDescription,
)

# The parts' names, where the verifier's users found them before the parts had modules of their own.
__all__ = [
    "Acceptance",
    "Forward",
    "HFForward",
    "KVState",
    "ModelVerifier",
    "Target",
    "TorchTreeOps",
    "TreeOps",
    "accept_each",
    "check_model",
    "kv_bytes_per_token",
]


def _decision_precision(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits are decided in float32, as ``generate`` does; fp32/fp64 stay as they are."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def _no_topk(rows: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The ``topk`` of a feedback that carries features only: int64 ``[rows, 0]``."""
    return np.zeros((rows, 0), dtype=np.int64)


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
    def engine(self) -> str:
        """What runs the forward (:data:`specdec.backends.ENGINES`)."""
        return self.forward.engine

    @property
    def name(self) -> str:
        return self.ops.name

    @property
    def buckets(self) -> tuple[int, ...] | None:
        """The tree sizes with a forward of their own (None: every tree size runs a forward of its own)."""
        return self.forward.buckets

    @property
    def description(self) -> VerifierDescription:
        """What this verifier is (:class:`~specdec.types.VerifierDescription`), as it is now."""
        forward = self.forward
        return VerifierDescription(self.engine, self.name, self.device, self.dtype, self.vocab_size,
                                   self.context_length, forward.max_tree_nodes, forward.kernel_path)  # fmt: skip

    def identity(self) -> dict[str, str]:
        """What a verification's cost depends on (:func:`~specdec.backends.identity.model_identity`, and the
        forward's own part of it)."""
        identity = model_identity(self.model, dtype=self.dtype, device=self.device, backend=self.name,
                                  cache=self.forward.cache_kind)  # fmt: skip
        identity.update(self.forward.identity())
        return identity

    def weights_fingerprint(self) -> str:
        """A hash of the model's weights (:func:`~specdec.backends.identity.weights_fingerprint`)."""
        return weights_fingerprint(self.model)

    # -- kernels -------------------------------------------------------------------------------
    @property
    def kernels(self) -> KernelChoice:
        """The kernel choice in force (module docstring)."""
        return self.forward.kernels

    def kernel_variants(self, rows: int) -> tuple[str, ...]:
        """The variants a forward over ``rows`` tokens can run (``("default",)``: the model's own forward)."""
        return self.forward.kernel_variants(rows)

    def use_kernels(self, choice: KernelChoice) -> None:
        """Run each later forward with the variant ``choice`` names for its size.

        A variant this verifier's forward knows (``KERNELS``) but does not offer for a size, or on
        this model, runs the default kernels; a name it does not know is an error.
        """
        unknown = [v for v in choice.variants() if v not in self.forward.KERNELS]
        if unknown:
            known = ", ".join(self.forward.KERNELS)
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
        features: bool = False,
    ) -> tuple[KVState, int, Feedback | None]:
        """Run the prompt; return the state, the first pending token and optional per-position feedback.

        Only the last position's logits are computed unless ``prompt_topk`` asks for the
        model's top ids after every prompt token (Token Recycling's warm start).
        ``chooser`` and ``repetition_penalty`` decide this sequence's tokens from here on.
        ``reserve``: how many more tokens the sequence may grow by (a static cache sizes
        itself for them; the dynamic cache grows as it goes and ignores it). ``features``: the
        feedback carries the model's features at every prompt position, where the forward gives them
        (:class:`~specdec.backends.forward.FeatureForward`; else no feature feedback).
        """
        self._check_prompt(prompt)
        input_ids = torch.tensor([list(prompt)], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            hidden = None
            if features and isinstance(self.forward, FeatureForward):
                cache, logits, hidden = self.forward.prefill_features(input_ids, keep_all=prompt_topk > 0,
                                                                      reserve=reserve)  # fmt: skip
            else:
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
            if prompt_topk or hidden is not None:
                top = topk_ids(logits, prompt_topk).cpu().numpy() if prompt_topk else _no_topk(len(prompt))
                feedback = Feedback(np.asarray(prompt, dtype=np.int64), top, (), hidden)
        return state, pending, feedback

    def verify(self, state: KVState, tree: DraftTree, topk: int = 0, features: bool = False) -> Verification:
        """One forward over ``tree`` after ``state.committed_len`` tokens; commits the accepted path.
        ``features``: the feedback carries every node's features, where the forward gives them."""
        self._check_row(state, tree)
        with torch.inference_mode():
            hidden = None
            if features and isinstance(self.forward, FeatureForward):
                logits, positions, hidden = self.forward.tree_features(state, tree)  # [N, V], int64 [N], [N, H]
            else:
                logits, positions = self.forward.tree(state, tree)  # [N, V], int64 [N]
            (acceptance,) = self._accept([state], [tree], logits, positions, topk)
            return self._commit(state, tree, acceptance, hidden)

    @property
    def live_limit(self) -> int | None:
        """How many sequences this verifier holds at once (None: each sequence owns its cache)."""
        return self.forward.live_limit

    def verify_batch(self, states: Sequence[KVState], trees: Sequence[DraftTree], topk: int = 0,
                     features: bool = False) -> list[Verification]:  # fmt: skip
        """Every row's tree, then each row's choices, walk and compaction in its own cache or region.

        Where the forward verifies many rows in one call (:meth:`Forward.rows`), one forward over
        all of them; else :meth:`verify` for every row, one row after another (the model's own
        forward takes one sequence per cache: each row's result is exactly its own verification).
        With ``features``, row after row (:meth:`verify`), which hands them over.
        """
        self._check_rows(states, trees)
        if features:
            return [self.verify(state, tree, topk, features) for state, tree in zip(states, trees, strict=True)]
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

    def _commit(self, state: KVState, tree: DraftTree, acceptance: Acceptance,
                features: torch.Tensor | None = None) -> Verification:  # fmt: skip
        """Keep the accepted path's KV and count it committed (inside ``inference_mode``: ``presence`` is
        an inference tensor)."""
        committed = state.committed_len
        self.forward.compact(state, committed, acceptance.path)
        if state.presence is not None:
            state.presence[torch.tensor([tree.tokens[i] for i in acceptance.path], device=self.device)] = True
        state.committed_len = committed + len(acceptance.path)
        feedback = None
        if acceptance.topk is not None or features is not None:
            top = acceptance.topk if acceptance.topk is not None else _no_topk(tree.size)
            feedback = Feedback(np.asarray(tree.tokens, dtype=np.int64), top, acceptance.path, features)
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
        (:mod:`specdec.backends.buckets.compile_cache`), so a later process pays much less than the
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
