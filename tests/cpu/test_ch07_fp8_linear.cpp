// Chapter 07 — FP8 training: the Linear under fp8:RECIPE against a reference
// built from the fp8 tier's quantize and GEMM; the policy; the delayed
// scales' update; a short training run; the checkpoint round trip with the
// FP8 state.
// Depends on: mpt/core/fp8_policy.hpp, mpt/fp8/linear_scaling.hpp,
// mpt/fp8/gemm.hpp, mpt/fp8/recipes.hpp, mpt/nn/layers/linear.hpp,
// mpt/train/run.hpp, mpt/train/checkpoint.hpp, test_support.hpp.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/fp8_policy.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/fp8/gemm.hpp"
#include "mpt/fp8/linear_scaling.hpp"
#include "mpt/fp8/recipes.hpp"
#include "mpt/nn/layers/linear.hpp"
#include "mpt/train/checkpoint.hpp"
#include "mpt/train/run.hpp"
#include "test_support.hpp"

namespace {

using mpt::DType;
using mpt::Fp8Role;
using mpt::Op;
using mpt::Tensor;
using mpt_test::bits;
using mpt_test::same_bits;

std::vector<float> ramp(std::size_t n, float step, float offset) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] =
        offset + step * static_cast<float>((i * 37) % 23) - step * 11.0f + 0.01f * static_cast<float>(i % 5);
  return v;
}

std::vector<float> values_of(const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  t.to_f32(v.data());
  return v;
}

// Puts `lin` (as layer "fc1") under ctx's fp8:RECIPE policy with a fresh
// state of `recipe` in `format`, and returns that state.
std::shared_ptr<mpt::fp8::Fp8LinearScaling> attach_state(mpt::Linear& lin, const mpt::Context& ctx,
                                                         mpt::fp8::LinearRecipe recipe,
                                                         mpt::fp8::Fp8Format format) {
  lin.set_path("fc1");
  lin.apply_policy(ctx.policy());
  mpt::fp8::Fp8LinearOptions o;
  o.recipe = recipe;
  o.format = format;
  auto state = std::make_shared<mpt::fp8::Fp8LinearScaling>(o);
  lin.fp8 = state;
  return state;
}

// Current scaling's scale for the values in `dtype`, from the fp8 tier.
float current_scale_of(const std::vector<float>& v, DType dtype) {
  return mpt::fp8::current_scale(mpt::fp8::amax_of(v.data(), v.size()), dtype);
}

// The reference's quantize: the tensor's values with a scale, as the fp8
// tier's current scaling chooses it or as given.
Tensor quantized(const std::vector<float>& v, mpt::Shape shape, DType d, float scale) {
  return Tensor::from_f32_scaled(v.data(), std::move(shape), d, scale);
}

mpt::train::RunConfig run_config(const std::string& model, const std::string& policy, std::int64_t steps) {
  mpt::train::RunConfig c;
  c.model = model;
  c.policy = policy;
  c.scaler = "none";
  c.steps = steps;
  return c;
}

}  // namespace

