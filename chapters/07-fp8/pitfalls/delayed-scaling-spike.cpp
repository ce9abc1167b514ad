// Chapter 07 — pitfall delayed-scaling-spike: a one-step spike under delayed scaling
// Depends on: common.hpp (draw_values, with_amax, fidelity, check, num,
// pct, this entry's declaration), mpt/fp8/recipes.hpp (DelayedScaling,
// quantize_current, current_scale); <cmath>, <string>, <vector>.
//
// Delayed scaling quantizes a step's tensor with a scale computed from the
// amaxes of earlier steps: scale = fp8_max / 2^margin / max(amax history).
// A tensor that suddenly grows (here one step 100 times larger than the
// others, as in a loss spike) hurts twice:
//  - at the spike, the scale still comes from the small tensors before it:
//    with margin 0 their amax sits on 448, so every value of the spike above
//    the old amax is clamped to ±448 (saturation, silent);
//  - after it, the spike's amax is the largest in the history for the next
//    amax_history_len steps, so the scale stays 100 times too small: the
//    ordinary tensors use the bottom of the format, and their small values
//    flush to zero. The scale recovers only when the spike leaves the history.
// Current scaling (each tensor's own amax) has neither problem; a margin
// would only trade the first for more of the second.
#include <cmath>
#include <string>
#include <vector>

#include "common.hpp"
#include "mpt/fp8/recipes.hpp"

namespace mpt::ch07 {
namespace {
namespace delayed_scaling_spike {

constexpr std::size_t kValues = 2048;
constexpr std::size_t kHistory = 16;          // amax_history_len (TE's default is 1024: the same, for longer)
constexpr std::size_t kWarmup = 4;            // steps that fill the history first (not measured)
constexpr std::size_t kBefore = 8;            // ordinary steps measured before the spike
constexpr std::size_t kAfter = kHistory + 8;  // steps after it: the history's length, then 8 more
constexpr double kAmax = 1.0;                 // every ordinary step's amax
constexpr double kSpike = 100.0;              // the spike step's amax
constexpr std::uint64_t kSeed = 7300;         // step t draws with seed kSeed + t

constexpr std::size_t kSpikeStep = kWarmup + kBefore;
constexpr std::size_t kSteps = kSpikeStep + 1 + kAfter;

std::vector<float> tensor_at(std::size_t t) {
  return with_amax(draw_values(kSeed + t, kValues, 1.0, 1.5), t == kSpikeStep ? kSpike : kAmax);
}

struct Step {
  Fidelity fid;
  float scale;  // the scale the step was quantized with
  float own;    // the scale of its own amax (current scaling)
};

RunResult run(bool delayed, std::string setup) {
  fp8::DelayedScalingOptions options;
  options.margin = 0;
  options.amax_history_len = kHistory;
  fp8::DelayedScaling recipe(DType::e4m3, options);
  std::vector<Step> steps;
  for (std::size_t t = 0; t < kSteps; ++t) {
    const std::vector<float> x = tensor_at(t);
    fp8::Fp8Tensor q;
    if (delayed) {
      //! [delayed-scaling-spike-broken]
      // delayed scaling, margin 0: the scale comes from the last 16 steps' amaxes
      q = recipe.quantize(x.data(), x.size());
      recipe.update();
      //! [delayed-scaling-spike-broken]
    } else {
      //! [delayed-scaling-spike-fixed]
      // current scaling: the scale comes from this tensor's own amax
      q = fp8::quantize_current(x.data(), x.size(), DType::e4m3);
      //! [delayed-scaling-spike-fixed]
    }
    steps.push_back({fidelity(x, q), q.scales[0], fp8::current_scale(q.amax[0], DType::e4m3)});
  }
  auto mean = [&](std::size_t first, std::size_t n, double Fidelity::*field) {
    double s = 0;
    for (std::size_t t = first; t < first + n; ++t) s += steps[t].fid.*field;
    return s / static_cast<double>(n);
  };
  double small_scale_steps = 0;
  for (std::size_t t = kSpikeStep + 1; t < kSteps; ++t)
    if (steps[t].scale < 0.5f * steps[t].own) small_scale_steps += 1;
  const Step& spike = steps[kSpikeStep];
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"before_flushed_fraction", mean(kWarmup, kBefore, &Fidelity::flushed_fraction),
       "values flushed to zero, the " + std::to_string(kBefore) + " steps before the spike"},
      {"spike_scale", spike.scale, "the scale the spike was quantized with"},
      {"spike_saturated_fraction", spike.fid.saturated_fraction, "the spike's values clamped to ±448"},
      {"spike_relative_error", spike.fid.relative_error, "‖read back − x‖ / ‖x‖ of the spike"},
      {"after_flushed_fraction", mean(kSpikeStep + 1, kHistory, &Fidelity::flushed_fraction),
       "values flushed to zero, the " + std::to_string(kHistory) + " steps after the spike"},
      {"after_median_relative_error", mean(kSpikeStep + 1, kHistory, &Fidelity::median_relative_error),
       "median |error| / |value|, the same steps"},
      {"small_scale_steps", small_scale_steps,
       "steps after the spike whose scale is below half their own amax's"},
      {"recovered_flushed_fraction",
       mean(kSpikeStep + 1 + kHistory, kAfter - kHistory, &Fidelity::flushed_fraction),
       "values flushed to zero, the " + std::to_string(kAfter - kHistory) + " steps after those"},
  };
  std::string per_step;
  for (std::size_t t = kWarmup; t < kSteps; ++t) {
    const double n = steps[t].fid.values;
    per_step += (t > kWarmup ? " " : "") + num(steps[t].fid.saturated_fraction * n) + "/" +
                num(steps[t].fid.flushed_fraction * n);
  }
  r.explanation = "The spike was quantized with scale " + num(spike.scale) + " (its own would be " +
                  num(spike.own) + "): " + pct(spike.fid.saturated_fraction) + " of it saturated. For " +
                  num(small_scale_steps) +
                  " steps after it the scale stayed below half the tensors' own, and " +
                  pct(r.get("after_flushed_fraction")) + " of their values flushed (" +
                  pct(r.get("before_flushed_fraction")) + " before). Saturated/flushed per step from step " +
                  std::to_string(kWarmup + 1) + " (the spike is step " + std::to_string(kSpikeStep + 1) +
                  "): " + per_step + ".";
  return r;
}

RunResult broken_run() {
  return run(true,
             "delayed scaling (E4M3, margin 0, history 16, max): 12 steps of amax 1, one of amax 100, "
             "24 of amax 1; 2048 heavy-tailed values a step");
}
RunResult fixed_run() { return run(false, "the same tensors with current scaling (each tensor's own amax)"); }

}  // namespace delayed_scaling_spike
}  // namespace

