"""A batch's rows on one static cache, verified in one forward: the static cache's batch verifier.

Why: a :class:`~specdec.backends.buckets.forward.BucketForward` holds one sequence, so a batch on a
static cache ran its rows one after another. On a GPU, where the static cache with CUDA graphs
is the default, that kept specdec's tokens per second flat in the batch size while Hugging
Face's batched ``generate`` grew with it (docs/bench has the GPU runs).

**The flat layout.** One cache of batch 1 whose slots are cut into ``P`` regions of ``S`` slots,
one per place, and ``M`` scratch slots at the end (``M``: the most padding a bucket adds, 255 for
buckets up to 512). Place ``p`` owns
slots ``p*S .. (p+1)*S - 1``. A step concatenates every row's tree into one tree of
``T = sum N_b`` nodes, padded up to a bucket as a lone tree is: row ``b``'s nodes are written at
``p_b*S + C_b + i`` with positions ``C_b + depth``, and see the committed slots of their own
region (``bounds`` of :func:`~specdec.backends.buckets.runner.tree_forward`) and their own ancestors;
padding nodes write to scratch slots and see only themselves. So every row is verified by one
forward, and all a bucket has carries over unchanged from the one-sequence verifier: its
buffers, its compiled function or captured CUDA graph, its self-check at first use against the
eager forward. The buckets go on past the one-sequence verifier's (:data:`ROWS_BUCKETS`: up to 512
nodes, 32 rows of 16), while one row's tree stays within ``row_nodes`` (128); trees that add up to
more than the largest bucket go in several forwards (the batch planner, which prices one forward,
then under-prices the step).

**What it costs.** Every node attends over all ``P*S + M`` slots, masked: nothing next to a GPU
step's launch overhead at these sizes; on a CPU an eager attention over every region costs more
than rows with caches of their own (``engine="specdec"``, the CPU's batch path, has those).

**Growth.** A row that needs more than ``S`` slots (a longer prompt joining, a row reaching the
end of its region) makes every region the next power of two: the live rows' committed slots move
to their new regions (:meth:`~specdec.backends.slot_cache.StaticKVCache.regrow_regions`) and
every bucket's forward is built or captured again, as when a lone static cache grows.

**Lossless.** A row's nodes see exactly what they see in a lone verification (their committed
slots and their ancestors) at the same positions; the other rows share only the matrix
products, whose rounding may differ in the last bits from a lone forward's (near-ties only, as
in any batch). Checked on tiny fp64 models of every architecture: every row equals its lone
plain decoding (tests/test_static_rows.py).

**Places.** A prefill takes the first free place; :meth:`release` frees it (a state that was
dropped without release frees its place too: places hold their states weakly). A verifier made
for ``P`` places holds at most ``P`` live sequences (:attr:`live_limit`); calibration and
:meth:`warm_up` need one free place (:meth:`preserving` gives it back afterwards).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from specdec.backends.buckets.forward import BucketForward
from specdec.backends.buckets.runner import BucketHost, BucketRunner
from specdec.backends.buckets.sizes import BUCKETS
from specdec.backends.buckets.windows import bucket_rewind
from specdec.backends.forward import KVState, Target, kv_bytes_per_token
from specdec.backends.sliding import WindowArg
from specdec.backends.slot_cache import MIN_CAPACITY, capacity_for
from specdec.backends.tree import ancestor_matrix
from specdec.backends.tree_ops import TreeOps
from specdec.backends.verifier import ModelVerifier
from specdec.errors import SpecDecError
from specdec.types import DraftTree, TokenChooser

# A batch's buckets: the one-sequence ones, then room for every row's tree of a large batch in one forward.
ROWS_BUCKETS = (*BUCKETS, 256, 512)


class RowsBucketRunner(BucketRunner):
    """A bucket's buffers and forward for the nodes of several rows (module docstring), with each
    node's committed range: ``bounds`` int64 ``[2, T]``."""

    def __init__(self, verifier: BucketHost, size: int, mode: str) -> None:
        super().__init__(verifier, size, mode)
        self.bounds = torch.zeros((2, size), dtype=torch.int64, device=verifier.device)
        self._staging_bounds = torch.zeros((2, size), dtype=torch.int64)
        if verifier.device.type == "cuda":
            self._staging_bounds = self._staging_bounds.pin_memory()

    def load_rows(self, rows: Sequence[tuple[DraftTree, int, int]], scratch: int) -> None:
        """Write each ``(tree, region base, committed length)`` row's nodes one after another, the
        padding after them at slots ``scratch ..``."""
        size = self.size
        staging = self._staging.numpy()  # [3, T]: tokens, positions, slots
        bounds = self._staging_bounds.numpy()  # [2, T]
        ancestors = self._staging_ancestors.numpy()  # [T, T]
        ancestors[:] = False
        start = 0
        for tree, base, committed in rows:
            end = start + tree.size
            staging[0, start:end] = tree.tokens
            staging[1, start:end] = np.asarray(tree.depths, dtype=np.int64) + committed
            staging[2, start:end] = np.arange(base + committed, base + committed + tree.size, dtype=np.int64)
            bounds[0, start:end] = base
            bounds[1, start:end] = base + committed
            ancestors[start:end, start:end] = ancestor_matrix(tree.parents)
            start = end
        if start > size:
            raise SpecDecError(f"{start} nodes do not fit the {size}-node bucket")
        staging[0, start:] = 0  # padding: token 0, at a scratch slot, seeing only itself
        staging[1, start:] = 0
        staging[2, start:] = np.arange(scratch, scratch + size - start, dtype=np.int64)
        bounds[:, start:] = 0
        ancestors[np.arange(start, size), np.arange(start, size)] = True
        self.filled = start
        self._upload()

    def _upload(self) -> None:
        super()._upload()
        assert self.bounds is not None
        self.bounds.copy_(self._staging_bounds, non_blocking=self.bounds.device.type != "cpu")


