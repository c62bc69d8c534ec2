"""Microbenchmarks of the three tree operations: the cuda_ext kernels vs the torch reference backend.

Each op is timed through the ``TreeOps`` interface the verifier calls (so the Python face of
each backend is included), with the default model's shapes: vocabulary 49,152, 30 layers of
3 KV heads x 64 dims, float32; tree sizes 1, 16, 64, 256; committed KV of 1K and 4K tokens.
``step`` is the three together (mask + acceptance + compaction), the figure the issue's 3x
target is about. Run, then tabulate torch vs cuda_ext (``specdec bench ratios``)::

    flock /tmp/specdec-bench.lock python -m pytest benchmarks/test_bench_backend.py --benchmark-only \\
        --benchmark-json=runs/backend.json
    specdec bench ratios runs/backend.json

On a machine with a CUDA device every case runs there too (``device=cuda``); each timed CUDA
call ends with ``torch.cuda.synchronize()`` so the time covers the device's work.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from specdec.backends.verifier import Acceptance, TorchTreeOps, TreeOps
from specdec.sampling import Greedy
from specdec.types import DraftTree

VOCAB = 49_152
LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64
TREE_SIZES = (1, 16, 64, 256)
KV_LENGTHS = (1024, 4096)
BACKENDS = ("torch", "cuda_ext")
NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=NO_CUDA)]


def bench_tree(size: int) -> DraftTree:
    """A random recursive tree (each node under a uniformly chosen earlier node): bushy, depth ~ ln N."""
    rng = random.Random(size)
    tokens, parents = [1], [-1]
    used: set[tuple[int, int]] = set()
    while len(tokens) < size:
        parent, token = rng.randrange(len(tokens)), rng.randrange(2, VOCAB)
        if (parent, token) not in used:
            used.add((parent, token))
            tokens.append(token)
            parents.append(parent)
    return DraftTree(tuple(tokens), tuple(parents))


def bench_logits(tree: DraftTree, device: torch.device) -> torch.Tensor:
    """float32 ``[N, V]`` whose argmax walks to the tree's deepest node (so compaction moves slots)."""
    logits = torch.randn(tree.size, VOCAB, generator=torch.Generator().manual_seed(tree.size))
    deepest = max(range(tree.size), key=lambda i: (tree.depths[i], i))
    path = tree.path_to(deepest)
    for parent, child in itertools.pairwise(path):
        logits[parent, tree.tokens[child]] = 100.0
    return logits.to(device)


def make_ops(backend: str, device: torch.device) -> TreeOps:
    if backend == "torch":
        return TorchTreeOps()
    from specdec.backends.cuda_ext import ExtTreeOps

    return ExtTreeOps(device)


class Cache:
    """``layers[i].keys/values`` ``[1, 3, C + N, 64]`` views of preallocated tensors, reset before every round."""

    def __init__(self, committed: int, size: int, device: torch.device) -> None:
        shape = (1, KV_HEADS, committed + size, HEAD_DIM)
        self.tensors = [torch.randn(shape).to(device) for _ in range(2 * LAYERS)]
        self.view = SimpleNamespace(layers=[])

    def reset(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        self.view.layers = [
            SimpleNamespace(keys=self.tensors[i], values=self.tensors[i + 1]) for i in range(0, len(self.tensors), 2)
        ]
        return (), {}


def synchronized(device: torch.device, call: Callable[[], Any]) -> Callable[[], Any]:
    if device.type != "cuda":
        return call

    def run() -> Any:
        out = call()
        torch.cuda.synchronize()
        return out

    return run


def label(benchmark: Any, op: str, backend: str, device: torch.device, size: int, committed: int | None) -> None:
    kv = "" if committed is None else f"-kv{committed // 1024}K"
    benchmark.group = f"{op}-{device.type}-n{size}{kv}"
    benchmark.extra_info.update(op=op, backend=backend, device=device.type, nodes=size, committed=committed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("committed", KV_LENGTHS)
@pytest.mark.parametrize("size", TREE_SIZES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_mask(benchmark: Any, backend: str, size: int, committed: int, device: str) -> None:
    where = torch.device(device)
    ops, tree = make_ops(backend, where), bench_tree(size)
    label(benchmark, "mask", backend, where, size, committed)
    benchmark(synchronized(where, lambda: ops.tree_inputs(tree, committed, where, None)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("topk", [0, 8])
@pytest.mark.parametrize("size", TREE_SIZES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_accept(benchmark: Any, backend: str, size: int, topk: int, device: str) -> None:
    where = torch.device(device)
    ops, tree = make_ops(backend, where), bench_tree(size)
    logits = bench_logits(tree, where)
    positions = torch.arange(tree.size, device=where)
    label(benchmark, f"accept-top{topk}", backend, where, size, None)
    result: Acceptance = benchmark(lambda: ops.accept(tree, logits, positions, Greedy(), topk))
    assert result.path == tuple(tree.path_to(result.path[-1]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("committed", KV_LENGTHS)
@pytest.mark.parametrize("size", TREE_SIZES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_compact(benchmark: Any, backend: str, size: int, committed: int, device: str) -> None:
    where = torch.device(device)
    ops, tree = make_ops(backend, where), bench_tree(size)
    path = TorchTreeOps().accept(tree, bench_logits(tree, where), torch.zeros(0), Greedy(), 0).path
    cache = Cache(committed, size, where)
    label(benchmark, "compact", backend, where, size, committed)
    run = synchronized(where, lambda: ops.compact(cache.view, committed, path))
    benchmark.pedantic(run, setup=cache.reset, rounds=200 if size < 256 else 60, warmup_rounds=3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("committed", KV_LENGTHS)
@pytest.mark.parametrize("size", TREE_SIZES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_step(benchmark: Any, backend: str, size: int, committed: int, device: str) -> None:
    """Mask + greedy acceptance + compaction: everything a verification step does besides the forward."""
    where = torch.device(device)
    ops, tree = make_ops(backend, where), bench_tree(size)
    logits = bench_logits(tree, where)
    cache = Cache(committed, size, where)
    label(benchmark, "step", backend, where, size, committed)

    def step() -> None:
        _, positions = ops.tree_inputs(tree, committed, where, None)
        acceptance = ops.accept(tree, logits, positions[0], Greedy(), 0)
        ops.compact(cache.view, committed, acceptance.path)

    benchmark.pedantic(synchronized(where, step), setup=cache.reset, rounds=100 if size < 256 else 30, warmup_rounds=2)
