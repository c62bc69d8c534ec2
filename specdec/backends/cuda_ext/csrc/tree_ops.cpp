// specdec tree operations: operator schemas and the CPU kernels.
//
// The schemas are registered with TORCH_LIBRARY, so the ops are torch.ops.specdec.* and compose
// with torch.compile (their fake implementations live in specdec/backends/cuda_ext/ops.py). The
// CUDA kernels of the same ops are in tree_ops_cuda.cu, compiled only when a CUDA toolkit and a
// CUDA build of torch are present. Layouts and the order on logits: tree_ops.h.
//
// The CPU kernels run on the calling thread. They are memory-bound passes over small arrays
// (the logits are the one large input), and the forward that surrounds them already uses
// torch's thread pool; a second OpenMP runtime linked into this extension would fight it.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <pybind11/pybind11.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "checks.h"
#include "faults.h"
#include "tree_ops.h"

// GCC's vector extensions give portable 8-lane code (SSE2, AVX2 or NEON registers); on x86-64
// Linux target_clones also compiles an AVX2 copy and picks it at load time when the CPU has it,
// so the cached binary stays correct on any machine that shares the cache directory.
#if defined(__GNUC__) && !defined(__clang__)
#define SPECDEC_VECTORS 1
#else
#define SPECDEC_VECTORS 0
#endif
#if SPECDEC_VECTORS && defined(__x86_64__) && defined(__linux__)
#define SPECDEC_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define SPECDEC_MULTIVERSION
#endif

#ifdef SPECDEC_WITH_CUDA
constexpr bool kHasCudaKernels = true;
#else
constexpr bool kHasCudaKernels = false;
#endif

namespace specdec {
namespace {

// ---------------------------------------------------------------------------------------------
// tree_mask

// mask [B, N, W] of mask_t (W = tree_start + N), positions [B, N] int64, parents [B, N] int64,
// committed [B] int64. O(B * N * W): every mask element is written once.
//
// Row i of a tree is its parent's row plus column i, and parents precede children, so the tree
// part of each row is a copy of a row already written: one pass in node order, no walks.
template <typename mask_t>
void fill_tree_mask(const int64_t* parents, const int64_t* committed, int64_t batch, int64_t nodes,
                    int64_t tree_start, mask_t allow, mask_t deny, mask_t* mask, int64_t* positions) {
  const int64_t width = tree_start + nodes;
  std::vector<int64_t> depth(nodes);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t visible = committed[b];
    for (int64_t i = 0; i < nodes; ++i) {
      mask_t* row = mask + (b * nodes + i) * width;  // [W]
      std::fill(row, row + visible, allow);
      std::fill(row + visible, row + tree_start, deny);
      mask_t* tree_row = row + tree_start;  // [N]: the tree's own columns
      const int64_t parent = parents[b * nodes + i];
      if (parent >= 0) {
        const mask_t* parent_row = mask + (b * nodes + parent) * width + tree_start;
        std::copy(parent_row, parent_row + nodes, tree_row);
        depth[i] = depth[parent] + 1;
      } else {  // the root, or a padding node
        std::fill(tree_row, tree_row + nodes, deny);
        depth[i] = 0;
      }
      tree_row[i] = allow;
      positions[b * nodes + i] = visible + depth[i];
    }
  }
}

// Value checks (faults.h) run before any output is written; a bad value raises at once, so a
// caller's status is never written on the CPU (it only has to have the right shape and device).
std::tuple<at::Tensor, at::Tensor> tree_mask_cpu(const at::Tensor& parents_in, const at::Tensor& committed_in,
                                                 int64_t tree_start, std::optional<at::ScalarType> additive_dtype,
                                                 const std::optional<at::Tensor>& status) {
  const auto dtype = check_mask_args(parents_in, committed_in, tree_start, additive_dtype);
  check_status_arg(status, parents_in.device(), "specdec::tree_mask");
  const int64_t batch = parents_in.size(0);
  const int64_t nodes = parents_in.size(1);
  const at::Tensor parents = parents_in.contiguous();      // [B, N] int64
  const at::Tensor committed = committed_in.contiguous();  // [B] int64
  const int64_t* parents_ptr = parents.data_ptr<int64_t>();
  const int64_t* committed_ptr = committed.data_ptr<int64_t>();
  raise_fault(first_fault(MaskChecks{parents_ptr, committed_ptr, batch, nodes, tree_start}));
  at::Tensor mask = at::empty({batch, 1, nodes, tree_start + nodes}, parents.options().dtype(dtype));
  at::Tensor positions = at::empty({batch, nodes}, parents.options());
  int64_t* positions_ptr = positions.data_ptr<int64_t>();
  if (dtype == at::kBool) {
    fill_tree_mask<bool>(parents_ptr, committed_ptr, batch, nodes, tree_start, true, false, mask.data_ptr<bool>(),
                         positions_ptr);
  } else {
    // Additive masks (eager attention adds them to the scores): 0 where allowed, the dtype's
    // most negative finite value elsewhere, the same values torch.finfo(dtype).min gives.
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "tree_mask_cpu", [&] {
      fill_tree_mask<scalar_t>(parents_ptr, committed_ptr, batch, nodes, tree_start, scalar_t(0),
                               std::numeric_limits<scalar_t>::lowest(), mask.data_ptr<scalar_t>(), positions_ptr);
    });
  }
  return {mask, positions};
}

