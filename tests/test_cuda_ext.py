"""The compiled backend (``cuda_ext``) against the torch reference backend: op by op, then whole runs.

Layers of tests:

- **differential, per op**: ``tree_mask``, ``tree_accept`` and ``compact_kv`` equal the
  reference (``TorchTreeOps``, ``tree_attention_inputs``, ``topk_ids``) exactly: integer
  outputs identical, masks and gathered KV bitwise equal, on random trees, sizes, batches
  and dtypes (hypothesis). Each runs on the CPU and again on CUDA, where the CUDA group
  skips with "no CUDA device" when there is none;
- **hand cases**: ties, NaN, padding nodes (bad input, in child processes: ``test_bad_input.py``
  by hand and ``test_fuzz_bad_input.py`` at random);
- **composability**: ``torch.library.opcheck`` and a ``torch.compile`` trace;
- **whole generations**: token identity between the two backends on the tiny fp64 models
  of every architecture and on the default model (slow);
- **selection and build**: ``auto`` / ``cuda_ext`` / fallback, build errors, the nvcc check.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from conftest import IDENTITY_COUNTS, native_or_skip, use_private_cache
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle_drafter import OracleTreeDrafter, random_tree
from test_lossless import hf_greedy, random_prompt
from tiny_models import ARCHITECTURES, VOCAB, tiny_model

import specdec
from specdec.backends import make_tree_ops, make_verifier
from specdec.backends.topk import topk_ids
from specdec.backends.tree import ancestor_matrix
from specdec.backends.verifier import ModelVerifier, TorchTreeOps
from specdec.decoding import DecodingConfig, StopRules
from specdec.drafters.none import NoDrafter
from specdec.drafters.pld import PLDConfig, PromptLookupDrafter
from specdec.engine import decode
from specdec.native import NativeBuildError
from specdec.sampling import Greedy
from specdec.testing import compare_outputs
from specdec.types import DraftTree


@pytest.fixture(scope="session")
def ext() -> Any:
    """The built extension, once per test session; a build failure fails (conftest.native_or_skip)."""
    from specdec.backends.cuda_ext import load

    return native_or_skip("cuda_ext", load)


def _cuda_ready() -> bool:
    return torch.cuda.is_available()


DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not _cuda_ready(), reason="no CUDA device")]),
]


@pytest.fixture(scope="module", params=DEVICES)
def device(request: pytest.FixtureRequest, ext: Any) -> torch.device:
    """Each differential test runs on the CPU and, where there is one, on a CUDA device."""
    if request.param == "cuda" and not ext.has_cuda_kernels():
        pytest.fail("a CUDA device is present but the extension was built without its CUDA kernels")
    return torch.device(request.param)


def ops() -> Any:
    from specdec.backends.cuda_ext import ops as module

    return module


# -- helpers: batches of trees, and what the reference says about them ---------------------------


def padded(trees: Sequence[DraftTree], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens, parents int64 ``[B, N]``: padding nodes carry token 0 and parent -1."""
    width = max(tree.size for tree in trees)
    tokens = torch.zeros((len(trees), width), dtype=torch.int64)
    parents = torch.full((len(trees), width), -1, dtype=torch.int64)
    for b, tree in enumerate(trees):
        tokens[b, : tree.size] = torch.tensor(tree.tokens)
        parents[b, : tree.size] = torch.tensor(tree.parents)
    return tokens.to(device), parents.to(device)


def expected_mask(tree: DraftTree, width: int, committed: int, tree_start: int) -> tuple[np.ndarray, np.ndarray]:
    """bool ``[width, tree_start + width]`` and int64 ``[width]`` for a tree padded to ``width`` nodes."""
    allowed = np.zeros((width, tree_start + width), dtype=np.bool_)
    allowed[:, :committed] = True
    allowed[: tree.size, tree_start : tree_start + tree.size] = ancestor_matrix(tree.parents)
    positions = np.full(width, committed, dtype=np.int64)
    positions[: tree.size] += np.asarray(tree.depths)
    for i in range(tree.size, width):  # padding: itself only
        allowed[i, tree_start + i] = True
    return allowed, positions


