"""One bucket's forward of a fixed-shape engine: its device buffers, its compiled function or CUDA graphs.

:func:`tree_forward` is the forward every mode runs (eager, compiled by inductor, captured);
:class:`BucketRunner` holds one bucket's buffers and runs it the way its mode says, for the
verifier that holds it now (:class:`BucketHost`: a
:class:`~specdec.backends.buckets.forward.BucketForward`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch

from specdec.backends.buckets.shared import SharedForward
from specdec.backends.buckets.windows import bucket_masks, ring_allowed
from specdec.backends.slot_cache import StaticKVCache
from specdec.backends.tree import ancestor_matrix
from specdec.errors import SpecDecError
from specdec.types import DraftTree

WARMUP_RUNS = 2  # eager runs before a CUDA graph capture (allocator, cuBLAS workspaces, lazy inits)


class BucketHost(Protocol):
    """What a :class:`BucketRunner` reads of the verifier that holds it."""

    model: Any
    device: torch.device
    additive_dtype: torch.dtype | None
    cache_keyword: str
    freezing: bool
    weight_prepack: bool

    @property
    def cache(self) -> StaticKVCache: ...

    def shared_forward(self, size: int, mode: str) -> SharedForward: ...

    def graph_pool(self) -> Any: ...


def tree_forward(
    model: Any,
    writer: Any,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor,
    ancestors: torch.Tensor,
    additive_dtype: torch.dtype | None,
    logits_to_keep: int,
    cache_keyword: str,
    bounds: torch.Tensor | None = None,
) -> torch.Tensor:
    """One forward of ``model`` over ``T`` nodes written at ``slots``; returns logits ``[T or keep, V]``.

    ``tokens``, ``positions`` int64 ``[1, T]``; ``slots`` int64 ``[T]`` (``slots[0]`` is the
    committed length ``C``: the tree's first slot); ``ancestors`` bool ``[T, T]``
    (ancestor-or-self). Node ``i`` attends to every slot ``< C`` and to the slots of its
    ancestors: ``mask[i, s] = s < C or ancestors[i, j]`` where ``s = slots[j]``, over the
    ``W`` slots of the cache's window (all ``S`` when it has none). Only tensor contents and
    ``W`` (a dynamic size) vary between calls, so this function compiles and captures once per ``T``.
    ``cache_keyword``: the name ``model``'s forward takes its cache by (:func:`~specdec.models.cache_keyword`).
    ``bounds`` int64 ``[2, T]`` (rows of a batch, :mod:`specdec.backends.buckets.rows`): node ``i``'s
    committed slots are ``bounds[0, i] <= s < bounds[1, i]`` instead of ``s < C``.
    A sliding-window model's (the cache's ``sliding``): its sliding layers attend over their rings
    (:mod:`~specdec.backends.slot_cache`) with a mask of the ring slots that hold a node's committed keys
    or ancestors inside its window (:func:`~specdec.backends.buckets.windows.ring_allowed`), and a model that mixes
    sliding and full layers takes both masks in a dict keyed by layer type.
    """
    width = writer.owner.width
    columns = torch.arange(width, device=slots.device)  # [W]
    if bounds is None:  # one sequence: its committed slots are 0 .. C-1
        committed = columns.unsqueeze(0) < slots[:1].unsqueeze(1)  # [1, W]
    else:  # rows of a batch, each in its own region of slots (rows.py): node i's are bounds[0, i] .. bounds[1, i]-1
        committed = (columns.unsqueeze(0) >= bounds[0].unsqueeze(1)) & (columns.unsqueeze(0) < bounds[1].unsqueeze(1))
    tree = torch.zeros((slots.shape[0], width), dtype=torch.bool, device=slots.device)
    tree = tree.index_copy(1, slots, ancestors)  # [T, W]: the ancestors' slots
    allowed = committed | tree  # [T, W]
    mask: Any
    if writer.owner.sliding is None:
        mask = _attention_mask(allowed, additive_dtype)
    else:  # sliding layers: their rings' slots within each node's window
        window, mixed = writer.owner.sliding
        near = ring_allowed(writer.owner, window, slots, positions, ancestors, bounds, writer.prompt)
        full = _attention_mask(allowed, additive_dtype) if mixed else None
        mask = bucket_masks(mixed, full, _attention_mask(near, additive_dtype))
    out = model(
        input_ids=tokens,
        position_ids=positions,
        attention_mask=mask,
        use_cache=True,
        logits_to_keep=logits_to_keep,
        **{cache_keyword: writer},
    )
    logits: torch.Tensor = out.logits[0]
    return logits


def _attention_mask(allowed: torch.Tensor, additive_dtype: torch.dtype | None) -> torch.Tensor:
    """The model's ``[1, 1, T, W]`` mask from ``allowed`` bool ``[T, W]``: itself, or additive (eager attention
    adds its mask to the scores)."""
    mask = allowed[None, None]
    if additive_dtype is not None:
        additive = torch.zeros(mask.shape, dtype=additive_dtype, device=allowed.device)
        mask = additive.masked_fill(~mask, torch.finfo(additive_dtype).min)
    return mask


class BucketRunner:
    """The device buffers and the forward of one bucket of ``size`` nodes.

    Buffers (all on the model's device; only their contents change): ``tokens``,
    ``positions`` int64 ``[1, T]``, ``slots`` int64 ``[T]``, ``ancestors`` bool ``[T, T]``.
    """

    def __init__(self, verifier: BucketHost, size: int, mode: str) -> None:
        device = verifier.device
        # Weakly: a runner outlives its verifier in the model's pool of device states (DeviceSet), and a
        # strong reference would keep every verifier that ever used it alive.
        self._verifier = weakref.ref(verifier)
        self.size = size
        self.mode = mode
        self.tokens = torch.zeros((1, size), dtype=torch.int64, device=device)
        self.positions = torch.zeros((1, size), dtype=torch.int64, device=device)
        self.slots = torch.arange(size, dtype=torch.int64, device=device)
        self.ancestors = torch.eye(size, dtype=torch.bool, device=device)
        self.bounds: torch.Tensor | None = None  # per-node committed ranges: rows of a batch only (buckets.rows)
        # Host staging for the uploads: one int64 row of tokens, positions and slots, pinned on CUDA.
        self._staging = torch.zeros((3, size), dtype=torch.int64)
        self._staging_ancestors = torch.zeros((size, size), dtype=torch.bool)
        if device.type == "cuda":
            self._staging = self._staging.pin_memory()
            self._staging_ancestors = self._staging_ancestors.pin_memory()
        self.writer = verifier.cache.writer(self.slots)
        self.generation = verifier.cache.generation
        self.filled = size  # nodes of the tree in the buffers (the rest is padding)
        # The compiled function is the model's, shared with every verifier of it (buckets.shared).
        self.shared: SharedForward | None = verifier.shared_forward(size, mode) if "inductor" in mode else None
        # Whether this forward's output is known to agree with the eager forward's (buckets.first_use).
        self._checked = mode == "eager" or (mode == "inductor" and self.shared is not None and self.shared.checked)
        self._compiled: Callable[..., torch.Tensor] | None = None
        # CUDA-graph modes: one graph (and its output tensor) per attention width it was captured at, each
        # checked at its own first replay (buckets.sizes.window_width: the widths come in a few tiers).
        self._graphs: dict[int, Any] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._checked_widths: set[int] = set()

    @property
    def checked(self) -> bool:
        """Whether the forward this runner would run now is known to agree with the eager forward: in the
        CUDA-graph modes the graph of the cache's current width, else the bucket's one forward."""
        if "cudagraphs" in self.mode:
            return self.verifier.cache.width in self._checked_widths
        return self._checked

    @checked.setter
    def checked(self, value: bool) -> None:
        if "cudagraphs" in self.mode:
            width = self.verifier.cache.width
            if value:
                self._checked_widths.add(width)
            else:
                self._checked_widths.discard(width)
        else:
            self._checked = value

    @property
    def captured_widths(self) -> tuple[int, ...]:
        """The attention widths this runner holds a captured graph for (CUDA-graph modes; tests count them)."""
        return tuple(sorted(self._graphs))

    @property
    def verifier(self) -> BucketHost:
        """The verifier that holds this runner's device state now."""
        verifier = self._verifier()
        if verifier is None:
            raise SpecDecError("this bucket's verifier is gone; its device state belongs to no verifier")
        return verifier

    def bind(self, verifier: BucketHost) -> None:
        """Serve ``verifier`` from now on (it took this runner's device state from the model's pool)."""
        self._verifier = weakref.ref(verifier)

    def load(self, tree: DraftTree, committed_len: int) -> None:
        """Write ``tree`` (padded to the bucket) after ``committed_len`` committed tokens into the buffers."""
        n, size = tree.size, self.size
        self.filled = n
        staging = self._staging.numpy()  # [3, T] int64: tokens, positions, slots
        staging[0, :n] = tree.tokens
        staging[0, n:] = 0  # padding nodes carry token 0 and see only themselves
        staging[1, :n] = np.asarray(tree.depths, dtype=np.int64) + committed_len
        staging[1, n:] = committed_len
        staging[2] = np.arange(committed_len, committed_len + size, dtype=np.int64)
        ancestors = self._staging_ancestors.numpy()  # [T, T]
        ancestors[:] = False
        ancestors[:n, :n] = ancestor_matrix(tree.parents)
        ancestors[np.arange(n, size), np.arange(n, size)] = True
        self._upload()

    def _upload(self) -> None:
        """Copy the host staging into the device buffers (pinned and asynchronous on CUDA)."""
        self.verifier.cache.log_writes(self._staging[0].numpy(), self._staging[2].numpy())  # rings' logs only
        blocking = self.tokens.device.type == "cpu"
        self.tokens.copy_(self._staging[0:1], non_blocking=not blocking)
        self.positions.copy_(self._staging[1:2], non_blocking=not blocking)
        self.slots.copy_(self._staging[2], non_blocking=not blocking)
        self.ancestors.copy_(self._staging_ancestors, non_blocking=not blocking)

    def eager(self) -> torch.Tensor:
        """The eager forward on the buffers' inputs (what every other mode must agree with)."""
        verifier = self.verifier
        return tree_forward(
            verifier.model, self.writer, self.tokens, self.positions, self.slots, self.ancestors,
            verifier.additive_dtype, 0, verifier.cache_keyword, self.bounds,
        )  # fmt: skip

    def _compiled_forward(self) -> torch.Tensor:
        if self._compiled is None:
            assert self.shared is not None
            self._compiled = self.shared.function
        verifier = self.verifier
        # Freezing folds the weights in as constants (prepacked for the CPU's GEMMs only where the
        # verifier's `weight_prepack` says so). Both are read where compilation starts, which
        # `options=` of torch.compile does not reach (seen with torch 2.13), hence the patch
        # around every call: a recompilation must freeze too.
        settings = {"freezing": verifier.freezing, "cpp.weight_prepack": verifier.weight_prepack}
        with torch._inductor.config.patch(settings):
            return self._compiled(
                verifier.model, self.writer, self.tokens, self.positions, self.slots, self.ancestors,
                verifier.additive_dtype, 0, verifier.cache_keyword, self.bounds,
            )  # fmt: skip

    def reset_compiled(self) -> None:
        """Take :attr:`shared`'s function again at the next forward (it was replaced)."""
        self._compiled = None

    def _capture(self, forward: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
        """Warm up on a side stream, then capture ``forward`` into a CUDA graph (shared memory pool); the
        graph and the output tensor its replays write."""
        side = torch.cuda.Stream(device=self.tokens.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(self.tokens.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):  # the writes land on the same slots as the replay's: harmless
                forward()
        torch.cuda.current_stream(self.tokens.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.verifier.graph_pool()):
            output = forward()
        return graph, output

    def run(self) -> torch.Tensor:
        """The bucket's logits ``[T, V]`` for the inputs in the buffers (KV written at ``slots``)."""
        if self.mode == "eager":
            return self.eager()
        if self.mode == "inductor":
            return self._compiled_forward()
        width = self.verifier.cache.width  # a graph replays the width it was captured at
        graph = self._graphs.get(width)
        if graph is None:
            forward = self._compiled_forward if self.mode == "inductor-cudagraphs" else self.eager
            graph, self._outputs[width] = self._capture(forward)
            self._graphs[width] = graph
        graph.replay()
        return self._outputs[width]
