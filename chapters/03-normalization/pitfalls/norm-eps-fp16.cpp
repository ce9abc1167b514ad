// Chapter 03 — pitfall norm-eps-fp16: eps in fp16, and 1/√(var + eps) of a constant channel
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/core/context.hpp, mpt/core/policy.hpp (uniform_policy),
// mpt/core/tensor.hpp, mpt/formats/format.hpp (limits_of),
// mpt/nn/layers/batch_norm.hpp, mpt/nn/layers/norm_math.hpp (Layout, statistics),
// mpt/nn/layers/welford.hpp; <cmath>, <cstddef>, <cstdint>, <limits>, <string>,
// <utility>, <vector>.
//
// eps keeps 1/√(var + eps) finite where a channel does not vary. In fp16
// the smallest positive value is 2^-24 ≈ 6e-8: eps = 1e-5 survives as a
// subnormal with a few significant bits, eps = 1e-8 rounds to 0. So does
// the variance of a channel that varies by less than about 2^-12 (a dead or
// saturated unit, a padded position). With var + eps computed and rsqrt
// taken in fp16 such a channel gets 1/√0 = inf, and its outputs
// (x − mean)·inf are NaN where x equals the mean and ±inf elsewhere. In FP32
// both eps are normal numbers and 1/√eps is finite.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/layers/norm_math.hpp"
#include "mpt/nn/layers/welford.hpp"

