// specdec skinny linear: the kernels of torch.ops.specdec_cpu.skinny_linear (registered in cpu_kernels.cpp).
//
// What and why: skinny_linear.h (the contract). Four paths, picked at run time:
//   avx512        hand-written AVX-512 kernels (float and bfloat16 weights), the fast path;
//   avx2          hand-written AVX2+FMA kernels with the 8-lane contract (skinny_linear_avx2.cpp): what a
//                 CPU without AVX-512 runs;
//   avx2-lanes16  the portable kernels compiled for AVX2+FMA: the 16-lane contract, AVX-512's bits (the
//                 "cpu-avx2" variant a CPU with AVX-512 may mix with its AVX-512 kernels per tree size);
//   portable      the portable kernels for the baseline target (any x86-64, or another architecture).
// double always takes a portable path (tests on fp64 models; nobody serves fp64).
//
// Work split: at::parallel_for hands each of torch's threads one share of every weight (whole 16-row
// units), so each thread streams its own contiguous part of W (no second thread pool: a private OpenMP
// runtime would fight torch's).
// Inside a block, the weight rows' vectors are loaded once per k step and applied to every x row
// of the block's group (register blocking: 16 accumulators, RO weight rows x RM x rows), and the
// lines of the next blocks are prefetched a few per k step while this one computes, so the stream
// from memory overlaps the arithmetic (rows() says how far, and what it measured).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_kernels.h"
#include "skinny_linear.h"

namespace specdec_cpu_kernels {

namespace portable {
#include "skinny_portable.inc"
#include "gguf_widen.inc"
}  // namespace portable

#if SPECDEC_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
#define SPECDEC_X86_FMA 1  // fma8 as the AVX2+FMA instruction (portable_vectors.inc)
#include "skinny_portable.inc"
#define SPECDEC_WIDEN_AVX2 1
#include "gguf_widen.inc"
#undef SPECDEC_WIDEN_AVX2
#undef SPECDEC_X86_FMA

// One block of a 32-element type (BYTES: Q8_0 34, Q4_0 18, Q4_1 20) as four 8-lane vectors (elements
// 0-7, 8-15, 16-23, 24-31): the operations of gguf_widen.inc, one rounding each.
template <int BYTES>
inline void widen_block32(const uint8_t* b, __m256 v[4]) {
  if constexpr (BYTES == 34) {
    const __m256 d = _mm256_set1_ps(half_fast(b));
    for (int p = 0; p < 4; ++p) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + p * 8));
      v[p] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    }
  } else {
    constexpr int kQs = BYTES == 20 ? 4 : 2;
    const __m256 d = _mm256_set1_ps(half_fast(b));
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kQs));
    const __m128i lo = _mm_and_si128(q, low4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), low4);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    const __m256 m = BYTES == 20 ? _mm256_set1_ps(half_fast(b + 2)) : _mm256_setzero_ps();
    for (int p = 0; p < 4; ++p) {
      __m256i n = _mm256_cvtepu8_epi32(parts[p]);
      if constexpr (BYTES == 18) n = _mm256_sub_epi32(n, _mm256_set1_epi32(8));
      const __m256 f = _mm256_cvtepi32_ps(n);
      if constexpr (BYTES == 20) {
        v[p] = _mm256_add_ps(_mm256_mul_ps(d, f), m);
      } else {
        v[p] = _mm256_mul_ps(d, f);
      }
    }
  }
}

// G weight rows from row o of GGUF blocks of a 32-element type against float x [RM <= 3, K], each row
// streamed start to end and widened in registers on the way (G rows side by side: G independent chains of
// fused multiply-adds, which one row's chain alone would leave waiting on each other's latency): the
// contract with LANES lanes (8: the AVX2 path's own; 16: the others', as 'avx2-lanes16' computes it), the
// accumulator of lane l taking k = l, l + LANES, ... in increasing order, then lane_sum in the contract's
// order (skinny_linear.h).
template <int BYTES, int LANES, int RM, int G>
inline void rows_blocks_group(const float* x, const uint8_t* w, float* y, int64_t K, int64_t N, int64_t B,
                              int64_t o) {
  constexpr int kHalves = LANES / 8;  // 8-lane registers per accumulator
  __m256 acc[G][RM][kHalves];
  for (int r = 0; r < G; ++r)
    for (int c = 0; c < RM; ++c)
      for (int h = 0; h < kHalves; ++h) acc[r][c][h] = _mm256_setzero_ps();
  const int64_t row_bytes = B * BYTES;
  for (int64_t blk = 0; blk < B; ++blk) {
    for (int r = 0; r < G; ++r) {
      __m256 v[4];
      widen_block32<BYTES>(w + (o + r) * row_bytes + blk * BYTES, v);
      for (int c = 0; c < RM; ++c)
        for (int p = 0; p < 4; ++p)
          acc[r][c][p % kHalves] =
              _mm256_fmadd_ps(v[p], _mm256_loadu_ps(x + c * K + blk * 32 + p * 8), acc[r][c][p % kHalves]);
    }
  }
  for (int r = 0; r < G; ++r)
    for (int c = 0; c < RM; ++c) {
      alignas(32) float a[LANES];
      for (int h = 0; h < kHalves; ++h) _mm256_store_ps(a + h * 8, acc[r][c][h]);
      float chunk[LANES / 4];
      for (int q = 0; q < LANES / 4; ++q) chunk[q] = (a[4 * q] + a[4 * q + 2]) + (a[4 * q + 1] + a[4 * q + 3]);
      y[c * N + o + r] = LANES == 8 ? chunk[0] + chunk[1] : (chunk[0] + chunk[1]) + (chunk[2] + chunk[3]);
    }
}

