"""Skinny linear kernels (``specdec.backends.skinny``): ``linear``'s math, one fixed summation order.

Checked: the op against ``torch.nn.functional.linear`` computed in float64 (random shapes and
leading dimensions, tails of every length, with and without bias, float32 / bfloat16 / float64);
the contract of ``csrc/skinny_linear.h``: every kernel path this CPU can run (AVX-512, AVX2,
portable) gives bitwise the same result, and a row's result is bitwise the same whatever other
rows come with it (batch invariance); bad input raises naming the value; the per-forward switch
installs on plain ``Linear`` layers only and always comes off.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conftest import native_or_skip
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.backends import skinny


@pytest.fixture(scope="module", autouse=True)
def extension() -> Iterator[Any]:
    yield native_or_skip("skinny_linear", skinny.load)


def runnable_isas() -> list[str]:
    """The kernel paths this CPU can run (the portable one always; AVX2 and AVX-512 where present)."""
    order = ("portable", "avx2", "avx512")
    best = skinny.cpu_isa()
    return list(order[: order.index(best) + 1])


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
def test_skinny_linear_is_linear_and_every_path_gives_the_same_bits(
    rows: int, lead: tuple[int, ...], fan_in: int, fan_out: int, bias: bool, dtype: torch.dtype, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, rows, fan_in, generator=generator, dtype=torch.float64).to(dtype)
    weight = torch.randn(fan_out, fan_in, generator=generator, dtype=torch.float64).to(dtype)
    b = torch.randn(fan_out, generator=generator, dtype=torch.float64).to(dtype) if bias else None
    expected = torch.nn.functional.linear(x.double(), weight.double(), None if b is None else b.double())
    results = {isa: skinny.skinny_linear(x, weight, b, isa) for isa in runnable_isas()}
    first = results["portable"]
    assert first.shape == (*lead, rows, fan_out) and first.dtype == dtype
    scale = expected.abs().max().item() + 1e-30
    error = (first.double() - expected).abs().max().item() / scale
    assert error < TOLERANCE[dtype], f"{dtype}: relative error {error:.3e}"
    for isa, result in results.items():
        assert torch.equal(result, first), f"isa {isa!r} differs from the portable path"


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
    with pytest.raises(RuntimeError, match="unknown isa 'sse9'"):
        skinny.skinny_linear(x, weight, None, "sse9")
    missing = [isa for isa in ("avx2", "avx512") if isa not in runnable_isas()]
    for isa in missing:  # on a CPU without it, forcing it must fail, not run a wrong kernel
        with pytest.raises(RuntimeError, match="not supported by this CPU"):
            skinny.skinny_linear(x, weight, None, isa)


def test_the_switch_serves_plain_linears_only_and_always_comes_off() -> None:
    class Custom(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), Custom(8, 8), torch.nn.Linear(8, 8).double())
    hooked = torch.nn.Linear(8, 8)
    hooked.forward = hooked.forward  # an instance forward, as accelerate's hooks install
    model.append(hooked)
    switch = skinny.SkinnyLinears(model)
    assert switch.layers == [model[0], model[2]]  # not the subclass, not the hooked layer
    x = torch.randn(3, 8)
    expected = model[0](x)
    with switch.active():
        assert "forward" in model[0].__dict__ and "forward" not in model[1].__dict__
        torch.testing.assert_close(model[0](x), expected, rtol=1e-6, atol=1e-6)
    assert "forward" not in model[0].__dict__ and "forward" not in model[2].__dict__
    with pytest.raises(KeyError), switch.active():
        raise KeyError("inside")
    assert all("forward" not in layer.__dict__ for layer in switch.layers)


def test_it_traces_into_a_compiled_graph() -> None:
    weight = torch.randn(24, 16)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(skinny.skinny_linear(x, weight)) * 2.0

    compiled = torch.compile(forward, fullgraph=True, backend="eager")
    x = torch.randn(3, 16)
    assert torch.equal(compiled(x), forward(x))
