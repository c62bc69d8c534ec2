// The skinny linear's AVX2 path (Isa::kAvx2, Isa::kAvx2Blocks): hand-written AVX2+FMA kernels for float and bfloat16
// weights that keep the 8-lane contract of skinny_linear.h (L = 8), not the 16-lane one of the
// AVX-512 and portable paths. Called by skinny_linear.cpp.
//
// Why a contract of its own: a 16-lane accumulator is one AVX-512 register but two of AVX2's, and
// AVX2 has 16 registers where AVX-512 has 32. Under 16 lanes the AVX2 kernel (skinny_portable.inc)
// could hold only 12 half accumulators, so it ran each tile of k twice (lanes 0-7, then 8-15) with
// the accumulators parked in memory between tiles and halves; that bookkeeping, not the memory, bound
// it (`specdec bench linears`: 51-69 GFLOP/s per thread where the AVX-512 kernels reach 88-104 on the
// same Zen 4 cores, whose AVX-512 FMA is two 256-bit halves). With 8 lanes one register is one
// accumulator: 4 weight rows x 3 x rows take 12 registers, the 3 x vectors of a step 3 more and the
// weight vector 1, every weight row is read start to end once per pass, and nothing is parked. The
// price: this path's results differ from the other paths' in the last bits. Within the path a row's
// result never depends on the other rows (batch invariance), which is what losslessness needs: a tree
// row equals the same token verified alone through the same kernels. tests/test_cpu_kernels.py holds
// it bitwise to an exact emulation of the 8-lane contract.
//
// Structure (the AVX-512 kernel's, skinny_linear.cpp): blocks of 4 weight rows; per block, passes over
// the x rows in groups of 3 (a remainder as groups of 2), each pass over all of K. The first pass reads
// the block from memory and the others find it in L1/L2, and the lines of the next block (into L1) and
// of the block three ahead (into L2) are prefetched a share per pass, spread over the pass's k steps.
// One or two x rows take one weight row at a time instead, or blocks too (Isa::kAvx2Blocks; rows()).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu_kernels.h"
#include "skinny_linear.h"

#if SPECDEC_X86
#include <immintrin.h>