template <int BYTES, int LANES, int RM>
inline void rows_blocks_streamed(const float* x, const uint8_t* w, float* y, int64_t K, int64_t N, int64_t B,
                                 int64_t o_begin, int64_t o_end) {
  constexpr int kGroup = (LANES == 16 && RM == 3) ? 2 : 4;  // accumulators within AVX2's 16 registers
  int64_t o = o_begin;
  for (; o + kGroup <= o_end; o += kGroup) rows_blocks_group<BYTES, LANES, RM, kGroup>(x, w, y, K, N, B, o);
  for (; o < o_end; ++o) rows_blocks_group<BYTES, LANES, RM, 1>(x, w, y, K, N, B, o);
}

// 1-3 x rows of a 32-element type's blocks, all of [o_begin, o_end) (returns o_end), or nothing (returns
// o_begin) for other rows or types.
template <int LANES>
int64_t rows_blocks_streamed(const float* x, const uint8_t* w, float* y, int64_t M, int64_t K, int64_t N, int64_t B,
                             int64_t block_bytes, int64_t o_begin, int64_t o_end) {
  auto by_rows = [&](auto bytes) {
    constexpr int BYTES = decltype(bytes)::value;
    if (M == 1) rows_blocks_streamed<BYTES, LANES, 1>(x, w, y, K, N, B, o_begin, o_end);
    if (M == 2) rows_blocks_streamed<BYTES, LANES, 2>(x, w, y, K, N, B, o_begin, o_end);
    if (M == 3) rows_blocks_streamed<BYTES, LANES, 3>(x, w, y, K, N, B, o_begin, o_end);
    return o_end;
  };
  if (M < 1 || M > 3) return o_begin;
  if (block_bytes == 20) return by_rows(std::integral_constant<int, 20>{});
  if (block_bytes == 18) return by_rows(std::integral_constant<int, 18>{});
  if (block_bytes == 34) return by_rows(std::integral_constant<int, 34>{});
  return o_begin;
}
}  // namespace avx2
#pragma GCC pop_options

// The AVX2 path's own kernels, with the 8-lane contract (skinny_linear_avx2.cpp); `stream_few`: 1-2 x rows
// stream one weight row at a time (Isa::kAvx2), else they take register blocks (Isa::kAvx2Blocks).
namespace avx2_lanes8 {
void rows_f32(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N, int64_t o_begin,
              int64_t o_end, bool stream_few);
void rows_bf16(const float* x, const uint16_t* w, float* y, int64_t M, int64_t K, int64_t N, int64_t o_begin,
               int64_t o_end, bool stream_few);
}  // namespace avx2_lanes8

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
namespace avx512 {

#include "lane_sums_avx512.inc"
#define SPECDEC_WIDEN_AVX512 1
#include "gguf_widen.inc"
#undef SPECDEC_WIDEN_AVX512

// Sixteen weight values at w[k], widened to float (all lanes, or the first `lanes` with zeros after).
inline __m512 load_w(const float* w) { return _mm512_loadu_ps(w); }
inline __m512 load_w(const uint16_t* w) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
inline __m512 load_w_tail(const float* w, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, w); }
inline __m512 load_w_tail(const uint16_t* w, __mmask16 mask) {
  const __m256i bits = _mm256_maskz_loadu_epi16(mask, w);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// Lines of W to prefetch while a block computes: lines from byte `near` of the weight into L1 and
// from byte `far` into L2, up to `per_step` of each per k step, so the requests spread over the
// block's arithmetic (issued in one burst, far ahead, they stalled the core: measured slower than no
// prefetch at all). Offsets, not pointers: an address is formed only for a line inside the weight
// (`near_end`, `far_end`: where each share stops, at most the weight's size), never past its end.
struct Prefetch {
  const char* base;
  int64_t near, far, near_end, far_end, per_step;
};

// RO weight rows (from row o) against RM rows of x (from row m); accumulator slot c * RO + r.
// Slots of absent x rows (rm < RM) stay zero and are not stored.
template <int RO, int RM, typename weight_t>
inline void block(const float* x, const weight_t* w, float* y, int64_t K, int64_t N, int64_t o, int64_t m,
                  int rm, Prefetch ahead) {
  static_assert(RO * RM == 16, "a block fills the 16 accumulators lane_sums16 reduces");
  __m512 acc[16];
  for (int s = 0; s < 16; ++s) acc[s] = _mm512_setzero_ps();
  const weight_t* w_rows = w + o * K;
  const float* x_rows = x + m * K;
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    for (int64_t j = 0; j < ahead.per_step && ahead.near < ahead.near_end; ++j, ahead.near += 64)
      _mm_prefetch(ahead.base + ahead.near, _MM_HINT_T0);
    for (int64_t j = 0; j < ahead.per_step && ahead.far < ahead.far_end; ++j, ahead.far += 64)
      _mm_prefetch(ahead.base + ahead.far, _MM_HINT_T2);
    __m512 wv[RO];
    for (int r = 0; r < RO; ++r) wv[r] = load_w(w_rows + r * K + k);
    for (int c = 0; c < RM; ++c) {
      if (c >= rm) break;
      const __m512 xv = _mm512_loadu_ps(x_rows + c * K + k);
      for (int r = 0; r < RO; ++r) acc[c * RO + r] = _mm512_fmadd_ps(wv[r], xv, acc[c * RO + r]);
    }
  }
  if (k < K) {  // lanes past K load zeros: fma(0, 0, acc) leaves acc as the contract says
    const __mmask16 mask = static_cast<__mmask16>((1u << (K - k)) - 1u);
    __m512 wv[RO];
    for (int r = 0; r < RO; ++r) wv[r] = load_w_tail(w_rows + r * K + k, mask);
    for (int c = 0; c < RM; ++c) {
      if (c >= rm) break;
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x_rows + c * K + k);
      for (int r = 0; r < RO; ++r) acc[c * RO + r] = _mm512_fmadd_ps(wv[r], xv, acc[c * RO + r]);
    }
  }
  alignas(64) float sums[16];
  _mm512_store_ps(sums, lane_sums16(acc));
  for (int c = 0; c < rm; ++c) std::memcpy(y + (m + c) * N + o, sums + c * RO, RO * sizeof(float));
}

