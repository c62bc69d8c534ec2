"""Calibration: measuring a verifier's cost per tree size and context, and which kernels to run.

**Calibration** (once per model, device and dtype, then cached by
:mod:`specdec.budget.calibration_cache`): prefill ``max(contexts)`` random tokens, then time
verifications of chains of every size in ``sizes`` at every context in ``contexts`` (the
cache is cropped back after each), rounds interleaved so a drift of the machine's load hits
all sizes alike; keep the fastest of ``repeats`` rounds (other jobs on a shared machine only
ever add time, so the minimum is the cost of the model itself). Two physical bounds then
remove what noise is left: costs are made non-decreasing in ``N`` (a larger tree never
costs less) and at most ``N * cost(1)`` (one forward over ``N`` tokens never costs more
than ``N`` one-token forwards). How busy the machine was meanwhile is recorded with the table
(:mod:`specdec.budget.machine_load`). On ``engine="specdec"`` with specdec's CPU kernels (three or
four variants per size, below) it is ~270 verifications (seconds to tens of seconds: docs/budget.md):
the first generation on a machine pays it, with a progress bar on a terminal
(``specdec calibrate`` pays it up front), and every later process reads the table.

**Kernel choice**: every size is also timed with each other kernel variant the verifier
offers for it (:meth:`~specdec.types.TunableVerifier.kernel_variants`: specdec's CPU kernels,
:mod:`specdec.backends.specdec_engine.cpu_kernels`, on ``engine="specdec"`` up to 64 rows), in the same
rounds. :func:`choose_kernels` turns the timings into a :class:`~specdec.types.KernelChoice`:
one node runs the variant that was fastest there; from two nodes up each calibrated size
runs its fastest variant, up to the first size where the default kernels win, and every
larger forward runs the default. The table keeps each size's time under that choice and the
choice itself (:attr:`~specdec.budget.cost_model.CostTable.kernels`), and the
:class:`~specdec.Generator` switches its verifier to it (:meth:`~specdec.types.TunableVerifier.use_kernels`),
so the costs the planner plans with are those of the kernels the verifier runs.

**Identity**: a table is valid for :func:`calibration_identity`, the verifier's
:meth:`~specdec.types.TunableVerifier.identity` (model architecture, dtype, device, attention,
backend, KV cache kind, torch version, threads), :data:`~specdec.budget.cost_model.CALIBRATION_VERSION`
and the build of the kernels the verifier runs (``kernels_build()`` where a verifier has one: a
hash of the CPU kernels' sources for the native verifier), so a specdec whose kernels changed
measures again instead of planning with the old kernels' costs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tqdm import tqdm

from specdec.budget.cost_model import CALIBRATION_VERSION, CostTable, FloatArray
from specdec.budget.machine_load import MachineWatch
from specdec.errors import SpecDecError
from specdec.types import DEFAULT_KERNEL, DraftTree, KernelChoice, TunableVerifier

DEFAULT_SIZES = (1, 2, 3, 4, 6, 8, 16, 32, 64, 128)
DEFAULT_CONTEXTS = (64, 1024)
DEFAULT_REPEATS = 3


def calibration_identity(verifier: TunableVerifier[Any]) -> dict[str, str]:
    """What a calibration table is valid for (module docstring), as strings."""
    build = getattr(getattr(verifier, "forward", None), "kernels_build", None)  # a ModelVerifier's forward
    kernels = str(build()) if callable(build) else "-"
    return {**verifier.identity(), "version": str(CALIBRATION_VERSION), "kernels_build": kernels}


def identity_key(identity: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def calibration_plan(
    verifier: TunableVerifier[Any], sizes: Sequence[int], contexts: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The sizes and contexts that fit the model's context length (a tiny model has a short one)."""
    sizes = tuple(sorted(set(int(s) for s in sizes)))
    contexts = tuple(sorted(set(int(c) for c in contexts)))
    if not sizes or sizes[0] < 1:
        raise SpecDecError(f"calibration sizes must be positive ints, got {list(sizes)}")
    if not contexts or contexts[0] < 1:
        raise SpecDecError(f"calibration contexts must be positive ints, got {list(contexts)}")
    limit = verifier.description.context_length
    if limit is None:
        return sizes, contexts
    # The largest tree after the largest context must fit; shrink the contexts first, then the sizes.
    sizes = tuple(s for s in sizes if s <= limit // 2) or (1,)
    room = limit - sizes[-1]
    fitted = tuple(sorted({min(c, room) for c in contexts} - {0}))
    if not fitted:
        raise SpecDecError(f"the model's context length {limit} leaves no room to calibrate")
    return sizes, fitted


def calibrate(
    verifier: TunableVerifier[Any],
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    repeats: int = DEFAULT_REPEATS,
    seed: int = 0,
) -> CostTable:
    """Measure verification seconds for every size at every context (module docstring).

    Costs ``(len(contexts) * repeats + 1) * len(sizes)`` verifications (each size counts
    once more for every other kernel variant timed there) plus one prefill of
    ``max(contexts)`` tokens. Random tokens stand in for text: the cost of a forward does
    not depend on which tokens it sees. The verifier's kernel choice is left as it was.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise SpecDecError(f"calibration repeats must be a positive int, got {repeats!r}")
    buckets = verifier.buckets
    if buckets is not None:  # a static cache costs its bucket's forward: time the buckets themselves
        sizes = tuple(b for b in buckets if b <= max(sizes))
    sizes, contexts = calibration_plan(verifier, sizes, contexts)
    watch = MachineWatch.start(verifier.description.device.type == "cpu")
    with verifier.preserving():  # a static cache keeps the sequence it serves
        table = _calibrate(verifier, sizes, contexts, repeats, seed)
    share = watch.others_share()
    return dataclasses.replace(table, bucketed=buckets is not None, others_share=0.0 if share is None else share)


def _calibrate(
    verifier: TunableVerifier[Any], sizes: tuple[int, ...], contexts: tuple[int, ...], repeats: int, seed: int
) -> CostTable:
    rng = random.Random(seed)
    vocab = verifier.description.vocab_size
    variants = {size: verifier.kernel_variants(size) for size in sizes}  # the default first
    names = tuple(dict.fromkeys(name for size in sizes for name in variants[size]))
    forwards = (len(contexts) * repeats + 1) * sum(len(v) for v in variants.values())
    # On a terminal only (disable=None): a library call must not print into a notebook or a log.
    progress = tqdm(total=forwards, desc="specdec: measuring the verification cost (once per machine)",
                    unit="forward", leave=False, disable=None, file=sys.stderr)  # fmt: skip
    prompt = [rng.randrange(vocab) for _ in range(contexts[-1])]
    state, pending, _ = verifier.prefill(prompt, reserve=sizes[-1])
    fastest: dict[str, list[list[float]]] = {name: [] for name in names}  # [C][S] per variant (inf: not timed)
    spreads: list[float] = []  # slowest / fastest - 1 of every timed cell's repeats
    kept = verifier.kernels
    try:
        for context in reversed(contexts):  # crop the one prefilled cache down, context by context
            verifier.rewind(state, context)
            times: dict[tuple[int, str], list[float]] = {}
            warmup = 1 if context == contexts[-1] else 0  # the first round warms up (allocator growth, kernel choice)
            for round_ in range(warmup + repeats):
                for size in sizes:
                    for variant in variants[size]:
                        verifier.use_kernels(KernelChoice.uniform(variant))
                        tree = DraftTree.chain(pending, [rng.randrange(vocab) for _ in range(size - 1)])
                        started = time.perf_counter()
                        verifier.verify(state, tree)  # ends in a host sync: the walk needs the choices
                        elapsed = time.perf_counter() - started
                        verifier.rewind(state, context)
                        progress.update()
                        if round_ >= warmup:
                            times.setdefault((size, variant), []).append(elapsed)
            for name in names:
                fastest[name].insert(0, [min(times.get((s, name), [np.inf])) for s in sizes])
            spreads.extend(max(t) / min(t) - 1.0 for t in times.values() if len(t) > 1)
    finally:
        progress.close()
        verifier.use_kernels(kept)
        verifier.release(state)
    measured = {name: np.array(rows) for name, rows in fastest.items()}  # [C, S] each
    kernels = choose_kernels(sizes, measured)
    seconds: list[tuple[float, ...]] = []
    for c in range(len(contexts)):
        row = np.array([measured[kernels.variant_for(s)][c, j] for j, s in enumerate(sizes)])  # [S]
        row = np.maximum.accumulate(row)  # non-decreasing
        row = np.minimum(row, np.asarray(sizes, dtype=np.float64) * row[0])  # subadditive
        seconds.append(tuple(float(s) for s in row))
    spread = float(np.median(spreads)) if spreads else 0.0
    return CostTable(sizes, contexts, tuple(seconds), calibration_identity(verifier), kernels, spread=spread)


def choose_kernels(sizes: Sequence[int], seconds: Mapping[str, FloatArray]) -> KernelChoice:
    """The kernel choice the timings call for (module docstring).

    ``seconds[variant]`` is ``[C, S]`` (``inf`` where that variant was not timed), the
    default kernels among them; a size's verdict sums its contexts, and a variant wins a
    size only when it is strictly faster than the default and every variant listed before it.

    >>> plain = np.array([[1.0, 2.0, 3.0]])
    >>> choose_kernels((1, 2, 4), {"default": plain, "cpu": np.array([[1.1, 1.5, 3.5]])})
    KernelChoice(ranges=((1, 'default'), (2, 'cpu')), beyond='default')
    """
    totals = {name: np.asarray(table, dtype=np.float64).sum(axis=0) for name, table in seconds.items()}  # [S] each

    def fastest(j: int) -> str:
        best = DEFAULT_KERNEL
        for name, total in totals.items():
            if float(total[j]) < float(totals[best][j]):
                best = name
        return best

    ranges = [(1, fastest(list(sizes).index(1)) if 1 in sizes else DEFAULT_KERNEL)]
    for j, size in enumerate(sizes):
        if size < 2:
            continue
        winner = fastest(j)
        if winner == DEFAULT_KERNEL:  # a variant that stopped paying here is not trusted at larger sizes
            break
        if ranges[-1][0] >= 2 and ranges[-1][1] == winner:
            ranges[-1] = (size, winner)
        else:
            ranges.append((size, winner))
    return KernelChoice(tuple(ranges))