TEST_CASE("fp8:RECIPE: Linear GEMMs read e4m3, every other op bf16, parameters f32") {
  const mpt::PolicySpec spec = mpt::parse_policy_string("fp8:delayed");
  CHECK(spec.text() == "fp8:delayed");
  CHECK(spec.needs().scaler == "none");
  CHECK(spec.needs().master_weights);
  const auto p = spec.make();
  const mpt::OpPrecision lin = p->decide({"linear", "fc1", {DType::f32, DType::f32}, true});
  CHECK(lin.input == DType::e4m3);
  CHECK(lin.compute == DType::f32);
  CHECK(lin.output == DType::bf16);
  // The tied head asks "linear" as F.linear does, not as an FP8 GEMM.
  CHECK(p->decide({"linear", "head", {DType::bf16, DType::f32}, false}).input == DType::bf16);
  CHECK(p->decide({"layer_norm", "ln", {DType::bf16}, false}).output == DType::bf16);
  CHECK(p->decide({"cross_entropy", "loss", {DType::bf16}, false}).output == DType::f32);
  CHECK(p->parameter_dtype("linear", "fc1") == DType::f32);
  CHECK(mpt::fp8_recipe_of_policy("fp8:current+fc3=f32") == "current");
  CHECK(mpt::fp8_recipe_of_policy("bf16") == "");
  CHECK_THROWS_WITH_AS(mpt::parse_policy_string("fp8:sometimes"),
                       doctest::Contains("delayed, current, mx-floor, mx-rceil"), std::invalid_argument);
  CHECK(
      mpt::parse_policy_string("fp8:mx-rceil").make()->decide({"linear", "fc1", {DType::f32}, true}).input ==
      DType::e4m3);
  // A rule takes a layer out of FP8: fc3 in f32 inside fp8:delayed.
  const auto ruled = mpt::parse_policy_string("fp8:delayed+fc3=f32").make();
  CHECK(ruled->decide({"linear", "fc3", {DType::f32, DType::f32}, true}).input == DType::f32);
  CHECK(ruled->decide({"linear", "fc1", {DType::f32, DType::f32}, true}).input == DType::e4m3);
}

TEST_CASE("an FP8 Linear is the fp8 tier's quantize and GEMM, forward and backward, bit for bit") {
  const std::int64_t batch = 6, in = 40, out = 5;
  const std::vector<float> w = ramp(static_cast<std::size_t>(out * in), 0.013f, 0.002f);
  const std::vector<float> b = ramp(static_cast<std::size_t>(out), 0.1f, 0.05f);
  mpt::Linear lin(Tensor::from_f32(w.data(), {out, in}, DType::f32),
                  Tensor::from_f32(b.data(), {out}, DType::f32));
  mpt::Context ctx(mpt::parse_policy_string("fp8:current").make());
  const auto state = attach_state(lin, ctx, mpt::fp8::LinearRecipe::current, mpt::fp8::Fp8Format::hybrid);

  const std::vector<float> xv = ramp(static_cast<std::size_t>(batch * in), 0.7f, 0.1f);
  const Tensor x = Tensor::from_f32(xv.data(), {batch, in}, DType::bf16);
  mpt::Trace trace;
  ctx.set_trace(&trace);
  const Tensor y = lin.forward(x, ctx);
  const std::vector<float> dyv = ramp(static_cast<std::size_t>(batch * out), 3e-4f, 1e-5f);
  const Tensor dy = Tensor::from_f32(dyv.data(), {batch, out}, DType::bf16);
  const Tensor dx = lin.backward(dy, ctx);

  // The reference, from the fp8 tier: current scales from each tensor's amax.
  const std::vector<float> xr = values_of(x), dyr = values_of(dy);
  const float sx = current_scale_of(xr, DType::e4m3);
  const float sw = current_scale_of(w, DType::e4m3);
  const float sg = current_scale_of(dyr, DType::e5m2);
  CHECK(state->last_scale(Fp8Role::input) == sx);
  CHECK(state->last_scale(Fp8Role::grad_output) == sg);
  const Tensor xq = quantized(xr, {batch, in}, DType::e4m3, sx);
  const Tensor wq = quantized(w, {out, in}, DType::e4m3, sw);
  const Tensor gq = quantized(dyr, {batch, out}, DType::e5m2, sg);
  const Tensor bias_bf16 = Tensor::from_f32(b.data(), {out}, DType::bf16);
  const Tensor y_ref = mpt::fp8::fp8_gemm(xq, Op::N, wq, Op::T, DType::bf16, &bias_bf16);
  const Tensor dx_ref = mpt::fp8::fp8_gemm(gq, Op::N, wq, Op::N, DType::bf16);
  const Tensor dw_ref = mpt::fp8::fp8_gemm(gq, Op::T, xq, Op::N, DType::f32);
  CHECK(y.dtype() == DType::bf16);
  CHECK(same_bits(values_of(y), values_of(y_ref)));
  CHECK(dx.dtype() == DType::bf16);
  CHECK(same_bits(values_of(dx), values_of(dx_ref)));
  CHECK(same_bits(values_of(lin.weight.grad), values_of(dw_ref)));
  // db = Σ_B dy in FP32 from dy as it arrived (not from its FP8 copy).
  std::vector<float> db(static_cast<std::size_t>(out), 0.0f);
  for (std::int64_t i = 0; i < batch; ++i)
    for (std::int64_t j = 0; j < out; ++j)
      db[static_cast<std::size_t>(j)] += dyr[static_cast<std::size_t>(i * out + j)];
  CHECK(same_bits(values_of(lin.bias.grad), db));

  // The trace shows what the GEMMs read: e4m3 forward, e5m2 for dy.
  bool fwd = false, bwd = false;
  for (const mpt::TraceEntry& e : trace.entries()) {
    if (e.op != "linear") continue;
    if (e.phase == mpt::Phase::forward) {
      fwd = e.inputs.at(0).dtype == DType::e4m3 && e.inputs.at(1).dtype == DType::e4m3 &&
            e.outputs.at(0).dtype == DType::bf16;
    } else {
      bwd = e.inputs.at(0).dtype == DType::e5m2 && e.inputs.at(1).dtype == DType::e4m3;
    }
  }
  CHECK(fwd);
  CHECK(bwd);
}