// One group of G weight rows, each streamed start to end, against RM rows of x (from row m): the
// accumulators go to `park` ([x row][16 weight rows of the block][16 lanes]) at the group's rows.
template <int G, int RM, typename weight_t>
inline void group_pass(const float* x, const weight_t* w_group, float* park, int64_t K, int64_t m) {
  __m512 acc[G][RM];
  for (int r = 0; r < G; ++r)
    for (int c = 0; c < RM; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[G];
    for (int r = 0; r < G; ++r) wv[r] = load_w(w_group + r * K + k);
    for (int c = 0; c < RM; ++c) {
      const __m512 xv = _mm512_loadu_ps(x + (m + c) * K + k);
      for (int r = 0; r < G; ++r) acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
    }
  }
  if (k < K) {  // lanes past K load zeros: fma(0, 0, acc) leaves acc as the contract says
    const __mmask16 mask = static_cast<__mmask16>((1u << (K - k)) - 1u);
    __m512 wv[G];
    for (int r = 0; r < G; ++r) wv[r] = load_w_tail(w_group + r * K + k, mask);
    for (int c = 0; c < RM; ++c) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + (m + c) * K + k);
      for (int r = 0; r < G; ++r) acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
    }
  }
  for (int c = 0; c < RM; ++c)
    for (int r = 0; r < G; ++r) _mm512_storeu_ps(park + ((m + c) * 16 + r) * 16, acc[r][c]);
}

// The scales of blocks [blk, blk + count) of G rows (`row_bytes` apart from `w_group`) as floats, block i's
// at out + i * kScales: Q4_1's d and m of row r at [2r], [2r + 1], the other types' d at [r]. Eight halves
// at a time in one F16C conversion, or each its own (half_to_float) where one of the eight is inf or NaN,
// which only that widens as numpy does: the same values. Converted ahead of their use, not block by
// block: a vector stored and at once read back lane by lane waits on the store (measured: the streamed
// Q4_1 kernel's 8-row groups took ~11 cycles a row and block so, ~5 this way).
template <int BYTES, int G>
inline void group_scales(const uint8_t* w_group, int64_t row_bytes, int64_t blk, int64_t count, float* out) {
  constexpr int kPer = BYTES == 20 ? 2 : 1;             // halves a row and block
  constexpr int kHalves = kPer * G;                      // a block's
  constexpr int kPadded = kHalves < 8 ? 8 : kHalves;     // whole chunks of 8
  if constexpr (kHalves < 8) {  // Q8_0's 4 rows: each its own (a vector measured slower)
    for (int64_t i = 0; i < count; ++i)
      for (int r = 0; r < G; ++r) out[i * kPadded + r] = half_fast(w_group + r * row_bytes + (blk + i) * BYTES);
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    alignas(16) uint16_t h[kPadded] = {};
    const uint8_t* b = w_group + (blk + i) * BYTES;
    for (int r = 0; r < G; ++r) std::memcpy(&h[kPer * r], b + r * row_bytes, kPer * sizeof(uint16_t));
    float* o = out + i * kPadded;
    for (int c = 0; c < kPadded; c += 8) {
      const __m128i halves = _mm_load_si128(reinterpret_cast<const __m128i*>(h + c));
      const __m128i exponent = _mm_set1_epi16(0x7C00);
      if (_mm_cmpeq_epi16_mask(_mm_and_si128(halves, exponent), exponent) == 0) {
        _mm256_storeu_ps(o + c, _mm256_cvtph_ps(halves));
      } else {
        for (int k = 0; k < 8; ++k) o[c + k] = half_to_float(h[c + k]);
      }
    }
  }
}

// Lines of a weight to prefetch (into L1) as a group streams: from byte `next` (a line's start) up to `end`
// (the weight's size: no address past it is formed), `step` bytes a block (the group's bytes a block), so
// the requests keep a fixed distance ahead of the reads, spread over the blocks' arithmetic.
struct Ahead {
  const char* base;
  int64_t next, end, step;
};