// ---------------------------------------------------------------------------------------------
// tree_accept: choices and top-k per node

// A running top-k list sorted by the order of tree_ops.h. Ids are pushed in increasing order, so
// a new element ties an equal value already listed and loses the tie: it enters only when it is
// strictly better than the last entry. O(k) per insertion; a row in random order inserts about
// k * ln(V / k) times, so a row costs O(V + k^2 log(V / k)) expected, O(V k) at worst.
template <typename acc_t>
struct TopList {
  std::vector<acc_t> values;  // [size <= k]
  std::vector<int64_t> ids;   // [size <= k]
  int64_t k;

  explicit TopList(int64_t k_) : k(k_) {
    values.reserve(k_);
    ids.reserve(k_);
  }

  bool full() const { return static_cast<int64_t>(ids.size()) == k; }

  void push(acc_t value, int64_t id) {
    if (full() && !ranks_before(value, id, values.back(), ids.back())) {
      return;
    }
    if (full()) {
      values.pop_back();
      ids.pop_back();
    }
    int64_t at = static_cast<int64_t>(ids.size());
    while (at > 0 && ranks_before(value, id, values[at - 1], ids[at - 1])) {
      --at;
    }
    values.insert(values.begin() + at, value);
    ids.insert(ids.begin() + at, id);
  }
};

// The first element of the order over x[0, V): one scalar pass. O(V).
template <typename scalar_t>
int64_t argmax_scalar(const scalar_t* x, int64_t vocab) {
  using acc_t = at::opmath_type<scalar_t>;
  acc_t best = static_cast<acc_t>(x[0]);
  int64_t best_id = 0;
  for (int64_t v = 1; v < vocab; ++v) {
    const acc_t value = static_cast<acc_t>(x[v]);
    if (ranks_before(value, v, best, best_id)) {
      best = value;
      best_id = v;
    }
  }
  return best_id;
}

template <typename scalar_t>
void topk_scalar(const scalar_t* x, int64_t vocab, int64_t k, int64_t* out /*[k]*/) {
  using acc_t = at::opmath_type<scalar_t>;
  TopList<acc_t> list(k);
  for (int64_t v = 0; v < vocab; ++v) {
    list.push(static_cast<acc_t>(x[v]), v);
  }
  std::copy(list.ids.begin(), list.ids.end(), out);
}

#if SPECDEC_VECTORS
using f32x8 = float __attribute__((vector_size(32)));
using i32x8 = int32_t __attribute__((vector_size(32)));

