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

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SPECDEC_X86 1
#include <immintrin.h>
#else
#define SPECDEC_X86 0
#endif

namespace specdec_cpu_kernels {
namespace {

// exp(x) for x <= 0, by a fixed sequence of IEEE operations (Cephes' expf polynomial): the same
// bits on every path. Inputs below -86 are raised to -86 (e^-86 ~ 4e-38: nothing next to e^0 = 1,
// the softmax's largest term), which keeps 2^n a normal number.
inline float exp_c(float x) {
  x = std::max(x, -86.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(n, -0.693359375f, x);
  r = std::fma(n, 2.12194440e-4f, r);
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  const float y = std::fma(p, r2, r) + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &y, sizeof bits);
  bits += static_cast<int32_t>(n) << 23;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

inline double exp_c(double x) { return std::exp(x); }

inline float widen(float v) { return v; }
inline double widen(double v) { return v; }
inline float widen(c10::BFloat16 v) { return static_cast<float>(v); }

template <typename acc_t>
constexpr int lanes() {
  return std::is_same_v<acc_t, double> ? 8 : 16;
}

// The lane tree of the contracts (skinny_linear.h): (0+2)+(1+3) per chunk of four, then chunks pairwise.
template <typename acc_t, int L>
inline acc_t lane_sum(const acc_t* acc) {
  acc_t chunk[L / 4];
  for (int c = 0; c < L / 4; ++c) chunk[c] = (acc[4 * c] + acc[4 * c + 2]) + (acc[4 * c + 1] + acc[4 * c + 3]);
  if constexpr (L == 16) {
    return (chunk[0] + chunk[1]) + (chunk[2] + chunk[3]);
  } else {
    return chunk[0] + chunk[1];
  }
}

// Where row i's visible slots are: the committed slots [0, start), then `tree` (absolute slots).
struct Visible {
  int64_t start;
  std::vector<int64_t> tree;
  int64_t size() const { return start + static_cast<int64_t>(tree.size()); }
  int64_t slot(int64_t v) const { return v < start ? v : tree[v - start]; }
};

// One row of one query head, portable: the contract, written out.
template <typename scalar_t, typename acc_t>
void row_portable(const scalar_t* q, const scalar_t* keys, const scalar_t* values, int64_t D, const Visible& seen,
                  acc_t scale, acc_t* scores, acc_t* out) {
  constexpr int L = lanes<acc_t>();
  const int64_t n = seen.size();
  for (int64_t v = 0; v < n; ++v) {
    const scalar_t* k = keys + seen.slot(v) * D;
    acc_t acc[L];
    for (int l = 0; l < L; ++l) acc[l] = acc_t(0);
    for (int64_t d0 = 0; d0 < D; d0 += L)
      for (int l = 0; l < L; ++l) {
        const bool inside = d0 + l < D;
        acc[l] = std::fma(inside ? widen(q[d0 + l]) : acc_t(0), inside ? widen(k[d0 + l]) : acc_t(0), acc[l]);
      }
    scores[v] = lane_sum<acc_t, L>(acc) * scale;
  }
  acc_t top = -std::numeric_limits<acc_t>::infinity();
  for (int64_t v = 0; v < n; ++v) top = std::max(top, scores[v]);
  acc_t sums[L];
  for (int l = 0; l < L; ++l) sums[l] = acc_t(0);
  for (int64_t v = 0; v < n; ++v) {
    scores[v] = exp_c(scores[v] - top);
    sums[v % L] = sums[v % L] + scores[v];
  }
  const acc_t total = lane_sum<acc_t, L>(sums);
  for (int64_t d = 0; d < D; ++d) out[d] = acc_t(0);
  for (int64_t v = 0; v < n; ++v) {
    const scalar_t* value = values + seen.slot(v) * D;
    for (int64_t d = 0; d < D; ++d) out[d] = std::fma(scores[v], widen(value[d]), out[d]);
  }
  for (int64_t d = 0; d < D; ++d) out[d] = out[d] / total;
}

#if SPECDEC_X86
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")

inline __m512 lane_sums16(const __m512* acc) {  // as in skinny_linear.cpp: lane i = lane_sum(acc[i])
  __m512 pairs[8];
  for (int i = 0; i < 8; ++i)
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(acc[2 * i], acc[2 * i + 1]),
                             _mm512_unpackhi_ps(acc[2 * i], acc[2 * i + 1]));
  __m512 chunks[4];
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(pairs[2 * i]);
    const __m512d b = _mm512_castps_pd(pairs[2 * i + 1]);
    chunks[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 h0 = _mm512_add_ps(_mm512_shuffle_f32x4(chunks[0], chunks[1], 0x88),
                                  _mm512_shuffle_f32x4(chunks[0], chunks[1], 0xDD));
  const __m512 h1 = _mm512_add_ps(_mm512_shuffle_f32x4(chunks[2], chunks[3], 0x88),
                                  _mm512_shuffle_f32x4(chunks[2], chunks[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(h0, h1, 0x88), _mm512_shuffle_f32x4(h0, h1, 0xDD));
}

inline __m512 exp16(__m512 x) {  // exp_c on sixteen lanes: the same operations, vectorized
  x = _mm512_max_ps(x, _mm512_set1_ps(-86.0f));
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

// One row of one query head on AVX-512 (float accumulation; float or bfloat16 data). D <= 256.
template <typename scalar_t>
void row_avx512(const scalar_t* q, const scalar_t* keys, const scalar_t* values, int64_t D, const Visible& seen,
                float scale, float* scores, float* out) {
  const int chunks = static_cast<int>((D + 15) / 16);
  __m512 qv[16];
  __mmask16 masks[16];
  for (int c = 0; c < chunks; ++c) {
    const int64_t left = std::min<int64_t>(16, D - 16 * c);
    masks[c] = static_cast<__mmask16>((1u << left) - 1u);
    qv[c] = load16(q + 16 * c, masks[c]);
  }
  const int64_t n = seen.size();
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int64_t v0 = 0; v0 < n; v0 += 16) {  // sixteen visible slots at a time
    __m512 acc[16];
    const int64_t block = std::min<int64_t>(16, n - v0);
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t j = 0; j < block; ++j) {
      const scalar_t* k = keys + seen.slot(v0 + j) * D;
      for (int c = 0; c < chunks; ++c) acc[j] = _mm512_fmadd_ps(qv[c], load16(k + 16 * c, masks[c]), acc[j]);
    }
    const __m512 s = _mm512_mul_ps(lane_sums16(acc), scale_v);
    _mm512_mask_storeu_ps(scores + v0, static_cast<__mmask16>((1u << block) - 1u), s);
  }
  __m512 top_v = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t v0 = 0; v0 < n; v0 += 16) {
    const __mmask16 m = static_cast<__mmask16>((1u << std::min<int64_t>(16, n - v0)) - 1u);
    top_v = _mm512_mask_max_ps(top_v, m, top_v, _mm512_maskz_loadu_ps(m, scores + v0));
  }
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(top_v));  // a max: exact in any order
  __m512 sums = _mm512_setzero_ps();
  for (int64_t v0 = 0; v0 < n; v0 += 16) {
    const __mmask16 m = static_cast<__mmask16>((1u << std::min<int64_t>(16, n - v0)) - 1u);
    const __m512 p = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores + v0), top)));
    _mm512_mask_storeu_ps(scores + v0, m, p);
    sums = _mm512_add_ps(sums, p);  // lane l gathers v = l, l + 16, ...; zeros past n
  }
  alignas(64) float lanes16[16];
  _mm512_store_ps(lanes16, sums);
  const float total = lane_sum<float, 16>(lanes16);
  __m512 o[16];
  for (int c = 0; c < chunks; ++c) o[c] = _mm512_setzero_ps();
  for (int64_t v = 0; v < n; ++v) {
    const __m512 p = _mm512_set1_ps(scores[v]);
    const scalar_t* value = values + seen.slot(v) * D;
    for (int c = 0; c < chunks; ++c) o[c] = _mm512_fmadd_ps(p, load16(value + 16 * c, masks[c]), o[c]);
  }
  const __m512 total_v = _mm512_set1_ps(total);
  for (int c = 0; c < chunks; ++c) _mm512_mask_storeu_ps(out + 16 * c, masks[c], _mm512_div_ps(o[c], total_v));
}

