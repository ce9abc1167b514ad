// Chapter 07 — FP8 training: the recipe's options in the policy text,
// fp8:delayed:margin=M,history=H,algo=max|most_recent and
// fp8:current:margin=M — their canonical text, the scaling state they give
// each Linear, and a one-line refusal for each way they can be wrong.
// Depends on: mpt/core/fp8_policy.hpp, mpt/core/policy_string.hpp,
// mpt/core/context.hpp, mpt/fp8/linear_scaling.hpp, mpt/fp8/recipes.hpp,
// mpt/nn/layers/linear.hpp, doctest.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/fp8_policy.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/fp8/linear_scaling.hpp"
#include "mpt/fp8/recipes.hpp"
#include "mpt/nn/layers/linear.hpp"

namespace {

using mpt::DType;
using mpt::Fp8Role;
using mpt::Tensor;

std::string canonical(const std::string& text) { return mpt::parse_policy_string(text).text(); }

/// One forward of a Linear under `policy` (its state attached by attach_fp8)
/// and the update after it: the input's delayed scale for the next step.
float input_scale_after_one_step(const std::string& policy) {
  const std::int64_t batch = 4, in = 8, out = 3;
  std::vector<float> w(static_cast<std::size_t>(out * in)), b(static_cast<std::size_t>(out), 0.0f),
      xv(static_cast<std::size_t>(batch * in));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.05f * static_cast<float>(i) - 0.3f;
  for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = 0.5f * static_cast<float>(i) - 3.0f;
  mpt::Linear lin(Tensor::from_f32(w.data(), {out, in}, DType::f32),
                  Tensor::from_f32(b.data(), {out}, DType::f32));
  lin.set_path("fc1");
  const mpt::PolicySpec spec = mpt::parse_policy_string(policy);
  mpt::Context ctx(spec.make());
  lin.apply_policy(ctx.policy());
  auto training = mpt::fp8::attach_fp8(lin, spec.text());
  REQUIRE(training != nullptr);
  (void)lin.forward(Tensor::from_f32(xv.data(), {batch, in}, DType::bf16), ctx);
  training->update();
  return training->layers().at(0).fp8->state(Fp8Role::input).scale();
}

}  // namespace

TEST_CASE("fp8 recipe options: canonical in the order margin, history, algo, defaults left out") {
  CHECK(canonical("fp8:delayed:algo=most_recent,history=16,margin=1") ==
        "fp8:delayed:margin=1,history=16,algo=most_recent");
  CHECK(canonical("fp8:delayed:margin=0,history=1024,algo=max") == "fp8:delayed");
  CHECK(canonical("fp8:delayed:history=0016") == "fp8:delayed:history=16");
  CHECK(canonical("fp8:current:margin=2+fc3=f32") == "fp8:current:margin=2+fc3=f32");
  CHECK(mpt::fp8_recipe_of_policy("fp8:delayed:margin=1+fc3=f32") == "delayed");
  CHECK(mpt::fp8_recipe_of_policy("fp8:current:margin=2") == "current");
  const mpt::Fp8Recipe r =
      mpt::fp8_recipe_and_options_of_policy("fp8:delayed:margin=3,history=7,algo=most_recent");
  CHECK(r.name == "delayed");
  CHECK(r.options.margin == 3);
  CHECK(r.options.history == 7);
  CHECK(r.options.most_recent);
  // The policy says what it runs.
  const std::string d =
      mpt::parse_policy_string("fp8:delayed:history=16,algo=most_recent").make()->describe();
  CHECK(d.find("16 steps, most_recent, margin 0") != std::string::npos);
  // The ranges are the recipes' own.
  CHECK(mpt::kFp8PolicyMaxMargin == mpt::fp8::kMaxMargin);
  CHECK(mpt::kFp8PolicyMaxHistory == mpt::fp8::kMaxAmaxHistoryLen);
}

TEST_CASE("fp8 recipe options reach every Linear's scaling state") {
  mpt::Linear lin(Tensor(DType::f32, {2, 3}), Tensor(DType::f32, {2}));
  lin.set_path("fc1");
  auto delayed = mpt::fp8::attach_fp8(lin, canonical("fp8:delayed:margin=2,history=5,algo=most_recent"));
  REQUIRE(delayed != nullptr);
  const mpt::fp8::Fp8LinearOptions& o = delayed->layers().at(0).fp8->options();
  CHECK(o.recipe == mpt::fp8::LinearRecipe::delayed);
  CHECK(o.delayed.margin == 2);
  CHECK(o.delayed.amax_history_len == 5);
  CHECK(o.delayed.algo == mpt::fp8::AmaxComputeAlgo::most_recent);
  auto current = mpt::fp8::attach_fp8(lin, canonical("fp8:current:margin=4"));
  CHECK(current->layers().at(0).fp8->options().current.margin == 4);
  // A margin of 1 aims the amax at 448 / 2: the next scale is exactly half.
  const float s0 = input_scale_after_one_step("fp8:delayed");
  const float s1 = input_scale_after_one_step("fp8:delayed:margin=1");
  CHECK(s0 > 1.0f);
  CHECK(s1 == s0 / 2.0f);
}

TEST_CASE("bad fp8 recipe options: one line naming what was wrong and what the recipe takes") {
  struct Bad {
    const char* text;
    const char* what;
    const char* valid;
  };
  const Bad bad[] = {
      {"fp8:delayed:", "an empty option list", "margin=0..24,history=1..1048576,algo=max|most_recent"},
      {"fp8:delayed:margin=25", "margin '25' is not a whole number from 0 to 24", "takes the options"},
      {"fp8:delayed:margin=-1", "margin '-1'", "takes the options"},
      {"fp8:delayed:history=0", "history '0' is not a whole number from 1 to 1048576", "takes the options"},
      {"fp8:delayed:history=99999999999", "history '99999999999'", "takes the options"},
      {"fp8:delayed:algo=min", "algo 'min' is neither max nor most_recent", "takes the options"},
      {"fp8:delayed:margin=1,margin=2", "option 'margin' given twice", "each at most once"},
      {"fp8:delayed:margin", "option 'margin' is not NAME=VALUE", "takes the options"},
      {"fp8:delayed:speed=2", "unknown option 'speed'", "takes the options"},
      {"fp8:current:history=4", "unknown option 'history'", "fp8:current takes the options margin=0..24"},
      {"fp8:mx-floor:margin=1", "options given to an MX recipe", "fp8:mx-floor takes no options"},
      {"fp8:delayed:margin=\n1", "margin '\\x0a1'", "takes the options"},
      {"fp8:weekly:margin=1", "fp8 takes fp8:RECIPE", "delayed, current, mx-floor, mx-rceil"},
  };
  for (const Bad& b : bad) {
    INFO(b.text);
    std::string message;
    try {
      (void)mpt::parse_policy_string(b.text);
    } catch (const std::invalid_argument& e) {
      message = e.what();
    }
    CHECK(message.find(b.what) != std::string::npos);
    CHECK(message.find(b.valid) != std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
  }
}
