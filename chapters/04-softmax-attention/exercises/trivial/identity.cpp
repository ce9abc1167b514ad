// Chapter 04 — exercises: trivial stub "change nothing": every input returned or copied as it came.
// Depends on: ex04.hpp. A grader that gave it full marks for any exercise
// would be broken; CI requires a score below full marks on every exercise.
#include "ex04.hpp"

#include <cstddef>
#include <limits>
#include <vector>

namespace mpt::ex04 {

// The first logit ("the largest one dominates anyway"), or −inf for none.
float stable_log_sum_exp(const float* z, std::int64_t n) {
  return n > 0 ? z[0] : -std::numeric_limits<float>::infinity();
}

OnlineSoftmax online_add(OnlineSoftmax s, float) { return s; }

OnlineSoftmax online_merge(const OnlineSoftmax& a, const OnlineSoftmax&) { return a; }

// The logits themselves as their gradient.
void softmax_cross_entropy_backward(const float* z, std::int64_t k, std::int64_t, std::int64_t, float, float,
                                    float* dz) {
  for (std::int64_t j = 0; j < k; ++j) dz[j] = z[j];
}

// The scores themselves as the probabilities.
mpt::Tensor attention_row_probabilities(const mpt::Tensor& scores, const std::vector<bool>&, float) {
  return scores;
}

}  // namespace mpt::ex04
