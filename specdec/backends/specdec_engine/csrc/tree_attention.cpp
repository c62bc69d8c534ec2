// specdec tree attention: the kernels of torch.ops.specdec_cpu.tree_attention (registered in
// cpu_kernels.cpp). The contract every path keeps, and why: tree_attention.h.
//
// Work split: at::parallel_for over query heads; a head's task runs its rows one after another.
// Per row: the scores of its visible slots (sixteen keys at a time on AVX-512: sixteen dot products
// in sixteen accumulators, reduced together), the softmax, and the weighted sum of the values. The
// keys and values of one KV head (S x D, ~256 KB at a 1,000-token context) stay in the core's L2
// across the rows and query heads that read them.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cpu_kernels.h"
#include "tree_attention.h"
#include "tree_attention_rows.h"

namespace specdec_cpu_kernels {

// The portable kernels: their definitions for the helpers below, their instances compiled elsewhere
// (tree_attention_baseline.cpp, tree_attention_avx2.cpp: tree_attention_rows.h says why).
namespace portable_rows {
#include "tree_attention_portable.inc"
SPECDEC_ROW_KERNELS(extern)
}  // namespace portable_rows

#if SPECDEC_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2_rows {
#define SPECDEC_X86_FMA 1  // fma8 as the AVX2+FMA instruction (portable_vectors.inc)
#include "tree_attention_portable.inc"
#undef SPECDEC_X86_FMA
SPECDEC_ROW_KERNELS(extern)
}  // namespace avx2_rows
#pragma GCC pop_options
#endif

namespace {
using portable_rows::exp_c;
using portable_rows::lane_sum;
using portable_rows::row_portable;
using portable_rows::widen;

#if SPECDEC_X86
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")

#include "lane_sums_avx512.inc"  // lane_sums16, as in skinny_linear.cpp

inline __m512 exp16(__m512 x) {  // exp_c on sixteen lanes: the same operations, vectorized
  x = _mm512_max_ps(_mm512_set1_ps(-86.0f), x);  // vmaxps gives its second operand where one is NaN: NaN stays
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  const __m512 r2 = _mm512_mul_ps(r, r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0f));
  const __m512i shift = _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23);
  return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(y), shift));
}

