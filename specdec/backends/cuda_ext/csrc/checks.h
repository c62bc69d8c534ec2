// specdec tree operations: the host-side argument checks both kernel files share.
//
// Shapes, dtypes and devices are checked here, before any kernel runs, with messages that name
// the argument and the bad value. Values (parent indices, tokens, path order, slots) are checked
// on the op's own device by the items of faults.h; raise_fault below words their messages, so a
// fault found on the device reads exactly like one found on the host.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <optional>

#include "faults.h"

namespace specdec {

// t: int64 [B, N] with N >= 1.
inline void check_index_matrix(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.dim() == 2, op, ": ", name, " must be a [B, N] tensor, got shape ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kLong, op, ": ", name, " must be int64, got ", t.scalar_type());
  TORCH_CHECK(t.size(1) >= 1, op, ": ", name, " needs at least one node (the root) per tree, got shape ", t.sizes());
}

// t: int64 [B] on `device`.
inline void check_row_vector(const at::Tensor& t, int64_t batch, const at::Device& device, const char* op,
                             const char* name) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == batch, op, ": ", name, " must be a [B] tensor with B = ", batch,
              ", got shape ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kLong, op, ": ", name, " must be int64, got ", t.scalar_type());
  TORCH_CHECK(t.device() == device, op, ": ", name, " is on ", t.device(), ", expected ", device);
}

// tree_mask(parents [B, N], committed_lens [B], tree_start, additive_dtype): returns the mask dtype.
inline at::ScalarType check_mask_args(const at::Tensor& parents, const at::Tensor& committed, int64_t tree_start,
                                      std::optional<at::ScalarType> additive_dtype) {
  const char* op = "specdec::tree_mask";
  check_index_matrix(parents, op, "parents");
  check_row_vector(committed, parents.size(0), parents.device(), op, "committed_lens");
  TORCH_CHECK(tree_start >= 0, op, ": tree_start must be >= 0, got ", tree_start);
  TORCH_CHECK(tree_start <= std::numeric_limits<int64_t>::max() - parents.size(1), op, ": tree_start = ", tree_start,
              " is too large: the mask's width tree_start + N overflows int64");
  const auto dtype = additive_dtype.value_or(at::kBool);
  TORCH_CHECK(dtype == at::kBool || at::isFloatingType(dtype), op,
              ": additive_dtype must be a floating dtype (or None for a bool mask), got ", dtype);
  return dtype;
}

// tree_accept(logits [B, N, V], tokens [B, N], parents [B, N], topk, choices [B, N]?).
inline void check_accept_args(const at::Tensor& logits, const at::Tensor& tokens, const at::Tensor& parents,
                              int64_t topk, const std::optional<at::Tensor>& choices) {
  const char* op = "specdec::tree_accept";
  TORCH_CHECK(logits.dim() == 3, op, ": logits must be [B, N, V], got shape ", logits.sizes());
  TORCH_CHECK(at::isFloatingType(logits.scalar_type()), op, ": logits must be floating, got ", logits.scalar_type());
  check_index_matrix(tokens, op, "tokens");
  check_index_matrix(parents, op, "parents");
  TORCH_CHECK(tokens.sizes() == parents.sizes() && tokens.size(0) == logits.size(0) &&
                  tokens.size(1) == logits.size(1),
              op, ": logits ", logits.sizes(), ", tokens ", tokens.sizes(), " and parents ", parents.sizes(),
              " disagree on [B, N]");
  TORCH_CHECK(tokens.device() == logits.device() && parents.device() == logits.device(), op,
              ": logits, tokens and parents must be on one device, got ", logits.device(), ", ", tokens.device(),
              " and ", parents.device());
  TORCH_CHECK(logits.size(2) >= 1, op, ": logits need at least one token, got shape ", logits.sizes());
  TORCH_CHECK(topk >= 0 && topk <= logits.size(2), op, ": topk must lie in [0, V = ", logits.size(2), "], got ",
              topk);
  if (choices.has_value()) {
    TORCH_CHECK(choices->sizes() == tokens.sizes() && choices->scalar_type() == at::kLong, op,
                ": choices must be int64 [B, N] = ", tokens.sizes(), ", got ", choices->scalar_type(), " ",
                choices->sizes());
    TORCH_CHECK(choices->device() == tokens.device(), op, ": choices is on ", choices->device(), ", expected ",
                tokens.device());
  }
}

