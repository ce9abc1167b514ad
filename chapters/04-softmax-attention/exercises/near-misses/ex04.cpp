// Chapter 04 — exercises: plausible wrong answers, one classic mistake per exercise.
// Depends on: ex04.hpp (and its Tensor for 4.4), the C++ standard library.
// CI requires some points but not full marks on every exercise: proof that
// the tests separate close from right.
#include "ex04.hpp"

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace mpt::ex04 {

// Mistake: log(Σ exp(z)) as written, the sum in float, no maximum taken
// out. Right for logits of moderate size (and for −inf, +inf and NaN, which
// exp and log pass through); exp overflows above 88.7 and underflows below
// −103, and log(exp(z)) is not z to the last bit.
float stable_log_sum_exp(const float* z, std::int64_t n) {
  float total = 0.0f;
  for (std::int64_t j = 0; j < n; ++j) total += std::exp(z[j]);
  return std::log(total);
}

OnlineSoftmax online_add(OnlineSoftmax s, float z) {
  if (z == -std::numeric_limits<float>::infinity()) return s;
  if (z > s.max) {
    s.sum = s.sum * std::exp(s.max - z) + 1.0f;
    s.max = z;
  } else {
    s.sum += std::exp(z - s.max);
  }
  return s;
}

// Mistake: the larger maximum is kept, but the two sums are added as they
// are, the smaller side's never rescaled to it. Right whenever one side is
// empty or both maxima are equal.
OnlineSoftmax online_merge(const OnlineSoftmax& a, const OnlineSoftmax& b) {
  if (a.sum == 0.0f) return b;
  if (b.sum == 0.0f) return a;
  return {std::fmax(a.max, b.max), a.sum + b.sum};
}

// Mistake: the target's share is smoothed to 1 − ε, but the ε/k that every
// class receives is forgotten. Right without label smoothing.
void softmax_cross_entropy_backward(const float* z, std::int64_t k, std::int64_t target,
                                    std::int64_t ignore_index, float label_smoothing, float g, float* dz) {
  for (std::int64_t j = 0; j < k; ++j) dz[j] = 0.0f;
  if (target == ignore_index) return;
  float m = z[0];
  for (std::int64_t j = 1; j < k; ++j) m = std::fmax(m, z[j]);
  float total = 0.0f;
  for (std::int64_t j = 0; j < k; ++j) total += std::exp(z[j] - m);
  for (std::int64_t j = 0; j < k; ++j) {
    const float p = std::exp(z[j] - m) / total;
    dz[j] = g * (p - (j == target ? 1.0f - label_smoothing : 0.0f));
  }
}

// Half a fix: the overflow of −1e9 seen, the mask made a real −inf and the
// fully masked row tested against it; the scores are still rounded into
// the scores' dtype before the softmax.
mpt::Tensor attention_row_probabilities(const mpt::Tensor& scores, const std::vector<bool>& keep,
                                        float scale) {
  const std::int64_t n = scores.numel();
  const auto count = static_cast<std::size_t>(n);
  const float minus_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> s(count);
  scores.to_f32(s.data());
  std::vector<float> scaled(count);
  for (std::size_t j = 0; j < count; ++j) scaled[j] = keep[j] ? s[j] * scale : minus_inf;
  const mpt::Tensor t = mpt::Tensor::from_f32(scaled.data(), {n}, scores.dtype());
  std::vector<float> tv(count);
  t.to_f32(tv.data());
  float max = tv[0];
  for (std::size_t j = 1; j < count; ++j) max = std::fmax(max, tv[j]);
  std::vector<float> p(count, 0.0f);
  if (max != minus_inf) {
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