// Argmax of float32 x[0, V) in eight lanes: lane l keeps the first maximum among x[l], x[l + 8],
// ... (strict '>' keeps the earliest), and the lanes merge by (value desc, id asc). NaN never
// wins a '>' test, so the lanes also record whether a NaN went by; then the result is -1 and the
// caller rescans exactly. O(V), ~8 elements per instruction. Requires 8 <= V < 2^31.
SPECDEC_MULTIVERSION int64_t argmax_f32_lanes(const float* x, int64_t vocab) {
  const i32x8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
  f32x8 best;
  std::memcpy(&best, x, sizeof best);
  i32x8 best_id = lane;
  i32x8 saw_nan = best != best;
  int32_t v = 8;
  for (; v + 8 <= vocab; v += 8) {
    f32x8 chunk;
    std::memcpy(&chunk, x + v, sizeof chunk);
    const i32x8 better = chunk > best;
    best = better ? chunk : best;
    best_id = better ? lane + v : best_id;
    saw_nan |= chunk != chunk;
  }
  float merged = best[0];
  int64_t merged_id = best_id[0];
  bool nan = saw_nan[0] != 0;
  for (int l = 1; l < 8; ++l) {
    nan = nan || saw_nan[l] != 0;
    if (best[l] > merged || (best[l] == merged && best_id[l] < merged_id)) {
      merged = best[l];
      merged_id = best_id[l];
    }
  }
  for (; v < vocab; ++v) {  // the tail: ids are larger, so only a strictly larger value wins
    nan = nan || x[v] != x[v];
    if (x[v] > merged) {
      merged = x[v];
      merged_id = v;
    }
  }
  return nan ? -1 : merged_id;
}

// Top-k of float32 x[0, V): the list is fed in chunks of eight; once it is full, a chunk whose
// elements are all <= the list's last value (and hold no NaN) cannot change it, and one
// vector compare skips it. O(V) plus the insertions of TopList.
SPECDEC_MULTIVERSION void topk_f32_filtered(const float* x, int64_t vocab, int64_t k, int64_t* out /*[k]*/) {
  TopList<float> list(k);
  int64_t v = 0;
  for (; v < vocab && !list.full(); ++v) {
    list.push(x[v], v);
  }
  for (; v + 8 <= vocab; v += 8) {
    const float last = list.values.back();
    if (last != last) {
      break;  // k NaNs listed: nothing later can enter (NaN ties go to the lower id)
    }
    f32x8 chunk;
    std::memcpy(&chunk, x + v, sizeof chunk);
    const i32x8 may_enter = (chunk > last) | (chunk != chunk);
    bool any = false;
    for (int l = 0; l < 8; ++l) {
      any = any || may_enter[l] != 0;
    }
    if (any) {
      for (int l = 0; l < 8; ++l) {
        list.push(chunk[l], v + l);
      }
    }
  }
  for (; v < vocab; ++v) {
    list.push(x[v], v);
  }
  std::copy(list.ids.begin(), list.ids.end(), out);
}
#endif  // SPECDEC_VECTORS

// The choice (first of the order) and, when k > 0, the top-k ids of one row x[0, V).
template <typename scalar_t>
void choose_row(const scalar_t* x, int64_t vocab, int64_t k, int64_t* choice, int64_t* top /*[k]*/) {
#if SPECDEC_VECTORS
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (k > 0) {
      topk_f32_filtered(x, vocab, k, top);
      *choice = top[0];
      return;
    }
    if (vocab >= 8 && vocab <= std::numeric_limits<int32_t>::max()) {
      const int64_t found = argmax_f32_lanes(x, vocab);
      *choice = found >= 0 ? found : argmax_scalar(x, vocab);
      return;
    }
  }
#endif
  if (k > 0) {
    topk_scalar(x, vocab, k, top);
    *choice = top[0];
  } else {
    *choice = argmax_scalar(x, vocab);
  }
}