// compact_kv(cache: [B, H, S, D] tensors, path [B, P], path_len [B], dest_starts [B], tree_start).
inline void check_compact_args(at::TensorList cache, const at::Tensor& path, const at::Tensor& path_len,
                               const at::Tensor& dest, int64_t tree_start) {
  const char* op = "specdec::compact_kv";
  check_index_matrix(path, op, "path");
  const int64_t batch = path.size(0);
  check_row_vector(path_len, batch, path.device(), op, "path_len");
  check_row_vector(dest, batch, path.device(), op, "dest_starts");
  TORCH_CHECK(tree_start >= 0, op, ": tree_start must be >= 0, got ", tree_start);
  for (size_t t = 0; t < cache.size(); ++t) {
    const at::Tensor& kv = cache[t];
    TORCH_CHECK(kv.device() == path.device(), op, ": cache[", t, "] is on ", kv.device(), ", the path on ",
                path.device());
    TORCH_CHECK(kv.dim() == 4 && kv.size(0) == batch, op, ": cache[", t, "] must be [B = ", batch,
                ", H, S, D], got shape ", kv.sizes());
    TORCH_CHECK(kv.stride(3) == 1 || kv.size(3) == 1, op, ": cache[", t,
                "] must be contiguous along head_dim, got strides ", kv.strides());
    TORCH_CHECK(kv.element_size() == cache[0].element_size(), op, ": cache[", t, "] has ", kv.element_size(),
                "-byte elements, cache[0] has ", cache[0].element_size());
  }
}

// status: int64 [kStatusWords], contiguous, on `device` (the layout: faults.h).
inline void check_status_arg(const std::optional<at::Tensor>& status, const at::Device& device, const char* op) {
  if (!status.has_value()) {
    return;
  }
  TORCH_CHECK(status->dim() == 1 && status->size(0) == kStatusWords && status->scalar_type() == at::kLong &&
                  status->is_contiguous(),
              op, ": status must be a contiguous int64 [", kStatusWords, "] tensor, got ", status->scalar_type(), " ",
              status->sizes(), status->is_contiguous() ? "" : " (not contiguous)");
  TORCH_CHECK(status->device() == device, op, ": status is on ", status->device(), ", expected ", device);
}

// compact_kv's value checks over contiguous path [B, P], path_len and dest_starts [B] (host or
// device pointers): the smallest cache tensor bounds every slot read.
inline CompactChecks compact_checks(at::TensorList cache, const at::Tensor& path, const at::Tensor& path_len,
                                    const at::Tensor& dest, int64_t tree_start) {
  int64_t slots = std::numeric_limits<int64_t>::max();
  int64_t slots_tensor = -1;
  for (size_t t = 0; t < cache.size(); ++t) {
    if (cache[t].size(2) < slots) {
      slots = cache[t].size(2);
      slots_tensor = static_cast<int64_t>(t);
    }
  }
  return CompactChecks{path.data_ptr<int64_t>(), path_len.data_ptr<int64_t>(), dest.data_ptr<int64_t>(), path.size(0),
                       path.size(1), tree_start, slots, slots_tensor};
}

// Raises the RuntimeError that names `fault`'s bad value (found on the host or read back from a
// device status); returns when there is no fault.
inline void raise_fault(const Fault& fault) {
  const int64_t b = fault.b;
  const int64_t i = fault.i;
  const int64_t value = fault.value;
  const char* op = fault.code <= kMaskCommitted ? "specdec::tree_mask"
                   : fault.code <= kAcceptChoice ? "specdec::tree_accept"
                                                 : "specdec::compact_kv";
  switch (fault.code) {
    case kNoFault:
      return;
    case kMaskRoot:
    case kAcceptRoot:
      TORCH_CHECK(false, op, ": parents[", b, ", 0] must be -1 (node 0 is the root), got ", value);
    case kMaskParent:
    case kAcceptParent:
      TORCH_CHECK(false, op, ": parents[", b, ", ", i, "] = ", value,
                  ": every parent must precede its child (-1 marks a padding node)");
    case kMaskCommitted:
      TORCH_CHECK(false, op, ": committed_lens[", b, "] = ", value, " must lie in [0, tree_start = ", fault.bound, "]");
    case kAcceptToken:
    case kAcceptChoice:
      TORCH_CHECK(false, op, ": ", fault.code == kAcceptToken ? "tokens[" : "choices[", b, ", ", i, "] = ", value,
                  " must be a token id in [0, V = ", fault.bound, ")");
    case kCompactPathLen:
      TORCH_CHECK(false, op, ": path_len[", b, "] = ", value, " must lie in [0, ", fault.bound, "]");
    case kCompactDest:
      TORCH_CHECK(false, op, ": dest_starts[", b, "] = ", value, " must lie in [0, tree_start = ", fault.bound, "]");
    case kCompactOrder:
      if (i == 0) {
        TORCH_CHECK(false, op, ": path[", b, ", 0] = ", value, ": a path is node indices, from 0 up");
      }
      TORCH_CHECK(false, op, ": path[", b, ", ", i, "] = ", value,
                  ": a path must be strictly increasing node indices from 0 up (the previous one is ", fault.aux, ")");
    case kCompactSlot:
      TORCH_CHECK(false, op, ": path[", b, ", ", i, "] = ", value, " is past the cache: the tree starts at slot ",
                  fault.aux2, " and cache[", fault.aux, "] holds ", fault.bound, " slots");
    default:
      TORCH_CHECK(false, "specdec: a status holds fault code ", fault.code, ", which no op writes (codes 1 to ",
                  static_cast<int64_t>(kLastFaultCode), "): is it a specdec status tensor?");
  }
}

}  // namespace specdec
