// specdec tree operations: the value checks of every op, written once for host and device code.
//
// Shapes, dtypes and devices are metadata the host always knows; checks.h checks them before
// anything runs. Values (parent indices, tokens, path nodes, lengths, slots) live inside the
// tensors, on the op's device, and a bad one could send a kernel out of bounds. On a GPU the host
// cannot read them without waiting for the device, and device code cannot raise. So each op's
// value checks are a numbered sequence of *items*, one per value to check, in a fixed order, each
// with its own predicate (the *Checks structs below), compiled for both sides:
//
//   - the CPU kernels scan the items in order before writing anything and raise the first fault
//     (tree_ops.cpp);
//   - on CUDA one block scans them on the device (first_fault_kernel, tree_ops_cuda.cu) and
//     writes the first fault into a status tensor, which the host turns into the same
//     RuntimeError (raise_fault, checks.h) when it reads the status: at once when the caller gave
//     the op no status (one host sync; the op then raises before launching its kernels), or at
//     the caller's own sync when it passed one (no extra sync; the kernels stay in bounds and
//     compact_kv leaves the cache untouched on a fault).
//
// Same items, same order, same message on both devices: the first bad value is named the same way.
//
// The status: int64 [kStatusWords] on the op's device, all zero while no fault was found.
//   [0] code (FaultCode; 0: no fault)   [1] b: the sequence   [2] i: the node or path index
//   [3] the bad value                   [4] the bound it broke
//   [5] aux, [6] aux2: what else the message needs (the previous path node; the cache tensor
//       and the tree's first slot)      [7] unused
// A status is sticky: an op that finds a fault already recorded leaves it (the first one stands),
// and compact_kv then moves nothing. The caller that reads and reports a fault zeroes the status
// before it passes it again (ExtTreeOps does, specdec/backends/cuda_ext/backend.py).
#pragma once

#include <cstdint>

#include "tree_ops.h"

namespace specdec {

constexpr int64_t kStatusWords = 8;

enum FaultCode : int64_t {
  kNoFault = 0,
  kMaskRoot = 1,          // tree_mask: parents[b, 0] != -1
  kMaskParent = 2,        // tree_mask: parents[b, i] outside [-1, i)
  kMaskCommitted = 3,     // tree_mask: committed_lens[b] outside [0, tree_start]
  kAcceptRoot = 4,        // tree_accept: parents[b, 0] != -1
  kAcceptParent = 5,      // tree_accept: parents[b, i] outside [-1, i)
  kAcceptToken = 6,       // tree_accept: tokens[b, i] outside [0, V)
  kAcceptChoice = 7,      // tree_accept: choices[b, i] outside [0, V)
  kCompactPathLen = 8,    // compact_kv: path_len[b] outside [0, P]
  kCompactDest = 9,       // compact_kv: dest_starts[b] outside [0, tree_start]
  kCompactOrder = 10,     // compact_kv: path[b, i] <= path[b, i - 1], or path[b, 0] < 0
  kCompactSlot = 11,      // compact_kv: slot tree_start + path[b, i] past the smallest cache tensor
  kLastFaultCode = 11,
};

struct Fault {
  int64_t code = kNoFault;
  int64_t b = 0;
  int64_t i = 0;
  int64_t value = 0;
  int64_t bound = 0;
  int64_t aux = 0;
  int64_t aux2 = 0;
};

SPECDEC_HOST_DEVICE Fault make_fault(int64_t code, int64_t b, int64_t i, int64_t value, int64_t bound,
                                     int64_t aux = 0, int64_t aux2 = 0) {
  Fault fault;
  fault.code = code;
  fault.b = b;
  fault.i = i;
  fault.value = value;
  fault.bound = bound;
  fault.aux = aux;
  fault.aux2 = aux2;
  return fault;
}

SPECDEC_HOST_DEVICE void store_fault(const Fault& fault, int64_t* status /*[kStatusWords]*/) {
  status[1] = fault.b;
  status[2] = fault.i;
  status[3] = fault.value;
  status[4] = fault.bound;
  status[5] = fault.aux;
  status[6] = fault.aux2;
  status[0] = fault.code;
}

SPECDEC_HOST_DEVICE Fault load_fault(const int64_t* status /*[kStatusWords]*/) {
  return make_fault(status[0], status[1], status[2], status[3], status[4], status[5], status[6]);
}

// Node i's parent: -1 at the root; -1 (padding) or an earlier node elsewhere. root_code is the
// op's kMaskRoot or kAcceptRoot; the parent-order code follows it.
SPECDEC_HOST_DEVICE bool parent_fault(int64_t b, int64_t i, int64_t parent, int64_t root_code, Fault* fault) {
  if (i == 0 ? parent == -1 : (parent >= -1 && parent < i)) {
    return false;
  }
  *fault = make_fault(i == 0 ? root_code : root_code + 1, b, i, parent, i);
  return true;
}

// Each *Checks struct: items() is how many values the op checks; fault(item, &fault) checks one,
// and on a fault fills `fault` and returns true. Items in increasing order are the order faults
// are reported in.

// tree_mask: parents [B, N] row by row, then committed_lens [B]. B * N + B items.
struct MaskChecks {
  const int64_t* parents;    // [B, N], contiguous
  const int64_t* committed;  // [B]
  int64_t batch;
  int64_t nodes;
  int64_t tree_start;