// One group of G rows of GGUF blocks of a 32-element type (BYTES per block), each streamed start to end and
// widened block by block in registers (widen_block32_scaled: the two 16-lane k steps of a block, which the
// accumulators take in increasing k as group_pass takes a float row's), against RM rows of x (from row
// m): the accumulators parked as group_pass parks them. Each weight byte is read from memory once and never stored widened: a plain step reads the file's bytes, not float32's
// (Q4_1: 0.625 bytes a weight).
template <int BYTES, int G, int RM>
inline void group_pass_blocks(const float* x, const uint8_t* w_group, float* park, int64_t K, int64_t B, int64_t m,
                              Ahead ahead) {
  constexpr int kStride = BYTES == 20 ? 2 : 1;
  __m512 acc[G][RM];
#pragma GCC unroll 16
  for (int r = 0; r < G; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < RM; ++c) acc[r][c] = _mm512_setzero_ps();
  const int64_t row_bytes = B * BYTES;
  constexpr int kScales = (BYTES == 20 ? 2 : 1) * G < 8 ? 8 : (BYTES == 20 ? 2 : 1) * G;  // group_scales' stride
  constexpr int64_t kChunk = 16;  // blocks whose scales are converted together
  alignas(64) float scales[kChunk * kScales];
  int64_t target = ahead.next;
  for (int64_t chunk = 0; chunk < B; chunk += kChunk) {
    const int64_t count = std::min(kChunk, B - chunk);
    group_scales<BYTES, G>(w_group, row_bytes, chunk, count, scales);
    for (int64_t blk = chunk; blk < chunk + count; ++blk) {
      target += ahead.step;
      for (; ahead.next < target && ahead.next < ahead.end; ahead.next += 64)
        _mm_prefetch(ahead.base + ahead.next, _MM_HINT_T0);
      __m512 x0[RM], x1[RM];
#pragma GCC unroll 4
      for (int c = 0; c < RM; ++c) {
        x0[c] = _mm512_loadu_ps(x + (m + c) * K + blk * 32);
        x1[c] = _mm512_loadu_ps(x + (m + c) * K + blk * 32 + 16);
      }
      const float* sc = scales + (blk - chunk) * kScales;
#pragma GCC unroll 16
      for (int r = 0; r < G; ++r) {
        __m512 first, second;
        widen_block32_scaled<BYTES>(w_group + r * row_bytes + blk * BYTES, _mm512_set1_ps(sc[kStride * r]),
                                    BYTES == 20 ? _mm512_set1_ps(sc[kStride * r + 1]) : _mm512_setzero_ps(), first,
                                    second);
#pragma GCC unroll 4
        for (int c = 0; c < RM; ++c) {
          acc[r][c] = _mm512_fmadd_ps(first, x0[c], acc[r][c]);
          acc[r][c] = _mm512_fmadd_ps(second, x1[c], acc[r][c]);
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int c = 0; c < RM; ++c)
#pragma GCC unroll 16
    for (int r = 0; r < G; ++r) _mm512_storeu_ps(park + ((m + c) * 16 + r) * 16, acc[r][c]);
}

// group_pass_blocks for Q4_K (256-element blocks of 8 sub-blocks): each row's scales unpacked once a block,
// then each pair of sub-blocks as four 16-lane vectors in increasing k (widen_q4_k_pair).
template <int G, int RM>
inline void group_pass_q4_k(const float* x, const uint8_t* w_group, float* park, int64_t K, int64_t B, int64_t m,
                            Ahead ahead) {
  __m512 acc[G][RM];
  for (int r = 0; r < G; ++r)
    for (int c = 0; c < RM; ++c) acc[r][c] = _mm512_setzero_ps();
  const int64_t row_bytes = B * 144;
  float scale[G][8], min[G][8];
  int64_t target = ahead.next;
  for (int64_t blk = 0; blk < B; ++blk) {
    for (int r = 0; r < G; ++r) q4_k_scales(w_group + r * row_bytes + blk * 144, scale[r], min[r]);
    for (int pair = 0; pair < 4; ++pair) {
      target += ahead.step;
      for (; ahead.next < target && ahead.next < ahead.end; ahead.next += 64)
        _mm_prefetch(ahead.base + ahead.next, _MM_HINT_T0);
      const int64_t k = blk * 256 + pair * 64;
      __m512 xv[RM][4];
      for (int c = 0; c < RM; ++c)
        for (int q = 0; q < 4; ++q) xv[c][q] = _mm512_loadu_ps(x + (m + c) * K + k + q * 16);
      for (int r = 0; r < G; ++r) {
        __m512 v[4];
        widen_q4_k_pair(w_group + r * row_bytes + blk * 144, pair, scale[r][2 * pair], min[r][2 * pair],
                        scale[r][2 * pair + 1], min[r][2 * pair + 1], v);
        for (int c = 0; c < RM; ++c)
          for (int q = 0; q < 4; ++q) acc[r][c] = _mm512_fmadd_ps(v[q], xv[c][q], acc[r][c]);
      }
    }
  }
  for (int c = 0; c < RM; ++c)
    for (int r = 0; r < G; ++r) _mm512_storeu_ps(park + ((m + c) * 16 + r) * 16, acc[r][c]);
}

// Rows [o_begin, o_end) of float x [RM, K] by GGUF blocks of a 32-element type or Q4_K, 16 weight rows at a
// time (groups of G streams, as rows() streams float rows): y's rows [o_begin, o) where o is returned
// (the rows past the last whole 16 are the caller's).
//
// The 8 (or 4) rows of a group are 8 short streams a hardware prefetcher does not follow: without the
// prefetches below (Q4_K's too) the Q4_1 and Q8_0 kernels waited on memory about half their time (one thread, the
// default model's weights, 1 x row: 19.2 -> 10.5 ms with them). Each group prefetches the weight's lines
// kAhead bytes ahead of its own start, `step` a block: every line once, a group or so before it is read,
// past the end of the task into the next rows, never past the weight's end. Prefetches change no result.
template <int BYTES, int RM, int G>
inline int64_t rows_blocks_g(const float* x, const uint8_t* w, float* y, int64_t K, int64_t N, int64_t B,
                             int64_t o_begin, int64_t o_end) {
  constexpr int64_t kAhead = 4096;  // measured: 2,048 slower, 8,192 and 16,384 no faster
  alignas(64) float park[RM * 16 * 16];
  const int64_t weight_bytes = N * B * BYTES;
  int64_t o = o_begin;
  for (; o + 16 <= o_end; o += 16) {
    for (int g = 0; g < 16; g += G) {
      const uint8_t* w_group = w + (o + g) * B * BYTES;
      float* group_park = park + g * 16;
      const int64_t start = ((o + g) * B * BYTES + kAhead + 63) / 64 * 64;
      const char* base = reinterpret_cast<const char*>(w);
      if constexpr (BYTES == 144) {  // a quarter of a block at a time
        group_pass_q4_k<G, RM>(x, w_group, group_park, K, B, 0, Ahead{base, start, weight_bytes, G * BYTES / 4});
      } else {
        group_pass_blocks<BYTES, G, RM>(x, w_group, group_park, K, B, 0, Ahead{base, start, weight_bytes, G * BYTES});
      }
    }
    for (int64_t c = 0; c < RM; ++c) {
      __m512 acc[16];
      for (int r = 0; r < 16; ++r) acc[r] = _mm512_load_ps(park + (c * 16 + r) * 16);
      _mm512_storeu_ps(y + c * N + o, lane_sums16(acc));
    }
  }
  return o;
}

// 1-4 x rows of a 32-element type, 1-3 of Q4_K: groups of 8 weight rows for 1-3 x rows (8 x 3 accumulators:
// some spill, measured faster than 4 rows), of 4 for 4 x rows.
template <int BYTES>
inline int64_t rows_blocks_streamed(const float* x, const uint8_t* w, float* y, int64_t M, int64_t K, int64_t N,
                                    int64_t B, int64_t o_begin, int64_t o_end) {
  if (M == 1) return rows_blocks_g<BYTES, 1, 8>(x, w, y, K, N, B, o_begin, o_end);
  if (M == 2) return rows_blocks_g<BYTES, 2, 8>(x, w, y, K, N, B, o_begin, o_end);
  if (M == 3) return rows_blocks_g<BYTES, 3, 8>(x, w, y, K, N, B, o_begin, o_end);
  if constexpr (BYTES != 144) {
    if (M == 4) return rows_blocks_g<BYTES, 4, 4>(x, w, y, K, N, B, o_begin, o_end);
  }
  return o_begin;
}

int64_t rows_blocks_streamed(const float* x, const uint8_t* w, float* y, int64_t M, int64_t K, int64_t N, int64_t B,
                             int64_t block_bytes, int64_t o_begin, int64_t o_end) {
  if (M < 1 || M > 4) return o_begin;
  if (block_bytes == 20) return rows_blocks_streamed<20>(x, w, y, M, K, N, B, o_begin, o_end);
  if (block_bytes == 18) return rows_blocks_streamed<18>(x, w, y, M, K, N, B, o_begin, o_end);
  if (block_bytes == 34) return rows_blocks_streamed<34>(x, w, y, M, K, N, B, o_begin, o_end);
  if (block_bytes == 144) return rows_blocks_streamed<144>(x, w, y, M, K, N, B, o_begin, o_end);
  return o_begin;
}

// Rows [o_begin, o_end) of w against all M rows of x (float; bfloat16 x is widened by the caller).
//
// Few x rows (M <= 3: plain steps and small trees) are bound by reading W. With `stream_few`
// (Isa::kAvx512) they take blocks of 16 weight rows, 8 rows at a time, each row read start to end
// (8 streams; 16 interleaved rows measured ~30% slower on an AMD Zen 5), their accumulators parked
// and the block's 16 outputs per x row reduced together. Without it (Isa::kAvx512Blocks) they take
// the register blocks below, as more rows do: on an Intel Xeon with AMX (2026-11-25, all 211 weights
// of the default model, fp32, 2 threads) 2 rows 22.4 -> 19.3 ms, 3 rows 26.5 -> 19.6, 1 row equal
// (19.5); the streams were written for the Zen 5 and not timed there against these blocks. The
// calibration times both paths on the machine at hand.
// More x rows are bound by arithmetic as much as by memory: 4 weight rows x groups of 4 x rows (the
// weight rows stay in L1 across the groups, 16 FMAs per 8 loads), the next block's rows prefetched
// while this one computes. Rows past the last whole block take the portable kernel,
// which computes the same bits.
template <typename weight_t>
inline void rows(const float* x, const weight_t* w, float* y, int64_t M, int64_t K, int64_t N, int64_t o_begin,
                 int64_t o_end, bool stream_few) {
  int64_t o = o_begin;
  if (M <= 3 && stream_few) {
    alignas(64) float park[3 * 16 * 16];
    for (; o + 16 <= o_end; o += 16) {
      for (int g = 0; g < 16; g += 8) {
        const weight_t* w_group = w + (o + g) * K;
        float* group_park = park + g * 16;
        if (M == 1) {
          group_pass<8, 1>(x, w_group, group_park, K, 0);
        } else if (M == 2) {
          group_pass<8, 2>(x, w_group, group_park, K, 0);
        } else {
          group_pass<8, 3>(x, w_group, group_park, K, 0);
        }
      }
      for (int64_t m = 0; m < M; ++m) {
        __m512 acc[16];
        for (int r = 0; r < 16; ++r) acc[r] = _mm512_load_ps(park + (m * 16 + r) * 16);
        _mm512_storeu_ps(y + m * N + o, lane_sums16(acc));
      }
    }
  } else {
    // Each block of 4 weight rows is read from memory once, in the first of its passes over the x
    // rows, and the arithmetic of all its passes is what can hide the next blocks' memory latency:
    // the lines of the next block (into L1) and of the block three ahead (into L2) are prefetched a
    // share per pass, spread over the pass's k steps, past the end of the task (a thread's share of
    // the weight, linears()) into the next rows, not past the weight's last row. Measured (default
    // model, all 211 weights, fp32, 2 threads): 16 rows 23.1 -> 18.0 ms, 8 rows 16.8 -> 12.9 (against
    // prefetching only the next block, in the first pass, within the task). Prefetches never fault and
    // change no result.
    constexpr int64_t kNear = 1, kFar = 3;  // blocks ahead
    const int64_t lines = (4 * K * static_cast<int64_t>(sizeof(weight_t)) + 63) / 64;
    const int64_t passes = (M + 3) / 4, steps = (K + 15) / 16;
    const int64_t per_pass = (lines + passes - 1) / passes, per_step = (per_pass + steps - 1) / steps;
    const int64_t weight_bytes = N * K * static_cast<int64_t>(sizeof(weight_t));
    const char* base = reinterpret_cast<const char*>(w);
    auto share_end = [&](int64_t from) { return std::min(weight_bytes, from + per_pass * 64); };
    for (; o + 4 <= o_end; o += 4) {
      const int64_t near = (o + 4 * kNear) * K * static_cast<int64_t>(sizeof(weight_t));
      const int64_t far = (o + 4 * kFar) * K * static_cast<int64_t>(sizeof(weight_t));
      for (int64_t m = 0, pass = 0; m < M; m += 4, ++pass) {
        const int64_t offset = pass * per_pass * 64;
        block<4, 4>(x, w, y, K, N, o, m, static_cast<int>(std::min<int64_t>(4, M - m)),
                    Prefetch{base, near + offset, far + offset, share_end(near + offset), share_end(far + offset),
                             per_step});
      }
    }
  }
  if (o < o_end) {
    if constexpr (std::is_same_v<weight_t, float>) {
      avx2::rows_f32(x, w, y, M, K, N, o, o_end);
    } else {
      avx2::rows_bf16(x, w, y, M, K, N, o, o_end);
    }
  }
}

void rows_f32(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N, int64_t o_begin,
              int64_t o_end, bool stream_few) {
  rows<float>(x, w, y, M, K, N, o_begin, o_end, stream_few);
}

void rows_bf16(const float* x, const uint16_t* w, float* y, int64_t M, int64_t K, int64_t N, int64_t o_begin,
               int64_t o_end, bool stream_few) {
  rows<uint16_t>(x, w, y, M, K, N, o_begin, o_end, stream_few);
}

}  // namespace avx512
#pragma GCC pop_options
#endif  // SPECDEC_X86

namespace {

// Whether `weight` is GGUF blocks (uint8 [N, B, block_bytes]: skinny_linear.h) rather than a dense [N, K].
bool is_blocks(const at::Tensor& weight) { return weight.scalar_type() == at::kByte; }

// One weight's checks (shape, dtype, layout, bias), naming `op`.
void check_weight(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  const char* op) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), op, ": CPU tensors only, got ", x.device(), " and ",
              weight.device());
  if (is_blocks(weight)) {
    TORCH_CHECK(weight.dim() == 3, op, ": GGUF blocks must be uint8 [out, blocks, block bytes], got shape ",
                weight.sizes());
    const int64_t elements = gguf_block_elements(weight.size(2));
    TORCH_CHECK(elements > 0, op, ": GGUF blocks of ", weight.size(2),
                " bytes are no supported type (Q8_0 34, Q4_0 18, Q4_1 20, Q4_K 144, Q6_K 210)");
    TORCH_CHECK(x.size(-1) == weight.size(1) * elements, op, ": x's last dimension is ", x.size(-1),
                ", the GGUF weight's in-features are ", weight.size(1) * elements, " (", weight.size(1), " blocks of ",
                elements, ")");
    TORCH_CHECK(x.scalar_type() == at::kFloat, op, ": GGUF blocks take float32 x, got ", x.scalar_type());
    TORCH_CHECK(weight.is_contiguous(), op, ": the GGUF blocks must be contiguous");
    if (bias.has_value()) {
      TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0) && bias->scalar_type() == at::kFloat, op,
                  ": bias must be [", weight.size(0), "] of float32, got ", bias->sizes(), " of ", bias->scalar_type());
    }
    return;
  }
  TORCH_CHECK(weight.dim() == 2, op, ": weight must be [out, in], got shape ", weight.sizes());
  const int64_t K = weight.size(1);
  const int64_t N = weight.size(0);
  TORCH_CHECK(x.size(-1) == K, op, ": x's last dimension is ", x.size(-1), ", the weight's in-features are ", K);
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), op, ": x is ", x.scalar_type(), ", the weight is ",
              weight.scalar_type());
  const auto dtype = weight.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kDouble, op,
              ": float32, bfloat16 or float64 only, got ", dtype);
  TORCH_CHECK(weight.is_contiguous(), op, ": the weight must be contiguous");
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == dtype, op, ": bias must be [", N,
                "] of ", dtype, ", got ", bias->sizes(), " of ", bias->scalar_type());
  }
}