TEST_CASE("Format E4M3: the Linear's dy is quantized in E4M3 with E4M3's scale, dx and dW from those codes") {
  // What Chapter 7's pitfall e4m3-for-gradients runs: the backward GEMMs read
  // dy in E4M3 (scale 448 / amax), not HYBRID's E5M2 (57344 / amax).
  const std::int64_t batch = 4, in = 24, out = 3;
  const std::vector<float> w = ramp(static_cast<std::size_t>(out * in), 0.011f, -0.1f);
  const std::vector<float> b(static_cast<std::size_t>(out), 0.0f);
  mpt::Linear lin(Tensor::from_f32(w.data(), {out, in}, DType::f32),
                  Tensor::from_f32(b.data(), {out}, DType::f32));
  mpt::Context ctx(mpt::parse_policy_string("fp8:current").make());
  const auto state = attach_state(lin, ctx, mpt::fp8::LinearRecipe::current, mpt::fp8::Fp8Format::e4m3);
  CHECK(state->dtype(Fp8Role::grad_output) == DType::e4m3);

  const std::vector<float> xv = ramp(static_cast<std::size_t>(batch * in), 0.3f, -2.0f);
  const Tensor x = Tensor::from_f32(xv.data(), {batch, in}, DType::bf16);
  (void)lin.forward(x, ctx);
  // dy spans 2^-27 .. 2^-3: E4M3's 17.8 binades cannot hold it all.
  std::vector<float> dyv(static_cast<std::size_t>(batch * out));
  for (std::size_t i = 0; i < dyv.size(); ++i) dyv[i] = std::ldexp(1.0f, -3 - static_cast<int>(i) * 24 / 11);
  const Tensor dy = Tensor::from_f32(dyv.data(), {batch, out}, DType::bf16);
  const Tensor dx = lin.backward(dy, ctx);

  const std::vector<float> xr = values_of(x), dyr = values_of(dy);
  const float sx = current_scale_of(xr, DType::e4m3);
  const float sw = current_scale_of(w, DType::e4m3);
  const float sg = current_scale_of(dyr, DType::e4m3);
  CHECK(state->last_scale(Fp8Role::grad_output) == sg);
  const Tensor xq = quantized(xr, {batch, in}, DType::e4m3, sx);
  const Tensor wq = quantized(w, {out, in}, DType::e4m3, sw);
  const Tensor gq = quantized(dyr, {batch, out}, DType::e4m3, sg);
  CHECK(same_bits(values_of(dx), values_of(mpt::fp8::fp8_gemm(gq, Op::N, wq, Op::N, DType::bf16))));
  CHECK(
      same_bits(values_of(lin.weight.grad), values_of(mpt::fp8::fp8_gemm(gq, Op::T, xq, Op::N, DType::f32))));
  // The smallest dy values are below E4M3's smallest subnormal at this scale: flushed.
  CHECK(state->counts(Fp8Role::grad_output).flushed > 0);
}