inline __m512 load16(const float* p, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, p); }
inline __m512 load16(const c10::BFloat16* p, __mmask16 mask) {
  const __m256i bits = _mm256_maskz_loadu_epi16(mask, reinterpret_cast<const uint16_t*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// Sixteen dot products q . k[j], each by the contract's lanes and tree, times `scale`, stored at
// out[0 .. count). CHUNKS (the 16-lane pieces of a head, D <= 16 * CHUNKS) is a compile-time
// constant and the sixteen keys are always sixteen (the pointers past `count` repeat a real key,
// their results are not stored): every loop unrolls and the accumulators stay in registers.
template <int CHUNKS, typename scalar_t>
inline void scores16(const __m512* qv, const __mmask16* masks, const scalar_t* const* k, int64_t count,
                     int chunks, __m512 scale, float* out) {
  __m512 acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
  for (int c = 0; c < CHUNKS; ++c) {  // each acc[j] a chain over the head's chunks in order; none past them
    if (c == chunks) break;
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_fmadd_ps(qv[c], load16(k[j] + 16 * c, masks[c]), acc[j]);
  }
  const __mmask16 keep = static_cast<__mmask16>((1u << count) - 1u);
  _mm512_mask_storeu_ps(out, keep, _mm512_mul_ps(lane_sums16(acc), scale));
}

// VP vectors' weighted values over slots [v0, v1) (weights p_j[v]), added to their running sums in
// `outs` (VP x CHUNKS accumulators: each value chunk is loaded once for the VP vectors). Each vector's
// sum is the contract's fma chain over the slots in increasing order.
template <int CHUNKS, int VP, typename scalar_t>
inline void weighted_values(const float* const* p, float* const* out, const scalar_t* values, int64_t D,
                            const __mmask16* masks, int64_t v0, int64_t v1) {
  __m512 o[VP][CHUNKS];
  for (int a = 0; a < VP; ++a)
    for (int c = 0; c < CHUNKS; ++c) o[a][c] = _mm512_maskz_loadu_ps(masks[c], out[a] + 16 * c);
  for (int64_t v = v0; v < v1; ++v) {
    const scalar_t* value = values + v * D;
    __m512 w[VP];
    for (int a = 0; a < VP; ++a) w[a] = _mm512_set1_ps(p[a][v]);
    for (int c = 0; c < CHUNKS; ++c) {
      const __m512 x = load16(value + 16 * c, masks[c]);
      for (int a = 0; a < VP; ++a) o[a][c] = _mm512_fmadd_ps(w[a], x, o[a][c]);
    }
  }
  for (int a = 0; a < VP; ++a)
    for (int c = 0; c < CHUNKS; ++c) _mm512_mask_storeu_ps(out[a] + 16 * c, masks[c], o[a][c]);
}

// Every vector of `task` (one KV head) attended over its visible slots, on AVX-512 (float accumulation).
// Keys and values are read block by block (KEY_BLOCK slots, ~16 KB each: they stay in L1) for all the
// task's vectors, so the cache is read once per task, not once per row and query head. Per vector the
// contract's order holds: scores are independent values; the sums and the weighted values run over
// the visible slots in increasing order (committed blocks ascending, then the vector's tree slots).
template <int CHUNKS, typename scalar_t>
void head_avx512(const scalar_t* query_base, int64_t q_head, int64_t q_row, const scalar_t* keys,
                 const scalar_t* values, int64_t D, int64_t start, int64_t T, int64_t group, int64_t kv_head,
                 const std::vector<std::vector<int64_t>>& tree_slots, float scale, Vectors task, float* scores,
                 float* outs, float* totals) {
  constexpr int64_t KEY_BLOCK = 64;
  // Vectors per pass of the weighted values: VP x CHUNKS accumulators, at most 16 registers.
  constexpr int VP = CHUNKS <= 4 ? 4 : CHUNKS <= 8 ? 2 : 1;
  __mmask16 masks[CHUNKS];
  // CHUNKS may exceed the head's chunks (head_avx512_any): masks past them are empty (loads give zeros,
  // stores write nothing) and the scores skip them, so the result is the instance's for exactly D.
  const int chunks = static_cast<int>((D + 15) / 16);
  for (int c = 0; c < CHUNKS; ++c)
    masks[c] = static_cast<__mmask16>((1u << std::clamp<int64_t>(D - 16 * c, 0, 16)) - 1u);
  const int64_t width = start + T;  // a vector's scores row: committed slots, then its tree part
  const __m512 scale_v = _mm512_set1_ps(scale);
  auto query_of = [&](int64_t j) {
    const int64_t row = j / group, head = kv_head * group + j % group;
    return query_base + head * q_head + row * q_row;
  };
  auto load_query = [&](int64_t j, __m512* qv) {
    const scalar_t* q = query_of(task.first + j);
    for (int c = 0; c < CHUNKS; ++c) qv[c] = load16(q + 16 * c, masks[c]);
  };
  // Pass 1: scores over the committed slots, block by block, every vector.
  for (int64_t b0 = 0; b0 < start; b0 += KEY_BLOCK) {
    const int64_t b1 = std::min(start, b0 + KEY_BLOCK);
    for (int64_t j = 0; j < task.count; ++j) {
      __m512 qv[CHUNKS];
      load_query(j, qv);
      const scalar_t* k[16];
      for (int64_t v0 = b0; v0 < b1; v0 += 16) {
        const int64_t count = std::min<int64_t>(16, b1 - v0);
        for (int64_t i = 0; i < 16; ++i) k[i] = keys + (v0 + (i < count ? i : 0)) * D;
        scores16<CHUNKS>(qv, masks, k, count, chunks, scale_v, scores + j * width + v0);
      }
    }
  }
  // The tree part's scores, then per vector: max, exponentials and their sum, all in slot order.
  for (int64_t j = 0; j < task.count; ++j) {
    const std::vector<int64_t>& tree = tree_slots[(task.first + j) / group];
    __m512 qv[CHUNKS];
    load_query(j, qv);
    const scalar_t* k[16];
    const int64_t tree_size = static_cast<int64_t>(tree.size());
    for (int64_t t0 = 0; t0 < tree_size; t0 += 16) {
      const int64_t count = std::min<int64_t>(16, tree_size - t0);
      for (int64_t i = 0; i < 16; ++i) k[i] = keys + tree[t0 + (i < count ? i : 0)] * D;
      scores16<CHUNKS>(qv, masks, k, count, chunks, scale_v, scores + j * width + start + t0);
    }
    float* row = scores + j * width;
    const int64_t n = start + tree_size;
    __m512 top_v = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __mmask16 nan = 0;  // the contract's non-finite rule: a NaN score makes the max NaN (vmaxps would drop it)
    for (int64_t v0 = 0; v0 < n; v0 += 16) {
      const __mmask16 m = static_cast<__mmask16>((1u << std::min<int64_t>(16, n - v0)) - 1u);
      const __m512 s = _mm512_maskz_loadu_ps(m, row + v0);
      nan |= _mm512_mask_cmp_ps_mask(m, s, s, _CMP_UNORD_Q);
      top_v = _mm512_mask_max_ps(top_v, m, top_v, s);
    }
    const float top_max = nan ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(top_v);
    const __m512 top = _mm512_set1_ps(top_max);  // a max: exact in any order
    __m512 sums = _mm512_setzero_ps();
    for (int64_t v0 = 0; v0 < n; v0 += 16) {
      const __mmask16 m = static_cast<__mmask16>((1u << std::min<int64_t>(16, n - v0)) - 1u);
      const __m512 p = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + v0), top)));
      _mm512_mask_storeu_ps(row + v0, m, p);
      sums = _mm512_add_ps(sums, p);  // lane l gathers v = l, l + 16, ...; zeros past n
    }
    alignas(64) float lanes16[16];
    _mm512_store_ps(lanes16, sums);
    totals[j] = lane_sum<float, 16>(lanes16);
  }
  // Pass 2: the weighted values over the committed slots, block by block, VP vectors at a time (the
  // last pass repeats a real vector in the unused places and stores it to a scratch row), each
  // vector's running sums kept in `outs` between blocks.
  for (int64_t j = 0; j < task.count * D; ++j) outs[j] = 0.0f;
  alignas(64) float scratch[VP > 1 ? VP - 1 : 1][16 * CHUNKS];
  for (int64_t b0 = 0; b0 < start; b0 += KEY_BLOCK) {
    const int64_t b1 = std::min(start, b0 + KEY_BLOCK);
    for (int64_t j = 0; j < task.count; j += VP) {
      const float* p[VP];
      float* out[VP];
      for (int a = 0; a < VP; ++a) {
        const bool real = j + a < task.count;
        p[a] = scores + (real ? j + a : j) * width;
        out[a] = real ? outs + (j + a) * D : scratch[a - 1];
      }
      weighted_values<CHUNKS, VP>(p, out, values, D, masks, b0, b1);
    }
  }
  for (int64_t j = 0; j < task.count; ++j) {  // the tree part, then the division by the sum
    const std::vector<int64_t>& tree = tree_slots[(task.first + j) / group];
    const float* p = scores + j * width + start;
    __m512 o[CHUNKS];
    for (int c = 0; c < CHUNKS; ++c) o[c] = _mm512_maskz_loadu_ps(masks[c], outs + j * D + 16 * c);
    for (size_t t = 0; t < tree.size(); ++t) {
      const scalar_t* value = values + tree[t] * D;
      const __m512 w = _mm512_set1_ps(p[t]);
      for (int c = 0; c < CHUNKS; ++c) o[c] = _mm512_fmadd_ps(w, load16(value + 16 * c, masks[c]), o[c]);
    }
    const __m512 total = _mm512_set1_ps(totals[j]);
    for (int c = 0; c < CHUNKS; ++c) _mm512_mask_storeu_ps(outs + j * D + 16 * c, masks[c], _mm512_div_ps(o[c], total));
  }
}

