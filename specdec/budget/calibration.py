"""Calibration: measuring a verifier's cost per tree size and context, and which kernels to run.

**Calibration** (once per model, device and dtype, then cached by
:mod:`specdec.budget.calibration_cache`): prefill ``max(contexts)`` random tokens, then time
verifications of chains of every size in ``sizes`` at every context in ``contexts`` (the
cache is cropped back after each), rounds interleaved so a drift of the machine's load hits
all sizes alike; keep the fastest of ``repeats`` rounds (other jobs on a shared machine only
ever add time, so the minimum is the cost of the model itself). Two physical bounds then
remove what noise is left: costs are made non-decreasing in ``N`` (a larger tree never
costs less) and at most ``N * cost(1)`` (one forward over ``N`` tokens never costs more
than ``N`` one-token forwards). ~60 verifications in all: ~10 s on a 2-core CPU for a 135M
model, ~1 s on a GPU. How busy the machine was meanwhile is recorded with the table
(:mod:`specdec.budget.machine_load`).

**Kernel choice**: where the verifier offers narrow products (:mod:`specdec.backends.narrow`:
CPU, fp32/fp64), every size from 1 to ``NARROW_MAX_SIZE`` is also timed with them, in the
same rounds (one node: the padded product). ``narrow_rows`` is the largest size up to which
they were faster at every calibrated size from 2 on (summed over the contexts),
``narrow_single`` whether the padded product was faster for one node; the table keeps the
faster time of each size under those rules, and :func:`~specdec.budget.calibration_cache.cost_model`
sets the verifier's switches from it, so the costs the planner plans with are those of the
kernels the verifier will run.

**Identity**: what the cost depends on, :func:`model_identity`: the model's architecture (its
config, minus names and paths: two checkpoints of one architecture cost the same), parameter
dtype, device (CPU model or GPU name), attention implementation, backend, KV cache kind,
torch version and thread count.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import random
import time
from collections.abc import Sequence

import numpy as np
import torch

from specdec.backends.verifier import ModelVerifier
from specdec.budget.cost_model import CALIBRATION_VERSION, CostTable, FloatArray
from specdec.budget.machine_load import MachineWatch
from specdec.errors import SpecDecError
from specdec.types import DraftTree

DEFAULT_SIZES = (1, 2, 3, 4, 6, 8, 16, 32, 64, 128)
NARROW_MAX_SIZE = 32  # narrow products are timed up to this size (past ~8 the usual GEMM wins)
DEFAULT_CONTEXTS = (64, 1024)
DEFAULT_REPEATS = 3


def _device_name(verifier: ModelVerifier) -> str:
    device = verifier.device
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{device.type}:{cpu}"


def model_identity(verifier: ModelVerifier) -> dict[str, str]:
    """What the verification cost depends on (module docstring), as strings."""
    config = verifier.model.config.to_dict()
    architecture = {k: v for k, v in config.items() if not k.startswith("_") and k not in ("name_or_path",)}
    digest = hashlib.sha256(json.dumps(architecture, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {
        "model_type": str(config.get("model_type", type(verifier.model).__name__)),
        "config": digest,
        "dtype": str(verifier.dtype).removeprefix("torch."),
        "device": _device_name(verifier),
        "attention": str(getattr(verifier.model.config, "_attn_implementation", None) or "eager"),
        "backend": verifier.name,
        "cache": verifier.cache_kind,
        "torch": torch.__version__,
        "threads": str(torch.get_num_threads()) if verifier.device.type == "cpu" else "-",
        "version": str(CALIBRATION_VERSION),
    }


def identity_key(identity: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def calibration_plan(
    verifier: ModelVerifier, sizes: Sequence[int], contexts: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The sizes and contexts that fit the model's context length (a tiny model has a short one)."""
    sizes = tuple(sorted(set(int(s) for s in sizes)))
    contexts = tuple(sorted(set(int(c) for c in contexts)))
    if not sizes or sizes[0] < 1:
        raise SpecDecError(f"calibration sizes must be positive ints, got {list(sizes)}")
    if not contexts or contexts[0] < 1:
        raise SpecDecError(f"calibration contexts must be positive ints, got {list(contexts)}")
    limit = verifier.context_length
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
    verifier: ModelVerifier,
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    repeats: int = DEFAULT_REPEATS,
    seed: int = 0,
) -> CostTable:
    """Measure verification seconds for every size at every context (module docstring).

    Costs ``(len(contexts) * repeats + 1) * len(sizes)`` verifications (each size that
    narrow products are timed at counts twice) plus one prefill of ``max(contexts)``
    tokens. Random tokens stand in for text: the cost of a forward does not depend on
    which tokens it sees.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise SpecDecError(f"calibration repeats must be a positive int, got {repeats!r}")
    buckets = getattr(verifier, "buckets", None)
    if buckets is not None:  # a static cache costs its bucket's forward: time the buckets themselves
        sizes = tuple(b for b in buckets if b <= max(sizes))
    sizes, contexts = calibration_plan(verifier, sizes, contexts)
    watch = MachineWatch.start(verifier.device.type == "cpu")
    with verifier.preserving():  # a static cache keeps the sequence it serves
        table = _calibrate(verifier, sizes, contexts, repeats, seed)
    share = watch.others_share()
    return dataclasses.replace(table, bucketed=buckets is not None, others_share=0.0 if share is None else share)


def _calibrate(
    verifier: ModelVerifier, sizes: tuple[int, ...], contexts: tuple[int, ...], repeats: int, seed: int
) -> CostTable:
    rng = random.Random(seed)
    vocab = verifier.vocab_size
    narrow_sizes = {s for s in sizes if s <= NARROW_MAX_SIZE} if verifier.narrow is not None else set()
    prompt = [rng.randrange(vocab) for _ in range(contexts[-1])]
    state, pending, _ = verifier.prefill(prompt, reserve=sizes[-1])
    plain: list[list[float]] = []  # [C][S] fastest round, usual kernels
    narrow: list[list[float]] = []  # [C][S] fastest round, narrow products (inf where not timed)
    spreads: list[float] = []  # slowest / fastest - 1 of every timed cell's repeats
    kept_rows, kept_single = verifier.narrow_rows, verifier.narrow_single
    try:
        for context in reversed(contexts):  # crop the one prefilled cache down, context by context
            verifier.rewind(state, context)
            times: dict[tuple[int, bool], list[float]] = {}
            warmup = 1 if context == contexts[-1] else 0  # the first round warms up (allocator growth, kernel choice)
            for round_ in range(warmup + repeats):
                for size in sizes:
                    for use_narrow in (False, True) if size in narrow_sizes else (False,):
                        verifier.narrow_rows = size if use_narrow and size > 1 else 0
                        verifier.narrow_single = use_narrow and size == 1
                        tree = DraftTree.chain(pending, [rng.randrange(vocab) for _ in range(size - 1)])
                        started = time.perf_counter()
                        verifier.verify(state, tree)  # ends in a host sync: the walk needs the choices
                        elapsed = time.perf_counter() - started
                        verifier.rewind(state, context)
                        if round_ >= warmup:
                            times.setdefault((size, use_narrow), []).append(elapsed)
            plain.insert(0, [min(times[(s, False)]) for s in sizes])
            spreads.extend(max(t) / min(t) - 1.0 for t in times.values() if len(t) > 1)
            narrow.insert(0, [min(times.get((s, True), [np.inf])) for s in sizes])
    finally:
        verifier.narrow_rows, verifier.narrow_single = kept_rows, kept_single
    narrow_rows = _narrow_threshold(sizes, np.array(plain), np.array(narrow))
    narrow_single = _narrow_single(sizes, np.array(plain), np.array(narrow))
    seconds: list[tuple[float, ...]] = []
    for plain_row, narrow_row in zip(plain, narrow, strict=True):
        row = np.array(
            [
                n if 2 <= s <= narrow_rows or (s == 1 and narrow_single) else p
                for s, p, n in zip(sizes, plain_row, narrow_row, strict=True)
            ]
        )
        fastest = np.maximum.accumulate(row)  # [S] non-decreasing
        fastest = np.minimum(fastest, np.asarray(sizes, dtype=np.float64) * fastest[0])  # subadditive
        seconds.append(tuple(float(s) for s in fastest))
    spread = float(np.median(spreads)) if spreads else 0.0
    return CostTable(
        sizes, contexts, tuple(seconds), model_identity(verifier), narrow_rows, narrow_single, spread=spread
    )


def _narrow_threshold(sizes: Sequence[int], plain: FloatArray, narrow: FloatArray) -> int:
    """The largest size up to which narrow products were faster at every timed size (0: none).

    ``plain`` and ``narrow`` are ``[C, S]`` seconds (``inf`` where narrow was not timed);
    a size's verdict sums its contexts.
    """
    rows = 0
    for j, size in enumerate(sizes):
        if size < 2:
            continue
        if not float(narrow[:, j].sum()) < float(plain[:, j].sum()):
            break
        rows = size
    return rows


def _narrow_single(sizes: Sequence[int], plain: FloatArray, narrow: FloatArray) -> bool:
    """Whether the padded narrow product was faster for one-node trees (summed over the contexts)."""
    if 1 not in sizes:
        return False
    j = list(sizes).index(1)
    return bool(float(narrow[:, j].sum()) < float(plain[:, j].sum()))