namespace specdec_cpu_kernels {
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2_lanes8 {
namespace {

// Loops over a block's registers must unroll whole, or the accumulators they index live in memory.
#define SPECDEC_UNROLL _Pragma("GCC unroll 16")

// Eight weight values at w, widened to float; and the same for the first n (< 8), zeros after.
inline __m256 load_w(const float* w) { return _mm256_loadu_ps(w); }
inline __m256 load_w(const uint16_t* w) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
inline __m256i tail_mask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline __m256 load_tail(const float* w, int64_t n) { return _mm256_maskload_ps(w, tail_mask(n)); }
inline __m256 load_tail(const uint16_t* w, int64_t n) {
  uint16_t padded[8] = {};
  std::memcpy(padded, w, static_cast<size_t>(n) * sizeof(uint16_t));
  return load_w(padded);
}

// The contract's lane_sum (L = 8) of four accumulators at once: lane i of the result is
// (a0 + a2) + (a1 + a3) of the low chunk of accumulator i plus the same of its high chunk.
inline __m128 lane_sums4(__m256 a, __m256 b, __m256 c, __m256 d) {
  // [a0+a2, b0+b2, a1+a3, b1+b3 | a4+a6, b4+b6, a5+a7, b5+b7], and the same for c, d
  const __m256 ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
  const __m256 cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
  // [(a0+a2) + (a1+a3), the same for b, c, d | chunk 1 of a, b, c, d]
  const __m256 chunks = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                      _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm_add_ps(_mm256_castps256_ps128(chunks), _mm256_extractf128_ps(chunks, 1));
}

// Lines of the weight to prefetch during a pass: from byte `near` into L1 and from byte `far` into L2,
// LINES of each per k step, each `stride` bytes on from the one before (at most a line: a stride under 64
// asks for a line again, which costs a load slot, and spreads a block's lines over all of its passes).
// The offsets are clamped to `near_last` / `far_last` (the last line of the block ahead, inside the
// weight), so an address is formed only inside the weight and no branch sits in the loop. Prefetches
// never fault and change no result.
struct Prefetch {
  const char* base = nullptr;
  int64_t near = 0, far = 0, near_last = 0, far_last = 0, stride = 64;
};

// RO weight rows (w_rows, stride K) against RM x rows (x_rows, stride K), all of K, one accumulator
// register per output; the sums go to y[c * N + r].
template <int RO, int RM, int LINES, typename weight_t>
inline void block(const float* x_rows, const weight_t* w_rows, float* y, int64_t K, int64_t N, Prefetch ahead) {
  static_assert(RM >= 1 && RM <= 3 && (RO == 1 || RO == 4),
                "at most 4 x 3 accumulators, 3 x vectors and a weight vector: AVX2's 16 registers");
  __m256 acc[RO][RM];
  SPECDEC_UNROLL for (int r = 0; r < RO; ++r)
    SPECDEC_UNROLL for (int c = 0; c < RM; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    SPECDEC_UNROLL for (int j = 0; j < LINES; ++j) {
      _mm_prefetch(ahead.base + std::min(ahead.near, ahead.near_last), _MM_HINT_T0);
      _mm_prefetch(ahead.base + std::min(ahead.far, ahead.far_last), _MM_HINT_T1);
      ahead.near += ahead.stride;
      ahead.far += ahead.stride;
    }
    // The x vectors are named values pinned to registers, and so is each weight vector: as an array, or
    // unpinned, GCC stored the x vectors to the stack at every step, or folded a vector into each of its
    // FMAs as a memory operand (one load per FMA). Measured (one thread, Zen 4, 64 x 576 weights in
    // cache): 4 rows 54 -> 79 GFLOP/s, 8 rows 78 -> 89.
    const __m256 zero = _mm256_setzero_ps();
    __m256 x0 = _mm256_loadu_ps(x_rows + k);
    __m256 x1 = RM > 1 ? _mm256_loadu_ps(x_rows + K + k) : zero;
    __m256 x2 = RM > 2 ? _mm256_loadu_ps(x_rows + 2 * K + k) : zero;
    if constexpr (RM == 3) asm("" : "+x"(x0), "+x"(x1), "+x"(x2));
    if constexpr (RM == 2) asm("" : "+x"(x0), "+x"(x1));
    SPECDEC_UNROLL for (int r = 0; r < RO; ++r) {
      __m256 wv = load_w(w_rows + r * K + k);
      if constexpr (RM > 1) asm("" : "+x"(wv));
      acc[r][0] = _mm256_fmadd_ps(wv, x0, acc[r][0]);
      if constexpr (RM > 1) acc[r][1] = _mm256_fmadd_ps(wv, x1, acc[r][1]);
      if constexpr (RM > 2) acc[r][2] = _mm256_fmadd_ps(wv, x2, acc[r][2]);
    }
  }
  if (k < K) {  // the tail: lanes past K load zeros, and fma(0, 0, acc) leaves acc as the contract says
    const int64_t n = K - k;
    __m256 xv[RM];
    for (int c = 0; c < RM; ++c) xv[c] = load_tail(x_rows + c * K + k, n);
    for (int r = 0; r < RO; ++r) {
      const __m256 wv = load_tail(w_rows + r * K + k, n);
      for (int c = 0; c < RM; ++c) acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
    }
  }
  const __m256 zero = _mm256_setzero_ps();
  SPECDEC_UNROLL for (int c = 0; c < RM; ++c) {
    alignas(16) float sums[4];
    if constexpr (RO == 4) {
      _mm_store_ps(sums, lane_sums4(acc[0][c], acc[1][c], acc[2][c], acc[3][c]));
    } else {
      _mm_store_ps(sums, lane_sums4(acc[0][c], zero, zero, zero));
    }
    std::memcpy(y + c * N, sums, RO * sizeof(float));
  }
}

// The weight rows [o, o + RO) (w_rows) against all M x rows: groups of 3 x rows, the rest as groups of 2
// (a remainder of one row after threes becomes two twos), one row alone only when M is 1. The passes
// prefetch LINES lines per k step each (Prefetch), each on from where the one before stopped, the block
// ahead spread evenly over all of them (but no more often than every half line: past that the repeated
// requests cost more load slots than the spread gained), and a pass that starts with the block ahead in
// prefetches nothing.
template <int RO, int LINES, typename weight_t>
inline void passes(const float* x, const weight_t* w_rows, float* y, int64_t M, int64_t K, int64_t N,
                   Prefetch ahead) {
  const int64_t threes = M % 3 == 1 ? (M - 4) / 3 : M / 3;
  if constexpr (LINES > 0) {
    const int64_t requests = (M == 1 ? 1 : threes + (M - 3 * threes + 1) / 2) * std::max<int64_t>(1, K / 8) * LINES;
    const int64_t block_bytes = RO * K * static_cast<int64_t>(sizeof(weight_t));
    ahead.stride = std::clamp<int64_t>((block_bytes + requests - 1) / requests, 32, 64);
  }
  const int64_t advance = LINES * ahead.stride * (K / 8);
  auto pass = [&](auto rm, int64_t m) {
    constexpr int RM = decltype(rm)::value;
    if (LINES > 0 && ahead.near <= ahead.near_last) {
      block<RO, RM, LINES>(x + m * K, w_rows, y + m * N, K, N, ahead);
    } else {
      block<RO, RM, 0>(x + m * K, w_rows, y + m * N, K, N, ahead);
    }
    ahead.near += advance;
    ahead.far += advance;
  };
  if (M == 1) return pass(std::integral_constant<int, 1>{}, 0);
  int64_t m = 0;
  for (; m < 3 * threes; m += 3) pass(std::integral_constant<int, 3>{}, m);
  for (; m < M; m += 2) pass(std::integral_constant<int, 2>{}, m);
}

// Blocks of RO weight rows, each prefetching the block after it (into L1) and the one three blocks on
// (into L2); rows past the last whole block one at a time.
template <int RO, int LINES, typename weight_t>
void rows_in_blocks(const float* x, const weight_t* w, float* y, int64_t M, int64_t K, int64_t N, int64_t o_begin,
                    int64_t o_end) {
  constexpr int64_t kNear = 1, kFar = 3;  // blocks ahead
  const int64_t row_bytes = K * static_cast<int64_t>(sizeof(weight_t));
  const int64_t weight_bytes = N * row_bytes;
  int64_t o = o_begin;
  for (; o + RO <= o_end; o += RO) {
    Prefetch ahead;
    if constexpr (LINES > 0) {
      ahead.base = reinterpret_cast<const char*>(w);
      ahead.near = (o + RO * kNear) * row_bytes;
      ahead.far = (o + RO * kFar) * row_bytes;
      // the last line of each block ahead, within the weight (a block past its end: its last line)
      ahead.near_last = std::max<int64_t>(0, std::min(weight_bytes, ahead.near + RO * row_bytes) - 64);
      ahead.far_last = std::max<int64_t>(0, std::min(weight_bytes, ahead.far + RO * row_bytes) - 64);
    }
    passes<RO, LINES>(x, w + o * K, y + o, M, K, N, ahead);
  }
  for (; o < o_end; ++o) passes<1, 0>(x, w + o * K, y + o, M, K, N, Prefetch{});
}

// One or two x rows (a plain step, a two-node tree) are bound by reading the weight, and which way reads
// it fastest depends on the CPU's memory system, so there are two (the same bits), and the calibration
// times both (Isa::kAvx2 and Isa::kAvx2Blocks, the "cpu" and "cpu-blocks" kernel variants):
// - `stream_few`: one weight row at a time, start to end, the row after it prefetched into L1 and the one
//   three on into L2 over its k steps: a single stream, which Zen 4's hardware prefetchers follow best
//   (measured there without the software prefetch, in turn, all of the default model's linear weights,
//   fp32, 2 threads, ms for 1 / 2 / 3 / 4 rows: 12.8 / 13.7 / 15.5 / 13.8 against 13.2 / 13.9 / 17.3 /
//   21.5 taking rows one at a time up to 4 rows, and 16.2 at 2 rows for blocks of 4);
// - else blocks of 4 weight rows, 2 lines of the blocks ahead per k step, as three rows take: on an Intel
//   Xeon (family 6 model 207), whose stream prefetcher stops at every 4 KiB page, the single stream
//   reached two thirds of the memory's bandwidth, and these blocks took 0.74x its time at one row and
//   0.68x at two.
// Three x rows: those blocks (one pass must bring a whole block in). More: blocks of 4 weight rows in
// passes of 3 x rows, 1 line per step.
template <typename weight_t>
void rows(const float* x, const weight_t* w, float* y, int64_t M, int64_t K, int64_t N, int64_t o_begin,
          int64_t o_end, bool stream_few) {
  if (M <= 2 && stream_few) return rows_in_blocks<1, 1>(x, w, y, M, K, N, o_begin, o_end);
  if (M <= 3) return rows_in_blocks<4, 2>(x, w, y, M, K, N, o_begin, o_end);
  rows_in_blocks<4, 1>(x, w, y, M, K, N, o_begin, o_end);
}

}  // namespace

void rows_f32(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N, int64_t o_begin,
              int64_t o_end, bool stream_few) {
  rows<float>(x, w, y, M, K, N, o_begin, o_end, stream_few);
}

void rows_bf16(const float* x, const uint16_t* w, float* y, int64_t M, int64_t K, int64_t N, int64_t o_begin,
               int64_t o_end, bool stream_few) {
  rows<uint16_t>(x, w, y, M, K, N, o_begin, o_end, stream_few);
}

}  // namespace avx2_lanes8
#pragma GCC pop_options
}  // namespace specdec_cpu_kernels
#endif  // SPECDEC_X86
