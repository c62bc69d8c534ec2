// specdec decoder layers: the layer loop of specdec/backends/specdec_engine/model_runner.py (DecoderRunner.forward_rows)
// for Llama-family layers, in C++: torch.ops.specdec_cpu.decoder_layers (registered in cpu_kernels.cpp).
//
// Why: a verification forward of the default model runs 30 layers of ~60 small operations each
// (the RMSNorms' six, rotary's ten, views, residual adds, the activation) around the few large
// ones (the linear layers and the attention, already specdec_cpu kernels). From Python each small
// operation costs its interpreter and dispatch overhead, ~3 ms a forward on this project's CPU:
// a fifth of a one-token step. Here the same operations are the same ATen calls, made from C++.
//
// Same bits: every operation is the one the Python loop performs, in the same order and dtype:
// the norms are Hugging Face's LlamaRMSNorm written out (to float32, pow 2, mean, + eps, rsqrt,
// multiply, back to the input dtype, times the weight), rotary is apply_rotary_pos_emb's
// q * cos + rotate_half(q) * sin, the activation SiLU, the linear layers skinny_linears /
// skinny_linear, the cache write write_segments and the attention tree_attention_segments (whose
// rows are bitwise tree_attention's). The runner uses this op only for a model on which a probe
// (one layer on random rows, both ways) gave the same bits, so a model whose norm, rotary or
// activation differs from these keeps the Python loop.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "cpu_kernels.h"