// Rows [o_begin, o_end) of float32 x [M, K] by GGUF blocks w [N, B, block_bytes] into y [M, N] (float):
// `group` weight rows at a time widened into `dense` [group, K] (skinny_linear.h: GGUF blocks), then the
// path's float kernel over all M rows into `sums` [M, group], copied into y's columns. Widening once per
// weight row for all M x rows keeps a tree's verification one widening per weight, whatever its size.
// `group`: the rows the path's float kernel takes together (16 for AVX-512's streams of 1-3 x rows, else
// its register block: 4, or the portable kernel's 8), so the widened rows stay in L1 (4 rows of
// 1,536 floats: 24 KiB) while all passes over the x rows read them.
template <typename Widen, typename Float>
void rows_blocks(const float* x, const uint8_t* w, float* y, int64_t M, int64_t K, int64_t N, int64_t blocks,
                 int64_t block_bytes, int64_t o_begin, int64_t o_end, Widen widen, Float float_rows, int64_t group) {
  const int64_t kGroup = group;
  std::vector<float> dense(static_cast<size_t>(kGroup * K)), sums(static_cast<size_t>(M * kGroup));
  const int64_t row_bytes = blocks * block_bytes;
  for (int64_t o = o_begin; o < o_end; o += kGroup) {
    const int64_t rows = std::min(kGroup, o_end - o);
    for (int64_t r = 0; r < rows; ++r) widen(w + (o + r) * row_bytes, blocks, block_bytes, dense.data() + r * K);
    float_rows(x, dense.data(), sums.data(), M, K, rows, 0, rows);
    for (int64_t m = 0; m < M; ++m) std::memcpy(y + m * N + o, sums.data() + m * rows, rows * sizeof(float));
  }
}