// head_avx512 for a head of D <= 256 values: the smallest instance whose CHUNKS covers D.
template <typename scalar_t>
void head_avx512_any(const scalar_t* query_base, int64_t q_head, int64_t q_row, const scalar_t* keys,
                     const scalar_t* values, int64_t D, int64_t start, int64_t T, int64_t group, int64_t kv_head,
                     const std::vector<std::vector<int64_t>>& tree_slots, float scale, Vectors task, float* scores,
                     float* outs, float* totals) {
#define SPECDEC_HEAD(C)                                                                                         \
  case C:                                                                                                        \
    return head_avx512<C, scalar_t>(query_base, q_head, q_row, keys, values, D, start, T, group, kv_head,       \
                                    tree_slots, scale, task, scores, outs, totals);
  // Three instances, not one per chunk count: a head's chunks past D are skipped at run time (the same
  // bits and the same work as an exact instance), and every instance costs build time.
  const int64_t chunks = (D + 15) / 16;
  switch (chunks <= 4 ? 4 : chunks <= 8 ? 8 : chunks <= 16 ? 16 : 0) {
    SPECDEC_HEAD(4) SPECDEC_HEAD(8) SPECDEC_HEAD(16)
    default:
      TORCH_CHECK(false, "specdec_cpu::tree_attention: the AVX-512 path takes head dims up to 256, got ", D);
  }
#undef SPECDEC_HEAD
}