TEST_CASE("an MX Linear: each GEMM's operands blocked along its own k, bit for bit") {
  // k differs per GEMM: in = 40 forward, out = 36 for dx, B = 34 for dW —
  // each over one full block of 32 and a short one, so a block along the
  // wrong dimension would show.
  const std::int64_t batch = 34, in = 40, out = 36;
  const std::vector<float> w = ramp(static_cast<std::size_t>(out * in), 0.013f, 0.002f);
  const std::vector<float> b = ramp(static_cast<std::size_t>(out), 0.1f, 0.05f);
  const std::vector<float> xv = ramp(static_cast<std::size_t>(batch * in), 0.7f, 0.1f);
  const std::vector<float> dyv = ramp(static_cast<std::size_t>(batch * out), 3e-4f, 1e-5f);
  for (const char* recipe : {"mx-floor", "mx-rceil"}) {
    INFO(recipe);
    mpt::Linear lin(Tensor::from_f32(w.data(), {out, in}, DType::f32),
                    Tensor::from_f32(b.data(), {out}, DType::f32));
    mpt::Context ctx(mpt::parse_policy_string(std::string("fp8:") + recipe).make());
    const auto state =
        attach_state(lin, ctx, mpt::fp8::linear_recipe_named(recipe), mpt::fp8::Fp8LinearOptions{}.format);
    CHECK(state->dtype(Fp8Role::grad_output) == DType::e4m3);  // MXFP8: E4M3 throughout
    const Tensor x = Tensor::from_f32(xv.data(), {batch, in}, DType::bf16);
    const Tensor dy = Tensor::from_f32(dyv.data(), {batch, out}, DType::bf16);
    const Tensor y = lin.forward(x, ctx);
    const Tensor dx = lin.backward(dy, ctx);

    const auto rule =
        std::string(recipe) == "mx-floor" ? mpt::fp8::MxScaleRule::floor : mpt::fp8::MxScaleRule::rceil;
    const auto mx = [rule](const std::vector<float>& v, std::int64_t rows, std::int64_t cols) {
      return mpt::fp8::quantize_mx(v.data(), static_cast<std::size_t>(rows), static_cast<std::size_t>(cols),
                                   DType::e4m3, rule);
    };
    const auto t = [](const std::vector<float>& v, std::int64_t rows, std::int64_t cols) {
      std::vector<float> r(v.size());
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j)
          r[static_cast<std::size_t>(j * rows + i)] = v[static_cast<std::size_t>(i * cols + j)];
      return r;
    };
    const std::vector<float> xr = values_of(x), dyr = values_of(dy);
    const Tensor bias_bf16 = Tensor::from_f32(b.data(), {out}, DType::bf16);
    const Tensor y_ref = mpt::fp8::fp8_gemm_mx(mx(xr, batch, in), mx(w, out, in), DType::bf16, &bias_bf16);
    const Tensor dx_ref = mpt::fp8::fp8_gemm_mx(mx(dyr, batch, out), mx(t(w, out, in), in, out), DType::bf16);
    const Tensor dw_ref = mpt::fp8::fp8_gemm_mx(mx(t(dyr, batch, out), out, batch),
                                                mx(t(xr, batch, in), in, batch), DType::f32);
    CHECK(same_bits(values_of(y), values_of(y_ref)));
    CHECK(same_bits(values_of(dx), values_of(dx_ref)));
    CHECK(same_bits(values_of(lin.weight.grad), values_of(dw_ref)));
    // Not the per-tensor GEMM: the block scales change the products' bits.
    const float sx = current_scale_of(xr, DType::e4m3);
    const float sw = current_scale_of(w, DType::e4m3);
    const Tensor y_tensor =
        mpt::fp8::fp8_gemm(quantized(xr, {batch, in}, DType::e4m3, sx), Op::N,
                           quantized(w, {out, in}, DType::e4m3, sw), Op::T, DType::bf16, &bias_bf16);
    CHECK_FALSE(same_bits(values_of(y), values_of(y_tensor)));
    // What the layer keeps for backward: the columnwise codes of x and W.
    std::size_t kept = 0;
    for (const Tensor* k : lin.saved()) kept += k->bytes();
    CHECK(kept == static_cast<std::size_t>(in * batch + in * out));
  }
}

