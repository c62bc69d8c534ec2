"""Verification through specdec's own forward (:mod:`specdec.backends.specdec_engine.model_runner`) on a cache per
sequence.

``engine="specdec"``: the model's forward is :class:`~specdec.backends.specdec_engine.model_runner.DecoderRunner`
(Llama-family decoders), eager, each sequence with its own
:class:`~specdec.backends.slot_cache.StaticKVCache` sized for its prompt and its token
budget (grown if it must), written in place at the tree's slots and compacted in place.
No compilation and no warm-up: the first step of the first call is as fast as any later
one.

**Kernels**: five variants (:meth:`SpecdecForward.kernel_variants`). ``"cpu"``: specdec's CPU
kernels (:mod:`specdec.backends.specdec_engine.cpu_kernels`: skinny linear layers and tree attention), the
choice for forwards of up to :data:`CPU_KERNEL_MAX_ROWS` rows from the start, where they are
available; ``"default"``: ``torch.nn.functional.linear`` and ``scaled_dot_product_attention``
(what the prompt's hundreds of rows take); ``"cpu-attention"``: torch's linear layers with
specdec's tree attention, for the sizes where a GEMM library's blocked products beat the
skinny kernels (many rows; bfloat16 GEMMs with AVX512_BF16) but SDPA's masked attention costs
twice the tree attention's; ``"cpu-blocks"`` (where ``"cpu"`` runs the AVX-512 or the AVX2 path,
forwards of 1-3 rows): ``"cpu"`` with the few-row products blocked as larger ones are rather than
streamed, the same bits, faster on some CPUs than the streams (an Intel Xeon's; docs/budget.md);
``"cpu-avx2"`` (CPUs with AVX-512,
forwards of up to :data:`AVX2_MAX_ROWS` rows): ``"cpu"`` on AVX2 kernels that keep the AVX-512 path's
bits (:data:`~specdec.backends.specdec_engine.cpu_kernels.AVX2_ISA`), faster than AVX-512 at few rows on some CPUs (an
AMD Zen 4); ``"cpu-widened"`` (a model loaded from a GGUF file, whose ``"cpu"`` reads the file's blocks:
:mod:`~specdec.backends.specdec_engine.gguf_blocks`): ``"cpu"`` on the model's float32 weights, the same
bits, faster where many rows make the forward bound by arithmetic rather than by reading weights. The
calibration times every
variant at every tree size and the :class:`~specdec.Generator` passes its verdict on; where
none is cached (a generator that never drafts never calibrates), the first plain steps time the
one-token variants in turn, where there are several, and keep the fastest for the process (:class:`PlainStepTrial`,
:data:`PLAIN_VERDICTS`). While the
CPU kernels serve both a plain step and a tree, a tree node's logits are bitwise those of the
same token verified alone (their contracts), so speculative output is plain decoding's exactly.

**Batches** (:meth:`SpecdecForward.rows`): the rows of many sequences' trees go through
one forward as the runner's segments (each its own cache, positions and ancestors; no padding),
so the weights are read once for the whole batch; acceptance and compaction then run per row.
The CPU kernels' rows are batch-invariant, so each row's logits are bitwise those it would get
verified alone.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch

from specdec.backends.forward import KVState, Target
from specdec.backends.identity import model_identity
from specdec.backends.slot_cache import StaticKVCache, capacity_for
from specdec.backends.specdec_engine import cpu_kernels, gguf_blocks
from specdec.backends.specdec_engine.model_runner import PLAIN, DecoderRunner, Kernels, Segment, aten_linear
from specdec.backends.tree import ancestor_matrix
from specdec.backends.tree_ops import TreeOps
from specdec.backends.verifier import ModelVerifier
from specdec.types import DEFAULT_KERNEL, DraftTree, KernelChoice, TokenChooser

# The most nodes one verification may hold: the engine's own cap on tree size.
MAX_NODES = 512
CPU_KERNEL = "cpu"  # specdec's CPU kernels (specdec.backends.specdec_engine.cpu_kernels)
CPU_ATTENTION = "cpu-attention"  # torch's linear layers, specdec's tree attention
CPU_BLOCKS = "cpu-blocks"  # specdec's CPU kernels with the few-row products blocked, not streamed (AVX-512, AVX2)
BLOCKS_MAX_ROWS = 3  # the rows up to which "cpu-blocks" computes otherwise than "cpu" (csrc/skinny_linear.cpp)
CPU_AVX2 = "cpu-avx2"  # specdec's CPU kernels on AVX2 with AVX-512's bits, on a CPU whose best is AVX-512
AVX2_MAX_ROWS = 8  # the largest verification at which the calibration times "cpu-avx2" (cpu_kernels.AVX2_ISA)
# specdec's CPU kernels on the model's float32 weights where "cpu" reads a GGUF file's blocks (gguf_blocks): the
# same bits; blocks read a sixth of the bytes but pay for widening, which costs more than it saves where a
# forward's rows make it bound by arithmetic (many rows, one thread), so the calibration times both.
CPU_WIDENED = "cpu-widened"
CPU_KERNEL_MAX_ROWS = 64  # the largest verification the calibration times the kernel variants at
# A prompt of up to this many tokens is prefilled by the kernel variant chosen for CPU_KERNEL_MAX_ROWS rows
# (longer ones by torch's): specdec's CPU kernels prefill faster than torch's linear and SDPA up to about
# there (docs/budget.md); where the calibration found torch's kernels faster at 64 rows, the prefill keeps
# them too.
PREFILL_MAX_ROWS = 1024
# Plain steps each kernel variant of a one-token forward times, interleaved, before the fastest takes the
# rest, where no calibration chose (PlainStepTrial).
PLAIN_TRIAL_STEPS = 3


class PlainStepTrial:
    """Which kernel variant a one-token forward runs where there are several (the AVX-512 and AVX2
    paths) and no calibration chose one: the candidates take turns over the first plain steps, each
    timed, and the fastest (its quickest step: a process's first pays one-time costs) then runs every
    later one.

    Why: the variants compute the same bits, but which is fastest depends on the CPU (on an AMD Zen 4
    the AVX2 stream beats AVX-512 at one row, on an Intel Xeon blocks beat streams: docs/benchmarks.md),
    and a generator that never drafts
    (``drafter="none"``) never calibrates. Timing real steps costs no extra forward: at most the
    trial's few steps run a slower variant.

    >>> trial = PlainStepTrial(("cpu", "cpu-avx2"), steps=2)
    >>> [trial.record(trial.next_variant(), s) for s in (0.024, 0.021, 0.023, 0.020)]
    [None, None, None, 'cpu-avx2']
    """

    def __init__(self, candidates: Sequence[str], steps: int = PLAIN_TRIAL_STEPS) -> None:
        self.candidates = tuple(candidates)
        self.steps = steps
        self.seconds: dict[str, list[float]] = {name: [] for name in self.candidates}
        self._turn = 0

    def next_variant(self) -> str:
        """The variant the next plain step runs (the candidates in turn)."""
        return self.candidates[self._turn % len(self.candidates)]

    def record(self, variant: str, seconds: float) -> str | None:
        """Note a plain step's time; the winner once every candidate has run its steps, else None."""
        self.seconds[variant].append(seconds)
        self._turn += 1
        if self._turn < self.steps * len(self.candidates):
            return None
        return min(self.candidates, key=lambda name: min(self.seconds[name]))


# The plain-step trial's verdicts in this process, by the forward's kernel build and the model's identity (its
# thread count included: SpecdecForward.__init__): the variants compute the same bits, so a verdict can only
# change the speed.
PLAIN_VERDICTS: dict[str, str] = {}


def _plain_choice(winner: str) -> KernelChoice:
    """A plain-step trial's ``winner`` for one token, ``"cpu"`` up to :data:`CPU_KERNEL_MAX_ROWS` rows."""
    if winner == CPU_KERNEL:
        return KernelChoice(((CPU_KERNEL_MAX_ROWS, CPU_KERNEL),))
    return KernelChoice(((1, winner), (CPU_KERNEL_MAX_ROWS, CPU_KERNEL)))


def widening_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``torch.nn.functional.linear`` where ``weight`` may be GGUF blocks (uint8 ``[N, B, block_bytes]``): widened
    first (:func:`~specdec.backends.specdec_engine.cpu_kernels.gguf_widen`, the float32 weight's bits, a transient
    ``[N, K]``), so torch's kernels compute on a blocks-only model what they compute on the widened one."""
    if weight.dtype == torch.uint8:
        weight = cpu_kernels.gguf_widen(weight)
    return aten_linear(x, weight, bias)


@functools.cache
def _forced_kernels(isa: str, blocks: bool = False) -> Kernels:
    """Specdec's CPU kernels with every op forced to ``isa``
    (:data:`~specdec.backends.specdec_engine.cpu_kernels.ISAS`); ``blocks``: reading a GGUF model's blocks
    (``Kernels.blocks``)."""
    return Kernels(
        functools.partial(cpu_kernels.skinny_linear, isa=isa), functools.partial(cpu_kernels.tree_attention, isa=isa),
        functools.partial(cpu_kernels.skinny_linears, isa=isa),
        functools.partial(cpu_kernels.tree_attention_segments, isa=isa), cpu_kernels.write_segments,
        functools.partial(cpu_kernels.decoder_layers, isa=isa), blocks,
    )  # fmt: skip


class SpecdecForward:
    """``engine="specdec"``: the forward of a :class:`~specdec.backends.verifier.ModelVerifier` by a
    :class:`DecoderRunner`, over a cache per sequence (a :class:`~specdec.backends.verifier.Forward`).

    Kernels: module docstring. The CPU kernels serve forwards of up to
    :data:`CPU_KERNEL_MAX_ROWS` rows from construction, where they build and serve the model
    (:func:`specdec.backends.specdec_engine.cpu_kernels.supports`); :meth:`use_kernels` changes that.
    """

    KERNELS = (DEFAULT_KERNEL, CPU_KERNEL, CPU_ATTENTION, CPU_BLOCKS, CPU_AVX2, CPU_WIDENED)
    engine = "specdec"  # specdec's own forward
    cache_kind = "native"  # in calibration keys: specdec's own forward, a cache per sequence, eager
    fallback_reason = None
    live_limit = None  # each sequence owns its cache
    max_tree_nodes: int | None = MAX_NODES
    buckets: tuple[int, ...] | None = None  # every tree size runs a forward of its own

    def __init__(self, target: Target) -> None:
        self.target = target
        self.device = target.device
        # A model loaded from a GGUF file: its linear layers read the file's blocks on the CPU kernels (the same
        # bits as its float32 weights, a sixth of the bytes for Q4_1: gguf_blocks), torch's kernels the weights.
        self.gguf = gguf_blocks.model_blocks(target.model)
        # A blocks-only model (specdec.gguf_weights) has no float32 weights: every variant reads the blocks, torch's
        # linear layers each weight widened from them (the float32 weight's bits) on the way.
        self.only_blocks = self.gguf is not None and self.gguf.only_copy
        self.runner = DecoderRunner(target.model, None if self.gguf is None else self.gguf.blocks, self.only_blocks)
        self.blocks = self.gguf is not None
        self.plain = Kernels(widening_linear, blocks=True) if self.only_blocks else PLAIN
        self.cpu_kernels = Kernels(
            cpu_kernels.skinny_linear, cpu_kernels.tree_attention, cpu_kernels.skinny_linears,
            cpu_kernels.tree_attention_segments, cpu_kernels.write_segments, cpu_kernels.decoder_layers, self.blocks,
        )  # fmt: skip
        self.cpu_widened = self.cpu_kernels if self.only_blocks else replace(self.cpu_kernels, blocks=False)
        self.cpu_attention = Kernels(self.plain.linear, cpu_kernels.tree_attention, None,
                                     cpu_kernels.tree_attention_segments, cpu_kernels.write_segments,
                                     blocks=self.only_blocks)  # fmt: skip
        self.kernels_available = cpu_kernels.supports(target.model) and cpu_kernels.available()
        self.cpu_blocks: Kernels | None = None
        self.runs_avx512 = False  # "cpu" runs the AVX-512 path (which "cpu-avx2" may stand in for)
        self._kernels = KernelChoice()  # the default kernels everywhere, where the CPU kernels do not serve
        if self.kernels_available:
            self._kernels = KernelChoice(((CPU_KERNEL_MAX_ROWS, CPU_KERNEL),))
            path = cpu_kernels.cpu_isa()
            self.runs_avx512 = path == "avx512"
            if path in cpu_kernels.BLOCKS_ISAS:
                self.cpu_blocks = _forced_kernels(cpu_kernels.BLOCKS_ISAS[path], self.blocks)
        # Where one-token forwards have other variants than "cpu" (the AVX-512 and AVX2 paths), the first plain
        # steps time them until a kernel choice is set (use_kernels: a calibration's, or a caller's) or they
        # decide; a verdict is kept for the process (PLAIN_VERDICTS), so a later forward of the same model and
        # kernels (every specdec.run call makes one) starts from it and times nothing.
        self.plain_trial: PlainStepTrial | None = None
        self._verdict_key = ""
        if self.cpu_blocks is not None:
            identity = model_identity(target.model, dtype=target.dtype, device=self.device, backend="-",
                                      cache=self.cache_kind)  # fmt: skip
            self._verdict_key = self.kernels_build() + "/" + json.dumps(identity, sort_keys=True)
            known = PLAIN_VERDICTS.get(self._verdict_key)
            if known is not None:
                self._kernels = _plain_choice(known)
            else:
                # Torch's linear layers are slower for one token than "cpu"; "cpu-widened" reads float32 weights,
                # several times the blocks' bytes, where one row is bound by reading them.
                skipped = (DEFAULT_KERNEL, CPU_ATTENTION, CPU_WIDENED)
                self.plain_trial = PlainStepTrial([v for v in self.kernel_variants(1) if v not in skipped])

    @property
    def kernels(self) -> KernelChoice:
        """The kernel choice in force (set by the verifier's ``use_kernels``)."""
        return self._kernels

    @kernels.setter
    def kernels(self, choice: KernelChoice) -> None:
        self._kernels = choice
        self.plain_trial = None  # a choice set from outside (a calibration's table, a caller's) is kept as it is

    def identity(self) -> dict[str, str]:
        """The kernel path ``auto`` runs where the CPU kernels serve the model (``kernel_path``: the CPU's
        best, or the one ``SPECDEC_CPU_ISA`` forced): the throughput the planner statistics remember
        differs between paths as much as between machines; ``weights``: ``"gguf-blocks"`` where the linear
        layers read a GGUF file's blocks (a sixth of the bytes: another speed)."""
        if not self.kernels_available:
            return {}
        return {"kernel_path": cpu_kernels.cpu_isa(), **({"weights": "gguf-blocks"} if self.blocks else {})}

    @property
    def kernel_path(self) -> str:
        """The CPU kernels' path ``auto`` runs where they serve the model (the CPU's best, or the one
        ``SPECDEC_CPU_ISA`` forced), else ``"-"``."""
        return cpu_kernels.cpu_isa() if self.kernels_available else "-"

    def kernels_build(self) -> str:
        """The CPU kernels' build (:func:`~specdec.backends.specdec_engine.cpu_kernels.build_key`) and the kernel path
        ``auto`` runs (``cpu_isa``: forced by ``SPECDEC_CPU_ISA`` or the CPU's best) where they serve this
        model, else ``"-"``: part of the calibration's identity, so costs measured on one path (or one
        machine's ISA) never plan another's."""
        if not self.kernels_available:
            return "-"
        weights = "/gguf-blocks-only" if self.only_blocks else "/gguf-blocks" if self.blocks else ""
        return f"{cpu_kernels.build_key()}/{cpu_kernels.cpu_isa()}{weights}"

    def kernel_variants(self, rows: int) -> tuple[str, ...]:
        """``("default", "cpu", "cpu-attention")`` where the CPU kernels serve the model and ``rows`` is
        worth timing; where ``"cpu"`` runs the AVX-512 or the AVX2 path, also ``"cpu-blocks"`` where it
        computes otherwise than ``"cpu"`` (up to :data:`BLOCKS_MAX_ROWS` rows); on AVX-512 also
        ``"cpu-avx2"`` (AVX2 kernels with the AVX-512 path's bits, up to :data:`AVX2_MAX_ROWS` rows: on an
        AMD Zen 4 faster at 1-2 rows: docs/backends.md); where ``"cpu"`` reads GGUF blocks, also
        ``"cpu-widened"`` (the float32 weights, the same bits). The calibration times each and keeps per size the
        fastest; its table is keyed by the path ``"cpu"`` runs (:meth:`kernels_build`) and names each
        size's variant, so one path's costs never plan another's."""
        if self.kernels_available and rows <= CPU_KERNEL_MAX_ROWS:
            variants: tuple[str, ...] = (DEFAULT_KERNEL, CPU_KERNEL, CPU_ATTENTION)
            if self.cpu_blocks is not None and rows <= BLOCKS_MAX_ROWS:
                variants += (CPU_BLOCKS,)
            if self.runs_avx512 and rows <= AVX2_MAX_ROWS:
                variants += (CPU_AVX2,)
            if self.blocks and not self.only_blocks:
                variants += (CPU_WIDENED,)
            return variants
        return (DEFAULT_KERNEL,)

    def _kernels_for(self, rows: int) -> Kernels:
        if self.kernels_available and rows <= CPU_KERNEL_MAX_ROWS:
            return self._variant_kernels(self._kernels.variant_for(rows))
        return self.plain

    def _variant_kernels(self, variant: str) -> Kernels:
        """The kernels of ``variant`` where the CPU kernels serve the model (the caller checked)."""
        if variant == CPU_KERNEL:
            return self.cpu_kernels
        if variant == CPU_ATTENTION:
            return self.cpu_attention
        if variant == CPU_BLOCKS:
            return self.cpu_kernels if self.cpu_blocks is None else self.cpu_blocks
        if variant == CPU_WIDENED:  # without GGUF blocks "cpu" reads the float32 weights already: "cpu" itself
            return self.cpu_widened
        if variant == CPU_AVX2:  # off AVX-512 "cpu" runs AVX2 or portable already: "cpu" itself
            return _forced_kernels(cpu_kernels.AVX2_ISA, self.blocks) if self.runs_avx512 else self.cpu_kernels
        return self.plain

    # -- the forward (specdec.backends.verifier.Forward) -------------------------------------------
    def prefill(self, input_ids: torch.Tensor, *, keep_all: bool, reserve: int) -> tuple[Any, torch.Tensor]:
        length = int(input_ids.shape[1])
        capacity = capacity_for(length + max(reserve, 0) + 1)
        cache = StaticKVCache(self.runner.num_layers, capacity, self.device)
        positions = torch.arange(length, device=self.device).unsqueeze(0)
        segment = Segment(input_ids, positions, cache, 0, None, last_only=not keep_all)
        rows = min(length, CPU_KERNEL_MAX_ROWS) if length <= PREFILL_MAX_ROWS else length  # PREFILL_MAX_ROWS: why
        (logits,) = self.runner.forward([segment], self._kernels_for(rows))
        cache.committed_len = length
        return cache, logits

    def prefill_features(
        self, input_ids: torch.Tensor, *, keep_all: bool, reserve: int
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """:meth:`prefill` and every prompt position's features (``FeatureForward``), from the same forward."""
        length = int(input_ids.shape[1])
        cache = StaticKVCache(self.runner.num_layers, capacity_for(length + max(reserve, 0) + 1), self.device)
        positions = torch.arange(length, device=self.device).unsqueeze(0)
        segment = Segment(input_ids, positions, cache, 0, None, last_only=not keep_all)
        rows = min(length, CPU_KERNEL_MAX_ROWS) if length <= PREFILL_MAX_ROWS else length  # as prefill's
        logits, features = self.runner.forward_features(segment, self._kernels_for(rows))
        cache.committed_len = length
        return cache, logits, features

    def tree_features(self, state: KVState, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`tree` and every node's features (``FeatureForward``); a plain step runs the kernels in force
        (the plain-step trial times the feature-less steps only)."""
        segment, positions = self._segment(state, tree)
        logits, features = self.runner.forward_features(segment, self._kernels_for(tree.size))
        return logits, positions, features

    def opened(self, state: KVState) -> None:
        """Nothing to record: the state holds its own cache."""

    def tree(self, state: KVState, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
        segment, positions = self._segment(state, tree)
        trial = self.plain_trial
        if trial is None or tree.size != 1:
            (logits,) = self.runner.forward([segment], self._kernels_for(tree.size))
            return logits, positions
        variant = trial.next_variant()  # a plain step of the trial (PlainStepTrial): the same bits on every variant
        started = time.perf_counter()
        (logits,) = self.runner.forward([segment], self._variant_kernels(variant))
        winner = trial.record(variant, time.perf_counter() - started)  # the logits are on the CPU: the forward is done
        if winner is not None:
            self.plain_trial = None
            self._kernels = _plain_choice(winner)
            PLAIN_VERDICTS[self._verdict_key] = winner
        return logits, positions

    def _segment(self, state: KVState, tree: DraftTree) -> tuple[Segment, torch.Tensor]:
        """``tree`` after the sequence's committed tokens as a runner segment, and its positions int64 ``[N]``;
        the sequence's cache grows first when the tree would overflow it."""
        cache: StaticKVCache = state.cache
        committed = state.committed_len
        if committed + tree.size > cache.capacity:
            cache.committed_len = committed
            cache.grow(capacity_for(committed + tree.size))
        positions = torch.tensor([[committed + depth for depth in tree.depths]], dtype=torch.long,
                                 device=self.device)  # fmt: skip  # [1, N]
        ancestors = None if tree.is_chain else torch.from_numpy(ancestor_matrix(tree.parents)).to(self.device)
        tokens = torch.tensor([tree.tokens], dtype=torch.long, device=self.device)
        return Segment(tokens, positions, cache, committed, ancestors), positions[0]

    def rows(self, states: Sequence[KVState], trees: Sequence[DraftTree]) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's tree in one forward (one pass over the weights for ``R = sum N_b`` rows).

        Each row gets exactly what a lone verification gives it wherever the forward's kernels are
        batch-invariant (specdec's CPU kernels, for ``R`` up to what the kernel choice gives them: a
        row's logits never depend on the other rows); past that, the default kernels' products
        differ from a lone row's in the last bits (the usual fp32 rounding; near-ties only).
        """
        pairs = [self._segment(state, tree) for state, tree in zip(states, trees, strict=True)]
        segments, positions = [s for s, _ in pairs], [p for _, p in pairs]
        rows = sum(tree.size for tree in trees)
        logits = self.runner.forward_rows(segments, self._kernels_for(rows))  # [R, V]
        return logits, torch.cat(positions)

    def row_bytes(self, tokens: int) -> int | None:
        """Peak KV-cache bytes of one sequence of up to ``tokens`` tokens: its cache's slots
        (:func:`~specdec.backends.slot_cache.capacity_for`: a power of two, at least 256) x layers x keys and
        values x KV heads x head size x the dtype's bytes. (A cache that must grow mid-sequence holds
        its old slots beside the new ones for the length of one copy: at most half as much again.)"""
        runner = self.runner
        itemsize = torch.empty((), dtype=self.target.dtype).element_size()
        return capacity_for(tokens) * runner.num_layers * 2 * runner.kv_heads * runner.head_dim * itemsize

    def compact(self, state: KVState, committed_len: int, path: Sequence[int]) -> None:
        state.cache.compact(committed_len, tuple(path))
        state.cache.committed_len = committed_len + len(path)

    def rewind(self, state: KVState, committed_len: int) -> None:
        state.cache.committed_len = committed_len  # later slots are overwritten

    def release(self, state: KVState) -> None:
        """Nothing to give back: the cache goes with the state."""

    @contextmanager
    def preserving(self) -> Iterator[None]:
        """Each sequence owns its cache: nothing to keep."""
        yield

    def close(self) -> None:
        """Nothing to give back."""


def specdec_verifier(model: Any, ops: TreeOps | None = None, chooser: TokenChooser | None = None) -> ModelVerifier:
    """``engine="specdec"``: a :class:`ModelVerifier` whose forward is a :class:`SpecdecForward`."""
    return ModelVerifier(model, ops, chooser, forward=SpecdecForward(Target.of(model)))