#pragma GCC pop_options
#endif  // SPECDEC_X86

// One segment of a call: T query rows (from row `first` of the query) over their own cache.
struct Part {
  at::Tensor keys, values;  // [1, Hkv, S, D] contiguous
  int64_t start, T, first;
  std::vector<std::vector<int64_t>> tree_slots;  // row i's tree part: the slots of its ancestors and itself
};

// Row i's tree part: the slots of its ancestors and itself (or of every row up to it: causal).
std::vector<std::vector<int64_t>> tree_slots_of(int64_t start, int64_t T, const bool* ancestors) {
  std::vector<std::vector<int64_t>> tree_slots(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t a = 0; a < T; ++a)
      if (ancestors != nullptr ? ancestors[i * T + a] : a <= i) tree_slots[i].push_back(start + a);
  return tree_slots;
}

// Every part's rows attended over its own cache, all parts' tasks in one parallel pass.
template <typename scalar_t>
void attend(const at::Tensor& query, const std::vector<Part>& parts, double scale, Isa isa, at::Tensor& out) {
  using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
  const int64_t Hq = query.size(1), D = query.size(3);
  const int64_t Hkv = parts[0].keys.size(1);
  const int64_t group = Hq / Hkv;
  const int64_t q_head = query.stride(1), q_row = query.stride(2);
  // Tasks: each part's KV heads' T * group query vectors, cut into pieces so both threads get work
  // on a model with few KV heads; every piece reads its KV head's keys and values once.
  struct Task {
    size_t part;
    int64_t kv_head;
    Vectors vectors;
  };
  std::vector<Task> tasks;
  const int64_t wanted = 2 * at::get_num_threads();
  for (size_t p = 0; p < parts.size(); ++p) {
    const int64_t per_head = parts[p].T * group;
    const int64_t heads = Hkv * static_cast<int64_t>(parts.size());
    const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(per_head, (wanted + heads - 1) / heads));
    const int64_t piece = (per_head + pieces - 1) / pieces;
    for (int64_t kv_head = 0; kv_head < Hkv; ++kv_head)
      for (int64_t first = 0; first < per_head; first += piece)
        tasks.push_back({p, kv_head, Vectors{first, std::min(piece, per_head - first)}});
  }
  scalar_t* op = out.mutable_data_ptr<scalar_t>();  // [1, R, Hq * D]
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> scores;
    std::vector<acc_t> outs, totals, query_scratch;
    for (int64_t t = begin; t < end; ++t) {
      const Task& task = tasks[static_cast<size_t>(t)];
      const Part& part = parts[task.part];
      const int64_t start = part.start, T = part.T, S = part.keys.size(2), kv_head = task.kv_head;
      const Vectors vectors = task.vectors;
      const scalar_t* qp = query.const_data_ptr<scalar_t>() + part.first * q_row;
      scalar_t* part_out = op + part.first * Hq * D;
      const scalar_t* head_keys = part.keys.const_data_ptr<scalar_t>() + kv_head * S * D;
      const scalar_t* head_values = part.values.const_data_ptr<scalar_t>() + kv_head * S * D;
      auto store_outs = [&] {  // a blocked kernel's outs [count, D] to the output rows, in the output dtype
        for (int64_t j = 0; j < vectors.count; ++j) {
          const int64_t vector = vectors.first + j, row = vector / group, head = kv_head * group + vector % group;
          scalar_t* o = part_out + (row * Hq + head) * D;
          for (int64_t d = 0; d < D; ++d) o[d] = static_cast<scalar_t>(outs[j * D + d]);
        }
      };
#if SPECDEC_X86
      if constexpr (!std::is_same_v<scalar_t, double>) {
        if (avx512_family(isa) && D <= 256) {
          scores.resize(static_cast<size_t>(vectors.count * (start + T)));
          outs.resize(static_cast<size_t>(vectors.count * D));
          totals.resize(static_cast<size_t>(vectors.count));
          head_avx512_any<scalar_t>(qp, q_head, q_row, head_keys, head_values, D, start, T, group, kv_head,
                                    part.tree_slots, static_cast<float>(scale), vectors, scores.data(), outs.data(),
                                    totals.data());
          store_outs();
          continue;
        }
      }
#endif
      if constexpr (!std::is_same_v<scalar_t, double>) {
        if (D <= 256) {  // AVX2 or portable: the blocked kernel of tree_attention_portable.inc
          scores.resize(static_cast<size_t>(vectors.count * (start + T)));
          outs.resize(static_cast<size_t>(vectors.count * D));
          totals.resize(static_cast<size_t>(vectors.count));
          query_scratch.resize(static_cast<size_t>(vectors.count * 256));
#if SPECDEC_X86
          if (avx2_family(isa)) {
            avx2_rows::head_blocked_any<scalar_t>(qp, q_head, q_row, head_keys, head_values, D, start, T, group,
                                                  kv_head, part.tree_slots, static_cast<float>(scale), vectors,
                                                  scores.data(), outs.data(), totals.data(), query_scratch.data());
          } else
#endif
          {
            portable_rows::head_blocked_any<scalar_t>(qp, q_head, q_row, head_keys, head_values, D, start, T, group,
                                                      kv_head, part.tree_slots, static_cast<float>(scale), vectors,
                                                      scores.data(), outs.data(), totals.data(), query_scratch.data());
          }
          store_outs();
          continue;
        }
      }
      scores.resize(static_cast<size_t>(start + T));
      outs.resize(static_cast<size_t>(D));
      Visible seen{start, {}};
      for (int64_t j = 0; j < vectors.count; ++j) {
        const int64_t vector = vectors.first + j, row = vector / group, head = kv_head * group + vector % group;
        seen.tree = part.tree_slots[row];
        const scalar_t* q = qp + head * q_head + row * q_row;
#if SPECDEC_X86
        if (avx2_family(isa)) {
          avx2_rows::row_portable<scalar_t, acc_t>(q, head_keys, head_values, D, seen, static_cast<acc_t>(scale),
                                                   scores.data(), outs.data());
        } else
#endif
        {
          row_portable<scalar_t, acc_t>(q, head_keys, head_values, D, seen, static_cast<acc_t>(scale), scores.data(),
                                        outs.data());
        }
        scalar_t* o = part_out + (row * Hq + head) * D;
        for (int64_t d = 0; d < D; ++d) o[d] = static_cast<scalar_t>(outs[d]);
      }
    }
  });
}