// y_i = x @ W_i^T (+ b_i) for every weight of the group, all in one parallel pass: each thread takes
// its share of every weight, so the threads meet once per group (not once per weight). Each output is
// computed as skinny_linear alone computes it (the same kernel over the same rows): the group changes
// only who computes what when.
std::vector<at::Tensor> linears(const at::Tensor& x, at::TensorList weights,
                                const std::vector<std::optional<at::Tensor>>& biases, Isa isa) {
  const int64_t K = x.size(-1);
  const auto dtype = x.scalar_type();  // every weight's, or float32 x beside GGUF blocks (check_weight)
  const at::Tensor rows = x.reshape({-1, K}).contiguous();  // [M, K]
  const int64_t M = rows.size(0);
  // float sums [M, N]; bfloat16 inputs are widened to float first (x is small) and the sums
  // rounded to bfloat16 at the end (round to nearest even, as torch rounds).
  const at::Tensor x_in = dtype == at::kBFloat16 ? rows.to(at::kFloat) : rows;
  struct Task {
    size_t weight;
    int64_t begin, end;
  };
  std::vector<at::Tensor> sums;
  for (const at::Tensor& weight : weights) sums.push_back(at::empty({M, weight.size(0)}, x_in.options()));
  // (a GGUF weight's out-features are its size(0) too: [N, B, block_bytes])
  auto run = [&](const Task& task) {
    if (M == 0) return;  // no x rows: nothing to compute (and x's data pointer may be null)
    const int64_t N = weights[task.weight].size(0);
    const int64_t b = task.begin, e = task.end;
    if (dtype == at::kDouble) {
      const double* xp = x_in.const_data_ptr<double>();
      const double* wp = weights[task.weight].const_data_ptr<double>();
      double* yp = sums[task.weight].mutable_data_ptr<double>();
#if SPECDEC_X86
      if (isa != Isa::kPortable) return avx2::rows_f64(xp, wp, yp, M, K, N, b, e);
#endif
      return portable::rows_f64(xp, wp, yp, M, K, N, b, e);
    }
    const float* xp = x_in.const_data_ptr<float>();
    float* yp = sums[task.weight].mutable_data_ptr<float>();
    if (is_blocks(weights[task.weight])) {
      const at::Tensor& blocks = weights[task.weight];
      const uint8_t* wp = blocks.const_data_ptr<uint8_t>();
      const int64_t B = blocks.size(1), bytes = blocks.size(2);
#if SPECDEC_X86
      if (avx512_family(isa)) {
        const bool stream = isa == Isa::kAvx512;
        // 1-4 x rows of a 32-element type (the default model's), 1-3 of Q4_K: widened in registers on the way
        // (the same bits); the rest (more rows, Q6_K, a share's last rows) through a widened buffer.
        const int64_t done = stream ? avx512::rows_blocks_streamed(xp, wp, yp, M, K, N, B, bytes, b, e) : b;
        if (done == e) return;
        return rows_blocks(xp, wp, yp, M, K, N, B, bytes, done, e, avx512::widen_row,
                           [stream](const float* xr, const float* wr, float* yr, int64_t m, int64_t k, int64_t n,
                                    int64_t ob, int64_t oe) { avx512::rows_f32(xr, wr, yr, m, k, n, ob, oe, stream); },
                           stream && M <= 3 ? 16 : 4);
      }
      if (avx2_lanes8_family(isa)) {
        const bool stream = isa == Isa::kAvx2;
        // 1-3 x rows of a 32-element type: widened in registers on the way, the same bits
        const int64_t done = avx2::rows_blocks_streamed<8>(xp, wp, yp, M, K, N, B, bytes, b, e);
        if (done == e) return;
        return rows_blocks(xp, wp, yp, M, K, N, B, bytes, done, e, avx2::widen_row,
                           [stream](const float* xr, const float* wr, float* yr, int64_t m, int64_t k, int64_t n,
                                    int64_t ob, int64_t oe) { avx2_lanes8::rows_f32(xr, wr, yr, m, k, n, ob, oe, stream); },
                           4);
      }
      if (isa == Isa::kAvx2Lanes16) {
        const int64_t done = avx2::rows_blocks_streamed<16>(xp, wp, yp, M, K, N, B, bytes, b, e);
        if (done == e) return;
        return rows_blocks(xp, wp, yp, M, K, N, B, bytes, done, e, avx2::widen_row, avx2::rows_f32, 8);
      }
#endif
      return rows_blocks(xp, wp, yp, M, K, N, B, bytes, b, e, portable::widen_row, portable::rows_f32, 8);
    }
    if (dtype == at::kFloat) {
      const float* wp = weights[task.weight].const_data_ptr<float>();
#if SPECDEC_X86
      if (avx512_family(isa)) return avx512::rows_f32(xp, wp, yp, M, K, N, b, e, isa == Isa::kAvx512);
      if (avx2_lanes8_family(isa)) return avx2_lanes8::rows_f32(xp, wp, yp, M, K, N, b, e, isa == Isa::kAvx2);
      if (isa == Isa::kAvx2Lanes16) return avx2::rows_f32(xp, wp, yp, M, K, N, b, e);
#endif
      return portable::rows_f32(xp, wp, yp, M, K, N, b, e);
    }
    const auto* wp = reinterpret_cast<const uint16_t*>(weights[task.weight].const_data_ptr<at::BFloat16>());
#if SPECDEC_X86
    if (avx512_family(isa)) return avx512::rows_bf16(xp, wp, yp, M, K, N, b, e, isa == Isa::kAvx512);
    if (avx2_lanes8_family(isa)) return avx2_lanes8::rows_bf16(xp, wp, yp, M, K, N, b, e, isa == Isa::kAvx2);
    if (isa == Isa::kAvx2Lanes16) return avx2::rows_bf16(xp, wp, yp, M, K, N, b, e);
#endif
    portable::rows_bf16(xp, wp, yp, M, K, N, b, e);
  };
  // Each of torch's threads takes one share of every weight of the group: near-equal counts of whole
  // 16-row units (so the AVX-512 blocks tile each share), its rows consecutive (the prefetches run ahead
  // within them). Tasks of a fixed grain dealt out in order left one thread with a task more: a
  // 576-row weight in 64-row tasks went 5 to 4. Measured (default model, verification after 1,024
  // tokens, 2 threads, AMD Zen 4): in one process alternating, 1 node 17.5 -> 16.6 ms on the AVX2 path,
  // 23.0 -> 22.3 on AVX-512, 2 to 16 nodes within 1%; in separate processes in turn, within the noise.
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (size_t i = 0; i < weights.size(); ++i) {
        const int64_t N = weights[i].size(0), units = (N + 15) / 16;
        const int64_t b = std::min(N, units * t / threads * 16), e = std::min(N, units * (t + 1) / threads * 16);
        if (b < e) run({i, b, e});
      }
  });
  std::vector<at::Tensor> outputs;
  for (size_t i = 0; i < weights.size(); ++i) {
    at::Tensor y = dtype == at::kBFloat16 ? sums[i].to(dtype) : sums[i];
    if (biases[i].has_value()) y.add_(*biases[i]);
    std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
    out_shape.back() = weights[i].size(0);
    outputs.push_back(y.view(out_shape));
  }
  return outputs;
}

}  // namespace

