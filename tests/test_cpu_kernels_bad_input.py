"""Bad input to specdec's CPU kernels (``torch.ops.specdec_cpu.*``): a RuntimeError naming it, never a crash.

Every op of ``specdec/backends/specdec_engine/csrc`` (skinny_linear, with dense weights and with GGUF
blocks, skinny_linears, gguf_widen, tree_attention, tree_attention_segments, write_segments,
decoder_layers) gets hand cases in the child-process harness of ``child_cases.py`` (one child runs them
all, each in three modes: torch on one thread, on several, from a Python thread; a crash fails the case
that caused it, with its signal): a valid call that must return, then one breakage each (a shape, a
dtype, a device, an empty input, a kernel path, a count), each with the message it must give. Random
breakage: the hypothesis test at the end draws valid calls of the two main ops and breaks one thing.
``torch.library.opcheck`` checks every op's schema, fake (meta) implementation and dispatch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from child_cases import OTHER, Case, T, failures, run_cases
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from specdec.backends.specdec_engine import cpu_kernels


@pytest.fixture(scope="module")
def kernels() -> Any:
    from conftest import native_or_skip  # here, not at the top: the children import this module for `call`

    return native_or_skip("cpu_kernels", cpu_kernels.load)


def call(name: str, *args: Any) -> Any:
    """What a child runs: ``torch.ops.specdec_cpu.<name>(*args)``, the extension loaded first."""
    cpu_kernels.load()
    return getattr(torch.ops.specdec_cpu, name)(*args)


def f(*shape: int, **options: Any) -> T:
    return T(shape=shape, dtype=options.pop("dtype", torch.float32), **options)


def blocks(out: int, count: int, size: int, **options: Any) -> T:
    """GGUF blocks uint8 ``[out, count, size]`` (random bytes: a block of any content widens to something)."""
    return T(shape=(out, count, size), dtype=torch.uint8, **options)


def case(name: str, op: str, args: tuple[Any, ...], match: str | None) -> Case:
    return Case(f"{op}: {name}", "test_cpu_kernels_bad_input:call", (op, *args), match)


TRIL = T([[True, False, False], [True, True, False], [True, False, True]], dtype=torch.bool)


def layer_args(**change: Any) -> tuple[Any, ...]:
    """A valid decoder_layers call: one layer, hidden 8, 2 query heads over 1 KV head of 4, 2 rows, 6 slots."""
    args: dict[str, Any] = {
        "hidden": f(1, 2, 8), "cos": f(1, 2, 4), "sin": f(1, 2, 4), "norms": [f(8), f(8)],
        "weights": [f(8, 8), f(4, 8), f(4, 8), f(8, 8), f(16, 8), f(16, 8), f(8, 16)], "biases": [None] * 7,
        "eps": 1e-6, "query_heads": 2, "kv_heads": 1, "rotary_together": True, "scale": 0.5,
        "keys": [f(1, 1, 6, 4)], "values": [f(1, 1, 6, 4)], "starts": [1], "counts": [2], "ancestors": [None],
        "isa": "auto",
    }
    args.update(change)
    return tuple(args.values())


CASES = [
    case("valid", "skinny_linear", (f(3, 8), f(5, 8), f(5), "auto"), None),
    case("no rows at all", "skinny_linear", (f(0, 8), f(5, 8), None, "auto"), None),
    case("no rows, each forced path", "skinny_linear", (f(0, 8), f(40, 8), None, "portable"), None),
    case("x without dimensions", "skinny_linear", (T(values=1.0, dtype=torch.float32), f(5, 8), None, "auto"),
         "x must have at least one dimension"),
    case("in-features differ", "skinny_linear", (f(3, 8), f(5, 7), None, "auto"),
         "x's last dimension is 8, the weight's in-features are 7"),
    case("weight of rank 3", "skinny_linear", (f(3, 8), f(1, 5, 8), None, "auto"), r"weight must be \[out, in\]"),
    case("dtypes differ", "skinny_linear", (f(3, 8), f(5, 8, dtype=torch.float64), None, "auto"),
         "x is Float, the weight is Double"),
    case("integer dtype", "skinny_linear", (f(3, 8, dtype=torch.int32), f(5, 8, dtype=torch.int32), None, "auto"),
         "float32, bfloat16 or float64 only"),
    case("weight not contiguous", "skinny_linear", (f(3, 8), f(5, 8, layout="strided"), None, "auto"),
         "the weight must be contiguous"),
    case("bias of the wrong length", "skinny_linear", (f(3, 8), f(5, 8), f(4), "auto"), r"bias must be \[5\]"),
    case("weight on another device", "skinny_linear", (f(3, 8), f(5, 8, device=OTHER), None, "auto"),
         "must be on one device"),
    case("an unknown kernel path", "skinny_linear", (f(3, 8), f(5, 8), None, "sse9"), "unknown isa 'sse9'"),
    case("GGUF blocks: valid", "skinny_linear", (f(3, 64), blocks(5, 2, 20), f(5), "auto"), None),
    case("GGUF blocks: valid, portable", "skinny_linear", (f(17, 256), blocks(21, 1, 210), None, "portable"), None),
    case("GGUF blocks: no rows", "skinny_linear", (f(0, 32), blocks(5, 1, 34), None, "auto"), None),
    case("GGUF blocks: of no type's size", "skinny_linear", (f(3, 32), blocks(5, 1, 21), None, "auto"),
         "GGUF blocks of 21 bytes are no supported type"),
    case("GGUF blocks: in-features differ", "skinny_linear", (f(3, 64), blocks(5, 1, 20), None, "auto"),
         "the GGUF weight's in-features are 32 "),
    case("GGUF blocks: bfloat16 x", "skinny_linear", (f(3, 32, dtype=torch.bfloat16), blocks(5, 1, 18), None, "auto"),
         "GGUF blocks take float32 x"),
    case("GGUF blocks: of rank 2", "skinny_linear", (f(3, 20), T(shape=(5, 20), dtype=torch.uint8), None, "auto"),
         r"GGUF blocks must be uint8 \[out, blocks, block bytes\]"),
    case("GGUF blocks: not contiguous", "skinny_linear", (f(3, 32), blocks(5, 1, 20, layout="strided"), None, "auto"),
         "the GGUF blocks must be contiguous|no supported type"),
    case("GGUF blocks: a bias of another dtype", "skinny_linear",
         (f(3, 32), blocks(5, 1, 20), f(5, dtype=torch.float64), "auto"), r"bias must be \[5\] of float32"),
    case("GGUF blocks: on another device", "skinny_linear", (f(3, 32), blocks(5, 1, 20, device=OTHER), None, "auto"),
         "must be on one device"),
    case("valid", "gguf_widen", (blocks(5, 2, 144), "auto"), None),
    case("each forced path", "gguf_widen", (blocks(40, 3, 20), "portable"), None),
    case("no rows", "gguf_widen", (blocks(0, 3, 34), "auto"), None),
    case("float blocks", "gguf_widen", (f(5, 2, 20), "auto"), r"must be uint8 \[out, blocks, block bytes\]"),
    case("blocks of no type's size", "gguf_widen", (blocks(5, 2, 19), "auto"), "19 bytes are no supported type"),
    case("not contiguous", "gguf_widen", (blocks(5, 2, 20, layout="transposed"), "auto"), "must be contiguous"),
    case("an unknown kernel path", "gguf_widen", (blocks(5, 2, 20), "sse9"), "unknown isa 'sse9'"),
    case("valid", "skinny_linears", (f(3, 8), [f(5, 8), f(2, 8)], [None, f(2)], "auto"), None),
    case("GGUF blocks beside a dense weight", "skinny_linears",
         (f(3, 32), [blocks(5, 1, 20), f(2, 32)], [None, f(2)], "auto"), None),
    case("GGUF blocks of another width", "skinny_linears",
         (f(3, 32), [blocks(5, 1, 20), blocks(2, 2, 20)], [None, None], "auto"), "in-features are 64"),
    case("no weights", "skinny_linears", (f(3, 8), [], [], "auto"), "at least one weight"),
    case("a bias too few", "skinny_linears", (f(3, 8), [f(5, 8), f(2, 8)], [None], "auto"), "2 weights and 1 biases"),
    case("valid", "tree_attention", (f(1, 2, 3, 4), f(1, 1, 6, 4), f(1, 1, 6, 4), 2, TRIL, 0.5, "auto"), None),
    case("causal, no ancestors", "tree_attention", (f(1, 2, 3, 4), f(1, 1, 6, 4), f(1, 1, 6, 4), 2, None, 0.5, "auto"),
         None),
    case("no rows", "tree_attention", (f(1, 2, 0, 4), f(1, 1, 6, 4), f(1, 1, 6, 4), 2, None, 0.5, "auto"), None),
    case("rows past the cache", "tree_attention", (f(1, 2, 3, 4), f(1, 1, 6, 4), f(1, 1, 6, 4), 4, None, 0.5, "auto"),
         r"rows at slots 4..6 outside the 6 slots"),
    case("a negative start", "tree_attention", (f(1, 2, 3, 4), f(1, 1, 6, 4), f(1, 1, 6, 4), -1, None, 0.5, "auto"),
         "outside the 6 slots"),
    case("query of rank 3", "tree_attention", (f(2, 3, 4), f(1, 1, 6, 4), f(1, 1, 6, 4), 2, None, 0.5, "auto"),
         r"query \[1, Hq, T, D\]"),
    case("3 query heads over 2 KV heads", "tree_attention",
         (f(1, 3, 3, 4), f(1, 2, 6, 4), f(1, 2, 6, 4), 2, None, 0.5, "auto"), "3 query heads over 2 KV heads"),
    case("ancestors of the wrong size", "tree_attention",
         (f(1, 2, 3, 4), f(1, 1, 6, 4), f(1, 1, 6, 4), 2, T([[True]], dtype=torch.bool), 0.5, "auto"),
         r"ancestors must be bool \[3, 3\]"),
    case("ancestors of another dtype", "tree_attention",
         (f(1, 2, 3, 4), f(1, 1, 6, 4), f(1, 1, 6, 4), 2, f(3, 3), 0.5, "auto"), r"ancestors must be bool \[3, 3\]"),
    case("keys on another device", "tree_attention",
         (f(1, 2, 3, 4), f(1, 1, 6, 4, device=OTHER), f(1, 1, 6, 4), 2, None, 0.5, "auto"), "must be on one device"),
    case("query head dim not contiguous", "tree_attention",
         (f(1, 2, 3, 4, layout="strided"), f(1, 1, 6, 4), f(1, 1, 6, 4), 2, None, 0.5, "auto"),
         "head dim must be contiguous"),
    case("valid", "tree_attention_segments",
         (f(1, 2, 3, 4), [f(1, 1, 6, 4), f(1, 1, 5, 4)], [f(1, 1, 6, 4), f(1, 1, 5, 4)], [2, 1], [2, 1], [None, None],
          0.5, "auto"), None),
    case("counts that do not add up", "tree_attention_segments",
         (f(1, 2, 3, 4), [f(1, 1, 6, 4)], [f(1, 1, 6, 4)], [2], [2], [None], 0.5, "auto"),
         "the segments' counts sum to 2, the query has 3 rows"),
    case("a segment without rows", "tree_attention_segments",
         (f(1, 2, 3, 4), [f(1, 1, 6, 4), f(1, 1, 6, 4)], [f(1, 1, 6, 4), f(1, 1, 6, 4)], [2, 1], [3, 0], [None, None],
          0.5, "auto"), "segment 1 has 0 rows"),
    case("no segments", "tree_attention_segments", (f(1, 2, 3, 4), [], [], [], [], [], 0.5, "auto"),
         "at least one segment"),
    case("valid", "write_segments", (f(1, 1, 3, 4), f(1, 1, 3, 4), [f(1, 1, 6, 4)], [f(1, 1, 6, 4)], [1], [3]), None),
    case("rows past the cache", "write_segments",
         (f(1, 1, 3, 4), f(1, 1, 3, 4), [f(1, 1, 6, 4)], [f(1, 1, 6, 4)], [4], [3]), "do not fit its 6 slots"),
    case("a cache of another dtype", "write_segments",
         (f(1, 1, 3, 4), f(1, 1, 3, 4), [f(1, 1, 6, 4, dtype=torch.float64)], [f(1, 1, 6, 4)], [1], [3]),
         "is not a contiguous CPU"),
    case("valid", "decoder_layers", layer_args(), None),
    case("head counts that do not fit", "decoder_layers", layer_args(query_heads=4), "do not fit"),
    case("KV heads that do not divide", "decoder_layers", layer_args(kv_heads=3), "a multiple of the second"),
    case("cos for other rows", "decoder_layers", layer_args(cos=f(1, 3, 4), sin=f(1, 3, 4)),
         r"cos and sin must be \[1, R, D\] with R = 2"),
    case("a weight too few", "decoder_layers", layer_args(weights=[f(8, 8)] * 6), "7 per layer"),
    case("caches for another layer count", "decoder_layers", layer_args(keys=[], values=[]), "layer-major"),
    case("rows past the cache", "decoder_layers", layer_args(starts=[5]), "do not fit its 6 slots"),
    case("an unknown kernel path", "decoder_layers", layer_args(isa="neon9"), "unknown isa 'neon9'"),
]


@pytest.fixture(scope="module")
def verdicts(kernels: Any) -> dict[str, Any]:
    del kernels
    return run_cases(CASES, "cpu")


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_bad_input_to_a_cpu_kernel_raises_naming_the_value(verdicts: dict[str, Any], name: str) -> None:
    problems = verdicts[name].problems()
    assert not problems, "\n".join(problems)


def test_every_cpu_kernel_has_a_valid_case_and_a_bad_one() -> None:
    for op in ("skinny_linear", "skinny_linears", "gguf_widen", "tree_attention", "tree_attention_segments",
               "write_segments", "decoder_layers"):
        mine = [c for c in CASES if c.args[0] == op]
        assert any(c.match is None for c in mine) and any(c.match is not None for c in mine), op


# -- random breakage (hypothesis; every call in the child) -------------------------------------------

BREAKS = ["dtype", "in-features", "device", "rank", "contiguity", "isa"]


@st.composite
def broken_linear(draw: st.DrawFn) -> tuple[Case, Case]:
    """A valid skinny_linear call and the same call with one thing broken (the message it must give)."""
    rows, fan_in, fan_out = draw(st.integers(0, 20)), draw(st.integers(1, 300)), draw(st.integers(1, 200))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float64]))
    isa = draw(st.sampled_from(("auto", "portable")))
    x, w = f(rows, fan_in, dtype=dtype), f(fan_out, fan_in, dtype=dtype)
    valid = case(f"valid {rows}x{fan_in} by {fan_out} {dtype} {isa}", "skinny_linear", (x, w, None, isa), None)
    what = draw(st.sampled_from(BREAKS))
    broken: dict[str, tuple[tuple[Any, ...], str]] = {
        "dtype": ((x, f(fan_out, fan_in, dtype=torch.float16), None, isa), "float32, bfloat16 or float64 only|x is"),
        "in-features": ((x, f(fan_out, fan_in + 1, dtype=dtype), None, isa), f"in-features are {fan_in + 1}"),
        "device": ((x, f(fan_out, fan_in, dtype=dtype, device=OTHER), None, isa), "must be on one device"),
        "rank": ((x, f(1, fan_out, fan_in, dtype=dtype), None, isa), r"weight must be \[out, in\]"),
        "contiguity": ((x, f(fan_out, fan_in, dtype=dtype, layout="transposed"), None, isa),
                       "must be contiguous|in-features"),
        "isa": ((x, w, None, "avx1024"), "unknown isa 'avx1024'"),
    }
    args, match = broken[what]
    return valid, case(f"{what}: {valid.name}", "skinny_linear", args, match)


@settings(max_examples=3, deadline=None, derandomize=True, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(pairs=st.lists(broken_linear(), min_size=10, max_size=10))
def test_randomly_broken_calls_raise_and_their_valid_twins_return(kernels: Any, pairs: list[tuple[Case, Case]]) -> None:
    del kernels
    cases = [replace(c, name=f"{i}. {c.name}") for i, pair in enumerate(pairs) for c in pair]  # names unique
    problems = failures(run_cases(cases, "cpu"))
    assert not problems, "\n".join(problems)


# -- opcheck ---------------------------------------------------------------------------------------


def _opcheck_samples() -> dict[str, tuple[Any, ...]]:
    generator = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    tril = torch.ones(3, 3, dtype=torch.bool).tril()
    gguf = torch.randint(0, 256, (5, 2, 20), dtype=torch.uint8, generator=generator)  # Q4_1 blocks
    gguf[..., 0:4] = torch.tensor([0x1E, 0x20, 0x1E, 0xA0], dtype=torch.uint8)  # d, m: finite halves (no NaN out)
    values = dict(zip(("hidden", "cos", "sin"), (r(1, 2, 8), r(1, 2, 4), r(1, 2, 4)), strict=True))
    layer = (
        values["hidden"], values["cos"], values["sin"], [r(8), r(8)],
        [r(8, 8), r(4, 8), r(4, 8), r(8, 8), r(16, 8), r(16, 8), r(8, 16)], [None] * 7, 1e-6, 2, 1, True, 0.5,
        [r(1, 1, 6, 4)], [r(1, 1, 6, 4)], [1], [2], [None], "auto",
    )
    return {
        "skinny_linear": (r(3, 8), r(5, 8), r(5), "auto"),
        "skinny_linears": (r(3, 8), [r(5, 8), r(2, 8)], [r(5), None], "auto"),
        "skinny_linear (GGUF blocks)": (r(3, 64), gguf, r(5), "auto"),
        "gguf_widen": (gguf, "auto"),
        "tree_attention": (r(1, 2, 3, 4), r(1, 1, 6, 4), r(1, 1, 6, 4), 2, tril, 0.5, "auto"),
        "tree_attention_segments": (r(1, 2, 3, 4), [r(1, 1, 6, 4)], [r(1, 1, 6, 4)], [2], [3], [tril], 0.5, "auto"),
        "write_segments": (r(1, 1, 3, 4), r(1, 1, 3, 4), [r(1, 1, 6, 4)], [r(1, 1, 6, 4)], [1], [3]),
        "decoder_layers": layer,
    }


@pytest.mark.parametrize("op", sorted(_opcheck_samples()))
def test_opcheck(kernels: Any, op: str) -> None:
    """Schema, fake implementation and dispatch of each op (``torch.library.opcheck``)."""
    del kernels
    torch.library.opcheck(getattr(torch.ops.specdec_cpu, op.split()[0]).default, _opcheck_samples()[op])