namespace mpt::ch03 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace norm_eps_fp16 {

// ---------------------------------------------------------------------------
// The batch both runs normalize, and what a run measures.

constexpr std::int64_t kBatch = 64;
constexpr std::int64_t kChannels = 3;
constexpr double kDefaultEps = 1e-5;  // torch.nn.BatchNorm's and LayerNorm's default
constexpr double kSmallEps = 1e-8;    // a smaller eps, as some hand-written norms use

norm_math::Layout layout() {
  norm_math::Layout l;
  l.outer = kBatch;
  l.channels = kChannels;
  return l;
}

/// [N, C] fp16 activations: channel 0 ordinary (std 1), channel 1 constant
/// (a saturated unit: every value 0.5), channel 2 near-constant (0.5, and
/// one value one fp16 step above it).
const std::vector<float>& activations() {
  static const std::vector<float> x = [] {
    const std::vector<float> ordinary = normal_values(kBatch, 0, 1, 305);
    std::vector<float> v(static_cast<std::size_t>(kBatch * kChannels));
    for (std::int64_t n = 0; n < kBatch; ++n) {
      const auto at = static_cast<std::size_t>(n * kChannels);
      v[at] = h(ordinary[static_cast<std::size_t>(n)]);
      v[at + 1] = 0.5f;
      v[at + 2] = n == kBatch / 2 ? static_cast<float>(0.5 + fp16_ulp(0.5)) : 0.5f;  // one fp16 step up
    }
    return v;
  }();
  return x;
}

/// One normalization of activations() with one eps.
struct Normalized {
  std::vector<float> y;       ///< the outputs
  std::vector<float> invstd;  ///< 1/√(var + eps) per channel
};

/// What a run did with both eps (its normalization is `run(eps)`).
struct EpsRun {
  Normalized small, standard;         ///< with eps 1e-8 and 1e-5
  double eps_small = 0, eps_std = 0;  ///< the eps values as the run stores them
  int eps_std_bits = 0;               ///< significant bits of the stored 1e-5
};

/// The outcomes of both runs (defined after the runs); `why` is the run's explanation.
RunResult eps_outcomes(const EpsRun& r, std::string setup, std::string why);

// ---------------------------------------------------------------------------
// The broken run.

/// The FP32 statistics of the library (norm_math::statistics), then var + eps and the
/// rsqrt in fp16, as a half-precision kernel that stores its intermediates
/// in fp16 computes them; the output (x − mean)·invstd in FP32, rounded once
/// into fp16. It exists only as this pitfall.
Normalized fp16_eps_batch_norm(const std::vector<float>& x, const norm_math::Layout& l, double eps) {
  std::vector<norm_math::Statistics> stats(static_cast<std::size_t>(l.channels));
  norm_math::statistics(x.data(), l, stats.data());
  Normalized r{std::vector<float>(x.size()), std::vector<float>(static_cast<std::size_t>(l.channels))};
  for (std::int64_t c = 0; c < l.channels; ++c) {
    const norm_math::Statistics& s = stats[static_cast<std::size_t>(c)];
    const float var = norm_math::variance_biased<float>(s), mean = static_cast<float>(s.mean);
    //! [norm-eps-fp16-broken]
    const float eps16 = h(static_cast<float>(eps));                  // 1e-5: a subnormal; 1e-8: 0
    const float invstd = h(1.0f / h(std::sqrt(h(h(var) + eps16))));  // var 0 + eps 0: 1/√0 = inf
    //! [norm-eps-fp16-broken]
    r.invstd[static_cast<std::size_t>(c)] = invstd;
    for (std::int64_t n = 0; n < l.outer; ++n) {
      const auto e = static_cast<std::size_t>(l.offset(n, c, 0));
      r.y[e] = h((x[e] - mean) * invstd);  // 0·inf = NaN, d·inf = ±inf
    }
  }
  return r;
}

RunResult eps_broken() {
  EpsRun r;
  r.small = fp16_eps_batch_norm(activations(), layout(), kSmallEps);
  r.standard = fp16_eps_batch_norm(activations(), layout(), kDefaultEps);
  const Fp16Rounding small = fp16_rounding(kSmallEps), standard = fp16_rounding(kDefaultEps);
  r.eps_small = small.value;
  r.eps_std = standard.value;
  r.eps_std_bits = standard.bits;
  const Limits f16 = limits_of(format_of(DType::f16).spec);
  const Fp64Stats ref = fp64_statistics(activations(), layout());
  const std::string why =
      "fp16's smallest subnormal is " + num(f16.min_subnormal) + ": eps = " + num(kDefaultEps) +
      " is stored as " + num(standard.value) + " (" + num(standard.value / f16.min_subnormal) + "·2^-24, " +
      std::to_string(standard.bits) + " significant bits of " + std::to_string(f16.precision) +
      "), eps = " + num(kSmallEps) + " as " + num(small.value) + ". The near-constant channel's variance " +
      num(ref.var[2]) + " rounds to " + num(h(static_cast<float>(ref.var[2]))) +
      " as well, so with eps = " + num(kSmallEps) +
      " var + eps is 0 in both constant channels and 1/√0 = " + num(r.small.invstd[1]) +
      ": (x − mean)·inf is NaN where x is the mean and ±inf elsewhere. With eps = " + num(kDefaultEps) +
      " the same channels get 1/√eps = " + num(r.standard.invstd[1]) +
      " (FP64: " + num(1 / std::sqrt(kDefaultEps)) + ").";
  return eps_outcomes(
      r,
      "a batch of 64 fp16 activations, one ordinary channel, one constant, one near-constant; "
      "FP32 statistics, var + eps and 1/√ in fp16; eps = 1e-8 and 1e-5",
      why);
}

// ---------------------------------------------------------------------------
// The fixed run.

/// The library's BatchNorm on activations() with eps: FP32 statistics,
/// var + eps and 1/√ in FP32, the output rounded once into fp16.
Normalized library_batch_norm(double eps) {
  const auto f16 = uniform_policy(DType::f16);
  Context ctx(f16);
  const std::vector<float>& x = activations();
  const Tensor input = Tensor::from_f32(x.data(), {kBatch, kChannels}, DType::f16);
  BatchNorm::Options o;
  o.affine = false;
  //! [norm-eps-fp16-fixed]
  o.eps = eps;  // a double option, added to the FP32 variance as a float
  BatchNorm bn(kChannels, o);
  bn.apply_policy(*f16);  // fp16 output, FP32 statistics and normalization
  const Tensor y = bn.forward(input, ctx);
  //! [norm-eps-fp16-fixed]
  Normalized r{std::vector<float>(x.size()), std::vector<float>(static_cast<std::size_t>(kChannels))};
  y.to_f32(r.y.data());
  bn.invstd().to_f32(r.invstd.data());
  return r;
}

RunResult eps_fixed() {
  EpsRun r;
  r.small = library_batch_norm(kSmallEps);
  r.standard = library_batch_norm(kDefaultEps);
  r.eps_small = static_cast<float>(kSmallEps);
  r.eps_std = static_cast<float>(kDefaultEps);
  r.eps_std_bits = limits_of(format_of(DType::f32).spec).precision;  // a normal FP32 number
  const std::string why = "In FP32 eps = " + num(kSmallEps) + " and " + num(kDefaultEps) +
                          " are normal numbers with all " + std::to_string(r.eps_std_bits) +
                          " bits; a constant channel gets 1/√eps = " + num(r.small.invstd[1]) + " (eps " +
                          num(kSmallEps) + ") and outputs (x − mean)·1/√eps = 0.";
  return eps_outcomes(
      r, "the same batch through the library's BatchNorm (FP32 statistics and 1/√, fp16 output)", why);
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult eps_outcomes(const EpsRun& r, std::string setup, std::string why) {
  const std::vector<float>& x = activations();
  const Fp64Stats ref = fp64_statistics(x, layout());
  const OutputErrors small =
      compare_outputs(r.small.y, fp64_normalize(x, layout(), ref, kSmallEps), layout());
  const OutputErrors standard =
      compare_outputs(r.standard.y, fp64_normalize(x, layout(), ref, kDefaultEps), layout());
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"eps_default_stored", r.eps_std, "eps = 1e-5 as the run stores it"},
      {"eps_default_bits", static_cast<double>(r.eps_std_bits), "its significant bits"},
      {"eps_small_stored", r.eps_small, "eps = 1e-8 as the run stores it"},
      {"near_constant_var_fp64", ref.var[2], "the near-constant channel's variance (FP64)"},
      {"constant_invstd", r.small.invstd[1], "1/√(var + eps) of the constant channel, eps 1e-8"},
      {"nan_outputs", small.nan, "outputs that are NaN, eps 1e-8"},
      {"inf_outputs", small.inf, "outputs that are ±inf, eps 1e-8"},
      {"outputs_off", small.off, "outputs more than one fp16 ulp (at max(|y|, 1)) from FP64's, eps 1e-8"},
      {"nonfinite_outputs_default_eps", standard.nan + standard.inf, "outputs that are inf or NaN, eps 1e-5"},
      {"worst_error_ulps_default_eps", standard.worst_ulps, "the largest error in those ulps, eps 1e-5"},
  };
  out.explanation = std::move(why);
  return out;
}

}  // namespace norm_eps_fp16
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall norm_eps_fp16_pitfall() {
  using namespace norm_eps_fp16;
  return Pitfall{
      "norm-eps-fp16",
      3,
      "a norm's eps in fp16: 1e-5 is a subnormal, 1e-8 is 0, and 1/√(var + eps) is inf",
      "fp16's smallest positive value is 2^-24 (about 6e-8): eps = 1e-5 is stored as a subnormal with a few "
      "significant bits and eps = 1e-8 as 0, and the variance of a channel that hardly varies rounds to 0 "
      "too. With var + eps and the rsqrt in fp16 such a channel gets 1/√0 = inf, and its outputs "
      "(x − mean)·inf are NaN or ±inf. Add eps and take the rsqrt in FP32, as the library's norms do.",
      eps_broken,
      eps_fixed,
      {
          check("1/√(var + eps) of the constant channel is inf",
                [](const RunResult& r) { return std::isinf(r.get("constant_invstd")); }),
          check("NaN outputs (x = mean times inf)",
                [](const RunResult& r) { return r.get("nan_outputs") > 0; }),
          check("±inf outputs (x ≠ mean times inf)",
                [](const RunResult& r) { return r.get("inf_outputs") > 0; }),
      },
      {
          check("1/√(var + eps) of the constant channel is finite",
                [](const RunResult& r) { return std::isfinite(r.get("constant_invstd")); }),
          check("every output within one fp16 ulp (at max(|y|, 1)) of FP64's, eps = 1e-8",
                [](const RunResult& r) { return r.get("outputs_off") == 0; }),
      },
      {
          check("with eps = 1e-5 every output is finite",
                [](const RunResult& r) { return r.get("nonfinite_outputs_default_eps") == 0; }),
      }};
}

}  // namespace mpt::ch03