Pitfall delayed_scaling_spike_pitfall() {
  using namespace delayed_scaling_spike;
  return Pitfall{
      "delayed-scaling-spike",
      7,
      "Delayed scaling and a spike: the spike saturates, then the stale amax underflows what follows",
      "Delayed scaling uses earlier steps' amaxes: a spike is quantized with the small tensors' scale and "
      "saturates, and then, while its amax stays in the history, the scale is too small for the ordinary "
      "tensors and their small values flush. Current scaling uses each tensor's own amax.",
      broken_run,
      fixed_run,
      {
          check("more than 1% of the spike's values saturate",
                [](const RunResult& r) { return r.get("spike_saturated_fraction") > 0.01; }),
          check("in the 16 steps after the spike, more than 5% of the values flush to zero",
                [](const RunResult& r) { return r.get("after_flushed_fraction") > 0.05; }),
          check("the scale stays small for at least 8 steps after the spike",
                [](const RunResult& r) { return r.get("small_scale_steps") >= 8; }),
      },
      {
          check("no value of the spike saturates",
                [](const RunResult& r) { return r.get("spike_saturated_fraction") == 0; }),
          check("in the 16 steps after the spike, fewer than 1% of the values flush to zero",
                [](const RunResult& r) { return r.get("after_flushed_fraction") < 0.01; }),
          check("no step after the spike has a scale below half its own",
                [](const RunResult& r) { return r.get("small_scale_steps") == 0; }),
      },
      {
          check("before the spike, and once it has left the history, fewer than 0.1% of the values flush",
                [](const RunResult& r) {
                  return r.get("before_flushed_fraction") < 0.001 &&
                         r.get("recovered_flushed_fraction") < 0.001;
                }),
      }};
}

}  // namespace mpt::ch07
