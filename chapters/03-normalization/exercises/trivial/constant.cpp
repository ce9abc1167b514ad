// Chapter 03 — exercises: trivial stub "return a constant", each constant a plausible one.
// Depends on: ex03.hpp. A grader that gave it full marks for any exercise
// would be broken; CI requires a score below full marks on every exercise.
#include "ex03.hpp"

#include <algorithm>
#include <vector>

namespace mpt::ex03 {

// "The standard normal": the counts add, mean 0, variance 1.
Stats merge_statistics(const Stats& a, const Stats& b) {
  const std::int64_t n = a.count + b.count;
  return {n, 0.0f, static_cast<float>(n)};
}

// A normalized layer's gradient "is about dy": ones everywhere.
void layer_norm_backward(const float*, const float*, const float*, std::int64_t rows, std::int64_t d, float,
                         float* dx, float* dgamma, float* dbeta) {
  std::fill(dx, dx + rows * d, 1.0f);
  std::fill(dgamma, dgamma + d, 1.0f);
  std::fill(dbeta, dbeta + d, static_cast<float>(rows));
}

// Normalized data has mean 0 and variance 1: y = β, running estimates (0, 1).
mpt::Tensor batch_norm_train_forward(const mpt::Tensor& x, const std::vector<float>&,
                                     const std::vector<float>& beta, float, float, RunningStats& running) {
  const std::int64_t channels = x.size(1), inner = x.numel() / (x.size(0) * channels);
  std::vector<float> y(static_cast<std::size_t>(x.numel()));
  for (std::size_t e = 0; e < y.size(); ++e)
    y[e] = beta[static_cast<std::size_t>((static_cast<std::int64_t>(e) / inner) % channels)];
  std::fill(running.mean.begin(), running.mean.end(), 0.0f);
  std::fill(running.var.begin(), running.var.end(), 1.0f);
  ++running.num_batches_tracked;
  return mpt::Tensor::from_f32(y.data(), x.shape(), x.dtype());
}

}  // namespace mpt::ex03
