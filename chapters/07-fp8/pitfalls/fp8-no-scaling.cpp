// Chapter 07 — pitfall fp8-no-scaling: FP8 without a scale
// Depends on: common.hpp (draw_values, fidelity, check, num, pct, this
// entry's declaration), mpt/fp8/recipes.hpp (quantize_current,
// fp8_dtype_for); <cmath>, <string>, <vector>.
//
// E4M3 holds magnitudes from 2^-9 to 448, E5M2 from 2^-16 to 57344: fixed
// windows. A tensor stored in FP8 with scale 1 keeps what falls inside its
// format's window and loses the rest: gradients of the order of 1e-6 are
// below E5M2's smallest subnormal and flush to zero, and activations of a
// residual stream in the hundreds and thousands are clamped at 448. The
// scale is what moves a tensor into the window: current scaling (Transformer
// Engine's Float8CurrentScaling) multiplies each tensor by fp8_max / amax,
// so its largest value lands on the format's max and the rest follow.
// Transformer Engine's default format, HYBRID, stores activations in E4M3
// and gradients in E5M2; so do both runs.
#include <cmath>
#include <string>
#include <vector>

#include "common.hpp"
#include "mpt/fp8/recipes.hpp"

namespace mpt::ch07 {
namespace {
namespace fp8_no_scaling {

constexpr std::size_t kValues = 4096;

// Activations of a residual stream: typical magnitude 40, heavy-tailed.
std::vector<float> activations() { return draw_values(7101, kValues, 40.0, 1.0); }
// Gradients: typical magnitude 2^-20 (about 1e-6), spread over orders of magnitude.
std::vector<float> gradients() { return draw_values(7102, kValues, std::exp2(-20.0), 1.5); }

RunResult run(bool scaled, std::string setup) {
  const std::vector<float> a = activations();
  const std::vector<float> g = gradients();
  const DType a_dtype = fp8::fp8_dtype_for(fp8::Fp8Format::hybrid, fp8::Pass::forward);   // e4m3
  const DType g_dtype = fp8::fp8_dtype_for(fp8::Fp8Format::hybrid, fp8::Pass::backward);  // e5m2
  fp8::Fp8Tensor qa, qg;
  if (!scaled) {
    //! [fp8-no-scaling-broken]
    // cast to FP8 as they are: scale 1
    qa = fp8::quantize_with_scale(a.data(), a.size(), a_dtype, 1.0f);
    qg = fp8::quantize_with_scale(g.data(), g.size(), g_dtype, 1.0f);
    //! [fp8-no-scaling-broken]
  } else {
    //! [fp8-no-scaling-fixed]
    // current scaling: each tensor's own amax lands on the format's max
    qa = fp8::quantize_current(a.data(), a.size(), a_dtype);
    qg = fp8::quantize_current(g.data(), g.size(), g_dtype);
    //! [fp8-no-scaling-fixed]
  }
  const Fidelity fa = fidelity(a, qa);
  const Fidelity fg = fidelity(g, qg);
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"activation_amax", fp8::amax_of(a.data(), a.size()), "the activations' largest magnitude"},
      {"activation_scale", qa.scales[0], "the activations' scale"},
      {"activation_flushed_fraction", fa.flushed_fraction, "activations flushed to zero (E4M3)"},
      {"activation_saturated_fraction", fa.saturated_fraction, "activations clamped to ±448 (E4M3)"},
      {"activation_relative_error", fa.relative_error, "‖read back − x‖ / ‖x‖ of the activations"},
      {"gradient_amax", fp8::amax_of(g.data(), g.size()), "the gradients' largest magnitude"},
      {"gradient_scale", qg.scales[0], "the gradients' scale"},
      {"gradient_flushed_fraction", fg.flushed_fraction, "gradients flushed to zero (E5M2)"},
      {"gradient_saturated_fraction", fg.saturated_fraction, "gradients clamped to ±57344 (E5M2)"},
      {"gradient_relative_error", fg.relative_error, "‖read back − x‖ / ‖x‖ of the gradients"},
  };
  r.explanation = "With scale " + num(qa.scales[0]) + ", " + pct(fa.saturated_fraction) +
                  " of the activations (amax " + num(r.get("activation_amax")) + ") are clamped and " +
                  pct(fa.flushed_fraction) + " flushed; with scale " + num(qg.scales[0]) + ", " +
                  pct(fg.flushed_fraction) + " of the gradients (amax " + num(r.get("gradient_amax")) +
                  ") flush to zero: their relative errors are " + num(fa.relative_error) + " and " +
                  num(fg.relative_error) + ".";
  return r;
}

RunResult broken_run() {
  return run(false,
             "activations (typical 40, heavy-tailed) in E4M3 and gradients (typical 2^-20) in E5M2, "
             "each cast with scale 1");
}
RunResult fixed_run() {
  return run(true, "the same tensors, each with current scaling (scale = fp8_max / its amax)");
}

}  // namespace fp8_no_scaling
}  // namespace

Pitfall fp8_no_scaling_pitfall() {
  using namespace fp8_no_scaling;
  return Pitfall{
      "fp8-no-scaling",
      7,
      "FP8 without scaling: gradients flush to zero, large activations saturate",
      "FP8's window is fixed (E4M3 2^-9..448, E5M2 2^-16..57344): with scale 1, gradients of 1e-6 flush "
      "to zero and activations in the thousands clamp at 448. A per-tensor scale (current scaling: fp8_max "
      "/ amax) moves each tensor into the window.",
      broken_run,
      fixed_run,
      {
          check("most gradient values flush to zero",
                [](const RunResult& r) { return r.get("gradient_flushed_fraction") > 0.5; }),
          check("some activations saturate at ±448",
                [](const RunResult& r) { return r.get("activation_saturated_fraction") > 0; }),
          check("both relative errors are above 20%",
                [](const RunResult& r) {
                  return r.get("activation_relative_error") > 0.2 && r.get("gradient_relative_error") > 0.2;
                }),
      },
      {
          check("fewer than 1% of the gradient values flush",
                [](const RunResult& r) { return r.get("gradient_flushed_fraction") < 0.01; }),
          check("no activation saturates",
                [](const RunResult& r) { return r.get("activation_saturated_fraction") == 0; }),
          check("both relative errors are below 10% (E5M2 keeps 3 significant bits)",
                [](const RunResult& r) {
                  return r.get("activation_relative_error") < 0.1 && r.get("gradient_relative_error") < 0.1;
                }),
      },
      {
          check("the same tensors in both runs",
                [](const RunResult& r) {
                  return r.get("activation_amax") == fp8::amax_of(activations().data(), kValues) &&
                         r.get("gradient_amax") == fp8::amax_of(gradients().data(), kValues);
                }),
      }};
}

}  // namespace mpt::ch07
