// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: what the
// chapter's pitfalls share, and the declarations of their registry entries.
// Depends on: ../../02-loss-scaling/pitfalls/common.hpp (num, pct, check,
// within: Chapter 2's small tools, reused), mpt/registry/pitfall.hpp (Check,
// Pitfall, RunResult), mpt/nn/layers/norm_math.hpp (Layout); <cstdint>, <string>,
// <vector>.
//
// One file per pitfall, pitfalls/<id>.cpp: its broken run, its fixed run,
// their outcomes and its checks, ending with the function that returns its
// registry entry (declared here, called by pitfalls/register.cpp). What more
// than one pitfall uses is here and in common.cpp (the training runs of
// running-stats-fp16 and bn-skipped-step-not-skipped are in ../training.hpp);
// the rest stays in its pitfall's file.
//
// Four pitfalls normalize one tensor and compare the result with the same
// normalization in FP64 (two passes over the widened values, written out in
// common.cpp); two train a small MLP with BatchNorm layers and Chapter 2's
// GradScaler. The broken runs hold the FP16 arithmetic the library refuses
// (its norms compute their statistics in FP32): every value such a kernel
// would store in fp16 is rounded there, through the library's rounding. Runs
// are seeded and take a fraction of a second. The `//! [id-broken]` /
// `//! [id-fixed]` markers in each pitfall's file delimit the code the
// chapter text shows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../../02-loss-scaling/pitfalls/common.hpp"
#include "mpt/nn/layers/norm_math.hpp"
#include "mpt/registry/pitfall.hpp"

namespace mpt::ch03 {

// ---------------------------------------------------------------------------
// Small tools shared by the runs.

using ch02::check;
using ch02::num;
using ch02::pct;
using ch02::within;

/// x rounded to fp16 (round to nearest even, overflow to inf): where an fp16
/// kernel stores a value.
float h(float x);
/// The spacing of fp16 values at |x| (the subnormal quantum below the normal
/// range).
double fp16_ulp(double x);
/// The fp16 value nearest to `v` (as a parameter or buffer converted with
/// .half() holds it), and the significant bits it keeps: 11 for a normal
/// number, fewer for a subnormal, 0 for zero.
struct Fp16Rounding {
  double value;  ///< fp16(v)
  int bits;      ///< its significant bits
};
/// See Fp16Rounding.
Fp16Rounding fp16_rounding(double v);

/// The variance a normalization used, recovered from its 1/√(var + eps):
/// 1/invstd² − eps in double (inf where invstd is 0, NaN where it is NaN).
double variance_from_invstd(double invstd, double eps);

/// n values from N(mean, std²), seeded (mpt::Rng), as float.
std::vector<float> normal_values(std::int64_t n, double mean, double std, std::uint64_t seed);

// ---------------------------------------------------------------------------
// The FP64 reference: every pitfall's outputs are compared with it.

/// Per-channel statistics in double, two passes over the widened values
/// (mean, then the mean squared deviation), in an (outer, channels, inner)
/// layout (norm_math.hpp).
struct Fp64Stats {
  std::vector<double> mean;  ///< per channel
  std::vector<double> var;   ///< biased variance, per channel
};
/// See Fp64Stats.
Fp64Stats fp64_statistics(const std::vector<float>& x, const norm_math::Layout& l);
/// x̂ = (x − mean)/√(var + eps) of every element in double (no affine).
std::vector<double> fp64_normalize(const std::vector<float>& x, const norm_math::Layout& l,
                                   const Fp64Stats& s, double eps);

/// How far a run's normalized outputs are from the FP64 ones.
struct OutputErrors {
  double nan = 0;  ///< outputs that are NaN
  double inf = 0;  ///< outputs that are ±inf
  /// Outputs more than one "output ulp" away: the fp16 spacing at
  /// max(|y_fp64|, 1). A normalized output is of size 1, and near 0 the
  /// subtraction x − mean leaves FP32 errors of size ε·|x|/std, below an
  /// fp16 ulp of 1 but above the fp16 spacing of a tiny output.
  double off = 0;
  double max_error = 0;   ///< the largest |y − y_fp64|; inf when some output is not finite
  double collapsed = 0;   ///< channels whose outputs are all 0 although their FP64 outputs are not
  double channels = 0;    ///< channels compared
  double worst_ulps = 0;  ///< the largest |y − y_fp64| in output ulps (inf as max_error)
};
/// Compare y with the FP64 outputs `ref`, both in layout l.
OutputErrors compare_outputs(const std::vector<float>& y, const std::vector<double>& ref,
                             const norm_math::Layout& l);

// ---------------------------------------------------------------------------
// The chapter's registry entries, one per pitfalls/<id>.cpp, in the order
// pitfalls/register.cpp registers them.

/// bn-variance-fp16: E[x²] − E[x]² in fp16: x² overflows for |x| ≥ 256, and
/// the normalized outputs are NaN or collapse to 0.
Pitfall bn_variance_fp16_pitfall();
/// variance-cancellation: E[x²] − E[x]² in FP32 with a mean far above the
/// spread cancels to a zero or negative variance.
Pitfall variance_cancellation_pitfall();
/// layernorm-fp16-accumulation: a 4096-feature row summed in fp16 stalls
/// (small values no longer add) or passes 65504.
Pitfall layernorm_fp16_accumulation_pitfall();
/// running-stats-fp16: BatchNorm running estimates kept in fp16 stop
/// following the data once the momentum update is below half an fp16 ulp.
Pitfall running_stats_fp16_pitfall();
/// norm-eps-fp16: eps in fp16 (1e-5 a subnormal, 1e-8 zero); rsqrt(var + eps)
/// of a near-constant channel is inf.
Pitfall norm_eps_fp16_pitfall();
/// bn-skipped-step-not-skipped: the GradScaler skips an overflowing step, but
/// BatchNorm has already folded its inf/NaN statistics into the running ones.
Pitfall bn_skipped_step_not_skipped_pitfall();

}  // namespace mpt::ch03