at::Tensor skinny_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                             c10::string_view isa_name) {
  const char* op = "specdec_cpu::skinny_linear";
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least one dimension");
  check_weight(x, weight, bias, op);
  const Isa isa = parse_isa(std::string(isa_name), "skinny_linear");
  return linears(x, {weight}, {bias}, isa)[0];
}

std::vector<at::Tensor> skinny_linears_cpu(const at::Tensor& x, at::TensorList weights,
                                           const c10::List<std::optional<at::Tensor>>& biases,
                                           c10::string_view isa_name) {
  const char* op = "specdec_cpu::skinny_linears";
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least one dimension");
  TORCH_CHECK(!weights.empty(), op, ": at least one weight");
  TORCH_CHECK(biases.size() == weights.size(), op, ": ", weights.size(), " weights and ", biases.size(), " biases");
  std::vector<std::optional<at::Tensor>> bias_list;
  for (size_t i = 0; i < weights.size(); ++i) {
    bias_list.push_back(biases.get(i));
    check_weight(x, weights[i], bias_list.back(), op);
  }
  const Isa isa = parse_isa(std::string(isa_name), "skinny_linears");
  return linears(x, weights, bias_list, isa);
}

int64_t linear_in_features(const at::Tensor& weight) {
  if (weight.scalar_type() == at::kByte && weight.dim() == 3) return weight.size(1) * gguf_block_elements(weight.size(2));
  return weight.size(-1);
}

