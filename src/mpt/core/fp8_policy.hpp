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
// decides the scales. The policy text carries the recipe's options, as
// Transformer Engine's recipe objects take them, written as Chapter 6's
// jmp: presets write theirs (no spaces; the canonical text omits the
// defaults and lists the rest in this order):
//     fp8:delayed:margin=M,history=H,algo=max|most_recent   DelayedScaling
//     fp8:current:margin=M                                  Float8CurrentScaling
// M in 0..kFp8PolicyMaxMargin (TE's default 0), H in 1..kFp8PolicyMaxHistory
// (default 1024), algo default max; mx-floor and mx-rceil take none. No loss scaler: TE trains FP8 under bf16
// without one, the per-tensor scale of the output gradient taking the loss scale's place.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "mpt/core/policy.hpp"
#include "mpt/core/policy_string.hpp"

namespace mpt {

/// The largest margin a policy text accepts: the fp8 tier's kMaxMargin
/// (recipes.hpp; linear_scaling.cpp checks that they agree).
inline constexpr int kFp8PolicyMaxMargin = 24;
/// The longest amax history a policy text accepts: the fp8 tier's
/// kMaxAmaxHistoryLen (recipes.hpp; linear_scaling.cpp checks that they agree).
inline constexpr std::size_t kFp8PolicyMaxHistory = std::size_t{1} << 20;

/// The options of fp8:RECIPE:OPTIONS (see the top of the file), TE's defaults
/// where the text gives none.
struct Fp8RecipeOptions {
  int margin = 0;              ///< delayed, current: aim the amax at fp8_max / 2^margin
  std::size_t history = 1024;  ///< delayed: amax_history_len
  bool most_recent = false;    ///< delayed: algo most_recent (else max)
};

/// A policy's recipe and its options.
struct Fp8Recipe {
  std::string name;          ///< "delayed", "current", "mx-floor", "mx-rceil"
  Fp8RecipeOptions options;  ///< what the text gave, defaults elsewhere
};

/// The recipes `fp8:RECIPE` names: "delayed", "current", "mx-floor", "mx-rceil".
const char* const* fp8_recipe_names();
/// "delayed, current, mx-floor, mx-rceil" — for messages.
std::string fp8_recipe_choices();

/// The policy of `fp8:RECIPE` (see the top of the file).
class Fp8Policy final : public Policy {
 public:
  /// `recipe` is what describe() names ("delayed", "current").
  explicit Fp8Policy(std::string recipe) : recipe_{std::move(recipe), {}} {}
  /// A recipe with its options.
  explicit Fp8Policy(Fp8Recipe recipe) : recipe_(std::move(recipe)) {}
  /// The recipe's name.
  const std::string& recipe() const { return recipe_.name; }
  /// The recipe's options.
  const Fp8RecipeOptions& options() const { return recipe_.options; }
  /// "FP8, recipe delayed: Linear layers' GEMMs in FP8 — x and W e4m3 forward, dy e5m2 ...".
  std::string describe() const override;

 protected:
  /// See the top of the file.
  OpPrecision decide_op(const OpInfo& op, const OpQuery& q) const override;
  /// f32: the master itself.
  DType parameter_dtype_of(const OpInfo& op, std::string_view path) const override;

 private:
  Fp8Recipe recipe_;
};

/// The recipe of a canonical policy text whose base is fp8:RECIPE
/// ("fp8:delayed+fc3=f32" and "fp8:delayed:margin=1" give "delayed"), or ""
/// for any other policy.
std::string fp8_recipe_of_policy(const std::string& canonical_text);
/// The recipe and its options of a canonical policy text whose base is
/// fp8:RECIPE[:OPTIONS]; std::invalid_argument for any other policy.
Fp8Recipe fp8_recipe_and_options_of_policy(const std::string& canonical_text);

}  // namespace mpt