def random_logits(rng: random.Random, shape: tuple[int, ...], dtype: torch.dtype, nan: bool = False) -> torch.Tensor:
    """Small integer logits, so ties are everywhere; sometimes NaN and infinities too."""
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    levels = rng.choice([2, 3, 8, 1000])
    logits = torch.randint(0, levels, shape, generator=generator).to(dtype)
    if nan:
        spots = torch.rand(shape, generator=generator)
        logits[spots < 0.02] = float("nan")
        logits[(spots > 0.02) & (spots < 0.04)] = float("inf")
        logits[(spots > 0.04) & (spots < 0.06)] = float("-inf")
    return logits


def fake_cache(tensors: Sequence[torch.Tensor]) -> SimpleNamespace:
    """A stand-in for DynamicCache: ``layers[i].keys/values`` ``[B, H, S, D]``."""
    return SimpleNamespace(
        layers=[SimpleNamespace(keys=tensors[i], values=tensors[i + 1]) for i in range(0, len(tensors), 2)]
    )


def bitwise(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of ``tensor``, so that equality is bit for bit (NaN payloads and signed zeros too)."""
    return tensor.contiguous().view(torch.uint8)


# -- tree_mask ----------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 40), committed=st.integers(0, 300))
def test_tree_inputs_equal_reference(device: torch.device, seed: int, size: int, committed: int) -> None:
    from specdec.backends.cuda_ext import ExtTreeOps

    tree = random_tree(random.Random(seed), 3, 50, size)
    for additive in (None, torch.float32, torch.float64, torch.float16, torch.bfloat16):
        ours = ExtTreeOps(device).tree_inputs(tree, committed, device, additive)
        theirs = TorchTreeOps().tree_inputs(tree, committed, device, additive)
        assert torch.equal(ours[1], theirs[1]) and ours[1].dtype == torch.int64
        if theirs[0] is None:
            assert ours[0] is None
        else:
            assert ours[0] is not None and ours[0].dtype == theirs[0].dtype and ours[0].shape == theirs[0].shape
            assert torch.equal(bitwise(ours[0]), bitwise(theirs[0]))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 4))
def test_tree_mask_batches_with_padding(device: torch.device, seed: int, batch: int) -> None:
    """Ragged trees and committed lengths: every row equals its own tree's reference layout."""
    rng = random.Random(seed)
    trees = [random_tree(rng, 1, 30, rng.randrange(1, 25)) for _ in range(batch)]
    committed = [rng.randrange(0, 40) for _ in range(batch)]
    tree_start = max(committed) + rng.randrange(0, 5)
    _, parents = padded(trees, device)
    mask, positions = ops().tree_mask(parents, torch.tensor(committed, device=device), tree_start)
    width = parents.shape[1]
    assert mask.shape == (batch, 1, width, tree_start + width) and mask.dtype == torch.bool
    for b, tree in enumerate(trees):
        allowed, expected_positions = expected_mask(tree, width, committed[b], tree_start)
        assert np.array_equal(mask[b, 0].cpu().numpy(), allowed), f"row {b}"
        assert positions[b].tolist() == expected_positions.tolist()


def test_tree_mask_hand_case(ext: Any) -> None:
    tree = DraftTree((10, 11, 12, 13), (-1, 0, 0, 1))
    mask, positions = ops().tree_mask(torch.tensor([tree.parents]), torch.tensor([3]), 3)
    assert positions.tolist() == [[3, 4, 4, 5]]
    assert mask[0, 0].int().tolist() == [
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 1, 0],
        [1, 1, 1, 1, 1, 0, 1],
    ]
    additive, _ = ops().tree_mask(torch.tensor([tree.parents]), torch.tensor([3]), 3, torch.float16)
    assert additive.dtype == torch.float16
    assert set(additive.unique().tolist()) == {0.0, torch.finfo(torch.float16).min}


# -- tree_accept --------------------------------------------------------------------------------