at::Tensor gguf_widen_cpu(const at::Tensor& blocks, c10::string_view isa_name) {
  const char* op = "specdec_cpu::gguf_widen";
  TORCH_CHECK(blocks.device().is_cpu(), op, ": CPU tensors only, got ", blocks.device());
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 3, op,
              ": GGUF blocks must be uint8 [out, blocks, block bytes], got ", blocks.scalar_type(), " of shape ",
              blocks.sizes());
  const int64_t elements = gguf_block_elements(blocks.size(2));
  TORCH_CHECK(elements > 0, op, ": GGUF blocks of ", blocks.size(2),
              " bytes are no supported type (Q8_0 34, Q4_0 18, Q4_1 20, Q4_K 144, Q6_K 210)");
  TORCH_CHECK(blocks.is_contiguous(), op, ": the GGUF blocks must be contiguous");
  const Isa isa = parse_isa(std::string(isa_name), "gguf_widen");
  const int64_t N = blocks.size(0), B = blocks.size(1), bytes = blocks.size(2), K = B * elements;
  at::Tensor dense = at::empty({N, K}, blocks.options().dtype(at::kFloat));
  if (N == 0 || K == 0) return dense;
  const uint8_t* wp = blocks.const_data_ptr<uint8_t>();
  float* out = dense.mutable_data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const uint8_t* row = wp + o * B * bytes;
#if SPECDEC_X86
      if (avx512_family(isa)) {
        avx512::widen_row(row, B, bytes, out + o * K);
        continue;
      }
      if (avx2_family(isa)) {
        avx2::widen_row(row, B, bytes, out + o * K);
        continue;
      }
#endif
      portable::widen_row(row, B, bytes, out + o * K);
    }
  });
  return dense;
}

}  // namespace specdec_cpu_kernels
