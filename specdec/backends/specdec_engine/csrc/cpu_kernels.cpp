// The registration of torch.ops.specdec_cpu.* and the instruction-set choice (cpu_kernels.h).
#include <pybind11/pybind11.h>
#include <torch/library.h>

#include <atomic>

#include "cpu_kernels.h"

namespace specdec_cpu_kernels {

namespace {
// The path 'auto' runs: -1 until set_auto_isa forces one (SPECDEC_CPU_ISA, read by cpu_kernels.py).
std::atomic<int> forced_auto{-1};
}  // namespace

bool cpu_has(Isa isa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (avx512_family(isa))
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
  if (avx2_family(isa))  // F16C: the GGUF blocks' half scales (every AVX2 CPU has it)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
  return isa == Isa::kPortable;
}

Isa best_isa() {
  static const Isa best = cpu_has(Isa::kAvx512) ? Isa::kAvx512 : (cpu_has(Isa::kAvx2) ? Isa::kAvx2 : Isa::kPortable);
  return best;
}

Isa auto_isa() {
  const int forced = forced_auto.load(std::memory_order_relaxed);
  return forced < 0 ? best_isa() : static_cast<Isa>(forced);
}

namespace {
// Every path with its name, in the order supported_isas and the unknown-name error list them: the one place
// a new path is named.
struct NamedIsa {
  Isa isa;
  const char* name;
};
constexpr NamedIsa kNamedIsas[] = {{Isa::kAvx512, "avx512"}, {Isa::kAvx512Blocks, "avx512-blocks"},
                                   {Isa::kAvx2, "avx2"},     {Isa::kAvx2Blocks, "avx2-blocks"},
                                   {Isa::kAvx2Lanes16, "avx2-lanes16"}, {Isa::kPortable, "portable"}};

// The names as a quoted list ("'a', 'b'"), those this CPU runs or all of them.
std::string quoted_names(bool only_supported) {
  std::string names;
  for (const NamedIsa& named : kNamedIsas)
    if (!only_supported || cpu_has(named.isa))
      names += std::string(names.empty() ? "'" : ", '") + named.name + "'";
  return names;
}
}  // namespace

std::string isa_name(Isa isa) {
  for (const NamedIsa& named : kNamedIsas)
    if (named.isa == isa) return named.name;
  TORCH_CHECK(false, "specdec_cpu: no name for isa ", static_cast<int>(isa));
  return {};
}

std::string supported_isas() { return quoted_names(true); }

void set_auto_isa(const std::string& name) {
  if (name == "auto") {
    forced_auto.store(-1, std::memory_order_relaxed);
    return;
  }
  forced_auto.store(static_cast<int>(parse_isa(name, "set_auto_isa")), std::memory_order_relaxed);
}

Isa parse_isa(const std::string& name, const char* op) {
  if (name == "auto") return auto_isa();
  const NamedIsa* found = nullptr;
  for (const NamedIsa& named : kNamedIsas)
    if (name == named.name) found = &named;
  TORCH_CHECK(found != nullptr, "specdec_cpu::", op, ": unknown isa '", name, "'; valid: 'auto', ", quoted_names(false));
  TORCH_CHECK(cpu_has(found->isa), "specdec_cpu::", op, ": isa '", name, "' is not supported by this CPU (it runs ",
              supported_isas(), ")");
  return found->isa;
}

std::string cpu_isa() { return isa_name(auto_isa()); }

}  // namespace specdec_cpu_kernels

