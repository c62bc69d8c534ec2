// specdec skinny linear: y = x @ W^T for a few rows of x, every weight row read from memory once.
//
// Why: verifying a draft tree of N nodes multiplies every weight W [out, in] of the model by N
// rows. For N from 1 to a few dozen that product is bound by reading W (the default model's
// 540 MB of fp32 weights take ~11-15 ms to stream on this project's CPU), not by arithmetic, and
// a GEMM library's kernels are tuned for large products: MKL streams the weights at ~18 GB/s for
// one row and repacks them for every call from two rows on. The kernels here read each weight
// row once in its stored layout and apply it to all N rows while it sits in registers.
//
// THE CONTRACT every path of this extension keeps, so that a row's result never depends on the other
// rows (batch invariance: a tree row equals the same token verified alone), and so that paths with
// the same L give bitwise the same result:
//
//   For output (m, o) with L lanes (L = 16 for float and bfloat16 on the AVX-512, 'avx2-lanes16' and
//   portable paths, 8 for them on the AVX2 path ('avx2', 'avx2-blocks'), 8 for double on every path):
//     acc[l] = 0 for l < L
//     for k0 = 0, L, 2L, ... < K:            // in increasing k0
//       for l < L:  acc[l] = fma(w[o, k0 + l], x[m, k0 + l], acc[l])   // 0 past K
//     y[m, o] = lane_sum(acc)
//   lane_sum (L = 16): chunk_c = (acc[4c] + acc[4c+2]) + (acc[4c+1] + acc[4c+3]) for c < 4;
//                      y = (chunk_0 + chunk_1) + (chunk_2 + chunk_3)
//   lane_sum (L = 8):  y = chunk_0 + chunk_1
//   fma is one rounding (a fused multiply-add); bfloat16 inputs are widened to float exactly,
//   accumulated in float, and the sum is rounded to bfloat16 (round to nearest even) at the end.
//   A bias, when given, is added to the rounded-to-float sum afterwards (in the output dtype).
//
// Why the AVX2 path has L = 8: one AVX2 register holds 8 floats, and AVX2 has 16 registers where
// AVX-512 has 32, so under L = 16 the AVX2 kernel could hold only 12 half accumulators and spent its
// time parking them (skinny_linear_avx2.cpp). With L = 8 its results differ from the other paths' in
// the last bits; a process runs one path ('auto': the best the CPU has, or SPECDEC_CPU_ISA), and a
// CPU with AVX-512 that mixes AVX2 kernels with its AVX-512 ones per tree size takes 'avx2-lanes16'.
//
// Layouts: x [M, K] and w [N, K] row-major and contiguous; y [M, N] row-major.
//
// GGUF BLOCKS. A weight may also be a GGUF file's quantized blocks: uint8 [N, B, block_bytes], row o
// of the weight being B consecutive blocks (a GGUF row, each an independent run of blocks), whose type
// the block size names (gguf_block_elements below: Q8_0 34, Q4_0 18, Q4_1 20, Q4_K 144, Q6_K 210 bytes),
// K = B x the type's elements per block, x float32. Each weight value is widened to exactly the float
// gguf-py's dequantizer gives it (gguf_widen.inc), 16 weight rows at a time into a buffer that stays in
// the core's caches, and those rows go through the float kernel of the same path over all M rows:
// every output is bitwise the float32 kernel's on the dequantized weight, on every path; the memory
// reads only the blocks (Q4_1: 0.625 bytes per weight against float's 4).
#pragma once

#include <cstdint>

namespace specdec_cpu_kernels {

// The elements per block of the GGUF type whose blocks are `block_bytes` long, or 0 for a size no
// supported type has.
inline int64_t gguf_block_elements(int64_t block_bytes) {
  switch (block_bytes) {
    case 34:   // Q8_0
    case 18:   // Q4_0
    case 20:   // Q4_1
      return 32;
    case 144:  // Q4_K
    case 210:  // Q6_K
      return 256;
    default:
      return 0;
  }
}

}  // namespace specdec_cpu_kernels
