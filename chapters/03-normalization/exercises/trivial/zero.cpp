// Chapter 03 — exercises: trivial stub "return zero": zero every output.
// Depends on: ex03.hpp. A grader that gave it full marks for any exercise
// would be broken; CI builds the grader against it and requires a score
// below full marks on every exercise.
#include "ex03.hpp"

#include <algorithm>

namespace mpt::ex03 {

Stats merge_statistics(const Stats&, const Stats&) { return {}; }

void layer_norm_backward(const float*, const float*, const float*, std::int64_t rows, std::int64_t d, float,
                         float* dx, float* dgamma, float* dbeta) {
  std::fill(dx, dx + rows * d, 0.0f);
  std::fill(dgamma, dgamma + d, 0.0f);
  std::fill(dbeta, dbeta + d, 0.0f);
}

mpt::Tensor batch_norm_train_forward(const mpt::Tensor& x, const std::vector<float>&,
                                     const std::vector<float>&, float, float, RunningStats& running) {
  std::fill(running.mean.begin(), running.mean.end(), 0.0f);
  std::fill(running.var.begin(), running.var.end(), 0.0f);
  return mpt::Tensor(x.dtype(), x.shape());
}

}  // namespace mpt::ex03