TORCH_LIBRARY(specdec_cpu, m) {
  // x [..., K] and weight [N, K] of one dtype (float32, bfloat16, float64), bias [N] or None ->
  // [..., N]. isa: 'auto' (the best this CPU has) or a path of parse_isa (bits: skinny_linear.h).
  m.def("skinny_linear(Tensor x, Tensor weight, Tensor? bias=None, str isa='auto') -> Tensor");
  // skinny_linear of one x by each weight (same in-features, one dtype), biases one per weight
  // (None or [N_i]): the outputs bitwise skinny_linear's, computed in one parallel pass.
  m.def("skinny_linears(Tensor x, Tensor[] weights, Tensor?[] biases, str isa='auto') -> Tensor[]");
  // GGUF blocks uint8 [N, B, block_bytes] -> float32 [N, K]: what skinny_linear widens them to, exactly
  // gguf-py's dequantized values (skinny_linear.h: GGUF blocks; a weight of skinny_linear may be such blocks).
  m.def("gguf_widen(Tensor blocks, str isa='auto') -> Tensor");
  // query [1, Hq, T, D], keys/values [1, Hkv, S, D] (a cache layer), ancestors bool [T, T] or None
  // (causal) -> [1, T, Hq * D]; rows see slots [0, start) and their tree part (tree_attention.h).
  m.def(
      "tree_attention(Tensor query, Tensor keys, Tensor values, int start, Tensor? ancestors, float scale, "
      "str isa='auto') -> Tensor");
  // query [1, Hq, R, D] holding the rows of several segments one after another (counts[s] rows each),
  // segment s over its own cache keys[s]/values[s] after starts[s] committed slots, under ancestors[s]
  // (or causal) -> [1, R, Hq * D]; each row bitwise what tree_attention gives its segment alone.
  m.def(
      "tree_attention_segments(Tensor query, Tensor[] keys, Tensor[] values, int[] starts, int[] counts, "
      "Tensor?[] ancestors, float scale, str isa='auto') -> Tensor");
  // key/value [1, Hkv, R, D] holding the segments' new rows one after another (counts[s] each) ->
  // written into keys[s]/values[s] [1, Hkv, S, D] at slots starts[s] ..; every check before any write.
  m.def(
      "write_segments(Tensor key, Tensor value, Tensor(a!)[] keys, Tensor(b!)[] values, int[] starts, "
      "int[] counts) -> ()");
  // hidden [1, R, E], cos/sin [1, R, D] -> hidden after every layer (cpu_kernels.h, decoder_layers.cpp):
  // the runner's layer loop, bitwise, with the caches written at the segments' slots.
  m.def(
      "decoder_layers(Tensor hidden, Tensor cos, Tensor sin, Tensor[] norms, Tensor[] weights, Tensor?[] biases, "
      "float eps, int query_heads, int kv_heads, bool rotary_together, float scale, Tensor(a!)[] keys, "
      "Tensor(b!)[] values, int[] starts, int[] counts, Tensor?[] ancestors, str isa='auto') -> Tensor");
}

TORCH_LIBRARY_IMPL(specdec_cpu, CPU, m) {
  m.impl("skinny_linear", &specdec_cpu_kernels::skinny_linear_cpu);
  m.impl("skinny_linears", &specdec_cpu_kernels::skinny_linears_cpu);
  m.impl("gguf_widen", &specdec_cpu_kernels::gguf_widen_cpu);
  m.impl("tree_attention", &specdec_cpu_kernels::tree_attention_cpu);
  m.impl("tree_attention_segments", &specdec_cpu_kernels::tree_attention_segments_cpu);
  m.impl("write_segments", &specdec_cpu_kernels::write_segments_cpu);
  m.impl("decoder_layers", &specdec_cpu_kernels::decoder_layers_cpu);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.doc() = "specdec's CPU kernels; the ops themselves are torch.ops.specdec_cpu.*";
  module.def("cpu_isa", &specdec_cpu_kernels::cpu_isa, "The kernel path 'auto' runs (forced, or the best this CPU has).");
  module.def("best_isa", [] { return specdec_cpu_kernels::isa_name(specdec_cpu_kernels::best_isa()); },
             "The best kernel path this CPU runs.");
  module.def("supported_isas", &specdec_cpu_kernels::supported_isas, "The kernel paths this CPU runs, quoted.");
  module.def("set_auto_isa", &specdec_cpu_kernels::set_auto_isa,
             "Force the path 'auto' runs for the whole process ('auto' undoes it); a bad name raises.");
}
