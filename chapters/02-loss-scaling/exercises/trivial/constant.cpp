// Chapter 02 exercises — trivial stub "return a constant", each constant a
// plausible one: a grader that gave it full marks for any exercise would be
// broken. Depends on: ex02.hpp. CI requires a score below full marks on
// every exercise.
#include "ex02.hpp"

namespace mpt::ex02 {

// Back to PyTorch's initial scale, 2^16, every iteration.
void update_scale(float& scale, std::int32_t& growth_tracker, bool, double, double, std::int32_t) {
  scale = 65536.0f;
  growth_tracker = 0;
}

// "Always overflowed": every step would be skipped.
bool unscale_and_check(float*, std::size_t, float) { return true; }

// "Clipped to norm 1".
ClipResult unscale_and_clip(const std::vector<GradTensor>&, float, double) { return {false, 1.0, true}; }

AccumulationResult accumulate_and_step(mpt::Mlp&, mpt::Optimizer&, mpt::GradScaler&,
                                       const std::vector<mpt::Dataset>&) {
  return {1.0f, true};
}

}  // namespace mpt::ex02