// One segment's checks (naming `op`), and the segment as a Part.
Part checked_part(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values, int64_t start,
                  int64_t T, int64_t first, const std::optional<at::Tensor>& ancestors, const char* op) {
  TORCH_CHECK(keys.device().is_cpu() && values.device().is_cpu(), op, ": CPU tensors only");
  TORCH_CHECK(keys.dim() == 4 && values.dim() == 4 && keys.size(0) == 1, op,
              ": query [1, Hq, T, D] and keys/values [1, Hkv, S, D], got ", query.sizes(), " and ", keys.sizes());
  TORCH_CHECK(keys.sizes() == values.sizes(), op, ": keys ", keys.sizes(), " and values ", values.sizes(), " differ");
  const auto dtype = query.scalar_type();
  TORCH_CHECK(keys.scalar_type() == dtype && values.scalar_type() == dtype, op, ": query, keys and values must share a dtype");
  const int64_t Hq = query.size(1), D = query.size(3);
  const int64_t Hkv = keys.size(1), S = keys.size(2);
  TORCH_CHECK(keys.size(3) == D, op, ": head dim ", D, " of the queries, ", keys.size(3), " of the keys");
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, op, ": ", Hq, " query heads over ", Hkv, " KV heads");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous(), op, ": keys and values must be contiguous");
  TORCH_CHECK(start >= 0 && start + T <= S, op, ": rows at slots ", start, "..", start + T - 1, " outside the ", S,
              " slots of the cache");
  const bool* anc = nullptr;
  at::Tensor anc_contiguous;
  if (ancestors.has_value()) {
    TORCH_CHECK(ancestors->device().is_cpu(), op, ": ancestors must be a CPU tensor, got one on ", ancestors->device());
    TORCH_CHECK(ancestors->scalar_type() == at::kBool && ancestors->dim() == 2 && ancestors->size(0) == T &&
                    ancestors->size(1) == T,
                op, ": ancestors must be bool [", T, ", ", T, "], got ", ancestors->scalar_type(), " ",
                ancestors->sizes());
    anc_contiguous = ancestors->contiguous();
    anc = anc_contiguous.const_data_ptr<bool>();
  }
  return Part{keys, values, start, T, first, tree_slots_of(start, T, anc)};
}

