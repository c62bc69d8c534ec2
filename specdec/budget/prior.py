"""The prior: a verification cost table from the model's shape and a sub-second probe of the machine.

Why: the cost model must exist before a generation's first draft, and timing ~270 verifications
to build it (:mod:`specdec.budget.calibration`) took 29 s on an idle 2-core CPU and 97 s beside
one busy process, inside the user's first call. Nothing the planner decides needs the table to be
right from the start, only right *in shape* soon: the online refinement
(:class:`~specdec.budget.cost_model.VerifyCostModel`) corrects every size the rule chooses from
that size's own steps, and the overall level from every step. So the first table is a roofline
estimate that costs no verification:

    cost(N, C) = overhead + weights / bandwidth + N * flops / gemm_rate
                 + N * C * attention_flops / gemm_rate + C * kv_bytes / bandwidth

``weights``: the bytes of every matrix a forward reads (the input embedding's rows are looked up,
not read; a tied output head counts once); ``flops``: two per weight per token; attention's
products per query and key; ``kv_bytes``: one position's keys and values over all layers.
``bandwidth`` and ``gemm_rate`` come from :func:`probe`: a one-row and a 16-row product through one
streamed 64 MiB weight, in the model's dtype on its device, through the linear layers its forward
runs (specdec's CPU kernels where they serve the model: they stream faster than torch's), best of 5:
the one-row product gives the bandwidth, what the 15 more rows add gives the arithmetic the stream
does not hide (a cache-resident product's rate overstated the slope 2.5x: the kernels overlap most of
their arithmetic with the stream). Tens of milliseconds, once per device, dtype, thread count and
kernels in a process. The sum of the weight and arithmetic terms, since
``gemm_rate`` counts only the arithmetic the stream leaves showing.

Where the estimate errs, it errs cheap: a size priced too low is chosen, measured on its first
steps and corrected; a size priced too high is reached by the planner's probes. The table is
marked ``source="prior"``; what runs learn from it is kept as a ``"learned"`` table
(:mod:`specdec.budget.calibration_cache`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specdec.budget.calibration import DEFAULT_CONTEXTS, DEFAULT_SIZES, calibration_identity, calibration_plan
from specdec.budget.cost_model import CostTable
from specdec.types import TunableVerifier

PROBE_REPEATS = 5
STREAM_BYTES = {"cpu": 64 << 20, "cuda": 512 << 20}  # larger than the last-level cache: the probe streams
GEMM_ROWS = 16  # the second probe: 16 rows through the same streamed weight
OVERHEAD_S = {"cpu": (2e-4, 2e-5), "cuda": (2e-4, 5e-5)}  # (per forward, per layer): the loop's own time


@dataclass(frozen=True)
class Machine:
    """What :func:`probe` measured: bytes per second streamed and flops per second computed."""

    bandwidth: float
    gemm_rate: float
    seconds: float  # what the probe itself took


@dataclass(frozen=True)
class Shape:
    """What a forward's cost depends on, read off the model (module docstring)."""

    weight_bytes: float
    flops_per_token: float
    layers: int
    attention_flops: float  # per query and key, over all layers
    kv_bytes: float  # per position, over all layers


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best(run: Any, device: torch.device) -> float:
    """The quickest of :data:`PROBE_REPEATS` timed calls of ``run`` after one untimed (other work only adds time)."""
    run()
    _sync(device)
    best = float("inf")
    for _ in range(PROBE_REPEATS):
        started = time.perf_counter()
        run()
        _sync(device)
        best = min(best, time.perf_counter() - started)
    return max(best, 1e-9)


Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x [M, K], weight [N, K]) -> [M, N]


def _torch_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight)


def _specdec_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    from specdec.backends.specdec_engine import cpu_kernels

    return cpu_kernels.skinny_linear(x, weight)