// Follows the model's choices down one tree; writes path [N] (-1 past the end) and returns its
// length. O(N): children come after their parent, so a single upward scan meets the current
// node's children before any of their descendants; when node j is the chosen child, the walk
// moves there and the scan goes on from j + 1. Siblings carry distinct tokens, so at most one
// child matches (with duplicates the lowest index would win, as in the CUDA kernel).
int64_t walk_tree(const int64_t* choices /*[N]*/, const int64_t* tokens /*[N]*/, const int64_t* parents /*[N]*/,
                  int64_t nodes, int64_t* path /*[N]*/) {
  int64_t length = 1;
  int64_t node = 0;
  path[0] = 0;
  for (int64_t j = 1; j < nodes; ++j) {
    if (parents[j] == node && tokens[j] == choices[node]) {
      path[length++] = j;
      node = j;
    }
  }
  std::fill(path + length, path + nodes, int64_t{-1});
  return length;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> tree_accept_cpu(
    const at::Tensor& logits_in, const at::Tensor& tokens_in, const at::Tensor& parents_in, int64_t topk,
    const std::optional<at::Tensor>& given_choices, const std::optional<at::Tensor>& status) {
  check_accept_args(logits_in, tokens_in, parents_in, topk, given_choices);
  check_status_arg(status, logits_in.device(), "specdec::tree_accept");
  const int64_t batch = logits_in.size(0);
  const int64_t nodes = logits_in.size(1);
  const int64_t vocab = logits_in.size(2);
  const at::Tensor logits = logits_in.contiguous();    // [B, N, V]
  const at::Tensor tokens = tokens_in.contiguous();    // [B, N] int64
  const at::Tensor parents = parents_in.contiguous();  // [B, N] int64
  const at::Tensor given = given_choices.has_value() ? given_choices->contiguous() : at::Tensor();  // [B, N] or none
  raise_fault(first_fault(AcceptChecks{parents.data_ptr<int64_t>(), tokens.data_ptr<int64_t>(),
                                       given.defined() ? given.data_ptr<int64_t>() : nullptr, batch, nodes, vocab}));

  const auto index_options = tokens.options();
  at::Tensor choices = at::empty({batch, nodes}, index_options);     // [B, N]
  at::Tensor path = at::empty({batch, nodes}, index_options);        // [B, N], -1 past the end
  at::Tensor path_len = at::empty({batch}, index_options);           // [B]
  at::Tensor bonus = at::empty({batch}, index_options);              // [B]
  at::Tensor top = at::empty({batch, nodes, topk}, index_options);   // [B, N, k]
  int64_t* choices_ptr = choices.data_ptr<int64_t>();
  int64_t* top_ptr = top.data_ptr<int64_t>();

  if (given.defined()) {  // a sampling chooser decided: keep its tokens, add the top-k
    choices.copy_(given);
  }
  const bool greedy = !given.defined();
  if (greedy || topk > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logits.scalar_type(), "tree_accept_cpu", [&] {
      const scalar_t* rows = logits.data_ptr<scalar_t>();  // [B * N, V]
      int64_t ignored = 0;  // the choice slot when a chooser already decided
      for (int64_t r = 0; r < batch * nodes; ++r) {
        choose_row(rows + r * vocab, vocab, topk, greedy ? choices_ptr + r : &ignored, top_ptr + r * topk);
      }
    });
  }

  const int64_t* tokens_ptr = tokens.data_ptr<int64_t>();
  const int64_t* parents_ptr = parents.data_ptr<int64_t>();
  int64_t* path_ptr = path.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t offset = b * nodes;
    const int64_t length =
        walk_tree(choices_ptr + offset, tokens_ptr + offset, parents_ptr + offset, nodes, path_ptr + offset);
    path_len.data_ptr<int64_t>()[b] = length;
    bonus.data_ptr<int64_t>()[b] = choices_ptr[offset + path_ptr[offset + length - 1]];
  }
  return {choices, path, path_len, bonus, top};
}

// ---------------------------------------------------------------------------------------------
// compact_kv

