// A standalone check of skinny_portable.inc (no torch): the blocked kernels against the contract of
// specdec/backends/specdec_engine/csrc/skinny_linear.h written out one output at a time, bitwise, over random shapes
// (every tail length, 1-100 x rows, in-features up to 1300, weight-row counts that are and are not
// multiples of 8), float and bfloat16 weights. Compiled for whatever target the compiler is told, so it
// runs the portable copy where torch is absent: scripts/cross_check.sh builds it for aarch64 and runs
// it under qemu.
// With --time it also prints the kernel's ms for the default model's shapes (no check).
//   g++ -O3 -std=c++17 -ffp-contract=off tests/native/skinny_contract_check.cpp -o check && ./check
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace kernel {
#include "../../specdec/backends/specdec_engine/csrc/skinny_portable.inc"
}  // namespace kernel

// The contract, one output at a time: 16 lanes, fma per lane in increasing k, zeros past K, the lane tree.
float contract(const float* x, const float* w, int64_t K) {
  float acc[16] = {};
  for (int64_t k0 = 0; k0 < K; k0 += 16)
    for (int l = 0; l < 16; ++l) {
      const bool inside = k0 + l < K;
      acc[l] = std::fma(inside ? w[k0 + l] : 0.0f, inside ? x[k0 + l] : 0.0f, acc[l]);
    }
  float chunk[4];
  for (int c = 0; c < 4; ++c) chunk[c] = (acc[4 * c] + acc[4 * c + 2]) + (acc[4 * c + 1] + acc[4 * c + 3]);
  return (chunk[0] + chunk[1]) + (chunk[2] + chunk[3]);
}

float widen(uint16_t bits) {
  const uint32_t word = uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

int check(std::mt19937& rng, int cases) {
  std::uniform_int_distribution<int64_t> rows_of(1, 100), fan_in(1, 300), fan_out(1, 70);
  std::normal_distribution<float> normal;
  int failures = 0;
  for (int t = 0; t < cases; ++t) {
    // Every 20th shape has rows past 1024 in-features, where 3-6 x rows take the tiled blocks, not streams.
    const int64_t M = t < 8 ? t + 1 : rows_of(rng), K = t % 20 == 19 ? 1000 + fan_in(rng) : fan_in(rng);
    const int64_t N = fan_out(rng);
    std::vector<float> x(M * K), w(N * K), y(M * N), wide(N * K);
    std::vector<uint16_t> w16(N * K);
    for (auto& v : x) v = normal(rng);
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] = normal(rng);
      uint32_t bits;
      std::memcpy(&bits, &w[i], sizeof bits);
      w16[i] = static_cast<uint16_t>(bits >> 16);
      wide[i] = widen(w16[i]);
    }
    for (int dtype = 0; dtype < 2; ++dtype) {
      // Split the weight rows as parallel tasks would (at a row that is not a multiple of 8 too).
      const int64_t split = std::min<int64_t>(N, 16 + (t % 5));
      for (const auto& range : {std::pair<int64_t, int64_t>{0, split}, {split, N}}) {
        if (dtype == 0) kernel::rows_f32(x.data(), w.data(), y.data(), M, K, N, range.first, range.second);
        else kernel::rows_bf16(x.data(), w16.data(), y.data(), M, K, N, range.first, range.second);
      }
      const std::vector<float>& reference = dtype == 0 ? w : wide;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t o = 0; o < N; ++o) {
          const float want = contract(x.data() + m * K, reference.data() + o * K, K);
          if (!same_bits(y[m * N + o], want) && failures++ < 10)
            std::printf("MISMATCH %s M=%lld K=%lld N=%lld at (%lld, %lld): %.9g vs %.9g\n", dtype ? "bf16" : "f32",
                        (long long)M, (long long)K, (long long)N, (long long)m, (long long)o, y[m * N + o], want);
        }
    }
  }
  return failures;
}

void time_shapes() {
  // The default model's linear layers per layer (out, in): q, k, v, o, gate, up, down; 30 layers.
  const int64_t shapes[7][2] = {{576, 576}, {192, 576}, {192, 576}, {576, 576}, {1536, 576}, {1536, 576}, {576, 1536}};
  std::vector<std::vector<float>> weights;
  for (int layer = 0; layer < 30; ++layer)
    for (auto& s : shapes) weights.emplace_back(s[0] * s[1], 0.01f);
  for (int64_t M : {1, 2, 3, 4, 5, 6, 8, 12, 16, 32}) {
    std::vector<float> x(M * 1536, 0.5f), y(M * 1536);
    double best = 1e30;
    for (int round = 0; round < 5; ++round) {
      const auto start = std::chrono::steady_clock::now();
      size_t i = 0;
      for (int layer = 0; layer < 30; ++layer)
        for (auto& s : shapes) {
          kernel::rows_f32(x.data(), weights[i++].data(), y.data(), M, s[1], s[0], 0, s[0]);
        }
      best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    std::printf("rows %3lld: %8.2f ms (one thread, all 210 linear weights)\n", (long long)M, best);
  }
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--time") {
    time_shapes();
    return 0;
  }
  std::mt19937 rng(1234);
  const int failures = check(rng, 300);
  std::printf("%s: %d mismatches in 300 random shapes (float and bfloat16 weights)\n",
              failures ? "FAILED" : "passed", failures);
  return failures ? 1 : 0;
}
