// specdec tree operations: the CUDA kernels (schemas and CPU kernels: tree_ops.cpp; layouts and
// the order on logits: tree_ops.h).
//
// Every launch goes on the current stream. The ops read their index inputs (parents, tokens,
// path, lengths) on the device, so the host never needs their values: the one synchronization of
// a verification step is the caller's copy of the small acceptance results to the host
// (specdec/backends/cuda_ext/backend.py).
//
// Bad values. Shapes, dtypes and devices are checked on the host (checks.h). Values are checked
// on the device: each op first launches first_fault_kernel over its items (faults.h), which
// records the first bad value in a status tensor. Without a status from the caller, the op reads
// that verdict back at once (a host sync) and raises before launching anything else; with one,
// it launches on and the caller reports the fault at its own sync (specdec::check_status), so
// the fast path pays one tiny launch per op and no sync. Either way the kernels themselves never
// read or write out of bounds whatever the values (every index they follow is range-checked or
// clamped; a parent walk stops at a parent that does not decrease), and compact_kv moves nothing
// while the status records a fault: bad input can produce wrong outputs that are reported as a
// fault, never a device-side assert or a stray write that would poison the CUDA context.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "checks.h"
#include "faults.h"
#include "tree_ops.h"

namespace specdec {
namespace {

constexpr int kWarp = 32;

constexpr int64_t kMaxGridX = std::numeric_limits<int32_t>::max();  // blocks along a grid's x axis

void check_on_cuda(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got one on ", t.device());
}

// ---------------------------------------------------------------------------------------------
// Value checks on the device (faults.h): one block scans the items of `checks` in order, blockDim
// at a time; the lowest failing item of the first chunk that has one is the first fault, written
// into status[kStatusWords] unless status already records one (an earlier op's fault stands).
// O(items / blockDim) steps of one predicate each; the items are a few per tree node.
constexpr int kCheckThreads = 256;

template <typename Checks>
__global__ void first_fault_kernel(Checks checks, int64_t* __restrict__ status) {
  __shared__ unsigned long long first;  // the lowest failing item of the current chunk
  if (status[0] != kNoFault) {
    return;  // the same for every thread: this kernel writes status only as its last act
  }
  const int64_t items = checks.items();
  for (int64_t chunk = 0; chunk < items; chunk += blockDim.x) {
    if (threadIdx.x == 0) {
      first = ~0ull;
    }
    __syncthreads();
    const int64_t item = chunk + threadIdx.x;
    Fault fault;
    const bool bad = item < items && checks.fault(item, &fault);
    if (bad) {
      atomicMin(&first, static_cast<unsigned long long>(item));
    }
    __syncthreads();
    const unsigned long long found = first;
    __syncthreads();  // every thread has read `first` before thread 0 resets it
    if (found != ~0ull) {
      if (bad && static_cast<unsigned long long>(item) == found) {
        store_fault(fault, status);
      }
      return;
    }
  }
}

// Checks an op's values on the device before its kernels run. With the caller's status the
// verdict stays there, for the caller's own sync to report; without one, a fresh status is read
// back at once (this call's one host sync) and a fault raises here, before anything else is
// launched. Returns the status the op's kernels consult.
template <typename Checks>
at::Tensor check_values(const Checks& checks, const std::optional<at::Tensor>& status_in, const at::Tensor& like,
                        cudaStream_t stream) {
  at::Tensor status =
      status_in.has_value() ? *status_in : at::zeros({kStatusWords}, like.options().dtype(at::kLong));  // [8]
  if (checks.items() > 0) {
    first_fault_kernel<Checks><<<1, kCheckThreads, 0, stream>>>(checks, status.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (!status_in.has_value()) {
    const at::Tensor host = status.cpu();  // host sync: the caller chose a checked call over a status
    raise_fault(load_fault(host.data_ptr<int64_t>()));
  }
  return status;
}

// ---------------------------------------------------------------------------------------------
// tree_mask: one block per mask row (b, i).
//
// parents [B, N] int64, committed [B] int64, mask [B, N, W] mask_t (W = tree_start + N),
// positions [B, N] int64; dynamic shared memory: N bytes (node i's ancestor-or-self flags).
// Thread 0 walks from node i up to the root (depth(i) steps, and a parent index that does not
// decrease ends the walk, so bad input cannot loop); then the block writes the row, coalesced.
// O(W + depth) per row.
template <typename mask_t>
__global__ void tree_mask_kernel(const int64_t* __restrict__ parents, const int64_t* __restrict__ committed,
                                 int64_t nodes, int64_t tree_start, mask_t allow, mask_t deny,
                                 mask_t* __restrict__ mask, int64_t* __restrict__ positions) {
  extern __shared__ unsigned char on_path[];  // [N]
  const int64_t row = blockIdx.x;             // b * N + i
  const int64_t b = row / nodes;
  const int64_t i = row % nodes;
  const int64_t* tree_parents = parents + b * nodes;  // [N]
  for (int64_t j = threadIdx.x; j < nodes; j += blockDim.x) {
    on_path[j] = 0;
  }
  __syncthreads();
  const int64_t visible = committed[b];
  if (threadIdx.x == 0) {
    on_path[i] = 1;
    int64_t depth = 0;
    int64_t node = i;
    while (node > 0) {
      const int64_t parent = tree_parents[node];
      if (parent < 0 || parent >= node) {
        break;  // node is padding (or the input is bad): it has no ancestors
      }
      on_path[parent] = 1;
      ++depth;
      node = parent;
    }
    positions[row] = visible + depth;
  }
  __syncthreads();
  const int64_t width = tree_start + nodes;
  mask_t* out = mask + row * width;  // [W]
  for (int64_t col = threadIdx.x; col < width; col += blockDim.x) {
    const bool allowed = col < tree_start ? col < visible : on_path[col - tree_start] != 0;
    out[col] = allowed ? allow : deny;
  }
}

// The kernel's shared memory holds one flag per node: 48 KiB, the limit without an opt-in.
constexpr int64_t kMaxMaskNodes = 48 * 1024;

std::tuple<at::Tensor, at::Tensor> tree_mask_cuda(const at::Tensor& parents_in, const at::Tensor& committed_in,
                                                  int64_t tree_start, std::optional<at::ScalarType> additive_dtype,
                                                  const std::optional<at::Tensor>& status) {
  const char* op = "specdec::tree_mask";
  check_on_cuda(parents_in, op, "parents");
  const auto dtype = check_mask_args(parents_in, committed_in, tree_start, additive_dtype);
  check_status_arg(status, parents_in.device(), op);
  const int64_t batch = parents_in.size(0);
  const int64_t nodes = parents_in.size(1);
  TORCH_CHECK(nodes <= kMaxMaskNodes, op, ": trees of ", nodes, " nodes are more than the CUDA kernel's ",
              kMaxMaskNodes, " (one byte of shared memory per node)");
  TORCH_CHECK(batch * nodes <= kMaxGridX, op, ": ", batch, " x ", nodes, " mask rows are more than a grid allows");
  const c10::cuda::CUDAGuard guard(parents_in.device());
  const at::Tensor parents = parents_in.contiguous();      // [B, N] int64
  const at::Tensor committed = committed_in.contiguous();  // [B] int64
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (batch > 0) {
    check_values(MaskChecks{parents.data_ptr<int64_t>(), committed.data_ptr<int64_t>(), batch, nodes, tree_start},
                 status, parents, stream);
  }
  at::Tensor mask = at::empty({batch, 1, nodes, tree_start + nodes}, parents.options().dtype(dtype));
  at::Tensor positions = at::empty({batch, nodes}, parents.options());
  if (batch == 0) {
    return {mask, positions};
  }
  const int threads = 256;
  const size_t shared = static_cast<size_t>(nodes);
  if (dtype == at::kBool) {
    tree_mask_kernel<bool><<<static_cast<unsigned>(batch * nodes), threads, shared, stream>>>(
        parents.data_ptr<int64_t>(), committed.data_ptr<int64_t>(), nodes, tree_start, true, false,
        mask.data_ptr<bool>(), positions.data_ptr<int64_t>());
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "tree_mask_cuda", [&] {
      tree_mask_kernel<scalar_t><<<static_cast<unsigned>(batch * nodes), threads, shared, stream>>>(
          parents.data_ptr<int64_t>(), committed.data_ptr<int64_t>(), nodes, tree_start, scalar_t(0),
          std::numeric_limits<scalar_t>::lowest(), mask.data_ptr<scalar_t>(), positions.data_ptr<int64_t>());
    });
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {mask, positions};
}

// ---------------------------------------------------------------------------------------------
// tree_accept, part 1: the top `rounds` entries of each logits row, one block per row.
//
// Round r finds the first element of the order among those ranked after round r - 1's winner,
// so the rounds list the row's top entries in order (O(rounds * V) reads per row; rounds is 1
// for a plain greedy choice, k for the top-k feedback, which drafters ask small: 8 or so).
// Each thread scans a strided slice, then the block reduces (warp shuffles, then one warp over
// the per-warp winners). logits [R, V]; choices [R] int64 or null; topk [R, k] int64.
template <typename acc_t>
struct Candidate {
  acc_t value;
  int64_t id;  // -1: none yet
};

template <typename acc_t>
__device__ __forceinline__ Candidate<acc_t> better_of(Candidate<acc_t> a, Candidate<acc_t> b) {
  if (a.id < 0) return b;
  if (b.id < 0) return a;
  return ranks_before(b.value, b.id, a.value, a.id) ? b : a;
}

template <typename acc_t>
__device__ __forceinline__ Candidate<acc_t> warp_best(Candidate<acc_t> mine) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    Candidate<acc_t> other;
    other.value = __shfl_down_sync(0xffffffffu, mine.value, offset);
    other.id = __shfl_down_sync(0xffffffffu, mine.id, offset);
    mine = better_of(mine, other);
  }
  return mine;
}

template <typename scalar_t>
__global__ void row_top_kernel(const scalar_t* __restrict__ logits, int64_t vocab, int64_t rounds, int64_t k,
                               int64_t* __restrict__ choices, int64_t* __restrict__ topk) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ Candidate<acc_t> warp_winners[32];  // one per warp (blockDim <= 1024)
  __shared__ Candidate<acc_t> winner;            // the previous round's, read by every thread
  const int64_t row = blockIdx.x;
  const scalar_t* x = logits + row * vocab;  // [V]
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = (blockDim.x + kWarp - 1) / kWarp;
  Candidate<acc_t> previous{acc_t(0), -1};
  for (int64_t r = 0; r < rounds; ++r) {
    Candidate<acc_t> mine{acc_t(0), -1};
    for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
      const acc_t value = static_cast<acc_t>(x[v]);
      const bool eligible = previous.id < 0 || ranks_before(previous.value, previous.id, value, v);
      if (eligible && (mine.id < 0 || ranks_before(value, v, mine.value, mine.id))) {
        mine = {value, v};
      }
    }
    mine = warp_best(mine);
    if (lane == 0) {
      warp_winners[warp] = mine;
    }
    __syncthreads();
    if (warp == 0) {
      Candidate<acc_t> best = lane < warps ? warp_winners[lane] : Candidate<acc_t>{acc_t(0), -1};
      best = warp_best(best);
      if (lane == 0) {
        winner = best;
        if (r < k) topk[row * k + r] = best.id;
        if (r == 0 && choices != nullptr) choices[row] = best.id;
      }
    }
    __syncthreads();
    previous = winner;
    __syncthreads();  // `winner` and `warp_winners` are rewritten next round
  }
}

