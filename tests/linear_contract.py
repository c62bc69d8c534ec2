"""The skinny linear's contract (``specdec/backends/specdec_engine/csrc/skinny_linear.h``) computed exactly in torch.

The tests' oracle for every kernel path: a path is held bitwise to the contract it keeps, whatever its
number of lanes ``L`` (16 for float and bfloat16 on the AVX-512, ``"avx2-lanes16"`` and portable paths;
8 on the AVX2 path; 8 for float64 everywhere).

The contract's step is a fused multiply-add, one rounding. Torch has no fma on the CPU, so a float32
``fma(a, b, c)`` is emulated in float64: ``a * b`` is exact there (24 + 24 bits < 53), the sum is
rounded once to 53 bits, and rounding that sum *to odd* (a result whose sum was inexact gets its last
bit set) before rounding to float32 gives the correctly rounded float32 result (Boldo and Melquiond,
"Emulation of FMA and correctly rounded sums: proved algorithms using rounding to odd", IEEE TC 2008:
rounding to odd with at least two more bits than the target makes the second rounding exact). The
sum's error, which decides "inexact", comes exactly from Knuth's TwoSum.
"""

from __future__ import annotations

import torch

# Lanes of the contract per kernel path for float32 and bfloat16 (float64: 8 on every path).
LANES = {"avx512": 16, "avx512-blocks": 16, "avx2-lanes16": 16, "portable": 16, "avx2": 8, "avx2-blocks": 8}


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a * b + c`` in float32 with one rounding (IEEE fma, round to nearest even); float32 in and out."""
    product = a.double() * b.double()  # exact
    addend = c.double()
    total = product + addend
    # TwoSum: the exact error of the float64 sum (valid for finite sums).
    back = total - product
    error = (product - (total - back)) + (addend - back)
    # Round to odd: an inexact float64 sum with an even last bit moves one ulp toward the exact value.
    even = (total.view(torch.int64) & 1) == 0
    inexact = torch.isfinite(total) & (error != 0)
    toward = torch.where(error > 0, torch.full_like(total, float("inf")), torch.full_like(total, float("-inf")))
    odd = torch.where(inexact & even, torch.nextafter(total, toward), total)
    return odd.float()


def lane_sum(acc: torch.Tensor) -> torch.Tensor:
    """The contract's summation tree over the last dimension (8 or 16 lanes), in the accumulators' dtype."""
    lanes = acc.shape[-1]
    chunks = [(acc[..., 4 * c] + acc[..., 4 * c + 2]) + (acc[..., 4 * c + 1] + acc[..., 4 * c + 3])
              for c in range(lanes // 4)]  # fmt: skip
    if lanes == 16:
        return (chunks[0] + chunks[1]) + (chunks[2] + chunks[3])
    return chunks[0] + chunks[1]


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lanes: int) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` by the contract with ``lanes`` lanes (float32 or bfloat16: float accumulation)."""
    assert x.dtype in (torch.float32, torch.bfloat16) and weight.dtype == x.dtype
    fan_in = weight.shape[1]
    rows = x.reshape(-1, fan_in).float()
    w = weight.float()
    pad = -fan_in % lanes
    rows = torch.nn.functional.pad(rows, (0, pad))
    w = torch.nn.functional.pad(w, (0, pad))
    acc = torch.zeros(rows.shape[0], w.shape[0], lanes)
    for k0 in range(0, fan_in + pad, lanes):
        acc = fma32(w[None, :, k0 : k0 + lanes], rows[:, None, k0 : k0 + lanes], acc)
    out = lane_sum(acc).to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])