class RowsForward(BucketForward):
    """The forward of a static-cache verifier of up to ``places`` sequences at once, all rows in one forward
    per step (module docstring). ``engine`` and ``buckets`` (by the rows' total nodes) as for
    :class:`~specdec.backends.buckets.forward.BucketForward`; ``row_nodes``: the most nodes one row's tree may have
    (:attr:`max_tree_nodes`; at most the largest bucket; None: 128, or the largest bucket if smaller).
    A state's ``seat`` is its place."""

    runner_class = RowsBucketRunner
    regions_alike = True  # every place's region is as large as the largest (batching.check_memory counts so)

    def __init__(
        self, target: Target, *, places: int, engine: str | None = None, buckets: Sequence[int] = ROWS_BUCKETS,
        row_nodes: int | None = None, window: WindowArg = "model",
    ) -> None:  # fmt: skip
        if isinstance(places, bool) or not isinstance(places, int) or places < 1:
            raise SpecDecError(f"places must be a positive int, got {places!r}")
        self.places = places
        self._owners: list[weakref.ReferenceType[KVState] | None] = [None] * places
        self._opening: int | None = None  # the place the prefill in progress writes
        sizes = sorted({int(b) for b in buckets})
        largest = sizes[-1] if sizes else 0
        if row_nodes is None:
            row_nodes = min(BUCKETS[-1], largest)
        if isinstance(row_nodes, bool) or not isinstance(row_nodes, int) or not 1 <= row_nodes <= largest:
            raise SpecDecError(f"row_nodes must be an int from 1 to the largest bucket ({largest}), "
                               f"got {row_nodes!r}")  # fmt: skip
        self.row_nodes = row_nodes
        scratch = scratch_for(sizes) if sizes else 0
        # Each row's ring holds its tree (at most row_nodes); the padding goes to the scratch slots.
        super().__init__(target, engine=engine, buckets=buckets, window=window, rings=(row_nodes, places, scratch),
                         first_capacity=places * MIN_CAPACITY + scratch, setting=("rows", places))  # fmt: skip
        self.max_tree_nodes = row_nodes  # one row's tree; the buckets hold every row's

    # -- layout ---------------------------------------------------------------------------
    @property
    def span(self) -> int:
        """Slots per place (``S``)."""
        return (self.cache.capacity - self.scratch) // self.places

    @property
    def scratch(self) -> int:
        """Slots for padding nodes after the regions: a tree is padded by less than the gap below its bucket.

        >>> scratch_for(ROWS_BUCKETS)
        255
        """
        return scratch_for(self.buckets)

    def _fit(self, needed: int) -> None:
        """Make every place hold ``needed`` slots, moving the live rows' committed slots (module docstring)."""
        span = self.span
        if needed <= span:
            return
        grown = capacity_for(needed)
        moves = []
        for place in range(self.places):
            state = self._owner(place)
            if state is not None:
                moves.append((place * span, place * grown, state.committed_len))
        self.cache.regrow_regions(self.places * grown + self.scratch, moves)
        self.held.drop_runners()  # their buffers wrote the old layout; the graphs read the old tensors

    # -- places ---------------------------------------------------------------------------
    def _owner(self, place: int) -> KVState | None:
        ref = self._owners[place]
        state = None if ref is None else ref()
        return state if state is not None and state.cache is not None else None

    def _check_owned(self, state: KVState) -> None:
        if state.cache is None:
            raise SpecDecError("this sequence was released: it cannot be verified any more")
        if not 0 <= state.seat < self.places or self._owner(state.seat) is not state:
            raise SpecDecError("this sequence does not belong to this batch verifier")

    @property
    def live_limit(self) -> int | None:
        """``places``: the sequences this verifier holds at once."""
        return self.places

    def row_bytes(self, tokens: int) -> int | None:
        """KV-cache bytes of one place holding up to ``tokens`` tokens: its region (a power of two of at
        least 256 slots; every place is as large as the largest) x layers x keys and values x KV heads x
        head size x the dtype's bytes. None where the config does not say."""
        per_token = kv_bytes_per_token(self.model.config, self.dtype)
        return None if per_token is None else per_token * capacity_for(tokens)

    def release(self, state: KVState) -> None:
        """The sequence is over: its place is free for the next prefill."""
        if state.cache is not None and 0 <= state.seat < self.places and self._owner(state.seat) is state:
            self._owners[state.seat] = None

    @contextmanager
    def preserving(self) -> Iterator[None]:
        """A block (calibration, warm-up) whose sequences are released at its end; live rows keep their places."""
        before = [self._owner(place) is not None for place in range(self.places)]
        try:
            yield
        finally:
            for place in range(self.places):
                state = self._owner(place)
                if state is not None and not before[place]:
                    self.release(state)
                    state.cache = None

    # -- the forward (specdec.backends.verifier.Forward) -------------------------------------------
    def prefill(self, input_ids: torch.Tensor, *, keep_all: bool, reserve: int) -> tuple[Any, torch.Tensor]:
        """The prompt, eagerly, into the first free place's region."""
        self.check_model_unchanged()
        place = next((p for p in range(self.places) if self._owner(p) is None), None)
        if place is None:
            raise SpecDecError(
                f"all {self.places} places of this batch verifier hold live sequences: release one first"
            )
        length = input_ids.shape[1]
        self._fit(length + max(reserve, 0) + self.row_nodes)
        base = place * self.span
        bounds = torch.full((2, length), base, dtype=torch.int64, device=self.device)  # nothing committed yet
        self.cache.window = None
        logits = self.prompt_forward(input_ids, keep_all, base, bounds)
        self._opening = place
        return self.cache, logits

    def opened(self, state: KVState) -> None:
        assert self._opening is not None, "a state without its prefill"
        place = state.seat = self._opening
        self._opening = None
        self._owners[place] = weakref.ref(state)

    def tree(self, state: KVState, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
        self._check_owned(state)
        return self._rows_forward([state], [tree])

    def rows(self, states: Sequence[KVState], trees: Sequence[DraftTree]) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's tree in one forward (several when they add up to more than the largest bucket); the
        verifier then decides, walks and compacts each row in its own region."""
        for state in states:
            self._check_owned(state)
        return self._rows_forward(states, trees)

    def _rows_forward(self, states: Sequence[KVState], trees: Sequence[DraftTree]) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' logits ``[R, V]`` and positions int64 ``[R]``, tree after tree (``R = sum N_b``)."""
        self._fit(max(state.committed_len + tree.size for state, tree in zip(states, trees, strict=True)))
        span, scratch = self.span, self.places * self.span
        logits_parts, position_parts = [], []
        groups = _groups([tree.size for tree in trees], self.largest_bucket)
        for group in groups:
            rows = [(trees[b], states[b].seat * span, states[b].committed_len) for b in group]
            total = sum(trees[b].size for b in group)
            runner = self.checks.runner(total)
            assert isinstance(runner, RowsBucketRunner)
            runner.load_rows(rows, scratch)
            self.cache.window = None
            logits = self.checks.run(runner)[:total]
            positions = runner.positions[0, :total]
            if len(groups) > 1:  # the next group may reuse this bucket's buffers (a replayed graph's output too)
                logits, positions = logits.clone(), positions.clone()
            logits_parts.append(logits)
            position_parts.append(positions)
        if len(logits_parts) == 1:
            return logits_parts[0], position_parts[0]
        return torch.cat(logits_parts), torch.cat(position_parts)

    def compact(self, state: KVState, committed_len: int, path: Sequence[int]) -> None:
        self.cache.compact(state.seat * self.span + committed_len, tuple(path))

    def rewind(self, state: KVState, committed_len: int) -> None:
        """The region's later slots are simply overwritten; a ring that lost keys runs them again."""
        if self.window is not None:
            bucket_rewind(self, state.seat, committed_len)


def rows_bucket_verifier(
    model: Any, ops: TreeOps | None = None, chooser: TokenChooser | None = None, *, places: int,
    engine: str | None = None, buckets: Sequence[int] = ROWS_BUCKETS, row_nodes: int | None = None,
) -> ModelVerifier:  # fmt: skip
    """A fixed-shape engine's verifier of up to ``places`` sequences at once: a :class:`ModelVerifier` whose
    forward is a :class:`RowsForward` (arguments as there)."""
    forward = RowsForward(Target.of(model), places=places, engine=engine, buckets=buckets, row_nodes=row_nodes)
    return ModelVerifier(model, ops, chooser, forward=forward)


def rows_verifier(verifier: ModelVerifier, places: int) -> ModelVerifier:
    """The verifier a batch of ``places`` runs on where ``verifier`` holds one sequence on buckets: a
    :func:`rows_bucket_verifier` of the same engine, tree ops, chooser and buckets (and larger ones, for every
    row's tree in one forward); ``verifier`` itself where its forward is not the one-sequence buckets'."""
    alone = verifier.forward
    if not isinstance(alone, BucketForward) or isinstance(alone, RowsForward):
        return verifier
    extra = tuple(b for b in ROWS_BUCKETS if b > alone.buckets[-1])  # every row's tree in one forward
    return rows_bucket_verifier(verifier.model, verifier.ops, verifier.chooser, places=places, engine=alone.engine,
                                buckets=(*alone.buckets, *extra), row_nodes=alone.largest_bucket)


def scratch_for(buckets: Sequence[int]) -> int:
    """Slots for padding nodes after the regions: a tree is padded by less than the gap below its bucket."""
    return max(b - a - 1 for a, b in zip((0, *buckets), buckets, strict=False))


def _groups(sizes: Sequence[int], limit: int) -> list[list[int]]:
    """Consecutive indices of ``sizes`` in groups that add up to at most ``limit`` each (order kept).

    >>> _groups([3, 4, 2, 8, 1], 8)
    [[0, 1], [2], [3], [4]]
    """
    groups: list[list[int]] = []
    total = limit + 1
    for index, size in enumerate(sizes):
        if total + size > limit:
            groups.append([])
            total = 0
        groups[-1].append(index)
        total += size
    return groups