ACCEPT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", ACCEPT_DTYPES, ids=str)
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 40), vocab=st.sampled_from([1, 7, 8, 9, 33, 200]))
def test_accept_equals_reference(device: torch.device, dtype: torch.dtype, seed: int, size: int, vocab: int) -> None:
    """Greedy walk, bonus and top-k ids identical to the reference, on tie-heavy logits (NaN sometimes)."""
    from specdec.backends.cuda_ext import ExtTreeOps

    rng = random.Random(seed)
    tree = random_tree(rng, rng.randrange(vocab), vocab, size) if vocab > 1 else DraftTree.single(0)
    logits = random_logits(rng, (tree.size, vocab), dtype, nan=rng.random() < 0.3).to(device)
    # Bias the logits toward the tree's own tokens, so that walks go deep.
    for i in range(1, tree.size):
        if rng.random() < 0.7:
            logits[tree.parents[i], tree.tokens[i]] = 2000
    positions = torch.arange(tree.size, device=device)
    k = rng.randrange(0, min(vocab, 10) + 1)
    ours = ExtTreeOps(device).accept(tree, logits, positions, Greedy(), k)
    theirs = TorchTreeOps().accept(tree, logits, positions, Greedy(), k)
    assert ours.path == theirs.path
    assert ours.bonus == theirs.bonus
    if k == 0:
        assert ours.topk is None and theirs.topk is None
    else:
        assert ours.topk is not None and theirs.topk is not None
        assert ours.topk.dtype == np.int64 and np.array_equal(ours.topk, theirs.topk)
        assert ours.topk[ours.path[-1], 0] == ours.bonus  # the choice is the first of the order


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 4))
def test_accept_batches_and_given_choices(device: torch.device, seed: int, batch: int) -> None:
    """Padded batches: every node's choice, top-k and every tree's walk; then the walk of given choices."""
    rng = random.Random(seed)
    vocab = 40
    trees = [random_tree(rng, 0, vocab, rng.randrange(1, 30)) for _ in range(batch)]
    tokens, parents = padded(trees, device)
    width = tokens.shape[1]
    logits = random_logits(rng, (batch, width, vocab), torch.float32, nan=rng.random() < 0.3).to(device)
    for b, tree in enumerate(trees):
        for i in range(1, tree.size):
            if rng.random() < 0.6:
                logits[b, tree.parents[i], tree.tokens[i]] = 2000
    k = rng.randrange(0, 6)
    out = ops().tree_accept(logits, tokens, parents, k)
    flat = logits.view(batch * width, vocab)
    assert torch.equal(out.choices.view(-1), flat.argmax(-1))
    assert torch.equal(out.topk_ids.view(batch * width, k), topk_ids(flat, k))
    for b, tree in enumerate(trees):
        reference = TorchTreeOps().accept(tree, logits[b, : tree.size], torch.zeros(0), Greedy(), 0)
        length = int(out.path_len[b])
        assert tuple(out.path[b, :length].tolist()) == reference.path
        assert set(out.path[b, length:].tolist()) <= {-1}
        assert int(out.bonus[b]) == reference.bonus

    # A sampling chooser's choices instead of the argmax: the walk follows them.
    given_choices = torch.randint(0, vocab, (batch, width), device=device)
    for b, tree in enumerate(trees):
        for i in range(1, tree.size):
            if rng.random() < 0.6:
                given_choices[b, tree.parents[i]] = tree.tokens[i]
    out = ops().tree_accept(logits, tokens, parents, k, given_choices)
    assert torch.equal(out.choices, given_choices)
    assert torch.equal(out.topk_ids.view(batch * width, k), topk_ids(flat, k))
    for b, tree in enumerate(trees):
        children, node, walked = tree.children(), 0, [0]
        while (child := children[node].get(int(given_choices[b, node]))) is not None:
            walked.append(child)
            node = child
        assert out.path[b, : int(out.path_len[b])].tolist() == walked
        assert int(out.bonus[b]) == int(given_choices[b, node])


