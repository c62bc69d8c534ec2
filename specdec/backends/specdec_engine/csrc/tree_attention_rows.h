// What tree_attention.cpp shares with the translation units that compile the portable tree-attention
// kernels (tree_attention_portable.inc) for AVX2 (tree_attention_avx2.cpp) and for the build's
// baseline target (tree_attention_baseline.cpp): the structs their signatures name and the list of
// their instances. Why three units: the kernels' unrolled templates are most of the extension's
// compile time, and one unit compiles on one core; split, a 2-core machine builds them side by side.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <vector>

namespace specdec_cpu_kernels {

// Where row i's visible slots are: the committed slots [0, start), then `tree` (absolute slots).
struct Visible {
  int64_t start;
  std::vector<int64_t> tree;
  int64_t size() const { return start + static_cast<int64_t>(tree.size()); }
  int64_t slot(int64_t v) const { return v < start ? v : tree[v - start]; }
};

// The query vectors of one KV head that one task serves: rows x query heads of the group.
struct Vectors {
  int64_t first, count;  // vector j = row * group + (query head - kv head * group), for j in [first, first + count)
};

}  // namespace specdec_cpu_kernels

// The instances tree_attention.cpp calls, inside a namespace that included tree_attention_portable.inc:
// `SPECDEC_ROW_KERNELS(extern)` declares them (the unit that calls them compiles none), and
// `SPECDEC_ROW_KERNELS()` defines them (the unit that owns that namespace's copy).
#define SPECDEC_HEAD_BLOCKED_INSTANCE(PREFIX, T)                                                                 \
  PREFIX template void head_blocked_any<T>(const T*, int64_t, int64_t, const T*, const T*, int64_t, int64_t,    \
                                           int64_t, int64_t, int64_t, const std::vector<std::vector<int64_t>>&, \
                                           float, Vectors, float*, float*, float*, float*);
#define SPECDEC_ROW_PORTABLE_INSTANCE(PREFIX, T, ACC)                                                         \
  PREFIX template void row_portable<T, ACC>(const T*, const T*, const T*, int64_t, const Visible&, ACC, ACC*, \
                                            ACC*);
#define SPECDEC_ROW_KERNELS(PREFIX)                                \
  SPECDEC_HEAD_BLOCKED_INSTANCE(PREFIX, float)                     \
  SPECDEC_HEAD_BLOCKED_INSTANCE(PREFIX, c10::BFloat16)             \
  SPECDEC_ROW_PORTABLE_INSTANCE(PREFIX, float, float)              \
  SPECDEC_ROW_PORTABLE_INSTANCE(PREFIX, c10::BFloat16, float)      \
  SPECDEC_ROW_PORTABLE_INSTANCE(PREFIX, double, double)