#pragma GCC pop_options
#endif  // SPECDEC_X86

template <typename scalar_t>
void attend(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values, int64_t start,
            const bool* ancestors, double scale, Isa isa, at::Tensor& out) {
  using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
  const int64_t Hq = query.size(1), T = query.size(2), D = query.size(3);
  const int64_t Hkv = keys.size(1), S = keys.size(2);
  const int64_t group = Hq / Hkv;
  const scalar_t* qp = query.const_data_ptr<scalar_t>();
  const scalar_t* kp = keys.const_data_ptr<scalar_t>();
  const scalar_t* vp = values.const_data_ptr<scalar_t>();
  scalar_t* op = out.mutable_data_ptr<scalar_t>();  // [1, T, Hq * D]
  const int64_t q_head = query.stride(1), q_row = query.stride(2);
  at::parallel_for(0, Hq, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> scores(static_cast<size_t>(start + T));
    std::vector<acc_t> row_out(static_cast<size_t>(D));
    Visible seen{start, {}};
    for (int64_t h = begin; h < end; ++h) {
      const scalar_t* head_keys = kp + (h / group) * S * D;
      const scalar_t* head_values = vp + (h / group) * S * D;
      for (int64_t i = 0; i < T; ++i) {
        seen.tree.clear();
        for (int64_t a = 0; a < T; ++a)
          if (ancestors != nullptr ? ancestors[i * T + a] : a <= i) seen.tree.push_back(start + a);
        const scalar_t* q = qp + h * q_head + i * q_row;
#if SPECDEC_X86
        if constexpr (!std::is_same_v<scalar_t, double>) {
          if (isa == Isa::kAvx512 && D <= 256) {
            row_avx512<scalar_t>(q, head_keys, head_values, D, seen, static_cast<float>(scale), scores.data(),
                                 row_out.data());
          } else {
            row_portable<scalar_t, acc_t>(q, head_keys, head_values, D, seen, static_cast<acc_t>(scale),
                                          scores.data(), row_out.data());
          }
        } else
#endif
        {
          row_portable<scalar_t, acc_t>(q, head_keys, head_values, D, seen, static_cast<acc_t>(scale), scores.data(),
                                        row_out.data());
        }
        scalar_t* o = op + (i * Hq + h) * D;
        for (int64_t d = 0; d < D; ++d) o[d] = static_cast<scalar_t>(row_out[d]);
      }
    }
  });
  (void)isa;
}

}  // namespace