class PositionShiftChooser:
    """A non-greedy chooser whose choice depends on the position, as a sampler's does."""

    name = "shift"

    def choose(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return (logits.argmax(dim=-1) + positions % 2) % logits.shape[-1]


def test_other_choosers_through_both_backends(device: torch.device) -> None:
    """A chooser other than greedy decides first; both backends walk the same choices."""
    from specdec.backends.cuda_ext import ExtTreeOps

    rng = random.Random(5)
    for _ in range(20):
        tree = random_tree(rng, 0, 20, rng.randrange(1, 20))
        logits = random_logits(rng, (tree.size, 20), torch.float32).to(device)
        for i in range(1, tree.size):
            if rng.random() < 0.7:
                logits[tree.parents[i], tree.tokens[i]] = 2000
        positions = torch.tensor([7 + d for d in tree.depths], device=device)
        ours = ExtTreeOps(device).accept(tree, logits, positions, PositionShiftChooser(), 3)
        theirs = TorchTreeOps().accept(tree, logits, positions, PositionShiftChooser(), 3)
        assert (ours.path, ours.bonus) == (theirs.path, theirs.bonus)
        assert ours.topk is not None and theirs.topk is not None and np.array_equal(ours.topk, theirs.topk)


def test_accept_hand_cases(ext: Any) -> None:
    nan, inf = float("nan"), float("inf")
    tree = DraftTree((4, 2, 3, 1), (-1, 0, 0, 1))
    logits = torch.tensor(
        [
            [0.0, 1.0, 4.0, 4.0, 4.0],  # three-way tie: the lowest id (2) wins, node 1 carries it
            [inf, 7.0, 7.0, inf, 0.0],  # inf ties: id 0, which no child carries -> stop, bonus 0
            [nan, 0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0],
        ]
    )
    out = ops().tree_accept(logits[None], torch.tensor([tree.tokens]), torch.tensor([tree.parents]), 3)
    assert out.path.tolist() == [[0, 1, -1, -1]] and out.path_len.tolist() == [2] and out.bonus.tolist() == [0]
    assert out.choices.tolist() == [[2, 0, 0, 0]]
    assert out.topk_ids.tolist() == [[[2, 3, 4], [0, 3, 1], [0, 1, 2], [0, 1, 2]]]
    nans = torch.tensor([[[1.0, nan, 5.0, nan, nan]]])
    out = ops().tree_accept(nans, torch.tensor([[0]]), torch.tensor([[-1]]), 4)
    assert out.choices.tolist() == [[1]] and out.topk_ids.tolist() == [[[1, 3, 4, 2]]]  # NaN above all, low id first
    assert topk_ids(nans[0], 4).tolist() == [[1, 3, 4, 2]] and int(nans[0].argmax()) == 1


def test_vectorized_argmax_agrees_at_every_length(ext: Any) -> None:
    """The 8-lane float32 argmax: ties placed in every lane, vocab lengths around the lane width."""
    for vocab in [*range(1, 40), 1000, 49152]:
        for winner in sorted({0, vocab // 3, vocab - 1}):
            logits = torch.zeros(1, 3, vocab)
            logits[0, 0, winner] = 1.0
            logits[0, 1, winner:] = 1.0  # a tie from winner to the end
            logits[0, 2, (winner * 7) % vocab] = float("nan")
            out = ops().tree_accept(logits, torch.zeros(1, 3, dtype=torch.int64), torch.tensor([[-1, 0, 1]]), 0)
            assert out.choices.tolist() == [[winner, winner, (winner * 7) % vocab]], vocab


# -- compact_kv ---------------------------------------------------------------------------------

KV_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", KV_DTYPES, ids=str)
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 40), committed=st.integers(0, 64))
def test_compact_equals_reference(
    device: torch.device, dtype: torch.dtype, seed: int, size: int, committed: int
) -> None:
    """Random accepted paths over random KV (contiguous or a cropped view): bitwise-equal caches."""
    from specdec.backends.cuda_ext import ExtTreeOps

    rng = random.Random(seed)
    tree = random_tree(rng, 0, 30, size)
    path = tree.path_to(rng.randrange(tree.size))
    layers, heads, head_dim = rng.randrange(1, 5), rng.randrange(1, 4), rng.choice([1, 8, 64])
    spare = rng.randrange(0, 3)  # a cropped cache is a view with slots beyond its length
    generator = torch.Generator().manual_seed(seed % 2**31)
    tensors = [
        torch.randn(1, heads, committed + tree.size + spare, head_dim, generator=generator).to(dtype).to(device)
        [:, :, : committed + tree.size]
        for _ in range(2 * layers)
    ]
    theirs = fake_cache([t.clone() for t in tensors])
    ours = fake_cache(tensors)  # the tensors themselves (cropped views when spare > 0), edited in place
    ExtTreeOps(device).compact(ours, committed, path)
    TorchTreeOps().compact(theirs, committed, path)
    for mine, reference in zip(ours.layers, theirs.layers, strict=True):
        assert mine.keys.shape == reference.keys.shape == (1, heads, committed + len(path), head_dim)
        assert torch.equal(bitwise(mine.keys), bitwise(reference.keys))
        assert torch.equal(bitwise(mine.values), bitwise(reference.values))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 4))
