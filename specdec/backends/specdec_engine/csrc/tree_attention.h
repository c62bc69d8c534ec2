// specdec tree attention on the CPU: the attention of a few query rows over a KV cache, each row
// computed by one fixed sequence of operations over the keys it sees.
//
// Why: a tree verification's attention (N query rows over C committed slots and the tree's own
// slots, under a tree mask) and a plain step's (one row over C slots and itself) must give the
// same numbers for the same token in the same context, or speculative output can differ from plain
// decoding wherever the model's top two logits are within rounding of each other. A library's
// attention kernel blocks rows and keys into small matrix products whose summation order depends
// on how many rows there are and where the mask cuts; this kernel's does not.
//
// THE CONTRACT (every path: AVX-512 and portable; float, bfloat16 widened to float, double):
//   Row i of a query head attends over its VISIBLE slots, in increasing slot order: the committed
//   slots [0, start), then its tree part: slots start + a for every tree node a that is i or an
//   ancestor of i (`ancestors[i][a]`), or, with no ancestor matrix (a causal pass: a prefill or a
//   plain step), slots start .. start + i. Let v index the visible slots 0, 1, 2, ... in that order.
//   score[v] = lane_sum(q . k) * scale      lanes as in skinny_linear.h: lane l accumulates
//                                            fma(q[d], k[d], acc[l]) for d = l, l+L, ... (0 past D)
//   m = max_v score[v]
//   p[v] = exp_c(score[v] - m)               exp_c: the polynomial of tree_attention.cpp (float),
//                                            std::exp (double)
//   l = lane_sum(acc) with acc[lane] += p[v] for v = lane, lane + L, ... (plain adds, v ascending)
//   out[d] = (fma chain over v ascending of p[v] * value[v][d]) / l
// So a tree node's row sees exactly the numbers, in exactly the order, that the same token sees
// in a plain step after its ancestors were committed: the results are bitwise equal.
//
// Non-finite values, on every path alike: m is NaN when any score is NaN (a plain max would keep or
// drop a NaN depending on its place), exp_c(NaN) is NaN (the clamp at -86 keeps NaN), so a NaN
// score makes every output of the row NaN; a NaN or infinity in a value reaches the outputs of its
// dims through the fma chain; everything else is IEEE arithmetic in the order above.
//
// Layouts: query [1, Hq, T, D] (any strides, D contiguous), keys/values [1, Hkv, S, D] contiguous
// (a cache layer), ancestors bool [T, T] or none; output [1, T, Hq * D] contiguous (what the output
// projection reads). Hq must be a multiple of Hkv (grouped heads: head h reads KV head h / (Hq/Hkv)).
#pragma once
