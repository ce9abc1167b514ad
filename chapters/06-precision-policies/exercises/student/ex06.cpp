// Chapter 06 — exercises: YOUR FILE: write 6.1, 6.2 and 6.3 here, and find and fix the bug in 6.4.
// Depends on: ex06.hpp (the specification), the C++ standard library, and
// for 6.4's given body mpt's Policy and UniformPolicy (mpt/core/policy.hpp).
// Each function of 6.1 to 6.3 throws until you replace its body; the grader
// reports the exercise as "not implemented" until then. 6.4's body runs, and
// scores nothing until it is fixed. See README.md for how to grade.
#include "ex06.hpp"

#include <cmath>  // std::isfinite, std::abs
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mpt/core/policy.hpp"

namespace mpt::ex06 {

LayerPolicy parse_layer_policy(const std::string& text) {
  (void)text;
  throw std::logic_error("exercise 6.1 not implemented");
}

mpt::DType layer_dtype(const LayerPolicy& policy, const std::string& path) {
  (void)policy;
  (void)path;
  throw std::logic_error("exercise 6.1 not implemented");
}

mpt::DType promote_dtypes(const std::vector<mpt::DType>& inputs) {
  (void)inputs;
  throw std::logic_error("exercise 6.2 not implemented");
}

StepVerdict greedy_step(const std::vector<std::string>& order, std::size_t next,
                        std::vector<std::string>& lowered, double fp32_loss, double budget,
                        const CandidateLosses& losses) {
  (void)order;
  (void)next;
  (void)lowered;
  (void)fp32_loss;
  (void)budget;
  (void)losses;
  throw std::logic_error("exercise 6.3 not implemented");
}

// Exercise 6.4 — DIAGNOSE: this body is given. It compiles, runs and keeps
// the layers it is asked for in FP32, and it has one bug; find it and fix
// it (ex06.hpp says what the policy must decide).
namespace {

// low everywhere, f32 at the layers named in `keep`.
class KeepNamedPolicy final : public mpt::Policy {
 public:
  KeepNamedPolicy(std::vector<std::string> keep, mpt::DType low)
      : keep_(std::move(keep)), low_(mpt::uniform_policy(low)), f32_(mpt::uniform_policy(mpt::DType::f32)) {}
  std::string describe() const override { return low_->describe() + "; f32 at the layers named"; }

 protected:
  mpt::OpPrecision decide_op(const mpt::OpInfo& /*op*/, const mpt::OpQuery& q) const override {
    return pick(q.path).decide(q);
  }
  mpt::DType parameter_dtype_of(const mpt::OpInfo& op, std::string_view path) const override {
    return pick(path).parameter_dtype(op.name, path);
  }

 private:
  // The policy that decides for the layer at `path`.
  const mpt::Policy& pick(std::string_view path) const {
    for (const std::string& name : keep_)
      if (path.find(name) != std::string_view::npos) return *f32_;  // `if name in path:` keep it in FP32
    return *low_;
  }
  std::vector<std::string> keep_;
  std::shared_ptr<const mpt::Policy> low_, f32_;
};

}  // namespace

std::shared_ptr<const mpt::Policy> keep_layers_f32(const std::vector<std::string>& paths, mpt::DType low) {
  return std::make_shared<KeepNamedPolicy>(paths, low);
}

}  // namespace mpt::ex06
