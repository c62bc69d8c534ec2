"""specdec's CPU kernels (``specdec.backends.specdec_engine.cpu_kernels``): one fixed order of operations each.

Skinny linear: the op against ``torch.nn.functional.linear`` computed in float64 (random shapes
and leading dimensions, tails of every length, with and without bias, float32 / bfloat16 /
float64); the contract of ``csrc/skinny_linear.h``: every kernel path this CPU can run gives
bitwise its contract's result, computed exactly in torch (``linear_contract``: 16 lanes on the
AVX-512, ``avx2-lanes16`` and portable paths, which therefore agree bitwise; 8 on the AVX2 path),
and a row's result is bitwise the same whatever other rows come with it (batch invariance). Tree attention: against
``scaled_dot_product_attention`` in float64 under the tree mask (random trees, contexts, head
shapes), every path the same bits, and a tree row bitwise equal to the same query attending
alone after its ancestors were committed (the contract of ``csrc/tree_attention.h``). Bad input
raises naming the value; both ops trace into compiled graphs.

Per path by name (the ``isa`` fixture: avx512, avx512-blocks, avx2, avx2-blocks, avx2-lanes16, portable): a path
this CPU cannot run is a visible skip, or a failure where ``SPECDEC_REQUIRE_ISAS`` names it; each is
held to torch and to its contract (the skinny linear) or to the portable path (the attention) across
parallel tasks and thread counts, for batch invariance, head dims up to 300 and non-finite inputs (one
rule on every path: a NaN score makes the row NaN).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conftest import native_or_skip
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linear_contract import LANES, fma32
from linear_contract import skinny_linear as contract_linear

from specdec.backends.specdec_engine import cpu_kernels as skinny
from specdec.backends.tree import ancestor_matrix


@pytest.fixture(scope="module", autouse=True)
def extension() -> Iterator[Any]:
    yield native_or_skip("cpu_kernels", skinny.load)


def contract_result(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, isa: str) -> torch.Tensor:
    """What ``isa``'s skinny linear must give bit for bit: its contract computed exactly (float32, bfloat16),
    or the portable path's result (float64: 8 lanes on every path, and no exact emulation of a float64 fma)."""
    if x.dtype == torch.float64:
        return skinny.skinny_linear(x, weight, bias, "portable")
    return contract_linear(x, weight, bias, LANES[isa])


def test_the_contract_emulation_rounds_a_fused_multiply_add_once() -> None:
    """1 + a * b with a * b = 2^-24 (1 + 2^-36): the exact sum lies just above the midpoint between 1 and
    1 + 2^-23, so one rounding gives 1 + 2^-23; rounding to float64 first lands on the midpoint itself
    (2^-60 is below its precision) and then to even, 1. The emulation must give the former."""
    a = torch.tensor([1 + 2**-12], dtype=torch.float32)
    b = torch.tensor([(1 - 2**-12 + 2**-24) * 2**-24], dtype=torch.float32)
    one = torch.ones(1, dtype=torch.float32)
    assert (a.double() * b.double() + one.double()).float().item() == 1.0  # the double rounding
    assert fma32(a, b, one).item() == 1 + 2**-23
    assert fma32(-a, b, -one).item() == -(1 + 2**-23)
    assert fma32(a, b, -one).item() == float(torch.tensor(-1 + 2**-24 + 2**-60, dtype=torch.float64).float())


# Relative error bound against a float64 reference: float32 and float64 accumulate in their own
# precision (error ~ sqrt(K) * eps); bfloat16's result is rounded to bfloat16 at the end (eps 2^-8).
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float64: 1e-13}