def test_compact_kv_batches(device: torch.device, seed: int, batch: int) -> None:
    """Ragged batches: row b's path gathers from the shared tree slots down to its own dest slot."""
    rng = random.Random(seed)
    trees = [random_tree(rng, 0, 30, rng.randrange(1, 20)) for _ in range(batch)]
    paths = [tree.path_to(rng.randrange(tree.size)) for tree in trees]
    dest = [rng.randrange(0, 30) for _ in range(batch)]
    tree_start = max(dest) + rng.randrange(0, 4)
    slots = tree_start + max(tree.size for tree in trees)
    width = max(len(p) for p in paths)
    path = torch.full((batch, width), -1, dtype=torch.int64)
    for b, p in enumerate(paths):
        path[b, : len(p)] = torch.tensor(p)
    cache = [torch.randn(batch, 3, slots, 16).to(device) for _ in range(4)]
    expected = [t.clone() for t in cache]
    for t in expected:
        for b, p in enumerate(paths):
            t[b, :, dest[b] : dest[b] + len(p)] = t[b, :, [tree_start + node for node in p]].clone()
    lengths = torch.tensor([len(p) for p in paths])
    ops().compact_kv(cache, path.to(device), lengths.to(device), torch.tensor(dest).to(device), tree_start)
    for mine, reference in zip(cache, expected, strict=True):
        assert torch.equal(bitwise(mine), bitwise(reference))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(1, 50))
def test_topk_ids_is_the_sorted_order(seed: int, vocab: int) -> None:
    """The reference top-k against a plain sort by (NaN first, value descending, id ascending)."""
    rng = random.Random(seed)
    logits = random_logits(rng, (6, vocab), torch.float32, nan=rng.random() < 0.5)
    k = rng.randrange(0, vocab + 1)
    for row, ids in zip(logits.tolist(), topk_ids(logits, k).tolist(), strict=True):
        ranked = sorted(range(vocab), key=lambda v, row=row: (row[v] == row[v], -row[v] if row[v] == row[v] else 0, v))
        assert ids == ranked[:k]


def test_topk_ids_rejects_bad_k() -> None:
    with pytest.raises(specdec.SpecDecError, match=r"k must lie in \[0, 3\] \(the vocabulary\), got 4"):
        topk_ids(torch.zeros(2, 3), 4)


# -- composability: schemas, fake implementations, torch.compile -----------------------------------


def test_opcheck(ext: Any) -> None:
    """torch.library.opcheck: schema (mutation declared), fake implementation, autograd registration."""
    tree = DraftTree((5, 2, 3, 1), (-1, 0, 0, 1))
    parents, tokens = torch.tensor([tree.parents]), torch.tensor([tree.tokens])
    torch.library.opcheck(torch.ops.specdec.tree_mask.default, (parents, torch.tensor([3]), 3, None))
    torch.library.opcheck(torch.ops.specdec.tree_mask.default, (parents, torch.tensor([3]), 3, torch.float32))
    torch.library.opcheck(torch.ops.specdec.tree_accept.default, (torch.randn(1, 4, 9), tokens, parents, 3, None))
    cache = [torch.randn(1, 2, 7, 4) for _ in range(4)]
    path = torch.tensor([[0, 1, 3]])
    torch.library.opcheck(torch.ops.specdec.compact_kv.default, (cache, path, torch.tensor([3]), torch.tensor([3]), 3))
    # With a status (declared mutable; the fast path's argument).
    status = ops().new_status("cpu")
    torch.library.opcheck(torch.ops.specdec.tree_mask.default, (parents, torch.tensor([3]), 3, None, status))
    logits = torch.randn(1, 4, 9)
    torch.library.opcheck(torch.ops.specdec.tree_accept.default, (logits, tokens, parents, 2, None, status))
    torch.library.opcheck(
        torch.ops.specdec.compact_kv.default, (cache, path, torch.tensor([3]), torch.tensor([3]), 3, status)
    )
    assert not status.any()


