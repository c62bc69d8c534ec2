// specdec tree operations: what the CPU (tree_ops.cpp) and CUDA (tree_ops_cuda.cu) kernels share.
//
// Vocabulary (specdec/types.py): a draft tree of N nodes has tokens[N] and parents[N], node 0
// the root (the pending token), parents[0] == -1, 0 <= parents[i] < i otherwise. It is verified
// after C committed tokens: node i sits at position C + depth(i) and its keys and values are
// written to slot tree_start + i. The three operations (schemas in tree_ops.cpp):
//
//   tree_mask   parents -> the 4D attention mask and the position ids the model takes;
//   tree_accept logits -> the model's choice at every node, the accepted path, the bonus
//               (the new pending token) and the top-k ids per node;
//   compact_kv  the accepted nodes' keys and values moved into place, all layers in one call.
//
// Batches. Every operation takes B trees padded to one N. The B sequences share one cache
// layout: sequence b's committed slots are [0, committed_lens[b]), slots [committed_lens[b],
// tree_start) are padding nobody attends to, and its tree occupies [tree_start, tree_start + N).
// A node i > 0 whose parent is -1 is padding: it sees the committed slots and itself, sits at
// depth 0, and no walk reaches it (it is nobody's child). With B == 1, tree_start == C.
//
// The one order on (logit, token id) pairs that every choice and every top-k list follows:
// larger value first; NaN counts as larger than every number (as torch.argmax and torch.topk
// treat it); equal values, and NaN against NaN, go to the lower token id. The greedy choice is
// the first element of this order, so topk[:, 0] == choice always.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPECDEC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SPECDEC_HOST_DEVICE inline
#endif

namespace specdec {

// True when (a, a_id) comes before (b, b_id) in the order above. acc_t is float or double:
// half and bfloat16 logits widen to float exactly, so widening never breaks or makes a tie.
template <typename acc_t>
SPECDEC_HOST_DEVICE bool ranks_before(acc_t a, int64_t a_id, acc_t b, int64_t b_id) {
  const bool a_nan = a != a;
  const bool b_nan = b != b;
  if (a_nan || b_nan) {
    return a_nan && (!b_nan || a_id < b_id);
  }
  return a > b || (a == b && a_id < b_id);
}

}  // namespace specdec
