"""``engine="hf"``: Hugging Face's own forward as a verifier's :class:`~specdec.backends.forward.Forward`.

**The user's model is never changed**: no layer, attention function or config entry of it is
swapped, not even for the length of one forward (another thread may be running the same
model), and nothing of it is wrapped or written to.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from transformers import DynamicCache

from specdec.backends.forward import KVState, ModelKernels, Target, kv_bytes_per_token
from specdec.backends.hf import windows
from specdec.backends.sliding import WindowArg, forward_window
from specdec.backends.tree_ops import TreeOps
from specdec.types import DraftTree, KernelChoice


class HFForward(ModelKernels):
    """``engine="hf"``: Hugging Face's own forward (``model(...)``), eager, a ``DynamicCache`` per
    sequence, with the default kernels; masks and compaction by the verifier's tree ops. ``window``: the
    model's sliding-window layout (default: its own, :func:`~specdec.backends.sliding.forward_window`), whose
    layers a :class:`~specdec.backends.hf.windows.WindowedCache` holds; None: full attention only."""

    engine = "hf"
    cache_kind = "dynamic"  # a Hugging Face DynamicCache per sequence, eager forwards
    fallback_reason = None
    live_limit = None  # each sequence owns its cache
    max_tree_nodes: int | None = None
    buckets: tuple[int, ...] | None = None  # every tree size runs a forward of its own

    def __init__(self, target: Target, ops: TreeOps, window: WindowArg = "model") -> None:
        self.target = target
        self.window = forward_window(window, target.model, "hf")
        self.model = target.model
        self.device = target.device
        self.ops = ops
        self.kernels = KernelChoice()  # the default kernels everywhere

    def identity(self) -> dict[str, str]:
        return {}

    def new_cache(self) -> Any:
        """A new sequence's cache: a ``DynamicCache``, whose sliding layers (if any) keep what a rejected tree
        needs (:class:`~specdec.backends.hf.windows.WindowedCache`)."""
        if self.window is None:
            return DynamicCache(config=self.model.config)
        return windows.new_cache(self.model.config, self.window)

    def prefill(self, input_ids: torch.Tensor, *, keep_all: bool, reserve: int) -> tuple[Any, torch.Tensor]:
        cache, out = self._prefill(input_ids, keep_all, reserve, features=False)
        return cache, out.logits[0]

    def prefill_features(
        self, input_ids: torch.Tensor, *, keep_all: bool, reserve: int
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """:meth:`prefill` and every prompt position's features (``FeatureForward``): transformers 5 reports
        the hidden state after the final norm as the last of ``hidden_states``; the logits are the same."""
        cache, out = self._prefill(input_ids, keep_all, reserve, features=True)
        return cache, out.logits[0], out.hidden_states[-1][0]

    def _prefill(self, input_ids: torch.Tensor, keep_all: bool, reserve: int, features: bool) -> tuple[Any, Any]:
        del reserve  # the dynamic cache grows as it goes
        cache = self.new_cache()
        keep = 0 if keep_all else 1
        extra: dict[str, Any] = {"output_hidden_states": True} if features else {}
        out = self.model(input_ids=input_ids, use_cache=True, logits_to_keep=keep,
                         **{self.target.cache_keyword: cache}, **extra)  # fmt: skip
        if self.window is not None:
            windows.after_prefill(cache, input_ids[0].tolist())  # records the prompt, trims the sliding layers
        return cache, out

    def opened(self, state: KVState) -> None:
        """Nothing to record: the state holds its own cache."""

    def tree(self, state: KVState, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
        out, position_ids = self._tree(state, tree, features=False)
        return out.logits[0], position_ids[0]

    def tree_features(self, state: KVState, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`tree` and every node's features (``FeatureForward``; see :meth:`prefill_features`)."""
        out, position_ids = self._tree(state, tree, features=True)
        return out.logits[0], position_ids[0], out.hidden_states[-1][0]

    def _tree(self, state: KVState, tree: DraftTree, features: bool) -> tuple[Any, torch.Tensor]:
        committed = state.committed_len
        additive = self.target.additive_dtype
        mask, position_ids = self.ops.tree_inputs(tree, committed, self.device, additive)
        input_ids = torch.tensor([tree.tokens], dtype=torch.long, device=self.device)
        masks = mask if self.window is None else windows.tree_mask(state.cache, tree, committed, mask, additive)
        out = self.model(
            input_ids=input_ids,
            attention_mask=masks,
            position_ids=position_ids,
            use_cache=True,
            **{self.target.cache_keyword: state.cache},
            **({"output_hidden_states": True} if features else {}),
        )
        return out, position_ids

    def rows(self, states: Sequence[KVState], trees: Sequence[DraftTree]) -> None:
        """None: one row at a time (the model's own forward takes one sequence per cache)."""
        del states, trees

    def compact(self, state: KVState, committed_len: int, path: Sequence[int]) -> None:
        if self.window is None or not windows.compact(self.ops, state.cache, committed_len, path):
            self.ops.compact(state.cache, committed_len, path)

    def rewind(self, state: KVState, committed_len: int) -> None:
        if committed_len >= state.committed_len:
            return
        if self.window is None or not windows.rewind(self, state, committed_len):
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
