// Chapter 06 — exercises: trivial stub "always f32": the precision nothing can go wrong in.
// Depends on: ex06.hpp. A grader that gave it full marks for any exercise
// would be broken; CI requires a score below full marks on every exercise.
#include "ex06.hpp"

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace mpt::ex06 {

LayerPolicy parse_layer_policy(const std::string&) { return LayerPolicy{mpt::DType::f32, {}}; }

mpt::DType layer_dtype(const LayerPolicy&, const std::string&) { return mpt::DType::f32; }

mpt::DType promote_dtypes(const std::vector<mpt::DType>&) { return mpt::DType::f32; }

// No layer is ever lowered, and nothing is measured.
StepVerdict greedy_step(const std::vector<std::string>&, std::size_t, std::vector<std::string>&,
                        double fp32_loss, double, const CandidateLosses&) {
  return StepVerdict{false, fp32_loss};
}

// FP32 everywhere: the layers asked for, and all the others.
std::shared_ptr<const mpt::Policy> keep_layers_f32(const std::vector<std::string>&, mpt::DType) {
  return mpt::uniform_policy(mpt::DType::f32);
}

}  // namespace mpt::ex06