void check_query(const at::Tensor& query, const char* op) {
  TORCH_CHECK(query.device().is_cpu(), op, ": CPU tensors only");
  TORCH_CHECK(query.dim() == 4 && query.size(0) == 1, op, ": query [1, Hq, T, D], got ", query.sizes());
  const auto dtype = query.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kDouble, op,
              ": float32, bfloat16 or float64 only, got ", dtype);
  TORCH_CHECK(query.stride(3) == 1, op, ": the query's head dim must be contiguous");
}

at::Tensor attend_parts(const at::Tensor& query, const std::vector<Part>& parts, double scale, Isa isa) {
  const int64_t Hq = query.size(1), R = query.size(2), D = query.size(3);
  at::Tensor out = at::empty({1, R, Hq * D}, query.options());
  if (R == 0) return out;
  const auto dtype = query.scalar_type();
  if (dtype == at::kFloat) {
    attend<float>(query, parts, scale, isa, out);
  } else if (dtype == at::kBFloat16) {
    attend<c10::BFloat16>(query, parts, scale, isa, out);
  } else {
    attend<double>(query, parts, scale, isa, out);
  }
  return out;
}

}  // namespace

at::Tensor tree_attention_cpu(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                              int64_t start, const std::optional<at::Tensor>& ancestors, double scale,
                              c10::string_view isa_name) {
  const char* op = "specdec_cpu::tree_attention";
  check_query(query, op);
  std::vector<Part> parts;
  parts.push_back(checked_part(query, keys, values, start, query.size(2), 0, ancestors, op));
  return attend_parts(query, parts, scale, parse_isa(std::string(isa_name), "tree_attention"));
}

at::Tensor tree_attention_segments_cpu(const at::Tensor& query, at::TensorList keys, at::TensorList values,
                                       at::IntArrayRef starts, at::IntArrayRef counts,
                                       const c10::List<std::optional<at::Tensor>>& ancestors, double scale,
                                       c10::string_view isa_name) {
  const char* op = "specdec_cpu::tree_attention_segments";
  check_query(query, op);
  const size_t n = keys.size();
  TORCH_CHECK(n > 0, op, ": at least one segment");
  TORCH_CHECK(values.size() == n && starts.size() == n && counts.size() == n && ancestors.size() == n, op, ": ", n,
              " keys, ", values.size(), " values, ", starts.size(), " starts, ", counts.size(), " counts and ",
              ancestors.size(), " ancestors: one of each per segment");
  std::vector<Part> parts;
  int64_t first = 0;
  for (size_t s = 0; s < n; ++s) {
    TORCH_CHECK(counts[s] >= 1, op, ": segment ", s, " has ", counts[s], " rows");
    TORCH_CHECK(keys[s].dim() == 4 && keys[s].size(1) == keys[0].size(1), op, ": segment ", s, "'s keys ",
                keys[s].sizes(), " have another number of KV heads than segment 0's ", keys[0].sizes());
    parts.push_back(checked_part(query, keys[s], values[s], starts[s], counts[s], first, ancestors.get(s), op));
    first += counts[s];
  }
  TORCH_CHECK(first == query.size(2), op, ": the segments' counts sum to ", first, ", the query has ",
              query.size(2), " rows");
  return attend_parts(query, parts, scale, parse_isa(std::string(isa_name), "tree_attention_segments"));
}

