// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the ways of
// computing a mean and a variance that the chapter compares, each written
// out on one run of FP32 values: the exact reference, the FP32 single pass,
// Welford's update in FP32, the FP32 two-pass, PyTorch's CPU BatchNorm and
// LayerNorm methods, and the library's (norm_math::statistics).
// Depends on: mpt/nn/layers/norm_math.hpp (the library's statistics), welford.hpp.
// Header-only: ch03_numbers prints the comparison, test_ch03_norm_accuracy
// asserts it.
//
// PyTorch's methods, as its source has them (aten/src/ATen/native/cpu/):
//
// - BatchNorm, contiguous float input (batch_norm_kernel.cpp,
//   batch_norm_cpu_collect_stats_contiguous_impl; Normalization.cpp,
//   batch_norm_cpu_update_stats_template): Σx in double, the mean rounded to
//   float; then Σ(x − mean)² with the difference and its square in float,
//   summed in double and stored as a float var_sum; the biased and unbiased
//   variances var_sum / n and var_sum / (n − 1) divided in float.
// - LayerNorm, float input (layer_norm_kernel.cpp; moments_utils.h,
//   RowwiseMoments): Welford's update in FP32 on 8 lanes (one AVX2 vector of
//   floats), 16 vectors a chunk, the chunks merged by a binary cascade with
//   Chan's formula, and the 8 lanes merged into the values after the last
//   full vector; the biased variance M2 / n in float.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "mpt/nn/layers/norm_math.hpp"
#include "mpt/nn/layers/welford.hpp"

namespace mpt::ch03 {

/// A mean and a biased and unbiased variance as a method returns them.
struct MeanVar {
  double mean = 0;          ///< the mean
  double var_biased = 0;    ///< M2 / n, what normalization divides by
  double var_unbiased = 0;  ///< M2 / (n − 1), what BatchNorm's running variance folds in
};

/// The reference: two passes in long double (64 significant bits on x86-64,
/// 113 on some other machines) on the FP32 values.
inline MeanVar exact_statistics(const float* x, std::int64_t n) {
  long double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += x[i];
  const long double mean = sum / static_cast<long double>(n);
  long double m2 = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const long double d = static_cast<long double>(x[i]) - mean;
    m2 += d * d;
  }
  return {static_cast<double>(mean), static_cast<double>(m2 / static_cast<long double>(n)),
          static_cast<double>(m2 / static_cast<long double>(n - 1))};
}

/// Relative error of `got` against a reference value computed in long double.
inline double relative_error(double got, double ref) { return std::abs(got - ref) / std::abs(ref); }

/// E[x²] − E[x]² in FP32: both sums in float, one value at a time.
inline MeanVar fp32_single_pass(const float* x, std::int64_t n) {
  float s = 0, s2 = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    s += x[i];
    s2 += x[i] * x[i];
  }
  const float mean = s / static_cast<float>(n);
  const float var = s2 / static_cast<float>(n) - mean * mean;
  return {mean, var, var * static_cast<float>(n) / static_cast<float>(n - 1)};
}

/// Welford's update in FP32, one value after the other (welford.hpp): what
/// one GPU thread runs before the merges.
inline MeanVar fp32_welford(const float* x, std::int64_t n) {
  Welford<float> w;
  for (std::int64_t i = 0; i < n; ++i) welford_add(w, x[i]);
  return {w.mean, welford_variance_biased(w), welford_variance_unbiased(w)};
}

/// The mean, then Σ(x − mean)², everything in FP32.
inline MeanVar fp32_two_pass(const float* x, std::int64_t n) {
  float s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += x[i];
  const float mean = s / static_cast<float>(n);
  float m2 = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float d = x[i] - mean;
    m2 += d * d;
  }
  return {mean, m2 / static_cast<float>(n), m2 / static_cast<float>(n - 1)};
}

/// PyTorch's contiguous CPU BatchNorm on one channel (see the top).
inline MeanVar torch_batch_norm(const float* x, std::int64_t n) {
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += x[i];
  const auto mean = static_cast<float>(sum / static_cast<double>(n));
  double var_sum = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float d = x[i] - mean;
    const float square = d * d;
    var_sum += square;
  }
  const auto var_sum_f = static_cast<float>(var_sum);
  return {mean, var_sum_f / static_cast<float>(n), var_sum_f / static_cast<float>(n - 1)};
}

