// Chapter 04 — exercises: trivial stub "zero everything".
// Depends on: ex04.hpp. A grader that gave it full marks for any exercise
// would be broken; CI requires a score below full marks on every exercise.
#include "ex04.hpp"

#include <cstddef>
#include <vector>

namespace mpt::ex04 {

float stable_log_sum_exp(const float*, std::int64_t) { return 0.0f; }

OnlineSoftmax online_add(OnlineSoftmax, float) { return {0.0f, 0.0f}; }

OnlineSoftmax online_merge(const OnlineSoftmax&, const OnlineSoftmax&) { return {0.0f, 0.0f}; }

void softmax_cross_entropy_backward(const float*, std::int64_t k, std::int64_t, std::int64_t, float, float,
                                    float* dz) {
  for (std::int64_t j = 0; j < k; ++j) dz[j] = 0.0f;
}

mpt::Tensor attention_row_probabilities(const mpt::Tensor& scores, const std::vector<bool>&, float) {
  const std::vector<float> zeros(static_cast<std::size_t>(scores.numel()), 0.0f);
  return mpt::Tensor::from_f32(zeros.data(), scores.shape(), scores.dtype());
}

}  // namespace mpt::ex04
