// Chapter 07 — FP8 training: the policy `fp8:RECIPE` — the GEMMs of Linear
// layers in FP8 (Transformer Engine's te.Linear under fp8_autocast),
// everything else in bf16 with FP32 parameters.
// Depends on: policy.hpp, policy_string.hpp (NamedBase: the grammar's view).
//
// What Transformer Engine runs in FP8 is the GEMMs of its modules (te.Linear,
// LayerNormLinear, ...); fp8_autocast leaves every other op in the precision
// around it, which in TE's examples and in Megatron is bf16 autocast. So:
//  - "linear" asked by a GEMM that can run in FP8 (OpQuery::fp8_gemm, set by
//    Linear): reads e4m3 (the forward's format; the Linear's scaling state
//    gives the gradient E5M2, HYBRID), computes in f32, stores bf16;
//  - every other op: reads and stores bf16, computes in f32 (the tied head
//    asks "linear" without fp8_gemm, as F.linear under TE is not an FP8 GEMM);
//  - a loss: reads what arrives, computes and returns f32;
//  - every parameter's model copy is the FP32 master itself: the Linear
//    quantizes its weight from the master every step (TE with FP32
//    parameters), other ops cast their parameters to bf16 where they read
//    them (the weight cast cache).
// The recipe (delayed, current, mx-floor, mx-rceil) is not the policy's business: the policy
// names where FP8 is; the per-layer scaling state (fp8/linear_scaling.hpp)
// decides the scales. No loss scaler: TE trains FP8 under bf16 without one,
// the per-tensor scale of the output gradient taking the loss scale's place.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "mpt/core/policy.hpp"
#include "mpt/core/policy_string.hpp"

namespace mpt {

/// The recipes `fp8:RECIPE` names: "delayed", "current", "mx-floor", "mx-rceil".
const char* const* fp8_recipe_names();
/// "delayed, current, mx-floor, mx-rceil" — for messages.
std::string fp8_recipe_choices();

/// The policy of `fp8:RECIPE` (see the top of the file).
class Fp8Policy final : public Policy {
 public:
  /// `recipe` is what describe() names ("delayed", "current").
  explicit Fp8Policy(std::string recipe) : recipe_(std::move(recipe)) {}
  /// The recipe's name.
  const std::string& recipe() const { return recipe_; }
  /// "FP8, recipe delayed: Linear layers' GEMMs in FP8 — x and W e4m3 forward, dy e5m2 ...".
  std::string describe() const override;

 protected:
  /// See the top of the file.
  OpPrecision decide_op(const OpInfo& op, const OpQuery& q) const override;
  /// f32: the master itself.
  DType parameter_dtype_of(const OpInfo& op, std::string_view path) const override;

 private:
  std::string recipe_;
};

/// The recipe of a canonical policy text whose base is fp8:RECIPE
/// ("fp8:delayed+fc3=f32" gives "delayed"), or "" for any other policy.
std::string fp8_recipe_of_policy(const std::string& canonical_text);

}  // namespace mpt