at::Tensor tree_attention_cpu(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                              int64_t start, const std::optional<at::Tensor>& ancestors, double scale,
                              c10::string_view isa_name) {
  const char* op = "specdec_cpu::tree_attention";
  TORCH_CHECK(query.device().is_cpu() && keys.device().is_cpu() && values.device().is_cpu(), op,
              ": CPU tensors only");
  TORCH_CHECK(query.dim() == 4 && keys.dim() == 4 && values.dim() == 4 && query.size(0) == 1 && keys.size(0) == 1,
              op, ": query [1, Hq, T, D] and keys/values [1, Hkv, S, D], got ", query.sizes(), " and ", keys.sizes());
  TORCH_CHECK(keys.sizes() == values.sizes(), op, ": keys ", keys.sizes(), " and values ", values.sizes(), " differ");
  const auto dtype = query.scalar_type();
  TORCH_CHECK(keys.scalar_type() == dtype && values.scalar_type() == dtype, op, ": query, keys and values must share a dtype");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kDouble, op,
              ": float32, bfloat16 or float64 only, got ", dtype);
  const int64_t Hq = query.size(1), T = query.size(2), D = query.size(3);
  const int64_t Hkv = keys.size(1), S = keys.size(2);
  TORCH_CHECK(keys.size(3) == D, op, ": head dim ", D, " of the queries, ", keys.size(3), " of the keys");
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, op, ": ", Hq, " query heads over ", Hkv, " KV heads");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous(), op, ": keys and values must be contiguous");
  TORCH_CHECK(query.stride(3) == 1, op, ": the query's head dim must be contiguous");
  TORCH_CHECK(start >= 0 && start + T <= S, op, ": rows at slots ", start, "..", start + T - 1, " outside the ", S,
              " slots of the cache");
  const bool* anc = nullptr;
  at::Tensor anc_contiguous;
  if (ancestors.has_value()) {
    TORCH_CHECK(ancestors->scalar_type() == at::kBool && ancestors->dim() == 2 && ancestors->size(0) == T &&
                    ancestors->size(1) == T,
                op, ": ancestors must be bool [", T, ", ", T, "], got ", ancestors->scalar_type(), " ",
                ancestors->sizes());
    anc_contiguous = ancestors->contiguous();
    anc = anc_contiguous.const_data_ptr<bool>();
  }
  const Isa isa = parse_isa(std::string(isa_name), "tree_attention");
  at::Tensor out = at::empty({1, T, Hq * D}, query.options());
  if (dtype == at::kFloat) {
    attend<float>(query, keys, values, start, anc, scale, isa, out);
  } else if (dtype == at::kBFloat16) {
    attend<c10::BFloat16>(query, keys, values, start, anc, scale, isa, out);
  } else {
    attend<double>(query, keys, values, start, anc, scale, isa, out);
  }
  return out;
}

}  // namespace specdec_cpu_kernels