@functools.cache
def _probe(device_type: str, device_index: int | None, dtype: torch.dtype, threads: int, kernels: str) -> Machine:
    started = time.perf_counter()
    device = torch.device(device_type, device_index) if device_index is not None else torch.device(device_type)
    linear: Linear = _specdec_linear if kernels == "specdec" else _torch_linear
    itemsize = torch.empty((), dtype=dtype).element_size()
    side = int((STREAM_BYTES.get(device_type, STREAM_BYTES["cpu"]) // itemsize) ** 0.5) // 64 * 64
    with torch.inference_mode():
        weight = torch.ones(side, side, dtype=dtype, device=device)
        one = torch.ones(1, side, dtype=dtype, device=device)
        rows = torch.ones(GEMM_ROWS, side, dtype=dtype, device=device)
        streamed = _best(functools.partial(linear, one, weight), device)
        both = _best(functools.partial(linear, rows, weight), device)
        del weight  # the probe's 64 MiB go back
    bandwidth = side * side * itemsize / streamed
    # What each row past the first adds to a streamed product: the arithmetic the stream does not hide.
    extra = max(both - streamed, 0.05 * streamed)
    gemm_rate = 2.0 * (GEMM_ROWS - 1) * side * side / extra
    return Machine(bandwidth, gemm_rate, time.perf_counter() - started)


def probe(device: torch.device, dtype: torch.dtype, kernels: str = "torch") -> Machine:
    """This machine's streaming bandwidth and product rate for ``dtype`` on ``device`` (module docstring) through
    the linear layers a forward runs (``kernels``: ``"specdec"``, specdec's CPU kernels, or ``"torch"``), once
    per device, dtype, thread count and kernels in a process."""
    threads = torch.get_num_threads() if device.type == "cpu" else 1
    return _probe(device.type, device.index, dtype, threads, kernels)


def model_shape(model: Any) -> Shape:
    """The :class:`Shape` of a Hugging Face causal LM (module docstring); a model without a config's sizes is read
    from its parameters alone (attention then counts as nothing: the refinement learns it)."""
    embedding = model.get_input_embeddings()
    embedding_weight = getattr(embedding, "weight", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_weight = getattr(head, "weight", None)
    elements, bytes_ = 0, 0
    seen: set[int] = set()
    for parameter in model.parameters():
        if id(parameter) in seen or parameter.dim() < 2:
            continue
        seen.add(id(parameter))
        if parameter is embedding_weight and head_weight is not embedding_weight:
            continue  # looked up, not read: an untied head is a parameter of its own
        elements += parameter.numel()
        bytes_ += parameter.numel() * parameter.element_size()
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    layers = int(getattr(text, "num_hidden_layers", 0) or 0)
    heads = int(getattr(text, "num_attention_heads", 0) or 0)
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    head_dim = int(getattr(text, "head_dim", 0) or 0) or (hidden // heads if heads else 0)
    kv_heads = int(getattr(text, "num_key_value_heads", 0) or 0) or heads
    itemsize = next(iter(model.parameters())).element_size()
    return Shape(
        weight_bytes=float(bytes_), flops_per_token=2.0 * elements, layers=max(layers, 1),
        attention_flops=4.0 * layers * heads * head_dim, kv_bytes=2.0 * layers * kv_heads * head_dim * itemsize,
    )  # fmt: skip


def prior_seconds(shape: Shape, machine: Machine, device_type: str, sizes: np.ndarray, context: int) -> np.ndarray:
    """``cost(N, C)`` of the module docstring at ``sizes`` ``[S]`` after ``context`` tokens, ``[S]``."""
    per_forward, per_layer = OVERHEAD_S.get(device_type, OVERHEAD_S["cpu"])
    fixed = per_forward + per_layer * shape.layers + (shape.weight_bytes + context * shape.kv_bytes) / machine.bandwidth
    compute = sizes * (shape.flops_per_token + context * shape.attention_flops) / machine.gemm_rate
    return np.asarray(fixed + compute, dtype=np.float64)


def prior_table(verifier: TunableVerifier[Any]) -> CostTable:
    """The prior cost table of ``verifier`` (module docstring): the calibration's sizes and contexts (a static
    cache's buckets, as calibration would time), the verifier's kernel choice in force, nothing verified."""
    description = verifier.description
    model = getattr(verifier, "model", None)
    if model is None:
        raise TypeError(f"{type(verifier).__name__} has no model to read a prior from")
    buckets = verifier.buckets
    sizes: tuple[int, ...] = DEFAULT_SIZES
    if buckets is not None:
        sizes = tuple(b for b in buckets if b <= max(DEFAULT_SIZES))
    sizes, contexts = calibration_plan(verifier, sizes, DEFAULT_CONTEXTS)
    kernels = "specdec" if description.kernel_path != "-" else "torch"  # where specdec's CPU kernels serve it
    machine = probe(description.device, description.dtype, kernels)
    shape = model_shape(model)
    grid = np.asarray(sizes, dtype=np.float64)
    seconds = tuple(
        tuple(float(v) for v in prior_seconds(shape, machine, description.device.type, grid, c)) for c in contexts
    )
    return CostTable(sizes, contexts, seconds, calibration_identity(verifier), verifier.kernels,
                     bucketed=buckets is not None, source="prior")  # fmt: skip