// tree_accept, part 2: the walk, one warp per tree. choices, tokens, parents [B, N] int64 ->
// path [B, N] (-1 past the end), path_len [B], bonus [B].
//
// The warp scans 32 nodes at a time for the child of the current node that carries its choice
// (__ballot_sync; the lowest matching index wins, as in the CPU scan); on a hit the walk moves
// there and the scan resumes after it (children follow their parent). O(N / 32 + depth) steps.
__global__ void walk_kernel(const int64_t* __restrict__ choices, const int64_t* __restrict__ tokens,
                            const int64_t* __restrict__ parents, int64_t nodes, int64_t* __restrict__ path,
                            int64_t* __restrict__ path_len, int64_t* __restrict__ bonus) {
  const int64_t b = blockIdx.x;
  const int lane = threadIdx.x;
  const int64_t* tree_choices = choices + b * nodes;  // [N]
  const int64_t* tree_tokens = tokens + b * nodes;    // [N]
  const int64_t* tree_parents = parents + b * nodes;  // [N]
  int64_t* tree_path = path + b * nodes;              // [N]
  int64_t node = 0;
  int64_t length = 1;
  int64_t wanted = tree_choices[0];
  if (lane == 0) {
    tree_path[0] = 0;
  }
  int64_t start = 1;
  while (start < nodes) {  // start, node and wanted are the same in every lane
    const int64_t j = start + lane;
    const bool hit = j < nodes && tree_parents[j] == node && tree_tokens[j] == wanted;
    const unsigned hits = __ballot_sync(0xffffffffu, hit);
    if (hits != 0) {
      const int64_t found = start + __ffs(hits) - 1;
      if (lane == 0) {
        tree_path[length] = found;
      }
      ++length;
      node = found;
      wanted = tree_choices[found];
      start = found + 1;
    } else {
      start += kWarp;
    }
  }
  for (int64_t j = length + lane; j < nodes; j += kWarp) {
    tree_path[j] = -1;
  }
  if (lane == 0) {
    path_len[b] = length;
    bonus[b] = wanted;
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> tree_accept_cuda(
    const at::Tensor& logits_in, const at::Tensor& tokens_in, const at::Tensor& parents_in, int64_t topk,
    const std::optional<at::Tensor>& given_choices, const std::optional<at::Tensor>& status) {
  const char* op = "specdec::tree_accept";
  check_on_cuda(logits_in, op, "logits");
  check_accept_args(logits_in, tokens_in, parents_in, topk, given_choices);
  check_status_arg(status, logits_in.device(), op);
  const int64_t batch = logits_in.size(0);
  const int64_t nodes = logits_in.size(1);
  const int64_t vocab = logits_in.size(2);
  TORCH_CHECK(batch * nodes <= kMaxGridX, op, ": ", batch, " x ", nodes, " logits rows are more than a grid allows");
  const c10::cuda::CUDAGuard guard(logits_in.device());
  const at::Tensor logits = logits_in.contiguous();    // [B, N, V]
  const at::Tensor tokens = tokens_in.contiguous();    // [B, N] int64
  const at::Tensor parents = parents_in.contiguous();  // [B, N] int64
  const at::Tensor given = given_choices.has_value() ? given_choices->contiguous() : at::Tensor();  // [B, N] or none
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (batch > 0) {
    check_values(AcceptChecks{parents.data_ptr<int64_t>(), tokens.data_ptr<int64_t>(),
                              given.defined() ? given.data_ptr<int64_t>() : nullptr, batch, nodes, vocab},
                 status, tokens, stream);
  }
  const auto index_options = tokens.options();
  at::Tensor choices = at::empty({batch, nodes}, index_options);    // [B, N]
  at::Tensor path = at::empty({batch, nodes}, index_options);       // [B, N]
  at::Tensor path_len = at::empty({batch}, index_options);          // [B]
  at::Tensor bonus = at::empty({batch}, index_options);             // [B]
  at::Tensor top = at::empty({batch, nodes, topk}, index_options);  // [B, N, k]
  if (batch == 0) {
    return {choices, path, path_len, bonus, top};
  }
  const bool greedy = !given.defined();
  if (!greedy) {
    choices.copy_(given);  // device to device, on the stream: no host wait
  }
  const int64_t rounds = greedy ? std::max<int64_t>(topk, 1) : topk;
  if (rounds > 0) {
    // 256 threads read 1 KiB of float32 per step, coalesced; V = 49,152 is 192 steps per round.
    const int threads = static_cast<int>(std::min<int64_t>(256, ((vocab + kWarp - 1) / kWarp) * kWarp));
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logits.scalar_type(), "tree_accept_cuda", [&] {
      row_top_kernel<scalar_t><<<static_cast<unsigned>(batch * nodes), threads, 0, stream>>>(
          logits.data_ptr<scalar_t>(), vocab, rounds, topk, greedy ? choices.data_ptr<int64_t>() : nullptr,
          top.data_ptr<int64_t>());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  walk_kernel<<<static_cast<unsigned>(batch), kWarp, 0, stream>>>(choices.data_ptr<int64_t>(), tokens.data_ptr<int64_t>(),
                                           parents.data_ptr<int64_t>(), nodes, path.data_ptr<int64_t>(),
                                           path_len.data_ptr<int64_t>(), bonus.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {choices, path, path_len, bonus, top};
}

// ---------------------------------------------------------------------------------------------
// compact_kv: every layer's keys and values in one launch per 32 tensors.
//
// The tensors' addresses and strides travel as a kernel argument (no host-to-device copy, so
// nothing to wait for). Grid: (tensor, b, head); each thread owns head_dim columns d, d +
// blockDim, ... of one (tensor, b, head) and copies them for i = 0, 1, ... in order. No two
// threads touch the same element, and in-order copying is safe in place: every later source
// slot lies above every slot already written (see compact_kv_cpu). word_t has the element's
// size, so one kernel serves every dtype.
constexpr int kTensorsPerLaunch = 32;

struct CacheTable {
  char* data[kTensorsPerLaunch];  // [B, H, S, D] tensors' base addresses
  int64_t stride_b[kTensorsPerLaunch];  // strides in elements
  int64_t stride_h[kTensorsPerLaunch];
  int64_t stride_s[kTensorsPerLaunch];
  int64_t heads[kTensorsPerLaunch];
  int64_t slots[kTensorsPerLaunch];
  int64_t head_dim[kTensorsPerLaunch];
};

// status [kStatusWords]: the checks ran before this kernel, on the same stream; while it records a
// fault nothing moves. The bounds below are checked again all the same, so that no value can
// send a read or a write outside the path or the cache.
template <typename word_t>
__global__ void compact_kv_kernel(CacheTable table, const int64_t* __restrict__ path,
                                  const int64_t* __restrict__ path_len, const int64_t* __restrict__ dest,
                                  int64_t nodes, int64_t tree_start, const int64_t* __restrict__ status) {
  const int t = blockIdx.x;
  const int64_t b = blockIdx.y;
  const int64_t h = blockIdx.z;
  if (h >= table.heads[t] || status[0] != kNoFault) {
    return;
  }
  word_t* head = reinterpret_cast<word_t*>(table.data[t]) + b * table.stride_b[t] + h * table.stride_h[t];
  const int64_t stride_s = table.stride_s[t];
  const int64_t slots = table.slots[t];
  const int64_t length = min(max(path_len[b], int64_t{0}), nodes);
  const int64_t first_target = dest[b];
  const int64_t* tree_path = path + b * nodes;  // [N]
  for (int64_t d = threadIdx.x; d < table.head_dim[t]; d += blockDim.x) {
    for (int64_t i = 0; i < length; ++i) {
      const int64_t node = tree_path[i];
      // Both slots inside [0, slots), compared without forming an out-of-range sum.
      const bool in_bounds = node >= 0 && node < slots - tree_start && first_target >= 0 && first_target < slots - i;
      const int64_t source = tree_start + node;
      const int64_t target = first_target + i;
      if (in_bounds && source != target) {
        head[target * stride_s + d] = head[source * stride_s + d];
      }
    }
  }
}

void compact_kv_cuda(at::TensorList cache, const at::Tensor& path_in, const at::Tensor& path_len_in,
                     const at::Tensor& dest_in, int64_t tree_start, const std::optional<at::Tensor>& status_in) {
  const char* op = "specdec::compact_kv";
  check_on_cuda(path_in, op, "path");
  check_compact_args(cache, path_in, path_len_in, dest_in, tree_start);
  check_status_arg(status_in, path_in.device(), op);
  const int64_t batch = path_in.size(0);
  const int64_t nodes = path_in.size(1);
  if (batch == 0) {
    return;
  }
  const int64_t item = cache.empty() ? 1 : cache[0].element_size();  // every tensor's (checks.h)
  TORCH_CHECK(item == 1 || item == 2 || item == 4 || item == 8, op, ": the CUDA kernel moves elements of 1, 2, 4 or 8 bytes, "
              "cache[0] has ", item);
  int64_t max_heads = 1;
  int64_t max_head_dim = 1;
  for (size_t t = 0; t < cache.size(); ++t) {
    const at::Tensor& kv = cache[t];
    TORCH_CHECK(kv.size(1) <= 65535, op, ": cache[", t, "] has ", kv.size(1), " heads, more than a grid allows");
    max_heads = std::max(max_heads, kv.size(1));
    max_head_dim = std::max(max_head_dim, kv.size(3));
  }
  TORCH_CHECK(batch <= 65535, op, ": a batch of ", batch, " sequences is more than a grid allows");
  const c10::cuda::CUDAGuard guard(path_in.device());
  const at::Tensor path = path_in.contiguous();          // [B, N] int64
  const at::Tensor path_len = path_len_in.contiguous();  // [B] int64
  const at::Tensor dest = dest_in.contiguous();          // [B] int64
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor status = check_values(compact_checks(cache, path, path_len, dest, tree_start), status_in, path, stream);
  if (cache.empty()) {
    return;
  }
  const int threads = static_cast<int>(std::min<int64_t>(256, ((max_head_dim + kWarp - 1) / kWarp) * kWarp));
  for (size_t first = 0; first < cache.size(); first += kTensorsPerLaunch) {
    const int count = static_cast<int>(std::min<size_t>(kTensorsPerLaunch, cache.size() - first));
    CacheTable table{};
    for (int t = 0; t < count; ++t) {
      const at::Tensor& kv = cache[first + t];
      table.data[t] = static_cast<char*>(kv.data_ptr());
      table.stride_b[t] = kv.stride(0);
      table.stride_h[t] = kv.stride(1);
      table.stride_s[t] = kv.stride(2);
      table.heads[t] = kv.size(1);
      table.slots[t] = kv.size(2);
      table.head_dim[t] = kv.size(3);
    }
    const dim3 grid(count, static_cast<unsigned>(batch), static_cast<unsigned>(max_heads));
    const int64_t* path_ptr = path.data_ptr<int64_t>();
    const int64_t* len_ptr = path_len.data_ptr<int64_t>();
    const int64_t* dest_ptr = dest.data_ptr<int64_t>();
    const auto launch = [&](auto word) {  // word: a value of the unsigned type as wide as one element
      using word_t = decltype(word);
      compact_kv_kernel<word_t><<<grid, threads, 0, stream>>>(table, path_ptr, len_ptr, dest_ptr, nodes, tree_start,
                                                             status.data_ptr<int64_t>());
    };
    switch (item) {
      case 1: launch(uint8_t{}); break;
      case 2: launch(uint16_t{}); break;
      case 4: launch(uint32_t{}); break;
      default: launch(uint64_t{}); break;  // 8 (checked above)
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

}  // namespace
}  // namespace specdec

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("tree_mask", &specdec::tree_mask_cuda);
  m.impl("tree_accept", &specdec::tree_accept_cuda);
  m.impl("compact_kv", &specdec::compact_kv_cuda);
}