TEST_CASE("delayed scaling in a Linear: scale 1 first, then fp8_max / amax of the step before") {
  const std::int64_t batch = 4, in = 8, out = 3;
  const std::vector<float> w = ramp(static_cast<std::size_t>(out * in), 0.05f, 0.0f);
  const std::vector<float> b(static_cast<std::size_t>(out), 0.0f);
  mpt::Linear lin(Tensor::from_f32(w.data(), {out, in}, DType::f32),
                  Tensor::from_f32(b.data(), {out}, DType::f32));
  lin.set_path("fc1");
  mpt::Context ctx(mpt::parse_policy_string("fp8:delayed").make());
  lin.apply_policy(ctx.policy());
  auto state = std::make_shared<mpt::fp8::Fp8LinearScaling>(mpt::fp8::Fp8LinearOptions{});
  lin.fp8 = state;
  const std::vector<float> xv = ramp(static_cast<std::size_t>(batch * in), 0.5f, 0.0f);
  const Tensor x = Tensor::from_f32(xv.data(), {batch, in}, DType::bf16);
  const std::vector<float> xr = values_of(x);
  (void)lin.forward(x, ctx);
  CHECK(state->last_scale(Fp8Role::input) == 1.0f);
  state->update();
  const float amax = mpt::fp8::amax_of(xr.data(), xr.size());
  CHECK(state->state(Fp8Role::input).scale() == 448.0f / amax);
  CHECK(state->state(Fp8Role::weight).scale() == 448.0f / mpt::fp8::amax_of(w.data(), w.size()));
  (void)lin.forward(x, ctx);
  CHECK(state->last_scale(Fp8Role::input) == 448.0f / amax);
  // Without its scaling state, a Linear refuses the FP8 answer.
  lin.fp8 = nullptr;
  CHECK_THROWS_WITH_AS(lin.forward(x, ctx), doctest::Contains("no FP8 scaling state"), std::invalid_argument);
}

TEST_CASE("every Linear of the Transformer gets a state; the tied head stays bf16") {
  mpt::train::TrainRun run(run_config("transformer", "fp8:delayed", 1));
  mpt::Trace trace;
  (void)run.step(trace);
  int fp8_linears = 0, bf16_linears = 0;
  for (const mpt::TraceEntry& e : trace.entries())
    if (e.op == "linear" && e.phase == mpt::Phase::forward)
      (e.inputs.at(0).dtype == DType::e4m3 ? fp8_linears : bf16_linears) += 1;
  CHECK(fp8_linears > 4);    // attention's q, k, v, out and the MLP's fc1, fc2, per block
  CHECK(bf16_linears == 1);  // the tied head
}

TEST_CASE("the MLP trains under fp8:delayed, fp8:current and fp8:mx-rceil: the loss falls") {
  for (const char* policy : {"fp8:delayed", "fp8:current", "fp8:mx-rceil"}) {
    INFO(policy);
    mpt::train::TrainRun run(run_config("mlp", policy, 60));
    double first = 0, last = 0;
    for (int i = 0; i < 60; ++i) {
      const float loss = run.step().loss;
      REQUIRE(std::isfinite(loss));
      if (i < 10) first += loss;
      if (i >= 50) last += loss;
    }
    CHECK(last < 0.5 * first);
  }
}

