// Chapter 07 — FP8 training: per-Linear scaling state (see linear_scaling.hpp).
// Depends on: linear_scaling.hpp, gemm.hpp, core/fp8_policy.hpp.
#include "mpt/fp8/linear_scaling.hpp"

#include <stdexcept>
#include <utility>

#include "mpt/core/fp8_policy.hpp"
#include "mpt/fp8/gemm.hpp"

namespace mpt::fp8 {

LinearRecipe linear_recipe_named(std::string_view name) {
  if (name == "delayed") return LinearRecipe::delayed;
  if (name == "current") return LinearRecipe::current;
  throw std::invalid_argument("fp8 recipe '" + std::string(name) + "' is not one of delayed, current");
}

Fp8LinearScaling::Fp8LinearScaling(const Fp8LinearOptions& options) : options_(options) {
  if (options_.recipe == LinearRecipe::delayed)
    for (Fp8Role r : kFp8Roles) states_.emplace_back(dtype(r), options_.delayed);
}

DType Fp8LinearScaling::dtype(Fp8Role role) const {
  return fp8_dtype_for(options_.format, role == Fp8Role::grad_output ? Pass::backward : Pass::forward);
}

DelayedScaling& Fp8LinearScaling::state(Fp8Role role) {
  if (states_.empty()) throw std::logic_error("Fp8LinearScaling: current scaling keeps no delayed state");
  return states_[static_cast<std::size_t>(role)];
}

Tensor Fp8LinearScaling::quantize(const Tensor& x, Fp8Role role) {
  std::vector<float> v(static_cast<std::size_t>(x.numel()));
  x.to_f32(v.data());
  const float amax = amax_of(v.data(), v.size());
  const DType d = dtype(role);
  float scale = 0;
  if (options_.recipe == LinearRecipe::delayed) {
    DelayedScaling& s = state(role);
    scale = s.scale();
    s.record_amax(amax);
  } else {
    scale = current_scale(amax, d, options_.current);
  }
  const auto i = static_cast<std::size_t>(role);
  last_scale_[i] = scale;
  // The outcome counts, from the encode the Tensor's codes equal (quantize.hpp).
  const FormatSpec& f = fp8_spec(d);
  for (const float e : v) counts_[i].add(quantize_element(e, scale, f, true).outcome);
  return Tensor::from_f32_scaled(v.data(), x.shape(), d, scale);
}

Tensor Fp8LinearScaling::gemm(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, DType out,
                              const Tensor* bias) {
  return fp8_gemm(a, transpose_a ? Op::T : Op::N, b, transpose_b ? Op::T : Op::N, out, bias);
}

void Fp8LinearScaling::update() {
  for (DelayedScaling& s : states_) s.update();
}

Fp8Training::Fp8Training(Module& model, const Fp8LinearOptions& options) : options_(options) {
  model.visit([this](Module& m) {
    if (auto* linear = dynamic_cast<Linear*>(&m)) {
      auto s = std::make_shared<Fp8LinearScaling>(options_);
      linear->fp8 = s;
      layers_.push_back({linear->path(), std::move(s)});
    }
  });
  if (layers_.empty()) throw std::invalid_argument("fp8: the model has no Linear layer to run in FP8");
}

void Fp8Training::update() {
  for (Layer& l : layers_) l.fp8->update();
}

std::unique_ptr<Fp8Training> attach_fp8(Module& model, const std::string& canonical_policy) {
  const std::string recipe = fp8_recipe_of_policy(canonical_policy);
  if (recipe.empty()) return nullptr;
  Fp8LinearOptions o;
  o.recipe = linear_recipe_named(recipe);
  return std::make_unique<Fp8Training>(model, o);
}

}  // namespace mpt::fp8
