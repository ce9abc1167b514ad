// Chapter 04 — exercises: trivial stub "return a constant", each constant a plausible one.
// Depends on: ex04.hpp, <cmath>. A grader that gave it full marks for any
// exercise would be broken; CI requires a score below full marks on every
// exercise.
#include "ex04.hpp"

#include <cmath>
#include <cstddef>
#include <vector>

namespace mpt::ex04 {

// "Uniform logits": log n.
float stable_log_sum_exp(const float*, std::int64_t n) { return std::log(static_cast<float>(n)); }

// Every logit counted as 0 with weight 1.
OnlineSoftmax online_add(OnlineSoftmax s, float) { return {0.0f, s.sum + 1.0f}; }

OnlineSoftmax online_merge(const OnlineSoftmax& a, const OnlineSoftmax& b) { return {0.0f, a.sum + b.sum}; }

// A uniform softmax against the target: 1/k − [j = target], times g.
void softmax_cross_entropy_backward(const float*, std::int64_t k, std::int64_t target, std::int64_t, float,
                                    float g, float* dz) {
  for (std::int64_t j = 0; j < k; ++j)
    dz[j] = g * (1.0f / static_cast<float>(k) - (j == target ? 1.0f : 0.0f));
}

// Every key equally likely, masked or not.
mpt::Tensor attention_row_probabilities(const mpt::Tensor& scores, const std::vector<bool>&, float) {
  const std::vector<float> uniform(static_cast<std::size_t>(scores.numel()),
                                   1.0f / static_cast<float>(scores.numel()));
  return mpt::Tensor::from_f32(uniform.data(), scores.shape(), scores.dtype());
}

}  // namespace mpt::ex04
