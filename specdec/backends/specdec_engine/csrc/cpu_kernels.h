// specdec's CPU kernels: the ops of torch.ops.specdec_cpu, and what their source files share.
//
// Seven ops, one extension (built and cached by specdec/native.py):
//   skinny_linear   y = x @ W^T for a few rows of x, one pass over W  (skinny_linear.h: the contract;
//                   W dense, or a GGUF file's quantized blocks widened on the way)
//   gguf_widen      GGUF blocks as the float32 weight they stand for (gguf_widen.inc)
//   skinny_linears  the same for several weights of one input in one parallel pass (q/k/v, gate/up)
//   tree_attention  attention of a few query rows over a KV cache     (tree_attention.h: the contract)
//   tree_attention_segments  the same for several sequences' rows, each over its own cache, in one pass
//   write_segments  the new keys and values of several sequences' rows into their caches
//   decoder_layers  a Llama-family decoder's layer loop over the ops above (decoder_layers.cpp)
// Each has a hand-written AVX-512 path and a portable path; an `isa` argument forces one
// ('auto': the best this CPU has), and every path computes the same bits (the contracts), which the
// tests check by forcing each, except the skinny linear's AVX2 path ('avx2'), which keeps an 8-lane
// contract of its own ('avx2-lanes16' runs the AVX2 kernels with the others' bits). The whole
// extension is compiled with -ffp-contract=off: a compiler that fused a multiply and an add on its own
// would break the contracts; fused multiply-adds are written out where the contracts have them
// (std::fma, _mm512_fmadd_ps, _mm256_fmadd_ps).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

// SPECDEC_X86: x86-64 with GCC or Clang, where the kernels compile AVX2 and AVX-512 paths per function.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SPECDEC_X86 1
#include <immintrin.h>
#else
#define SPECDEC_X86 0
#endif

namespace specdec_cpu_kernels {

// kAvx512Blocks: the AVX-512 kernels with the skinny linear's register blocks at every row count,
// where kAvx512 streams the weight rows for up to 3 x rows (skinny_linear.cpp, rows()). The same
// bits (the contract); which is faster depends on the CPU's memory system, so the calibration
// times both (the "cpu-blocks" kernel variant, specdec/backends/specdec_engine/forward.py).
// kAvx2Lanes16: the AVX2 kernels keeping the AVX-512 path's contract, where kAvx2's skinny linear keeps
// an 8-lane one of its own (skinny_linear.h, skinny_linear_avx2.cpp): what a CPU with AVX-512 times
// beside its AVX-512 kernels per tree size (the "cpu-avx2" kernel variant), which may mix the two
// paths within one generation only because they give the same bits.
// kAvx2Blocks: kAvx2 with the skinny linear's 1-2 x rows in register blocks of 4 weight rows, where kAvx2
// streams one weight row at a time; the same bits (the 8-lane contract), and as with kAvx512Blocks the
// faster depends on the CPU's memory system (skinny_linear_avx2.cpp, rows()), so the calibration of a
// CPU whose path is AVX2 times both (its "cpu-blocks" kernel variant).
enum class Isa : int { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Blocks = 3, kAvx2Lanes16 = 4, kAvx2Blocks = 5 };

// Whether `isa` runs the AVX-512 kernels (either way of blocking the skinny linear's few rows).
inline bool avx512_family(Isa isa) { return isa == Isa::kAvx512 || isa == Isa::kAvx512Blocks; }

// Whether `isa` runs AVX2 kernels (the tree attention's are the same for both; the skinny linear's differ).
inline bool avx2_family(Isa isa) {
  return isa == Isa::kAvx2 || isa == Isa::kAvx2Blocks || isa == Isa::kAvx2Lanes16;
}

// Whether `isa` runs the skinny linear's 8-lane AVX2 kernels (skinny_linear_avx2.cpp; either way of
// blocking its few rows).
inline bool avx2_lanes8_family(Isa isa) { return isa == Isa::kAvx2 || isa == Isa::kAvx2Blocks; }

// Whether this CPU runs `isa`; the best one it runs; `name` ('auto', 'avx512', 'avx512-blocks',
// 'avx2', 'avx2-blocks', 'avx2-lanes16', 'portable') parsed and checked against the CPU (an unknown or
// unsupported name raises, naming `op`).
// auto_isa: what 'auto' runs: the best, or the path set_auto_isa forced for the whole process
// (SPECDEC_CPU_ISA, read by specdec/backends/specdec_engine/cpu_kernels.py).
bool cpu_has(Isa isa);
Isa best_isa();
Isa auto_isa();
Isa parse_isa(const std::string& name, const char* op);
std::string isa_name(Isa isa);
std::string supported_isas();
void set_auto_isa(const std::string& name);
std::string cpu_isa();

at::Tensor skinny_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                             c10::string_view isa);

std::vector<at::Tensor> skinny_linears_cpu(const at::Tensor& x, at::TensorList weights,
                                           const c10::List<std::optional<at::Tensor>>& biases, c10::string_view isa);

// A skinny_linear weight's in-features: size(1) of a dense [N, K], B x elements per block of GGUF blocks
// [N, B, block_bytes] (0 for a block size no type has).
int64_t linear_in_features(const at::Tensor& weight);

// GGUF blocks uint8 [N, B, block_bytes] (skinny_linear.h) -> float32 [N, B x elements per block]: the
// values gguf-py's dequantizer gives (gguf_widen.inc), the ones skinny_linear widens them to.
at::Tensor gguf_widen_cpu(const at::Tensor& blocks, c10::string_view isa);

at::Tensor tree_attention_cpu(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                              int64_t start, const std::optional<at::Tensor>& ancestors, double scale,
                              c10::string_view isa);

at::Tensor tree_attention_segments_cpu(const at::Tensor& query, at::TensorList keys, at::TensorList values,
                                       at::IntArrayRef starts, at::IntArrayRef counts,
                                       const c10::List<std::optional<at::Tensor>>& ancestors, double scale,
                                       c10::string_view isa);

// Writes the new rows of several segments into their caches: rows offset .. offset + counts[s] - 1
// of key/value [1, Hkv, R, D] (any strides, D contiguous; offset the sum of the earlier counts) go
// to slots starts[s] .. of keys[s]/values[s] [1, Hkv, S, D] (contiguous, one dtype): the slice
// assignments of a batched forward's every segment and layer in one call.
void write_segments_cpu(const at::Tensor& key, const at::Tensor& value, at::TensorList keys, at::TensorList values,
                        at::IntArrayRef starts, at::IntArrayRef counts);

// The layer loop of a Llama-family decoder (decoder_layers.cpp): every layer's norms, projections,
// rotary, cache write, attention and MLP over hidden [1, R, E]; returns the last layer's output.
// norms: 2 per layer (input, post-attention); weights and biases: 7 per layer (q, k, v, o, gate,
// up, down); keys/values: one cache layer per layer and segment, layer-major.
at::Tensor decoder_layers_cpu(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
                              at::TensorList norms, at::TensorList weights,
                              const c10::List<std::optional<at::Tensor>>& biases, double eps, int64_t query_heads,
                              int64_t kv_heads, bool rotary_together, double scale, at::TensorList keys,
                              at::TensorList values, at::IntArrayRef starts, at::IntArrayRef counts,
                              const c10::List<std::optional<at::Tensor>>& ancestors, c10::string_view isa);

}  // namespace specdec_cpu_kernels
