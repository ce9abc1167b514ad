// Chapter 04 — exercises: YOUR FILE: write 4.1, 4.2 and 4.3 here, and find and fix the bug in 4.4.
// Depends on: ex04.hpp (the specification), the C++ standard library, and
// for 4.4's given body the Tensor of ex04.hpp (mpt/core/tensor.hpp).
// Each function of 4.1 to 4.3 throws until you replace its body; the grader
// reports the exercise as "not implemented" until then. 4.4's body runs, and
// scores nothing until it is fixed. See README.md for how to grade.
#include "ex04.hpp"

#include <cmath>  // std::exp, std::log
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <vector>

namespace mpt::ex04 {

float stable_log_sum_exp(const float* z, std::int64_t n) {
  (void)z;
  (void)n;
  throw std::logic_error("exercise 4.1 not implemented");
}

OnlineSoftmax online_add(OnlineSoftmax s, float z) {
  (void)s;
  (void)z;
  throw std::logic_error("exercise 4.2 not implemented");
}

OnlineSoftmax online_merge(const OnlineSoftmax& a, const OnlineSoftmax& b) {
  (void)a;
  (void)b;
  throw std::logic_error("exercise 4.2 not implemented");
}

void softmax_cross_entropy_backward(const float* z, std::int64_t k, std::int64_t target,
                                    std::int64_t ignore_index, float label_smoothing, float g, float* dz) {
  (void)z;
  (void)k;
  (void)target;
  (void)ignore_index;
  (void)label_smoothing;
  (void)g;
  (void)dz;
  throw std::logic_error("exercise 4.3 not implemented");
}

// Exercise 4.4 — DIAGNOSE: this body is given. It compiles, runs and gives
// rows whose probabilities sum to 1, and it has one mixed-precision bug;
// find it and fix it (ex04.hpp says what one call must do).
mpt::Tensor attention_row_probabilities(const mpt::Tensor& scores, const std::vector<bool>& keep,
                                        float scale) {
  const std::int64_t n = scores.numel();
  const auto count = static_cast<std::size_t>(n);
  // A removed position gets a score far below any real one instead of −inf,
  // so that no row ever computes −inf − (−inf).
  const float masked_score = -1e9f;

  std::vector<float> s(count);
  scores.to_f32(s.data());
  std::vector<float> scaled(count);
  for (std::size_t j = 0; j < count; ++j) scaled[j] = keep[j] ? s[j] * scale : masked_score;
  // The scaled, masked scores, kept as the scores are.
  const mpt::Tensor t = mpt::Tensor::from_f32(scaled.data(), {n}, scores.dtype());
  std::vector<float> tv(count);
  t.to_f32(tv.data());

  // The softmax in FP32: the maximum first, then the sum of exp(t − max).
  float max = tv[0];
  for (std::size_t j = 1; j < count; ++j) max = std::fmax(max, tv[j]);
  std::vector<float> p(count, 0.0f);
  if (max != masked_score) {  // else no position is kept: zeros
    float sum = 0.0f;
    for (std::size_t j = 0; j < count; ++j) {
      p[j] = std::exp(tv[j] - max);
      sum += p[j];
    }
    for (std::size_t j = 0; j < count; ++j) p[j] /= sum;
  }
  return mpt::Tensor::from_f32(p.data(), {n}, scores.dtype());
}

}  // namespace mpt::ex04