TEST_CASE("checkpoints hold the delayed states by name, and a resume continues bit for bit") {
  using mpt::train::parse_checkpoint;
  using mpt::train::serialize_checkpoint;
  const mpt::train::RunConfig c = run_config("mlp", "fp8:delayed", 12);
  mpt::train::TrainRun straight(c);
  for (int i = 0; i < 12; ++i) (void)straight.step();
  std::string bytes;
  {
    mpt::train::TrainRun first(c);
    for (int i = 0; i < 5; ++i) (void)first.step();
    bytes = serialize_checkpoint(first.checkpoint());
  }
  const mpt::train::Checkpoint saved = parse_checkpoint(bytes);
  int histories = 0, scales = 0;
  bool fc1_input = false;
  for (const mpt::train::TensorRecord& t : saved.tensors) {
    if (t.name.rfind("fp8.amax_history/", 0) == 0) ++histories;
    if (t.name.rfind("fp8.scale/", 0) == 0) {
      ++scales;
      CHECK(t.values.at(0) != 1.0f);  // five updates moved every scale off its start
    }
    if (t.name == "fp8.amax_history/fc1.input") fc1_input = t.values.size() == 1024;
  }
  CHECK(histories == 9);  // 3 Linears × input, weight, grad_output
  CHECK(scales == 9);
  CHECK(fc1_input);
  mpt::train::TrainRun resumed(c);
  resumed.restore(saved);
  for (int i = 5; i < 12; ++i) (void)resumed.step();
  for (std::size_t i = 0; i < straight.history().size(); ++i) {
    INFO("step " << i + 1);
    CHECK(bits(resumed.history()[i].loss) == bits(straight.history()[i].loss));
  }
  CHECK(resumed.masters_checksum() == straight.masters_checksum());
  CHECK(serialize_checkpoint(resumed.checkpoint()) == serialize_checkpoint(straight.checkpoint()));

  // Current and MX scaling keep no state between steps: no fp8 tensors, and
  // a resume is bit for bit all the same.
  for (const char* policy : {"fp8:current", "fp8:mx-rceil"}) {
    INFO(policy);
    const mpt::train::RunConfig cc = run_config("mlp", policy, 6);
    mpt::train::TrainRun whole(cc), part(cc), rest(cc);
    for (int i = 0; i < 6; ++i) (void)whole.step();
    for (int i = 0; i < 3; ++i) (void)part.step();
    const mpt::train::Checkpoint ck = parse_checkpoint(serialize_checkpoint(part.checkpoint()));
    for (const mpt::train::TensorRecord& t : ck.tensors) CHECK(t.name.rfind("fp8.", 0) != 0);
    rest.restore(ck);
    for (int i = 3; i < 6; ++i) (void)rest.step();
    CHECK(rest.masters_checksum() == whole.masters_checksum());
  }

  // A checkpoint without the FP8 state (a resume that drops it) is refused.
  mpt::train::Checkpoint dropped = saved;
  std::vector<mpt::train::TensorRecord> kept;
  for (const mpt::train::TensorRecord& t : dropped.tensors)
    if (t.name.rfind("fp8.", 0) != 0) kept.push_back(t);
  dropped.tensors = kept;
  mpt::train::TrainRun refused(c);
  CHECK_THROWS_WITH_AS(refused.restore(dropped), doctest::Contains("tensors"), std::invalid_argument);
  // A state that cannot be: a negative amax in a history, refused by name.
  mpt::train::Checkpoint bad = saved;
  for (mpt::train::TensorRecord& t : bad.tensors)
    if (t.name == "fp8.amax_history/fc2.weight") t.values[3] = -1.0f;
  CHECK_THROWS_WITH_AS(refused.restore(bad), doctest::Contains("fp8.amax_history/fc2.weight"),
                       std::invalid_argument);
}