  SPECDEC_HOST_DEVICE int64_t items() const { return batch * nodes + batch; }

  SPECDEC_HOST_DEVICE bool fault(int64_t item, Fault* fault) const {
    if (item < batch * nodes) {
      return parent_fault(item / nodes, item % nodes, parents[item], kMaskRoot, fault);
    }
    const int64_t b = item - batch * nodes;
    const int64_t visible = committed[b];
    if (visible >= 0 && visible <= tree_start) {
      return false;
    }
    *fault = make_fault(kMaskCommitted, b, 0, visible, tree_start);
    return true;
  }
};

// tree_accept: parents [B, N], then tokens [B, N], then the given choices [B, N] (none: no items
// fail). 3 * B * N items. A draft token or a choice outside the logits' vocabulary is an upstream
// bug (a drafter or datastore of another tokenizer; a chooser that left the vocabulary), and the
// bonus becomes the next step's input token: named here, not carried on.
struct AcceptChecks {
  const int64_t* parents;  // [B, N], contiguous
  const int64_t* tokens;   // [B, N], contiguous
  const int64_t* choices;  // [B, N], contiguous, or null (greedy)
  int64_t batch;
  int64_t nodes;
  int64_t vocab;

  SPECDEC_HOST_DEVICE int64_t items() const { return 3 * batch * nodes; }

  SPECDEC_HOST_DEVICE bool fault(int64_t item, Fault* fault) const {
    const int64_t cells = batch * nodes;
    const int64_t part = item / cells;  // 0: parents, 1: tokens, 2: choices
    const int64_t cell = item % cells;  // b * N + i
    if (part == 0) {
      return parent_fault(cell / nodes, cell % nodes, parents[cell], kAcceptRoot, fault);
    }
    if (part == 2 && choices == nullptr) {
      return false;
    }
    const int64_t token = part == 1 ? tokens[cell] : choices[cell];
    if (token >= 0 && token < vocab) {
      return false;
    }
    *fault = make_fault(part == 1 ? kAcceptToken : kAcceptChoice, cell / nodes, cell % nodes, token, vocab);
    return true;
  }
};

// compact_kv, sequence by sequence: path_len[b], dest_starts[b], then path[b, 0 .. path_len[b]).
// B * (P + 2) items. A path node must exceed the previous one (so the in-place moves are safe,
// see compact_kv_cpu) and its slot tree_start + node must lie inside every cache tensor: `slots`
// is the smallest tensor's S and `slots_tensor` its index (INT64_MAX and -1 for an empty cache).
// Destinations need no item of their own: dest_starts[b] + i <= tree_start + path[b, i].
struct CompactChecks {
  const int64_t* path;      // [B, P], contiguous
  const int64_t* path_len;  // [B]
  const int64_t* dest;      // [B]
  int64_t batch;
  int64_t width;  // P
  int64_t tree_start;
  int64_t slots;
  int64_t slots_tensor;

  SPECDEC_HOST_DEVICE int64_t items() const { return batch * (width + 2); }

  SPECDEC_HOST_DEVICE bool fault(int64_t item, Fault* fault) const {
    const int64_t b = item / (width + 2);
    const int64_t part = item % (width + 2);
    if (part == 0) {
      const int64_t length = path_len[b];
      if (length >= 0 && length <= width) {
        return false;
      }
      *fault = make_fault(kCompactPathLen, b, 0, length, width);
      return true;
    }
    if (part == 1) {
      const int64_t first_target = dest[b];
      if (first_target >= 0 && first_target <= tree_start) {
        return false;
      }
      *fault = make_fault(kCompactDest, b, 0, first_target, tree_start);
      return true;
    }
    const int64_t i = part - 2;
    if (i >= path_len[b]) {  // past the path (a bad path_len is an earlier item)
      return false;
    }
    const int64_t node = path[b * width + i];
    const int64_t previous = i > 0 ? path[b * width + i - 1] : -1;
    if (node <= previous) {
      *fault = make_fault(kCompactOrder, b, i, node, previous, previous);
      return true;
    }
    if (node >= slots - tree_start) {  // tree_start + node >= slots, without overflow (slots >= 0)
      *fault = make_fault(kCompactSlot, b, i, node, slots, slots_tensor, tree_start);
      return true;
    }
    return false;
  }
};

// The first failing item, scanned in order on the host (the CPU kernels); code kNoFault if none.
template <typename Checks>
Fault first_fault(const Checks& checks) {
  Fault fault;
  const int64_t items = checks.items();
  for (int64_t item = 0; item < items; ++item) {
    if (checks.fault(item, &fault)) {
      return fault;
    }
  }
  return Fault{};
}

}  // namespace specdec
