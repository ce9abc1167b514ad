// Chapter 04 — exercises: REFERENCE SOLUTION (MPT-REFERENCE-SOLUTION), never shipped to students.
// Depends on: ex04.hpp (and its Tensor for 4.4), the C++ standard library.
// 4.1 to 4.3 are written from the specification, not from mpt's
// softmax_math.hpp, so that grading them against mpt is a real check.
// tools/make_handout.sh refuses to produce a handout that contains these lines.
#include "ex04.hpp"

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace mpt::ex04 {

namespace {

constexpr float kInfinity = std::numeric_limits<float>::infinity();

}  // namespace

float stable_log_sum_exp(const float* z, std::int64_t n) {
  // The maximum first; a NaN anywhere decides the answer on its own.
  float biggest = -kInfinity;
  for (std::int64_t i = 0; i < n; ++i) {
    if (std::isnan(z[i])) return z[i];
    if (z[i] > biggest) biggest = z[i];
  }
  // Nothing but −inf (or nothing at all): the sum is 0 and its log −inf. A
  // +inf logit: the sum is +inf. Either way the maximum is the answer, and
  // subtracting it would compute inf − inf.
  if (std::isinf(biggest)) return biggest;
  // Every exponent is <= 0 and one of them is exactly 0: 1 <= total <= n.
  double total = 0.0;
  for (std::int64_t j = 0; j < n; ++j) total += std::exp(static_cast<double>(z[j]) - biggest);
  return static_cast<float>(biggest + std::log(total));
}

OnlineSoftmax online_add(OnlineSoftmax s, float z) {
  if (z == -kInfinity) return s;  // a masked position; also keeps {−inf, 0} free of −inf − (−inf)
  if (z <= s.max) {
    s.sum += std::exp(z - s.max);
    return s;
  }
  // A new maximum: the old terms were measured against the old one.
  const float shrink = std::exp(s.max - z);  // exp(−inf) = 0 for the empty state
  s.sum = s.sum * shrink + 1.0f;
  s.max = z;
  return s;
}

OnlineSoftmax online_merge(const OnlineSoftmax& a, const OnlineSoftmax& b) {
  if (a.sum == 0.0f) return b;  // a is empty: b exactly, even when b is empty too
  if (b.sum == 0.0f) return a;
  const bool a_leads = a.max >= b.max;
  const OnlineSoftmax& big = a_leads ? a : b;
  const OnlineSoftmax& small = a_leads ? b : a;
  OnlineSoftmax merged;
  merged.max = big.max;
  merged.sum = big.sum + small.sum * std::exp(small.max - big.max);
  return merged;
}

void softmax_cross_entropy_backward(const float* z, std::int64_t k, std::int64_t target,
                                    std::int64_t ignore_index, float label_smoothing, float g, float* dz) {
  if (target == ignore_index) {
    for (std::int64_t j = 0; j < k; ++j) dz[j] = 0.0f;
    return;
  }
  float top = -kInfinity;
  for (std::int64_t j = 0; j < k; ++j) top = std::fmax(top, z[j]);
  // The exponentials go into dz first; the sum stays in double.
  double denominator = 0.0;
  for (std::int64_t j = 0; j < k; ++j) {
    dz[j] = std::exp(z[j] - top);
    denominator += dz[j];
  }
  const double spread = static_cast<double>(label_smoothing) / static_cast<double>(k);
  const double on_target = 1.0 - static_cast<double>(label_smoothing);
  for (std::int64_t j = 0; j < k; ++j) {
    const double p = dz[j] / denominator;
    const double wanted = spread + (j == target ? on_target : 0.0);
    dz[j] = static_cast<float>(static_cast<double>(g) * (p - wanted));
  }
}

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
  // The fix: the scaled, masked scores stay in FP32. Rounded into fp16,
  // −1e9 became −inf (and the fully masked row NaN; in bf16 it became
  // −998244352 and the row uniform), and every kept score lost its digits
  // beyond fp16's 11 bits: an absolute error in a score is a relative error
  // in its probability, 2^-12·|t| and more.
  const std::vector<float>& tv = scaled;

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