@settings(max_examples=80, deadline=None)
@given(
    rows=st.integers(1, 40),
    lead=st.sampled_from([(), (1,), (3,)]),
    fan_in=st.integers(1, 200),
    fan_out=st.integers(1, 70),
    bias=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
    seed=st.integers(0, 2**31),
)
def test_skinny_linear_is_linear_and_every_path_gives_its_contract_s_bits(
    rows: int, lead: tuple[int, ...], fan_in: int, fan_out: int, bias: bool, dtype: torch.dtype, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, rows, fan_in, generator=generator, dtype=torch.float64).to(dtype)
    weight = torch.randn(fan_out, fan_in, generator=generator, dtype=torch.float64).to(dtype)
    b = torch.randn(fan_out, generator=generator, dtype=torch.float64).to(dtype) if bias else None
    expected = torch.nn.functional.linear(x.double(), weight.double(), None if b is None else b.double())
    results = {isa: skinny.skinny_linear(x, weight, b, isa) for isa in skinny.supported_isas()}
    scale = expected.abs().max().item() + 1e-30
    for isa, result in results.items():
        assert result.shape == (*lead, rows, fan_out) and result.dtype == dtype
        error = (result.double() - expected).abs().max().item() / scale
        assert error < TOLERANCE[dtype], f"{isa}, {dtype}: relative error {error:.3e}"
        assert torch.equal(result, contract_result(x, weight, b, isa)), f"isa {isa!r} breaks its contract"
        if LANES[isa] == 16 or dtype == torch.float64:
            assert torch.equal(result, results["portable"]), f"isa {isa!r} differs from the portable path"


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 40),
    fan_in=st.integers(1, 200),
    fan_outs=st.lists(st.integers(1, 300), min_size=1, max_size=4),
    biases=st.lists(st.booleans(), min_size=4, max_size=4),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
    seed=st.integers(0, 2**31),
)
def test_a_group_of_weights_gives_each_weight_s_own_bits(
    rows: int, fan_in: int, fan_outs: list[int], biases: list[bool], dtype: torch.dtype, seed: int
) -> None:
    """skinny_linears (one parallel pass over several weights) equals skinny_linear per weight, bit for bit."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, rows, fan_in, generator=generator).to(dtype)
    layers = []
    for n, b in zip(fan_outs, biases, strict=False):
        weight = torch.randn(n, fan_in, generator=generator).to(dtype)
        layers.append((weight, torch.randn(n, generator=generator).to(dtype) if b else None))
    for isa in skinny.supported_isas():
        together = skinny.skinny_linears(x, layers, isa)
        assert len(together) == len(layers)
        for (weight, bias), got in zip(layers, together, strict=True):
            assert got.shape == (1, rows, weight.shape[0]) and got.dtype == dtype
            assert torch.equal(got, skinny.skinny_linear(x, weight, bias, isa)), isa


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: [(torch.randn(3, 4), None), (torch.randn(3, 5), None)], "the weight's in-features are 5"),
        (lambda: [(torch.randn(3, 4), None), (torch.randn(3, 4).double(), None)], "x is Float, the weight is Double"),
        (lambda: [(torch.randn(3, 4), torch.randn(2))], "bias must be [3]"),
        (lambda: [], "at least one weight"),
    ],
)
def test_a_bad_group_is_refused_naming_the_value(make: Any, message: str) -> None:
    with pytest.raises(RuntimeError) as raised:
        skinny.skinny_linears(torch.randn(2, 4), make())
    assert message in str(raised.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("fan_in", [576, 1536, 37, 16])
def test_a_row_gives_the_same_bits_whatever_rows_come_with_it(dtype: torch.dtype, fan_in: int) -> None:
    generator = torch.Generator().manual_seed(fan_in)
    x = torch.randn(33, fan_in, generator=generator).to(dtype)
    weight = torch.randn(100, fan_in, generator=generator).to(dtype)
    together = skinny.skinny_linear(x, weight)
    for count in (1, 2, 3, 4, 5, 8, 16, 33):
        for start in (0, 33 - count):
            alone = skinny.skinny_linear(x[start : start + count], weight)
            assert torch.equal(alone, together[start : start + count]), (count, start)


def test_the_real_shapes_of_the_default_model() -> None:
    """Every linear shape of SmolLM2-135M (and its 49,152-row head), 1 to 16 rows, against linear."""
    generator = torch.Generator().manual_seed(0)
    for out_features, in_features in ((576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)):
        weight = torch.randn(out_features, in_features, generator=generator) * 0.05
        for rows in (1, 2, 3, 8, 16):
            x = torch.randn(rows, in_features, generator=generator)
            expected = torch.nn.functional.linear(x.double(), weight.double())
            got = skinny.skinny_linear(x, weight)
            torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: (torch.randn(2, 5), torch.randn(3, 4), None), "last dimension is 5"),
        (lambda: (torch.randn(2, 4), torch.randn(3, 4, dtype=torch.float64), None), "x is Float, the weight is Double"),
        (lambda: (torch.randn(2, 4).half(), torch.randn(3, 4).half(), None), "got Half"),
        (lambda: (torch.randn(2, 4), torch.randn(4, 3).t(), None), "must be contiguous"),
        (lambda: (torch.randn(2, 4), torch.randn(3, 4, 1), None), "must be [out, in]"),
        (lambda: (torch.randn(2, 4), torch.randn(3, 4), torch.randn(5)), "bias must be [3]"),
    ],
)
def test_bad_input_is_refused_naming_the_value(make: Any, message: str) -> None:
    x, weight, b = make()
    with pytest.raises(RuntimeError) as raised:
        skinny.skinny_linear(x, weight, b)
    assert message in str(raised.value)


def test_an_unknown_or_missing_instruction_set_is_refused() -> None:
    x, weight = torch.randn(2, 4), torch.randn(3, 4)
    valid = ", ".join(f"'{isa}'" for isa in skinny.ISAS)  # the C++ list and the Python one name the same paths
    with pytest.raises(RuntimeError, match=re.escape(f"unknown isa 'sse9'; valid: {valid}")):
        skinny.skinny_linear(x, weight, None, "sse9")
    supported = skinny.supported_isas()  # the CPU's, whatever SPECDEC_CPU_ISA forces
    missing = [isa for isa in skinny.ISAS[1:] if isa not in supported]
    for isa in missing:  # on a CPU without it, forcing it must fail, not run a wrong kernel
        with pytest.raises(RuntimeError, match="not supported by this CPU"):
            skinny.skinny_linear(x, weight, None, isa)


def test_it_traces_into_a_compiled_graph() -> None:
    weight = torch.randn(24, 16)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(skinny.skinny_linear(x, weight)) * 2.0

    compiled = torch.compile(forward, fullgraph=True, backend="eager")
    x = torch.randn(3, 16)
    assert torch.equal(compiled(x), forward(x))


@st.composite
def trees(draw: st.DrawFn, max_nodes: int = 20) -> tuple[int, ...]:
    """Random parents arrays: node 0 the root, every parent before its child."""
    size = draw(st.integers(1, max_nodes))
    return (-1, *(draw(st.integers(0, i - 1)) for i in range(1, size)))


def sdpa_reference(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    """``scaled_dot_product_attention`` in float64 with ``visible`` bool ``[T, T]`` over the tree part."""
    rows = query.shape[2]
    mask = torch.ones(rows, start + rows, dtype=torch.bool)
    mask[:, start:] = visible
    out = torch.nn.functional.scaled_dot_product_attention(
        query.double(), keys[:, :, : start + rows].double(), values[:, :, : start + rows].double(),
        attn_mask=mask[None, None], scale=scale, enable_gqa=True,
    )  # fmt: skip
    return out.transpose(1, 2).reshape(1, rows, -1)


@settings(max_examples=60, deadline=None)
@given(
    parents=trees(),
    causal=st.booleans(),
    start=st.integers(0, 90),
    spare=st.integers(0, 10),
    heads=st.sampled_from([(1, 1), (4, 2), (9, 3), (2, 2)]),
    head_dim=st.sampled_from([8, 16, 20, 64, 96, 128, 200]),  # 1..13 AVX-512 chunks: every pass width
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
    seed=st.integers(0, 2**31),
)
def test_tree_attention_is_masked_attention_and_every_path_gives_the_same_bits(
    parents: tuple[int, ...], causal: bool, start: int, spare: int, heads: tuple[int, int], head_dim: int,
    dtype: torch.dtype, seed: int,
) -> None:
    rows = len(parents)
    query_heads, kv_heads = heads
    generator = torch.Generator().manual_seed(seed)
    slots = start + rows + spare
    keys = torch.randn(1, kv_heads, slots, head_dim, generator=generator).to(dtype)
    values = torch.randn(1, kv_heads, slots, head_dim, generator=generator).to(dtype)
    # The query in the layout the runner hands over: [1, T, Hq, D] memory, viewed as [1, Hq, T, D].
    query = torch.randn(1, rows, query_heads, head_dim, generator=generator).to(dtype).transpose(1, 2)
    ancestors = None if causal else torch.from_numpy(ancestor_matrix(parents))
    visible = torch.ones(rows, rows, dtype=torch.bool).tril() if ancestors is None else ancestors
    scale = head_dim**-0.5
    results = {isa: skinny.tree_attention(query, keys, values, start, ancestors, scale, isa)
               for isa in skinny.supported_isas()}  # fmt: skip
    first = results["portable"]
    assert first.shape == (1, rows, query_heads * head_dim) and first.dtype == dtype
    expected = sdpa_reference(query, keys, values, start, visible, scale)
    error = (first.double() - expected).abs().max().item()
    assert error < {torch.float32: 2e-6, torch.bfloat16: 2e-2, torch.float64: 1e-13}[dtype], error
    for isa, result in results.items():
        assert torch.equal(result, first), f"isa {isa!r} differs from the portable path"


@settings(max_examples=30, deadline=None)
@given(
    shapes=st.lists(
        st.tuples(trees(max_nodes=12), st.booleans(), st.integers(0, 70), st.integers(0, 8)), min_size=1, max_size=4
    ),
    heads=st.sampled_from([(1, 1), (9, 3), (4, 2)]),
    head_dim=st.sampled_from([16, 20, 64]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
    seed=st.integers(0, 2**31),
)
def test_segments_in_one_call_give_each_segment_s_own_bits(
    shapes: list[tuple[tuple[int, ...], bool, int, int]], heads: tuple[int, int], head_dim: int, dtype: torch.dtype,
    seed: int,
) -> None:
    """tree_attention_segments (several sequences' rows, each over its own cache, one call) equals
    tree_attention per segment, bit for bit, on every path."""
    query_heads, kv_heads = heads
    generator = torch.Generator().manual_seed(seed)
    segments, queries = [], []
    for parents, causal, start, spare in shapes:
        rows = len(parents)
        slots = start + rows + spare
        keys = torch.randn(1, kv_heads, slots, head_dim, generator=generator).to(dtype)
        values = torch.randn(1, kv_heads, slots, head_dim, generator=generator).to(dtype)
        ancestors = None if causal else torch.from_numpy(ancestor_matrix(parents))
        segments.append((keys, values, start, rows, ancestors))
        queries.append(torch.randn(1, rows, query_heads, head_dim, generator=generator).to(dtype))
    query = torch.cat(queries, dim=1).transpose(1, 2)  # [1, Hq, R, D], as the runner hands it over
    for isa in skinny.supported_isas():
        together = skinny.tree_attention_segments(query, segments, 0.125, isa)
        first = 0
        for (keys, values, start, rows, ancestors), alone_query in zip(segments, queries, strict=True):
            alone = skinny.tree_attention(alone_query.transpose(1, 2), keys, values, start, ancestors, 0.125, isa)
            assert torch.equal(together[:, first : first + rows], alone), (isa, first)
            first += rows


@pytest.mark.parametrize(
    ("counts", "message"),
    [([2, 2], "counts sum to 4, the query has 3 rows"), ([3, 0], "segment 1 has 0 rows")],
)
def test_bad_segments_are_refused_naming_the_value(counts: list[int], message: str) -> None:
    keys = torch.randn(1, 3, 20, 64)
    segments = [(keys, keys.clone(), 5, count, None) for count in counts]
    with pytest.raises(RuntimeError) as raised:
        skinny.tree_attention_segments(torch.randn(1, 9, 3, 64), segments, 0.125)
    assert message in str(raised.value)


@settings(max_examples=30, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.integers(1, 9), st.integers(0, 40), st.integers(0, 5)), min_size=1, max_size=6),
    kv_heads=st.sampled_from([1, 3]),
    head_dim=st.sampled_from([8, 64]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
    seed=st.integers(0, 2**31),
)
def test_write_segments_equals_a_slice_assignment_per_segment(
    shapes: list[tuple[int, int, int]], kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int
) -> None:
    """write_segments puts each segment's rows of the runner's transposed key/value view at its cache's
    slots, exactly as the slice assignments it replaces, and touches no other slot."""
    generator = torch.Generator().manual_seed(seed)
    total = sum(rows for rows, _, _ in shapes)
    # As the runner hands them over: [1, R, H, D] projections viewed as [1, H, R, D] (D contiguous).
    key = torch.randn(1, total, kv_heads, head_dim, generator=generator).to(dtype).transpose(1, 2)
    value = torch.randn(1, total, kv_heads, head_dim, generator=generator).to(dtype).transpose(1, 2)
    caches = [tuple(torch.randn(1, kv_heads, start + rows + spare, head_dim, generator=generator).to(dtype)
                    for _ in range(2)) for rows, start, spare in shapes]  # fmt: skip
    expected = [(keys.clone(), values.clone()) for keys, values in caches]
    first = 0
    for (keys, values), (rows, start, _) in zip(expected, shapes, strict=True):
        keys[:, :, start : start + rows] = key[:, :, first : first + rows]
        values[:, :, start : start + rows] = value[:, :, first : first + rows]
        first += rows
    skinny.write_segments(key, value, caches, [start for _, start, _ in shapes], [rows for rows, _, _ in shapes])
    for (keys, values), (want_keys, want_values) in zip(caches, expected, strict=True):
        assert torch.equal(keys, want_keys) and torch.equal(values, want_values)


@pytest.mark.parametrize(
    ("starts", "counts", "message"),
    [([0, 18], [2, 3], "segment 1: 3 rows at slot 18 do not fit its 20 slots"),
     ([0, 0], [2, 2], "counts sum to 4, key has 5 rows"),
     ([0, 0], [5, 0], "segment 1: 0 rows")],
)  # fmt: skip
def test_bad_writes_are_refused_before_any_write(starts: list[int], counts: list[int], message: str) -> None:
    """A bad segment anywhere raises naming it, and no cache was written (the checks come first)."""
    key = torch.randn(1, 5, 3, 64).transpose(1, 2)
    caches = [(torch.zeros(1, 3, 20, 64), torch.zeros(1, 3, 20, 64)) for _ in counts]
    with pytest.raises(RuntimeError) as raised:
        skinny.write_segments(key, key.clone(), caches, starts, counts)
    assert message in str(raised.value)
    assert all(not keys.any() and not values.any() for keys, values in caches)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_tree_row_equals_the_same_query_after_its_ancestors_were_committed(dtype: torch.dtype) -> None:
    parents = (-1, 0, 0, 1, 1, 3, 2, 5, 0)
    rows, start, head_dim = len(parents), 57, 64
    generator = torch.Generator().manual_seed(1)
    keys = torch.randn(1, 3, 100, head_dim, generator=generator).to(dtype)
    values = torch.randn(1, 3, 100, head_dim, generator=generator).to(dtype)
    query = torch.randn(1, 9, rows, head_dim, generator=generator).to(dtype)
    ancestors = ancestor_matrix(parents)
    tree = skinny.tree_attention(query, keys, values, start, torch.from_numpy(ancestors), 0.125)
    for node in range(rows):
        path = [a for a in range(rows) if ancestors[node, a]]  # the root .. node, in slot order
        committed_keys, committed_values = keys.clone(), values.clone()
        for depth, a in enumerate(path):  # plain decoding would have these at consecutive slots
            committed_keys[:, :, start + depth] = keys[:, :, start + a]
            committed_values[:, :, start + depth] = values[:, :, start + a]
        alone = skinny.tree_attention(
            query[:, :, node : node + 1], committed_keys, committed_values, start + len(path) - 1, None, 0.125
        )
        assert torch.equal(alone[0, 0], tree[0, node]), f"node {node}"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"start": 99}, "slots 99..101 outside the 100 slots"),
        ({"keys": torch.randn(1, 3, 100, 32), "values": torch.randn(1, 3, 100, 32)}, "head dim 64 of the queries, 32"),
        ({"keys": torch.randn(1, 3, 100, 32)}, "keys [1, 3, 100, 32] and values [1, 3, 100, 64] differ"),
        ({"query": torch.randn(1, 4, 3, 64)}, "4 query heads over 3 KV heads"),
        ({"ancestors": torch.ones(2, 2, dtype=torch.bool)}, "ancestors must be bool [3, 3]"),
        ({"values": torch.randn(1, 3, 100, 64).double()}, "must share a dtype"),
        ({"keys": torch.randn(1, 3, 64, 100).transpose(2, 3)}, "must be contiguous"),
    ],
)
def test_tree_attention_refuses_bad_input_naming_the_value(change: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {
        "query": torch.randn(1, 9, 3, 64), "keys": torch.randn(1, 3, 100, 64), "values": torch.randn(1, 3, 100, 64),
        "start": 10, "ancestors": None, "scale": 0.125,
    }  # fmt: skip
    arguments.update(change)
    with pytest.raises(RuntimeError) as raised:
        skinny.tree_attention(**arguments)
    assert message in str(raised.value)


# ---- every kernel path by name: skipped visibly where this CPU cannot run it ------------------------

ALL_ISAS = skinny.ISAS[1:]  # every path by name ("auto" is one of them)
REQUIRE_ENV = "SPECDEC_REQUIRE_ISAS"  # comma-separated paths that must run here (CI on a known machine)


@pytest.fixture(params=ALL_ISAS)
def isa(request: pytest.FixtureRequest) -> str:
    """One kernel path: a path this CPU lacks is a visible skip (a failure where ``SPECDEC_REQUIRE_ISAS`` names it)."""
    name = str(request.param)
    supported = skinny.supported_isas()
    if name not in supported:
        required = {item.strip() for item in __import__("os").environ.get(REQUIRE_ENV, "").split(",") if item.strip()}
        reason = f"this CPU cannot run the {name} path (it runs {', '.join(supported)})"
        if name in required:
            pytest.fail(f"{REQUIRE_ENV} names {name}: {reason}")
        pytest.skip(reason)
    return name


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """Torch's thread count for the test (the kernels split their tasks over them), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(int(request.param))
    yield int(request.param)
    torch.set_num_threads(before)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values with NaN in the same places (NaN payloads aside)."""
    return bool(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.integers(0, 40),
    fan_in=st.integers(1, 700),
    fan_out=st.integers(1, 400),  # up to ~25 parallel tasks at these fan-ins: outputs drawn across tasks
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**31),
)
def test_each_path_is_linear_across_tasks_and_threads_and_keeps_its_contract(
    isa: str, threads: int, rows: int, fan_in: int, fan_out: int, dtype: torch.dtype, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, fan_in, generator=generator, dtype=torch.float64).to(dtype)
    weight = torch.randn(fan_out, fan_in, generator=generator, dtype=torch.float64).to(dtype)
    got = skinny.skinny_linear(x, weight, None, isa)
    assert got.shape == (rows, fan_out) and got.dtype == dtype
    expected = torch.nn.functional.linear(x.double(), weight.double())
    if rows:
        error = (got.double() - expected).abs().max().item() / (expected.abs().max().item() + 1e-30)
        assert error < TOLERANCE[dtype], f"{isa}, {dtype}: relative error {error:.3e}"
    assert torch.equal(got, contract_result(x, weight, None, isa)), f"{isa} breaks its contract"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_path_gives_a_row_the_same_bits_whatever_rows_come_with_it(isa: str, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(40, 600, generator=generator).to(dtype)
    weight = torch.randn(300, 600, generator=generator).to(dtype)
    together = skinny.skinny_linear(x, weight, None, isa)
    for count in (1, 2, 3, 4, 6, 7, 8, 13, 40):
        for start in (0, 40 - count):
            assert torch.equal(skinny.skinny_linear(x[start : start + count], weight, None, isa),
                               together[start : start + count]), (isa, count, start)  # fmt: skip


def test_each_path_keeps_non_finite_weights_where_they_are(isa: str) -> None:
    """An inf or NaN in a weight row gives NaN/inf in that output column on every path, where its contract has them."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(5, 100, generator=generator)
    weight = torch.randn(70, 100, generator=generator)
    weight[3, 17] = float("nan")
    weight[40, 99] = float("inf")
    x[2, 0] = float("-inf")
    got = skinny.skinny_linear(x, weight, None, isa)
    assert _bits_equal(got, contract_result(x, weight, None, isa)), isa
    assert got[:, 3].isnan().all() and got[2].isnan().any()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parents=trees(max_nodes=12),
    start=st.integers(0, 150),
    heads=st.sampled_from([(1, 1), (9, 3), (4, 2)]),
    head_dim=st.sampled_from([8, 20, 64, 209, 232, 256, 300]),  # up to 256: the blocked paths; 300: the row path
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    non_finite=st.sampled_from(["none", "nan-key", "inf-query", "nan-value", "-inf-key"]),
    seed=st.integers(0, 2**31),
)
def test_each_path_attends_as_the_portable_one_with_any_head_and_non_finite_input(
    isa: str, threads: int, parents: tuple[int, ...], start: int, heads: tuple[int, int], head_dim: int,
    dtype: torch.dtype, non_finite: str, seed: int,
) -> None:
    """Head dims past the AVX-512 kernel's 16 chunks, several tasks (threads), and the contract's rule for
    non-finite values (tree_attention.h): every path gives the portable path's values, NaN in the same places."""
    rows = len(parents)
    query_heads, kv_heads = heads
    generator = torch.Generator().manual_seed(seed)
    slots = start + rows
    keys = torch.randn(1, kv_heads, slots, head_dim, generator=generator)
    values = torch.randn(1, kv_heads, slots, head_dim, generator=generator)
    query = torch.randn(1, query_heads, rows, head_dim, generator=generator)
    slot = int(torch.randint(0, slots, (1,), generator=generator))
    if non_finite == "nan-key":
        keys[0, 0, slot, head_dim // 2] = float("nan")
    elif non_finite == "-inf-key":
        keys[0, 0, slot, 0] = float("-inf")
    elif non_finite == "inf-query":
        query[0, 0, rows - 1, 1 % head_dim] = float("inf")
    elif non_finite == "nan-value":
        values[0, 0, slot, head_dim - 1] = float("nan")
    keys, values, query = keys.to(dtype), values.to(dtype), query.to(dtype)
    ancestors = torch.from_numpy(ancestor_matrix(parents))
    got = skinny.tree_attention(query, keys, values, start, ancestors, head_dim**-0.5, isa)
    oracle = skinny.tree_attention(query, keys, values, start, ancestors, head_dim**-0.5, "portable")
    assert _bits_equal(got, oracle), f"{isa} differs from the portable path ({non_finite}, head dim {head_dim})"
    if non_finite == "nan-key":  # every row that sees that key gets NaN (a NaN score makes the row NaN)
        seen = [i for i in range(rows) if slot < start or bool(ancestors[i, slot - start])]
        assert all(got[0, i, :head_dim].isnan().all() for i in seen)