def test_torch_compile_traces_the_ops(ext: Any) -> None:
    def step(parents: torch.Tensor, tokens: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mask, positions = ops().tree_mask(parents, torch.tensor([2]), 2)
        out = ops().tree_accept(logits, tokens, parents, 2)
        return mask, positions, out.path, out.bonus, out.topk_ids

    tree = DraftTree((5, 2, 3, 1), (-1, 0, 0, 1))
    args = (torch.tensor([tree.parents]), torch.tensor([tree.tokens]), torch.randn(1, 4, 9))
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    for mine, reference in zip(compiled(*args), step(*args), strict=True):
        assert torch.equal(mine, reference)


# -- whole generations: token identity between the backends ----------------------------------------


# Every architecture with sdpa; eager attention (the additive mask) on two of them, since the
# additive mask itself is checked bitwise above.
GENERATION_CASES = [(arch, "sdpa") for arch in ARCHITECTURES] + [("llama", "eager"), ("gpt2", "eager")]


@pytest.mark.parametrize(("arch", "attn"), GENERATION_CASES)
def test_generations_identical_between_backends(ext: Any, arch: str, attn: str) -> None:
    """Oracle trees (deep paths, scattered slots) and PLD: both backends emit plain greedy output."""
    model = tiny_model(arch, attn)
    rng = random.Random(f"cuda_ext-{arch}-{attn}")
    accepted = 0
    # The model's own forward: every tree op of the backend (mask, acceptance, compaction) runs.
    verifiers = [make_verifier(model, "hf", tree_ops=backend) for backend in ("cuda_ext", "torch")]
    rules = DecodingConfig(StopRules(40))
    for seed in range(2):
        prompt = random_prompt(rng)
        truth = hf_greedy(model, prompt, 40)
        for kind in ("oracle", "pld"):
            # The engine itself, so every step verifies the drafter's whole tree.
            runs = [
                decode(
                    verifier,
                    OracleTreeDrafter(truth, VOCAB, seed=seed, size=24, depth=7)
                    if kind == "oracle"
                    else PromptLookupDrafter(PLDConfig()),
                    prompt,
                    rules,
                )
                for verifier in verifiers
            ]
            assert runs[0].tokens == runs[1].tokens == truth, f"{kind}: prompt {prompt}"
            assert [r.accepted for r in runs[0].stats.records] == [r.accepted for r in runs[1].stats.records]
            accepted += sum(r.accepted for r in runs[0].stats.records)
        IDENTITY_COUNTS[f"{arch}/cuda_ext/{attn}"] += 2
    assert accepted > 10  # regression guard: drafts were accepted, so compaction really moved KV


def committed_kv(state: Any) -> list[torch.Tensor]:
    """Every layer's committed keys and values, from a dynamic cache (HF layers) or specdec's own."""
    cache = state.cache
    if hasattr(cache, "layers"):
        return [t for layer in cache.layers for t in (layer.keys, layer.values)]
    return [t[:, :, : state.committed_len] for t in (*cache.keys, *cache.values)]


@pytest.mark.parametrize("engine", ["hf", "specdec"])
def test_feedback_identical_between_backends(ext: Any, engine: str) -> None:
    """Step by step on the same trees: accepted nodes, bonus, top-k feedback and the KV cache agree."""
    model = tiny_model("llama")
    verifiers = [make_verifier(model, engine, tree_ops=backend) for backend in ("cuda_ext", "torch")]
    assert [v.name for v in verifiers] == ["cuda_ext", "torch"]
    rng = random.Random(3)
    prompt = random_prompt(rng)
    truth = hf_greedy(model, prompt, 60)
    states = []
    for verifier in verifiers:
        state, pending, feedback = verifier.prefill(prompt, prompt_topk=6)
        assert pending == truth[0] and feedback is not None
        states.append(state)
    drafter = OracleTreeDrafter(truth, VOCAB, seed=1, size=20, depth=5)
    drafter.reset(prompt)
    pending = truth[0]
    for _ in range(8):  # at most 8 * 7 tokens of the 60 known
        tree = drafter.propose(pending, 64)
        results = [v.verify(s, tree, topk=6) for v, s in zip(verifiers, states, strict=True)]
        assert results[0].accepted_nodes == results[1].accepted_nodes and results[0].bonus == results[1].bonus
        feedback = [r.feedback for r in results]
        assert feedback[0] is not None and feedback[1] is not None
        assert np.array_equal(feedback[0].topk, feedback[1].topk)
        for ours, theirs in zip(committed_kv(states[0]), committed_kv(states[1]), strict=True):
            assert torch.equal(ours, theirs)
        drafter.update(results[0].accepted_tokens, results[0].feedback)
        pending = results[0].bonus


@pytest.mark.slow
def test_default_model_identical_between_backends(ext: Any, default_model: tuple[Any, Any]) -> None:
    """SmolLM2-135M (fp32): the same tokens and steps from both backends; plain decoding agrees."""
    from specdec.models import encode_prompt

    model, tokenizer = default_model
    verifiers = [make_verifier(model, tree_ops=backend) for backend in ("cuda_ext", "torch")]
    rules = DecodingConfig(StopRules(40))
    accepted = 0
    for text in (
        "Repeat this sentence twice: the quick brown fox jumps over the lazy dog.",
        "Rename x to total everywhere in: def f(x):\n    x = x + 1\n    return x * x",
    ):
        prompt = encode_prompt(tokenizer, text)
        runs = [decode(verifier, PromptLookupDrafter(PLDConfig()), prompt, rules) for verifier in verifiers]
        # The backends feed the model identical inputs, so even fp32 rounding agrees: identity, no tolerance.
        assert runs[0].tokens == runs[1].tokens, text
        assert [r.accepted for r in runs[0].stats.records] == [r.accepted for r in runs[1].stats.records]
        accepted += sum(r.accepted for r in runs[0].stats.records)
        plain = decode(verifiers[0], NoDrafter(), prompt, rules)
        comparison = compare_outputs(model, prompt, runs[0].tokens, plain.tokens)
        assert comparison.acceptable, comparison.describe()
        IDENTITY_COUNTS["smollm2/cuda_ext" + ("" if comparison.identical else " (near-tie)")] += 1
    assert accepted > 5  # regression guard: drafts were accepted, so compaction moved KV


# -- selection, build, CUDA source ------------------------------------------------------------------


def test_backend_selection(ext: Any) -> None:
    from specdec.backends.cuda_ext import BackendUnavailableError, ExtTreeOps

    assert isinstance(make_tree_ops("cuda_ext", torch.device("cpu")), ExtTreeOps)
    assert isinstance(make_tree_ops("auto", torch.device("cpu")), ExtTreeOps)
    assert isinstance(make_tree_ops("torch", torch.device("cpu")), TorchTreeOps)
    with pytest.raises(specdec.SpecDecError, match=r"unknown tree ops 'cuda'; valid names: auto, torch, cuda_ext"):
        make_tree_ops("cuda", torch.device("cpu"))
    with pytest.raises(BackendUnavailableError, match="the model is on 'meta'"):
        ExtTreeOps("meta")


def test_auto_falls_back_once_with_the_reason(ext: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import specdec.backends
    from specdec.backends.cuda_ext import build

    failure = NativeBuildError("building extension 'tree_ops' failed: exit 1\n--- build output ---\nerror: boom")
    monkeypatch.setattr(build, "_FAILURE", failure)
    monkeypatch.setattr(specdec.backends, "_warned_fallback", False)
    with pytest.warns(RuntimeWarning, match=r"use the torch reference: .*building extension 'tree_ops' failed"):
        assert isinstance(make_tree_ops("auto", torch.device("cpu")), TorchTreeOps)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second fallback is silent
        assert isinstance(make_tree_ops("auto", torch.device("cpu")), TorchTreeOps)
    with pytest.raises(NativeBuildError, match="error: boom"):
        make_tree_ops("cuda_ext", torch.device("cpu"))
    model = tiny_model("llama")
    assert specdec.run(model, [1, 2, 3], "pld", max_new_tokens=5).tokens == hf_greedy(model, [1, 2, 3], 5)


def test_build_failure_carries_the_compiler_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specdec.native import load_extension

    use_private_cache(monkeypatch, tmp_path / "cache")
    source = tmp_path / "broken.cpp"
    source.write_text("int broken( { return 0; }\n")
    with pytest.raises(NativeBuildError, match=r"building extension 'broken' failed(.|\n)*broken\.cpp"):
        load_extension("broken", [source])


def test_a_second_build_of_a_loaded_extension_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two builds of one extension register the same torch op namespace: loading both would abort
    the process, so the second is a clear error (the sources changed under a running process)."""
    import types

    from specdec import native

    source = tmp_path / "ops.cpp"
    source.write_text("// edited since the process loaded it\n")
    monkeypatch.setitem(native._LOADED, "specdec_ops_000000000000", types.ModuleType("old"))
    with pytest.raises(NativeBuildError, match=r"already loaded another build \(specdec_ops_000000000000\)"):
        native.load_extension("ops", [source])


def test_cache_key_follows_headers(tmp_path: Path) -> None:
    from specdec.native import extension_key

    source, header = tmp_path / "a.cpp", tmp_path / "a.h"
    source.write_text('#include "a.h"\n')
    header.write_text("// one\n")
    before = extension_key([source, header], ["-O3"], False)
    header.write_text("// two\n")
    assert extension_key([source, header], ["-O3"], False) != before


def test_cache_key_follows_torchs_build_not_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two virtual environments with the same torch share a build (the binary is the same; a second environment
    would otherwise build it again, 130 s for the CPU kernels on a 2-core Xeon); another torch build does not."""
    from specdec.native import extension_key

    source = tmp_path / "a.cpp"
    source.write_text("// one\n")
    here = extension_key([source], ["-O3"], False)
    monkeypatch.setattr("sys.prefix", str(tmp_path / "another-venv"))
    assert extension_key([source], ["-O3"], False) == here
    monkeypatch.setattr(torch.version, "git_version", "0" * 40)
    assert extension_key([source], ["-O3"], False) != here


@pytest.mark.slow
def test_cuda_source_compiles_with_nvcc() -> None:
    """nvcc compiles the CUDA kernels against torch's headers (no GPU needed; linking and running do)."""
    from specdec.backends.cuda_ext.nvcc_check import compile_cuda_source, find_nvcc

    if find_nvcc() is None:
        pytest.skip("nvcc not found (set CUDA_HOME or put nvcc on the PATH)")
    report = compile_cuda_source("sm_90")
    assert report.returncode == 0, report.output[-4000:]
    assert report.missing_kernels == []
    assert report.own_warnings == []


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_ready(), reason="no CUDA device")
def test_one_host_sync_per_step_on_cuda(ext: Any) -> None:
    """On a GPU, mask + acceptance + compaction synchronize with the host once: the results' copy."""
    from specdec.backends.cuda_ext import ExtTreeOps

    device = torch.device("cuda")
    ext_ops = ExtTreeOps(device)
    tree = random_tree(random.Random(0), 0, 100, 32)
    logits = torch.randn(tree.size, 1000, device=device)
    cache = fake_cache([torch.randn(1, 2, 50 + tree.size, 8, device=device) for _ in range(4)])
    ext_ops.accept(tree, logits, torch.zeros(tree.size, device=device), Greedy(), 4)  # warm-up (allocators)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, positions = ext_ops.tree_inputs(tree, 50, device, None)
            acceptance = ext_ops.accept(tree, logits, positions[0], Greedy(), 4)
            ext_ops.compact(cache, 50, acceptance.path)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) == 1, [str(w.message) for w in syncs]


def test_verifier_name_reports_backend(ext: Any) -> None:
    model = tiny_model("gpt2")
    assert ModelVerifier(model).name == "torch"
    assert make_verifier(model, tree_ops="cuda_ext").name == "cuda_ext"
