// Chapter 07 — pitfall per-tensor-outlier: one outlier flattens the rest of its tensor
// Depends on: common.hpp (draw_values, fidelity, check, num, pct, this
// entry's declaration), mpt/fp8/recipes.hpp (quantize_current),
// mpt/fp8/quantize.hpp (quantize_mx); <cmath>, <string>, <vector>.
//
// A per-tensor scale is fp8_max / amax: one value 2^16 times the tensor's
// typical magnitude puts the amax there, and every other value is multiplied
// by a scale 2^16 times smaller than its own would be. E4M3 spans about 18
// binades (2^-9 to 448), so the ordinary values land in its bottom few:
// below 2^-6 as subnormals with fewer than 4 significant bits, or below
// 2^-10 as zeros. MX block scaling (one E8M0 scale per 32 values along a
// row; NVIDIA's RCEIL rule, Transformer Engine's MXFP8) confines the outlier
// to its own block: the other blocks keep their own scales, and only the 31
// neighbours of the outlier share its fate.
#include <cmath>
#include <string>
#include <vector>

#include "common.hpp"
#include "mpt/fp8/quantize.hpp"
#include "mpt/fp8/recipes.hpp"

namespace mpt::ch07 {
namespace {
namespace per_tensor_outlier {

constexpr std::size_t kRows = 32;
constexpr std::size_t kCols = 128;
constexpr std::size_t kOutlier = 5 * kCols + 70;  // row 5, column 70
constexpr double kOutlierValue = 65536.0;         // 2^16 times the typical magnitude (1)

// Activations: typical magnitude 1, mildly heavy-tailed, and one outlier.
std::vector<float> activations() {
  std::vector<float> x = draw_values(7500, kRows * kCols, 1.0, 0.5);
  x[kOutlier] = static_cast<float>(kOutlierValue);
  return x;
}

RunResult run(bool blocks, std::string setup) {
  const std::vector<float> x = activations();
  fp8::Fp8Tensor q;
  if (!blocks) {
    //! [per-tensor-outlier-broken]
    // one scale for the whole tensor, from its amax: the outlier's
    q = fp8::quantize_current(x.data(), x.size(), DType::e4m3);
    //! [per-tensor-outlier-broken]
  } else {
    //! [per-tensor-outlier-fixed]
    // one E8M0 scale per 32 values of a row (MXFP8, RCEIL)
    q = fp8::quantize_mx(x.data(), kRows, kCols, DType::e4m3, fp8::MxScaleRule::rceil);
    //! [per-tensor-outlier-fixed]
  }
  std::vector<bool> others(x.size(), true);
  others[kOutlier] = false;
  std::vector<bool> outlier(x.size(), false);
  outlier[kOutlier] = true;
  const Fidelity fo = fidelity(x, q, others);
  const Fidelity fx = fidelity(x, q, outlier);
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"scales", static_cast<double>(q.scales.size()), "scales the tensor was stored with"},
      {"outlier_relative_error", fx.relative_error, "|read back − x| / |x| of the outlier"},
      {"others_flushed_fraction", fo.flushed_fraction, "the other values flushed to zero"},
      {"others_subnormal_fraction", fo.subnormal_fraction,
       "the other values stored as subnormals (fewer than 4 significant bits)"},
      {"others_relative_error", fo.relative_error, "‖read back − x‖ / ‖x‖ over the other values"},
      {"others_median_relative_error", fo.median_relative_error,
       "median |error| / |value| over the other values"},
  };
  r.explanation = "With " + num(r.get("scales")) + " scale(s), " + pct(fo.flushed_fraction) +
                  " of the other values flush to zero and " + pct(fo.subnormal_fraction) +
                  " are subnormal; their relative error is " + num(fo.relative_error) + " (median " +
                  num(fo.median_relative_error) + "), the outlier's " + num(fx.relative_error) + ".";
  return r;
}

RunResult broken_run() {
  return run(false,
             "a 32 x 128 activation matrix (typical magnitude 1) with one value of 2^16, in E4M3 with "
             "one per-tensor scale (current scaling)");
}
RunResult fixed_run() {
  return run(true, "the same matrix with MX block scaling: one E8M0 scale per 32 values of a row (RCEIL)");
}

}  // namespace per_tensor_outlier
}  // namespace

Pitfall per_tensor_outlier_pitfall() {
  using namespace per_tensor_outlier;
  return Pitfall{
      "per-tensor-outlier",
      7,
      "One outlier under per-tensor scaling: the other values sink to subnormals and zeros",
      "A per-tensor scale is set by the tensor's largest value: an outlier 2^16 times the rest pushes every "
      "other value into E4M3's bottom binades, where it has fewer bits or flushes. MX block scaling gives "
      "each 32 values their own scale, and only the outlier's block is affected.",
      broken_run,
      fixed_run,
      {
          check("more than half of the other values are subnormal",
                [](const RunResult& r) { return r.get("others_subnormal_fraction") > 0.5; }),
          check("more than 5% of the other values flush to zero",
                [](const RunResult& r) { return r.get("others_flushed_fraction") > 0.05; }),
          check("the other values' relative error is above 5%",
                [](const RunResult& r) { return r.get("others_relative_error") > 0.05; }),
      },
      {
          check("fewer than 5% of the other values are subnormal",
                [](const RunResult& r) { return r.get("others_subnormal_fraction") < 0.05; }),
          check("fewer than 1% of the other values flush to zero",
                [](const RunResult& r) { return r.get("others_flushed_fraction") < 0.01; }),
          check("the other values' relative error is below 4%",
                [](const RunResult& r) { return r.get("others_relative_error") < 0.04; }),
      },
      {
          check("the outlier itself is kept to within 2^-4",
                [](const RunResult& r) { return r.get("outlier_relative_error") <= 0.0625; }),
      }};
}

}  // namespace mpt::ch07
