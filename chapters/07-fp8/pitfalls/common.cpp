// Chapter 07 — FP8 with per-tensor and block scaling: what the pitfalls share
// Depends on: common.hpp, mpt/core/random.hpp (Rng), mpt/fp8/recipes.hpp
// (DelayedScaling, current_scale), mpt/formats/round_element.hpp (decode,
// format_max); <algorithm>, <cmath>, <string>, <vector>.
#include "common.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mpt/core/random.hpp"
#include "mpt/formats/round_element.hpp"
#include "mpt/fp8/recipes.hpp"

namespace mpt::ch07 {

std::vector<float> draw_values(std::uint64_t seed, std::size_t n, double typical, double spread) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (float& v : x) {
    const double z = rng.normal();
    const double w = rng.normal();
    v = static_cast<float>(typical * z * std::exp(spread * w));
  }
  return x;
}

std::vector<float> with_amax(std::vector<float> x, double amax) {
  double m = 0;
  for (float v : x) m = std::max(m, std::fabs(static_cast<double>(v)));
  const double k = m > 0 ? amax / m : 1.0;
  for (float& v : x) v = static_cast<float>(static_cast<double>(v) * k);
  return x;
}

Fidelity fidelity(const std::vector<float>& x, const fp8::Fp8Tensor& t, const std::vector<bool>& include) {
  const FormatSpec& f = t.spec();
  const float min_normal = mpt::detail::pow2f(f.emin());
  const std::vector<float> back = fp8::dequantize(t);
  Fidelity r;
  double flushed = 0, saturated = 0, subnormal = 0, err2 = 0, ref2 = 0;
  std::vector<double> rel;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!include.empty() && !include[i]) continue;
    r.values += 1;
    const float scale = t.scales[t.scale_index(i)];
    const fp8::Fp8Element e = fp8::quantize_element(x[i], scale, f, t.saturate);
    if (e.outcome == fp8::Fp8Outcome::flushed) flushed += 1;
    if (e.outcome == fp8::Fp8Outcome::saturated) saturated += 1;
    const float stored = std::fabs(decode(e.code, f));
    if (e.outcome == fp8::Fp8Outcome::in_range && stored > 0 && stored < min_normal) subnormal += 1;
    if (!std::isfinite(x[i])) continue;
    const double d = static_cast<double>(back[i]) - static_cast<double>(x[i]);
    err2 += d * d;
    ref2 += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    if (x[i] != 0) rel.push_back(std::fabs(d) / std::fabs(static_cast<double>(x[i])));
  }
  if (r.values > 0) {
    r.flushed_fraction = flushed / r.values;
    r.saturated_fraction = saturated / r.values;
    r.subnormal_fraction = subnormal / r.values;
  }
  r.relative_error = ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0;
  if (!rel.empty()) {
    const auto mid = rel.begin() + static_cast<std::ptrdiff_t>(rel.size() / 2);
    std::nth_element(rel.begin(), mid, rel.end());
    r.median_relative_error = *mid;
  }
  return r;
}

// ---------------------------------------------------------------------------
// The sequence of amax-history-too-long and amax-history-too-short.

namespace {

constexpr std::size_t kHistoryValues = 1024;
constexpr std::size_t kHistorySteps = 160;    // ten periods
constexpr double kHistoryStartAmax = 16.0;    // at scale 1 (delayed scaling's first step) nothing saturates
constexpr double kHistoryShrinkBinades = 6;   // the tensor shrinks 2^6-fold over the run
constexpr double kHistoryPeakFactor = 8.0;    // every kHistoryPeriod-th step is 8 times larger
constexpr std::uint64_t kHistorySeed = 7004;  // step t draws with seed kHistorySeed + t

bool is_peak(std::size_t t) { return t % kHistoryPeriod == kHistoryPeriod - 1; }

double history_amax(std::size_t t) {
  const double trend = kHistoryStartAmax * std::exp2(-kHistoryShrinkBinades * static_cast<double>(t) /
                                                     static_cast<double>(kHistorySteps));
  return is_peak(t) ? trend * kHistoryPeakFactor : trend;
}

}  // namespace

RunResult amax_history_run(std::size_t history_len, std::string setup) {
  fp8::DelayedScalingOptions options;
  options.margin = 0;
  options.amax_history_len = history_len;
  options.algo = fp8::AmaxComputeAlgo::max;
  fp8::DelayedScaling recipe(DType::e4m3, options);
  // per step: the fidelity, and how many binades below its own current-scaling scale the scale was
  std::vector<Fidelity> fid;
  std::vector<double> lag;
  for (std::size_t t = 0; t < kHistorySteps; ++t) {
    const std::vector<float> x =
        with_amax(draw_values(kHistorySeed + t, kHistoryValues, 1.0, 1.5), history_amax(t));
    const float own = fp8::current_scale(fp8::amax_of(x.data(), x.size()), DType::e4m3);
    lag.push_back(std::log2(static_cast<double>(own) / static_cast<double>(recipe.scale())));
    const fp8::Fp8Tensor q = recipe.quantize(x.data(), x.size());
    recipe.update();
    fid.push_back(fidelity(x, q));
  }
  // the peaks after the first; the ordinary steps of the second period and of the last
  double peak_sat = 0, peaks = 0;
  for (std::size_t t = kHistoryPeriod; t < kHistorySteps; ++t)
    if (is_peak(t)) {
      peak_sat += fid[t].saturated_fraction;
      peaks += 1;
    }
  auto period_mean = [&](std::size_t first, double Fidelity::*field) {
    double s = 0, n = 0;
    for (std::size_t t = first; t < first + kHistoryPeriod; ++t)
      if (!is_peak(t)) {
        s += fid[t].*field;
        n += 1;
      }
    return s / n;
  };
  const std::size_t last = kHistorySteps - kHistoryPeriod;
  double late_lag = 0, n_late = 0;
  for (std::size_t t = last; t < kHistorySteps; ++t)
    if (!is_peak(t)) {
      late_lag += lag[t];
      n_late += 1;
    }
  late_lag /= n_late;
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"first_peak_saturated_fraction", fid[kHistoryPeriod - 1].saturated_fraction,
       "values saturated at the first peak (step " + std::to_string(kHistoryPeriod) + ")"},
      {"peak_saturated_fraction", peak_sat / peaks, "values saturated at each later peak, on average"},
      {"early_flushed_fraction", period_mean(kHistoryPeriod, &Fidelity::flushed_fraction),
       "values flushed to zero at the ordinary steps of the second period"},
      {"late_flushed_fraction", period_mean(last, &Fidelity::flushed_fraction),
       "values flushed to zero at the ordinary steps of the last period"},
      {"late_median_relative_error", period_mean(last, &Fidelity::median_relative_error),
       "median |error| / |value| at the ordinary steps of the last period"},
      {"late_scale_lag_binades", late_lag,
       "log2(the tensor's own scale / the scale used), ordinary steps of the last period"},
  };
  r.explanation = "With a history of " + std::to_string(history_len) +
                  " steps, the peaks after the first saturate " + pct(peak_sat / peaks) +
                  " of their values; in the last period the scale is " + num(late_lag) +
                  " binades below the tensor's own, and " + pct(r.get("late_flushed_fraction")) +
                  " of the ordinary values flush to zero (" + pct(r.get("early_flushed_fraction")) +
                  " in the second period).";
  return r;
}

}  // namespace mpt::ch07