namespace specdec_cpu_kernels {

namespace {

constexpr int64_t kWeightsPerLayer = 7;  // q, k, v, o, gate, up, down
constexpr int64_t kNormsPerLayer = 2;    // input, post-attention

// Hugging Face's LlamaRMSNorm.forward, operation for operation.
at::Tensor rms_norm(const at::Tensor& hidden, const at::Tensor& weight, double eps) {
  const auto dtype = hidden.scalar_type();
  at::Tensor x = hidden.to(at::kFloat);
  const at::Tensor variance = x.pow(2).mean(-1, /*keepdim=*/true);
  x = x * at::rsqrt(variance + eps);
  return weight * x.to(dtype);
}

// apply_rotary_pos_emb's q * cos + rotate_half(q) * sin (cos, sin already unsqueezed to [1, 1, R, D]).
at::Tensor rotate(const at::Tensor& t, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = t.size(-1) / 2;
  const at::Tensor x1 = t.slice(-1, 0, half);
  const at::Tensor x2 = t.slice(-1, half);
  const at::Tensor rotated = at::cat({-x2, x1}, -1);
  return (t * cos) + (rotated * sin);
}

}  // namespace

at::Tensor decoder_layers_cpu(const at::Tensor& hidden_in, const at::Tensor& cos_in, const at::Tensor& sin_in,
                              at::TensorList norms, at::TensorList weights,
                              const c10::List<std::optional<at::Tensor>>& biases, double eps, int64_t query_heads,
                              int64_t kv_heads, bool rotary_together, double scale, at::TensorList keys,
                              at::TensorList values, at::IntArrayRef starts, at::IntArrayRef counts,
                              const c10::List<std::optional<at::Tensor>>& ancestors, c10::string_view isa) {
  const char* op = "specdec_cpu::decoder_layers";
  TORCH_CHECK(hidden_in.dim() == 3 && hidden_in.size(0) == 1, op, ": hidden must be [1, R, E], got ",
              hidden_in.sizes());
  const int64_t layers = static_cast<int64_t>(weights.size()) / kWeightsPerLayer;
  TORCH_CHECK(layers >= 1 && static_cast<int64_t>(weights.size()) == layers * kWeightsPerLayer, op, ": ",
              weights.size(), " weights: ", kWeightsPerLayer, " per layer (q, k, v, o, gate, up, down)");
  TORCH_CHECK(static_cast<int64_t>(norms.size()) == layers * kNormsPerLayer, op, ": ", norms.size(),
              " norm weights for ", layers, " layers (", kNormsPerLayer, " per layer)");
  TORCH_CHECK(static_cast<int64_t>(biases.size()) == layers * kWeightsPerLayer, op, ": ", biases.size(),
              " biases for ", weights.size(), " weights");
  const int64_t segments = static_cast<int64_t>(starts.size());
  TORCH_CHECK(segments >= 1 && static_cast<int64_t>(counts.size()) == segments &&
                  static_cast<int64_t>(ancestors.size()) == segments,
              op, ": ", starts.size(), " starts, ", counts.size(), " counts and ", ancestors.size(),
              " ancestors: one of each per segment");
  TORCH_CHECK(static_cast<int64_t>(keys.size()) == layers * segments &&
                  static_cast<int64_t>(values.size()) == layers * segments,
              op, ": ", keys.size(), " key and ", values.size(), " value caches for ", layers, " layers x ", segments,
              " segments (layer-major)");
  TORCH_CHECK(query_heads >= 1 && kv_heads >= 1 && query_heads % kv_heads == 0, op, ": ", query_heads,
              " query heads over ", kv_heads, " KV heads (positive, the first a multiple of the second)");
  TORCH_CHECK(cos_in.dim() == 3 && sin_in.sizes() == cos_in.sizes() && cos_in.size(0) == 1 &&
                  cos_in.size(1) == hidden_in.size(1),
              op, ": cos and sin must be [1, R, D] with R = ", hidden_in.size(1), " rows, got ", cos_in.sizes(), " and ",
              sin_in.sizes());
  // The projections must fit the heads, or the views below would read the wrong rows: q and o carry
  // query_heads * head_dim features, k and v kv_heads * head_dim, each layer alike.
  const int64_t dim = cos_in.size(-1);
  for (size_t i = 0; i < weights.size(); ++i)
    TORCH_CHECK(weights[i].dim() == 2 || (weights[i].scalar_type() == at::kByte && weights[i].dim() == 3), op,
                ": weight ", i, " must be [out, in] (or GGUF blocks [out, blocks, block bytes]), got shape ",
                weights[i].sizes());
  for (int64_t layer = 0; layer < layers; ++layer) {
    const int64_t w0 = layer * kWeightsPerLayer;
    const int64_t q_out = weights[static_cast<size_t>(w0)].size(0), k_out = weights[static_cast<size_t>(w0 + 1)].size(0),
                  v_out = weights[static_cast<size_t>(w0 + 2)].size(0), o_in = linear_in_features(weights[static_cast<size_t>(w0 + 3)]);
    TORCH_CHECK(q_out == query_heads * dim && o_in == query_heads * dim && k_out == kv_heads * dim &&
                    v_out == kv_heads * dim,
                op, ": layer ", layer, "'s projections (q ", q_out, ", k ", k_out, ", v ", v_out, ", o in ", o_in,
                " features) do not fit ", query_heads, " query heads and ", kv_heads, " KV heads of ", dim);
  }
  const int64_t head_dim = cos_in.size(-1);
  const int64_t rows = hidden_in.size(1);
  const at::Tensor cos = cos_in.unsqueeze(1);  // [1, 1, R, D]
  const at::Tensor sin = sin_in.unsqueeze(1);
  const std::vector<int64_t> shape = {1, rows, -1, head_dim};
  at::Tensor hidden = hidden_in;
  for (int64_t layer = 0; layer < layers; ++layer) {
    const int64_t w0 = layer * kWeightsPerLayer;
    auto bias = [&](int64_t i) { return biases.get(static_cast<size_t>(w0 + i)); };
    const at::TensorList layer_keys = keys.slice(static_cast<size_t>(layer * segments), static_cast<size_t>(segments));
    const at::TensorList layer_values =
        values.slice(static_cast<size_t>(layer * segments), static_cast<size_t>(segments));

    at::Tensor residual = hidden;
    at::Tensor x = rms_norm(hidden, norms[static_cast<size_t>(layer * kNormsPerLayer)], eps);
    c10::List<std::optional<at::Tensor>> qkv_bias({bias(0), bias(1), bias(2)});
    const std::vector<at::Tensor> qkv = skinny_linears_cpu(x, weights.slice(static_cast<size_t>(w0), 3), qkv_bias, isa);
    at::Tensor query = qkv[0].view(shape).transpose(1, 2);  // [1, H, R, D]
    at::Tensor key = qkv[1].view(shape).transpose(1, 2);
    const at::Tensor value = qkv[2].view(shape).transpose(1, 2);
    if (rotary_together) {  // one rotation over the query and key heads side by side (the runner checked: same bits)
      const at::Tensor both = rotate(at::cat({query, key}, 1), cos, sin);
      query = both.slice(1, 0, query_heads);
      key = both.slice(1, query_heads);
    } else {
      query = rotate(query, cos, sin);
      key = rotate(key, cos, sin);
    }
    write_segments_cpu(key, value, layer_keys, layer_values, starts, counts);
    const at::Tensor attended =
        tree_attention_segments_cpu(query, layer_keys, layer_values, starts, counts, ancestors, scale, isa);
    hidden = residual + skinny_linear_cpu(attended, weights[static_cast<size_t>(w0 + 3)], bias(3), isa);

    residual = hidden;
    x = rms_norm(hidden, norms[static_cast<size_t>(layer * kNormsPerLayer + 1)], eps);
    c10::List<std::optional<at::Tensor>> mlp_bias({bias(4), bias(5)});
    const std::vector<at::Tensor> gate_up =
        skinny_linears_cpu(x, weights.slice(static_cast<size_t>(w0 + 4), 2), mlp_bias, isa);
    hidden = residual + skinny_linear_cpu(at::silu(gate_up[0]) * gate_up[1], weights[static_cast<size_t>(w0 + 6)],
                                          bias(6), isa);
  }
  return hidden;
}

}  // namespace specdec_cpu_kernels
