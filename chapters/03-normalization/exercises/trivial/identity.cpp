// Chapter 03 — exercises: trivial stub "return the input": change nothing.
// Depends on: ex03.hpp. A grader that gave it full marks for any exercise
// would be broken; CI builds the grader against it and requires a score
// below full marks on every exercise.
#include "ex03.hpp"

#include <algorithm>

namespace mpt::ex03 {

// The first operand, as if the second were empty.
Stats merge_statistics(const Stats& a, const Stats&) { return a; }

// dy passed through, as if the norm were not there; no parameter gradients.
void layer_norm_backward(const float*, const float* dy, const float*, std::int64_t rows, std::int64_t d,
                         float, float* dx, float* dgamma, float* dbeta) {
  std::copy(dy, dy + rows * d, dx);
  std::fill(dgamma, dgamma + d, 0.0f);
  std::fill(dbeta, dbeta + d, 0.0f);
}

// x as it is, and the running estimates untouched.
mpt::Tensor batch_norm_train_forward(const mpt::Tensor& x, const std::vector<float>&,
                                     const std::vector<float>&, float, float, RunningStats&) {
  return x;
}

}  // namespace mpt::ex03
