// The portable tree-attention kernels (tree_attention_portable.inc) compiled for AVX2+FMA, in a unit of
// their own so the build compiles them beside the others (tree_attention_rows.h says why). Called by
// tree_attention.cpp for Isa::kAvx2; the same bits as every other path (tree_attention.h).
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu_kernels.h"
#include "tree_attention_rows.h"

#if SPECDEC_X86
namespace specdec_cpu_kernels {
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2_rows {
#define SPECDEC_X86_FMA 1  // fma8 as the AVX2+FMA instruction (portable_vectors.inc)
#include "tree_attention_portable.inc"
#undef SPECDEC_X86_FMA
SPECDEC_ROW_KERNELS()
}  // namespace avx2_rows
#pragma GCC pop_options
}  // namespace specdec_cpu_kernels
#endif
