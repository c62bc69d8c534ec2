"""Verification through specdec's own forward (:mod:`specdec.backends.runner`) on a cache per sequence.

``cache="native"``: the model's forward is :class:`~specdec.backends.runner.DecoderRunner`
(Llama-family decoders), eager, each sequence with its own
:class:`~specdec.backends.static_cache.StaticKVCache` sized for its prompt and its token
budget (grown if it must), written in place at the tree's slots and compacted in place.
No compilation and no warm-up: the first step of the first call is as fast as any later
one.

**Kernels**: two variants (:meth:`RunnerVerifier.kernel_variants`). ``"cpu"``: specdec's CPU
kernels (:mod:`specdec.backends.cpu_kernels`: skinny linear layers and tree attention), the
choice for forwards of up to :data:`CPU_KERNEL_MAX_ROWS` rows from the start, where they are
available; ``"default"``: ``torch.nn.functional.linear`` and ``scaled_dot_product_attention``
(what the prompt's hundreds of rows take). The calibration times both at every tree size and
the :class:`~specdec.Generator` passes its verdict on. While the CPU kernels serve both a
plain step and a tree, a tree node's logits are bitwise those of the same token verified
alone (their contracts), so speculative output is plain decoding's exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specdec.backends import cpu_kernels
from specdec.backends.runner import PLAIN, DecoderRunner, Kernels, Segment
from specdec.backends.static import capacity_for
from specdec.backends.static_cache import StaticKVCache
from specdec.backends.tree import ancestor_matrix
from specdec.backends.verifier import KVState, ModelVerifier, TreeOps
from specdec.errors import SpecDecError
from specdec.types import DEFAULT_KERNEL, DraftTree, KernelChoice, TokenChooser

# The most nodes one verification may hold: the engine's own cap on tree size.
MAX_NODES = 512
CPU_KERNEL = "cpu"  # specdec's CPU kernels (specdec.backends.cpu_kernels)
CPU_KERNEL_MAX_ROWS = 64  # past this many rows a GEMM library's blocked products win: not worth timing


class RunnerVerifier(ModelVerifier):
    """A :class:`ModelVerifier` whose forwards are a :class:`DecoderRunner` over a cache per sequence.

    Kernels: module docstring. The CPU kernels serve forwards of up to
    :data:`CPU_KERNEL_MAX_ROWS` rows from construction, where they build and serve the model
    (:func:`specdec.backends.cpu_kernels.supports`); :meth:`use_kernels` changes that.
    """

    KERNELS = (DEFAULT_KERNEL, CPU_KERNEL)

    def __init__(self, model: Any, ops: TreeOps | None = None, chooser: TokenChooser | None = None) -> None:
        super().__init__(model, ops, chooser)
        self.runner = DecoderRunner(model)
        self.cpu_kernels = Kernels(cpu_kernels.skinny_linear, cpu_kernels.tree_attention)
        self.kernels_available = cpu_kernels.supports(model) and cpu_kernels.available()
        if self.kernels_available:
            self._kernels = KernelChoice(((CPU_KERNEL_MAX_ROWS, CPU_KERNEL),))
        self.max_tree_nodes = MAX_NODES

    @property
    def cache_kind(self) -> str:
        """``"native"``: specdec's own forward, a cache per sequence, eager."""
        return "native"

    def kernel_variants(self, rows: int) -> tuple[str, ...]:
        """``("default", "cpu")`` where the CPU kernels serve the model and ``rows`` is worth timing."""
        if self.kernels_available and rows <= CPU_KERNEL_MAX_ROWS:
            return self.KERNELS
        return (DEFAULT_KERNEL,)

    def _kernels_for(self, rows: int) -> Kernels:
        if self.kernels_available and rows <= CPU_KERNEL_MAX_ROWS and self._kernels.variant_for(rows) == CPU_KERNEL:
            return self.cpu_kernels
        return PLAIN

    # -- the model-side hooks of ModelVerifier -----------------------------------------------
    def _prefill_forward(self, input_ids: torch.Tensor, *, keep_all: bool, reserve: int) -> tuple[Any, torch.Tensor]:
        length = int(input_ids.shape[1])
        capacity = capacity_for(length + max(reserve, 0) + 1)
        cache = StaticKVCache(self.runner.num_layers, capacity, self.device)
        positions = torch.arange(length, device=self.device).unsqueeze(0)
        segment = Segment(input_ids, positions, cache, 0, None, last_only=not keep_all)
        (logits,) = self.runner.forward([segment], self._kernels_for(length))
        cache.committed_len = length
        return cache, logits

    def _tree_forward(self, state: KVState, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
        cache: StaticKVCache = state.cache
        committed = state.committed_len
        if committed + tree.size > cache.capacity:
            cache.committed_len = committed
            cache.grow(capacity_for(committed + tree.size))
        positions = torch.tensor([tree.depths], dtype=torch.long, device=self.device) + committed
        ancestors = None if tree.is_chain else torch.from_numpy(ancestor_matrix(tree.parents)).to(self.device)
        tokens = torch.tensor([tree.tokens], dtype=torch.long, device=self.device)
        segment = Segment(tokens, positions, cache, committed, ancestors)
        (logits,) = self.runner.forward([segment], self._kernels_for(tree.size))
        position_ids = positions
        return logits, position_ids[0]

    def _compact(self, state: KVState, committed_len: int, path: Sequence[int]) -> None:
        state.cache.compact(committed_len, tuple(path))
        state.cache.committed_len = committed_len + len(path)

    def rewind(self, state: KVState, committed_len: int) -> None:
        if not 0 <= committed_len <= state.committed_len:
            raise SpecDecError(f"cannot rewind {state.committed_len} committed tokens to {committed_len}")
        state.committed_len = state.cache.committed_len = committed_len  # later slots are overwritten