// Every tensor of `cache` is [B, H, S, D] (keys and values of every layer). For each sequence b,
// accepted node path[b, i] (i < path_len[b]) moves from slot tree_start + path[b, i] to slot
// dest_starts[b] + i. Done in place in increasing i: path is strictly increasing, so path[b, j]
// >= j and every later source slot tree_start + path[b, j] lies above every slot written so far
// (dest_starts[b] + i <= tree_start + i < tree_start + path[b, j] for i < j). O(layers * B * H *
// accepted * D) bytes moved; slots past the path are left for the caller to crop.
void compact_kv_cpu(at::TensorList cache, const at::Tensor& path_in, const at::Tensor& path_len_in,
                    const at::Tensor& dest_in, int64_t tree_start, const std::optional<at::Tensor>& status) {
  check_compact_args(cache, path_in, path_len_in, dest_in, tree_start);
  check_status_arg(status, path_in.device(), "specdec::compact_kv");
  const int64_t batch = path_in.size(0);
  const int64_t nodes = path_in.size(1);
  const at::Tensor path = path_in.contiguous();          // [B, N] int64
  const at::Tensor path_len = path_len_in.contiguous();  // [B] int64
  const at::Tensor dest = dest_in.contiguous();          // [B] int64
  raise_fault(first_fault(compact_checks(cache, path, path_len, dest, tree_start)));
  const int64_t* path_ptr = path.data_ptr<int64_t>();
  const int64_t* len_ptr = path_len.data_ptr<int64_t>();
  const int64_t* dest_ptr = dest.data_ptr<int64_t>();
  for (size_t t = 0; t < cache.size(); ++t) {
    const at::Tensor& kv = cache[t];
    const int64_t item = kv.element_size();
    const int64_t row_bytes = kv.size(3) * item;
    char* base = static_cast<char*>(kv.data_ptr());  // [B, H, S, D] elements of `item` bytes
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < kv.size(1); ++h) {
        char* head = base + (b * kv.stride(0) + h * kv.stride(1)) * item;  // [S, D] of one head
        for (int64_t i = 0; i < len_ptr[b]; ++i) {
          const int64_t source = tree_start + path_ptr[b * nodes + i];
          const int64_t target = dest_ptr[b] + i;
          if (source != target) {
            std::memcpy(head + target * kv.stride(2) * item, head + source * kv.stride(2) * item, row_bytes);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace specdec

namespace specdec {
namespace {

// check_status: raises the fault a status records (see faults.h), on the host. A CUDA status is
// copied to the host first: that is a synchronization, so callers on the fast path read the
// status in the copy they make anyway and pass its host copy here (ExtTreeOps.accept).
void check_status(const at::Tensor& status) {
  check_status_arg(status, status.device(), "specdec::check_status");
  const at::Tensor host = status.to(at::kCPU);
  raise_fault(load_fault(host.data_ptr<int64_t>()));
}

}  // namespace
}  // namespace specdec

// Every op takes an optional `status` (int64 [8], zeros; faults.h): on the CPU a bad value raises at
// once either way; on CUDA, without a status the op checks its values on the device and reads the
// verdict back (one host sync) before launching anything, and with one it records the first fault
// there for the caller's own sync to report (check_status), with no sync of its own.
TORCH_LIBRARY(specdec, m) {
  // parents int64 [B, N], committed_lens int64 [B] -> mask [B, 1, N, tree_start + N] (bool, or
  // additive_dtype with 0 / finfo.min), position_ids int64 [B, N].
  m.def(
      "tree_mask(Tensor parents, Tensor committed_lens, SymInt tree_start, ScalarType? additive_dtype=None, "
      "Tensor(a!)? status=None) -> (Tensor mask, Tensor position_ids)");
  // logits float [B, N, V], tokens and parents int64 [B, N], choices int64 [B, N] (from a sampling
  // chooser; None: greedy) -> choices [B, N], path [B, N] (-1 past the end), path_len [B],
  // bonus [B], topk_ids [B, N, topk], all int64.
  m.def(
      "tree_accept(Tensor logits, Tensor tokens, Tensor parents, int topk, Tensor? choices=None, "
      "Tensor(a!)? status=None) -> (Tensor choices, Tensor path, Tensor path_len, Tensor bonus, Tensor topk_ids)");
  // cache: [B, H, S, D] tensors, edited in place; path int64 [B, N], path_len and dest_starts int64 [B].
  m.def(
      "compact_kv(Tensor(a!)[] cache, Tensor path, Tensor path_len, Tensor dest_starts, SymInt tree_start, "
      "Tensor(b!)? status=None) -> ()");
  // status int64 [8] on any device -> raises the RuntimeError naming the fault it records, if any.
  m.def("check_status(Tensor status) -> ()", &specdec::check_status);
}

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("tree_mask", &specdec::tree_mask_cpu);
  m.impl("tree_accept", &specdec::tree_accept_cpu);
  m.impl("compact_kv", &specdec::compact_kv_cpu);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.doc() = "specdec tree operations; the ops themselves are torch.ops.specdec.*";
  module.def("has_cuda_kernels", [] { return kHasCudaKernels; },
             "Whether this build carries the CUDA kernels (tree_ops_cuda.cu) besides the CPU ones.");
}