namespace {

void check_new_rows(const at::Tensor& rows, const char* name, const char* op) {
  TORCH_CHECK(rows.device().is_cpu() && rows.dim() == 4 && rows.size(0) == 1 && rows.stride(3) == 1, op, ": ", name,
              " must be a CPU tensor [1, Hkv, R, D] with D contiguous, got ", rows.sizes(), " strides ",
              rows.strides());
}

void copy_rows(const at::Tensor& rows, const at::Tensor& cache, int64_t first, int64_t start, int64_t count) {
  const int64_t heads = rows.size(1), dim = rows.size(3), slots = cache.size(2);
  const size_t bytes = size_t(dim) * rows.element_size();
  const char* from = static_cast<const char*>(rows.data_ptr());
  char* to = static_cast<char*>(cache.data_ptr());
  const int64_t item = rows.element_size();
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < count; ++i)
      std::memcpy(to + ((h * slots + start + i) * dim) * item,
                  from + (h * rows.stride(1) + (first + i) * rows.stride(2)) * item, bytes);
}

}  // namespace

void write_segments_cpu(const at::Tensor& key, const at::Tensor& value, at::TensorList keys, at::TensorList values,
                        at::IntArrayRef starts, at::IntArrayRef counts) {
  const char* op = "specdec_cpu::write_segments";
  check_new_rows(key, "key", op);
  check_new_rows(value, "value", op);
  TORCH_CHECK(key.sizes() == value.sizes() && key.scalar_type() == value.scalar_type(), op,
              ": key and value differ: ", key.sizes(), " ", key.scalar_type(), " vs ", value.sizes(), " ",
              value.scalar_type());
  const size_t n = keys.size();
  TORCH_CHECK(values.size() == n && starts.size() == n && counts.size() == n, op, ": ", n, " keys, ",
              values.size(), " values, ", starts.size(), " starts and ", counts.size(), " counts: one of each per segment");
  int64_t first = 0;
  for (size_t s = 0; s < n; ++s) {  // every check before the first write: a bad call changes nothing
    for (const at::Tensor* cache : {&keys[s], &values[s]}) {
      TORCH_CHECK(cache->device().is_cpu() && cache->is_contiguous() && cache->dim() == 4 && cache->size(0) == 1 &&
                      cache->size(1) == key.size(1) && cache->size(3) == key.size(3) &&
                      cache->scalar_type() == key.scalar_type(),
                  op, ": segment ", s, "'s cache ", cache->sizes(), " ", cache->scalar_type(),
                  " is not a contiguous CPU [1, ", key.size(1), ", S, ", key.size(3), "] of ", key.scalar_type());
    }
    TORCH_CHECK(counts[s] >= 1 && starts[s] >= 0 && starts[s] + counts[s] <= keys[s].size(2) &&
                    starts[s] + counts[s] <= values[s].size(2),
                op, ": segment ", s, ": ", counts[s], " rows at slot ", starts[s], " do not fit its ",
                keys[s].size(2), " slots");
    first += counts[s];
  }
  TORCH_CHECK(first == key.size(2), op, ": the segments' counts sum to ", first, ", key has ", key.size(2), " rows");
  first = 0;
  for (size_t s = 0; s < n; ++s) {
    copy_rows(key, keys[s], first, starts[s], counts[s]);
    copy_rows(value, values[s], first, starts[s], counts[s]);
    first += counts[s];
  }
}

}  // namespace specdec_cpu_kernels
