// The portable tree-attention kernels (tree_attention_portable.inc) compiled for the build's baseline
// target (any x86-64, or NEON on aarch64), in a unit of their own so the build compiles them beside the
// others (tree_attention_rows.h says why). Called by tree_attention.cpp for Isa::kPortable, for float64
// and for heads wider than the blocked kernels take; the same bits as every other path (tree_attention.h).
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu_kernels.h"
#include "tree_attention_rows.h"

namespace specdec_cpu_kernels {
namespace portable_rows {
#include "tree_attention_portable.inc"
SPECDEC_ROW_KERNELS()
}  // namespace portable_rows
}  // namespace specdec_cpu_kernels
