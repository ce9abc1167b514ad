// Chapters 01 onwards — the deterministic inputs the benchmarks time, shared
// by the CPU and the GPU programs so both sides measure the same data.
// Depends on: the standard library only (no Google Benchmark, no CUDA).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace bench {

/// The next state of a 64-bit LCG (Knuth's MMIX constants): cheap, and the
/// same sequence everywhere.
inline std::uint64_t lcg_next(std::uint64_t s) { return s * 6364136223846793005ull + 1442695040888963407ull; }

/// Values spread over 48 binades, |x| in [2^-30, 2^18), random signs: fp16's
/// whole range and beyond, so every branch of a rounding (normal, subnormal,
/// overflow) is exercised.
inline void fill_wide_range(std::vector<float>& v) {
  std::uint64_t s = 0x9e3779b97f4a7c15ull;
  for (float& x : v) {
    s = lcg_next(s);
    const int e = static_cast<int>((s >> 33) % 48) - 30;
    x = std::ldexp(static_cast<float>(s >> 40) / 16777216.0f, e) * ((s >> 32) & 1 ? -1.0f : 1.0f);
  }
}

/// Finite gradient-like values, |x| in [2^-20, 2^4), random signs.
inline void fill_gradients(std::vector<float>& v) {
  std::uint64_t s = 0x9e3779b97f4a7c15ull;
  for (float& x : v) {
    s = lcg_next(s);
    const int e = static_cast<int>((s >> 33) % 24) - 20;
    x = std::ldexp(1.0f + static_cast<float>(s >> 41) / 8388608.0f, e) * ((s >> 32) & 1 ? -1.0f : 1.0f);
  }
}

/// The sizes of an MLP-like list of gradient tensors covering n elements:
/// weights, biases and odd shapes in a fixed pattern, repeated until n is
/// used up, the last tensor taking what is left.
inline std::vector<std::size_t> mixed_tensor_sizes(std::size_t n) {
  const std::size_t pattern[] = {std::size_t{4096} * 1024,
                                 4096,
                                 std::size_t{1024} * 1024,
                                 1024,
                                 1000003,
                                 7,
                                 257,
                                 65541,
                                 std::size_t{512} * 384,
                                 384,
                                 3,
                                 2000001};
  std::vector<std::size_t> sizes;
  for (std::size_t at = 0, k = 0; at < n; ++k) {
    sizes.push_back(std::min(pattern[k % (sizeof pattern / sizeof pattern[0])], n - at));
    at += sizes.back();
  }
  return sizes;
}

}  // namespace bench