namespace detail {
/// Partial moments of moments_utils.h: a count, a mean, an M2.
struct Moments {
  std::int64_t m0 = 0;  ///< the count
  float m1 = 0;         ///< the mean
  float m2 = 0;         ///< Σ(x − mean)²
};
/// Chan's merge as moments_utils.h's AddMoments writes it (c = n_add / n).
inline void add_moments(std::int64_t m0_add, float m1_add, float m2_add, Moments& m) {
  const std::int64_t n = m.m0 + m0_add;
  const float c = n == 0 ? 0.0f : static_cast<float>(m0_add) / static_cast<float>(n);
  const float delta = m1_add - m.m1;
  m.m1 += c * delta;
  m.m2 += m2_add + delta * delta * c * static_cast<float>(m.m0);
  m.m0 = n;
}
}  // namespace detail

/// PyTorch's RowwiseMoments on one LayerNorm row (see the top). The
/// unbiased variance is M2 / (n − 1) in float (LayerNorm does not use it).
inline MeanVar torch_layer_norm(const float* x, std::int64_t n_values) {
  using detail::Moments;
  constexpr std::int64_t kLanes = 8, kChunk = 16;
  const std::int64_t vectors = n_values / kLanes;
  const std::int64_t chunks = (vectors + kChunk - 1) / kChunk;
  int depth = 0;
  while ((std::int64_t{1} << depth) < chunks) ++depth;  // ⌈log2 chunks⌉
  // A stack of partial moments per lane, merged like a binary counter: chunk
  // i goes to level 0, and every level whose count is complete moves up.
  std::vector<std::vector<Moments>> stack(static_cast<std::size_t>(std::max(depth, 1)),
                                          std::vector<Moments>(kLanes));
  for (std::int64_t i = 0; i < chunks; ++i) {
    const std::int64_t m0 = std::min(kChunk, vectors - i * kChunk);
    for (std::int64_t lane = 0; lane < kLanes; ++lane) {
      float m1 = 0, m2 = 0;
      for (std::int64_t j = 0; j < m0; ++j) {
        const float v = x[(i * kChunk + j) * kLanes + lane];
        const float delta = v - m1;
        m1 += delta * (1.0f / static_cast<float>(j + 1));
        m2 += delta * (v - m1);
      }
      detail::add_moments(m0, m1, m2, stack[0][static_cast<std::size_t>(lane)]);
    }
    std::int64_t mask = i + 1;
    for (int j = 1; j < depth && (mask & 1) == 0; ++j) {
      for (std::size_t lane = 0; lane < kLanes; ++lane) {
        Moments& lower = stack[static_cast<std::size_t>(j - 1)][lane];
        detail::add_moments(lower.m0, lower.m1, lower.m2, stack[static_cast<std::size_t>(j)][lane]);
        lower = Moments{};
      }
      mask >>= 1;
    }
  }
  for (int j = 1; j < depth; ++j)
    for (std::size_t lane = 0; lane < kLanes; ++lane) {
      const Moments up = stack[static_cast<std::size_t>(j)][lane];
      detail::add_moments(up.m0, up.m1, up.m2, stack[0][lane]);
    }
  Moments total;
  for (std::int64_t k = vectors * kLanes; k < n_values; ++k) {
    const float delta = x[k] - total.m1;
    ++total.m0;
    total.m1 += delta / static_cast<float>(total.m0);
    total.m2 += delta * (x[k] - total.m1);
  }
  for (std::size_t lane = 0; lane < kLanes; ++lane) {
    const Moments& l = stack[0][lane];
    detail::add_moments(vectors, l.m1, l.m2, total);
  }
  return {total.m1, total.m2 / static_cast<float>(n_values), total.m2 / static_cast<float>(n_values - 1)};
}

/// The library's CPU layers: norm_math::statistics (two passes, double
/// sums), the mean and the variances rounded once into FP32.
inline MeanVar mpt_statistics(const float* x, std::int64_t n) {
  norm_math::Statistics s;
  norm_math::statistics(x, norm_math::Layout{1, 1, n}, &s);
  return {static_cast<float>(s.mean), norm_math::variance_biased<float>(s),
          norm_math::variance_unbiased<float>(s)};
}

}  // namespace mpt::ch03
