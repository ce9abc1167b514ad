// Chapter 02 exercises — trivial stub "return zero": zero every output.
// A grader that gave it full marks for any exercise would be broken.
// Depends on: ex02.hpp. CI builds the grader against it and requires a
// score below full marks on every exercise.
#include "ex02.hpp"

namespace mpt::ex02 {

void update_scale(float& scale, std::int32_t& growth_tracker, bool, double, double, std::int32_t) {
  scale = 0.0f;
  growth_tracker = 0;
}

bool unscale_and_check(float* g, std::size_t n, float) {
  for (std::size_t i = 0; i < n; ++i) g[i] = 0.0f;
  return false;
}

ClipResult unscale_and_clip(const std::vector<GradTensor>& grads, float, double) {
  for (const GradTensor& t : grads)
    for (std::size_t i = 0; i < t.size; ++i) t.data[i] = 0.0f;
  return {false, 0.0, false};
}

AccumulationResult accumulate_and_step(mpt::Mlp&, mpt::Optimizer& opt, mpt::GradScaler&,
                                       const std::vector<mpt::Dataset>&) {
  opt.zero_grad();
  return {0.0f, false};
}

}  // namespace mpt::ex02
