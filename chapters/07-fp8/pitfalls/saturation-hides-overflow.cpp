// Chapter 07 — pitfall saturation-hides-overflow: inf becomes ±448 without a trace
// Depends on: common.hpp (draw_values, check, num, this entry's
// declaration), mpt/fp8/quantize.hpp (quantize_with_scale, dequantize,
// Fp8Counts); <cmath>, <limits>, <string>, <vector>.
//
// FP8 casts saturate by default (OCP's saturating conversion, CUDA's
// __NV_SATFINITE, Transformer Engine's casts): a value beyond ±448 after
// scaling, ±inf included, is stored as ±448 (E4M3 has no inf). A gradient
// that overflowed upstream (three infs from an fp16 product) therefore reads
// back as three ordinary values of magnitude 448 / scale — with a scale from
// the tensor's amax history, the largest finite gradient (to within fp32's
// rounding of 1 / scale). A check for
// inf and NaN on what was read back, as a GradScaler makes, finds nothing,
// and the step is taken. The FP8 tensor's counts (Fp8Tensor::counts, what
// quantize_element said of each element) are the only trace: reading them is
// the fix.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common.hpp"
#include "mpt/fp8/quantize.hpp"

namespace mpt::ch07 {
namespace {
namespace saturation_hides_overflow {

constexpr std::size_t kValues = 4096;
constexpr std::size_t kInfs[] = {17, 1000, 3333};  // where the product overflowed

// A gradient (E4M3, Transformer Engine's Format.E4M3) with three infs, the
// third negative; its finite amax is what the scale was computed from.
std::vector<float> gradient() {
  std::vector<float> g = draw_values(7600, kValues, std::exp2(-10.0), 1.0);
  const float inf = std::numeric_limits<float>::infinity();
  g[kInfs[0]] = inf;
  g[kInfs[1]] = inf;
  g[kInfs[2]] = -inf;
  return g;
}

float finite_amax(const std::vector<float>& g) {
  float a = 0;
  for (float v : g)
    if (std::isfinite(v)) a = std::fmax(a, std::fabs(v));
  return a;
}

// found: how many overflowed values the run's check reports.
RunResult run(bool read_counts, std::string setup) {
  const std::vector<float> g = gradient();
  const float scale = 448.0f / finite_amax(g);  // the scale the amax history gave (finite values only)
  const fp8::Fp8Tensor q = fp8::quantize_with_scale(g.data(), g.size(), DType::e4m3, scale);
  const std::vector<float> back = fp8::dequantize(q);
  double input_nonfinite = 0, back_nonfinite = 0, largest_at_inf = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) {
      input_nonfinite += 1;
      largest_at_inf = std::fmax(largest_at_inf, std::fabs(static_cast<double>(back[i])));
    }
    if (!std::isfinite(back[i])) back_nonfinite += 1;
  }
  double found = 0;
  if (!read_counts) {
    //! [saturation-hides-overflow-broken]
    // look for inf and NaN in what was read back, as a GradScaler does
    for (float v : back)
      if (!std::isfinite(v)) found += 1;
    //! [saturation-hides-overflow-broken]
  } else {
    //! [saturation-hides-overflow-fixed]
    // read what the cast counted: every value beyond ±448 (or inf) it clamped
    found = static_cast<double>(q.counts.saturated + q.counts.overflowed + q.counts.nan);
    //! [saturation-hides-overflow-fixed]
  }
  const bool skip = found > 0;
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"input_nonfinite", input_nonfinite, "infs in the gradient before the cast"},
      {"read_back_nonfinite", back_nonfinite, "infs and NaNs in the gradient read back from E4M3"},
      {"read_back_at_inf", largest_at_inf, "the largest magnitude read back where the infs were"},
      {"finite_amax", finite_amax(g), "the largest finite gradient magnitude"},
      {"overflow_found", found, "overflowed values the run's check reports"},
      {"step_skipped", skip ? 1.0 : 0.0, "1 when the run skips the optimizer step"},
  };
  r.explanation = "The " + num(input_nonfinite) + " infs were stored as ±448 and read back as ±" +
                  num(largest_at_inf) + " (the largest finite gradient is " + num(r.get("finite_amax")) +
                  "); the read-back holds " + num(back_nonfinite) +
                  " non-finite values, and the run's check found " + num(found) +
                  (skip ? ": the step is skipped." : ": the step is taken.");
  return r;
}

RunResult broken_run() {
  return run(false,
             "a 4096-value gradient with 3 infs, cast to E4M3 with saturation (the default) and the "
             "scale of its finite amax; inf/NaN checked on the values read back");
}
RunResult fixed_run() {
  return run(true,
             "the same cast; the overflow read from the FP8 tensor's counts (saturated, overflowed, NaN)");
}

}  // namespace saturation_hides_overflow
}  // namespace

Pitfall saturation_hides_overflow_pitfall() {
  using namespace saturation_hides_overflow;
  return Pitfall{
      "saturation-hides-overflow",
      7,
      "Saturation hides overflow: an inf becomes ±448 and no inf check finds it",
      "A saturating FP8 cast (the default) stores ±inf and anything beyond ±448 as ±448: the values read "
      "back are finite, and an inf/NaN check on them finds nothing. Only the cast's counts of saturated "
      "values record the overflow; read them.",
      broken_run,
      fixed_run,
      {
          check("the check finds no overflow",
                [](const RunResult& r) { return r.get("overflow_found") == 0; }),
          check("the step is taken with the clamped values",
                [](const RunResult& r) { return r.get("step_skipped") == 0; }),
      },
      {
          check("the check finds every inf",
                [](const RunResult& r) { return r.get("overflow_found") == r.get("input_nonfinite"); }),
          check("the step is skipped", [](const RunResult& r) { return r.get("step_skipped") == 1; }),
      },
      {
          check("the gradient holds infs", [](const RunResult& r) { return r.get("input_nonfinite") > 0; }),
          check("nothing read back is inf or NaN",
                [](const RunResult& r) { return r.get("read_back_nonfinite") == 0; }),
          check("where the infs were, the largest finite gradient's magnitude is read back",
                [](const RunResult& r) {
                  return std::fabs(r.get("read_back_at_inf") - r.get("finite_amax")) <=
                         r.get("finite_amax") * 0.0625;
                }),
      }};
}

}  // namespace mpt::ch07
