// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: Welford's
// running mean and variance, and the merge of two partial statistics.
// Depends on: format_spec.hpp (for MPT_HD) only. Host-and-device: the CPU
// norm layers (batch_norm.cpp, layer_norm.cpp) and the CUDA norm kernels
// (kernels/nn/) call these exact functions, so the CPU tests cover the code
// the GPU runs. Templated on the scalar: float is what the layers and
// kernels accumulate in; double is the reference the tests compare with.
//
// Welford (1962) updates the mean and M2 = Σ (x - mean)² one value at a time
// without ever forming Σ x² (whose E[x²] − E[x]² cancels catastrophically
// when the mean is large next to the spread). Chan, Golub and LeVeque (1979)
// give the merge of two partial results, which is what a parallel reduction
// (a warp, a block, a grid) combines.
#pragma once

#include <cstdint>

#include "mpt/formats/format_spec.hpp"

namespace mpt {

/// The running statistics of a set of values: how many, their mean, and M2,
/// the sum of squared deviations from that mean. The empty set is {0, 0, 0}.
template <class T>
struct Welford {
  std::int64_t count = 0;  ///< values seen
  T mean = T(0);           ///< their mean (0 for none)
  T m2 = T(0);             ///< Σ (x − mean)² over them
};

/// Add one value: n ← n + 1, δ = x − mean, mean ← mean + δ/n,
/// M2 ← M2 + δ·(x − mean_new). Every operation in T.
//! [welford-add]
template <class T>
MPT_HD inline void welford_add(Welford<T>& s, T x) {
  s.count += 1;
  const T delta = x - s.mean;
  s.mean += delta / static_cast<T>(s.count);
  s.m2 += delta * (x - s.mean);
}
//! [welford-add]

/// The statistics of the union of two disjoint sets (Chan et al.): with
/// n = nₐ + n_b, δ = mean_b − meanₐ and f = n_b / n,
/// mean = meanₐ + δ·f and M2 = M2ₐ + M2_b + δ²·nₐ·f. Merging with an empty
/// set returns the other exactly; the result does not depend on which
/// operand is empty, so a reduction may pad with {0, 0, 0}.
//! [welford-merge]
template <class T>
MPT_HD inline Welford<T> welford_merge(const Welford<T>& a, const Welford<T>& b) {
  if (a.count == 0) return b;
  if (b.count == 0) return a;
  Welford<T> r;
  r.count = a.count + b.count;
  const T delta = b.mean - a.mean;
  const T f = static_cast<T>(b.count) / static_cast<T>(r.count);
  r.mean = a.mean + delta * f;
  r.m2 = a.m2 + b.m2 + delta * delta * static_cast<T>(a.count) * f;
  return r;
}
//! [welford-merge]

/// The biased variance M2 / n, what normalization divides by (PyTorch's
/// BatchNorm and LayerNorm normalize with it). 0 for an empty set.
template <class T>
MPT_HD inline T welford_variance_biased(const Welford<T>& s) {
  return s.count > 0 ? s.m2 / static_cast<T>(s.count) : T(0);
}

/// The unbiased variance M2 / (n − 1), what BatchNorm folds into its running
/// variance. For n = 1 it is M2 / 0: inf or NaN, as in PyTorch (where a
/// training-mode BatchNorm refuses a channel of one value anyway).
template <class T>
MPT_HD inline T welford_variance_unbiased(const Welford<T>& s) {
  return s.m2 / static_cast<T>(s.count - 1);
}

}  // namespace mpt
