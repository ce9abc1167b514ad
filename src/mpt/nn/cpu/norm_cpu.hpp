// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the CPU forward
// both layers run, one run of values at a time.
// Depends on: tensor.hpp (core), rounding.hpp (Implementation), norm_math.hpp
// (the formulas it runs).
//
// norm_math::statistics, mean_invstd and forward describe the forward over
// a whole tensor. Run literally, that is an FP32 copy of x, two passes for
// the statistics, a pass for y in FP32 and one more to round it. forward()
// below computes the same values one (n, c) run at a time, in memory order:
// each run widened (or read in place), its sums taken, and then normalized
// and rounded straight into y. A LayerNorm row is its own channel, so its
// two sums and its normalization follow each other while the row is in the
// L1 cache; a BatchNorm in training takes every run's Σx first, then every
// run's Σ(x − mean)², and then normalizes: three reads of x in memory
// order (PyTorch's contiguous CPU BatchNorm makes the same three). Every
// value is bit for bit the whole-tensor formulas' on the widened input,
// rounded once: the same sums in the same lanes, the same per-element
// operations. With AVX2 the 16 lanes of the sums are four 4-double vectors
// and the normalization runs 8 values at a time, reading and writing fp16
// codes in place (norm_cpu_avx2.cpp); the bits are the same.
#pragma once

#include <cstdint>

#include "mpt/core/tensor.hpp"
#include "mpt/formats/rounding.hpp"
#include "mpt/nn/layers/norm_math.hpp"

namespace mpt::norm_cpu {

/// norm_math::statistics of one run x[0..n) (one channel of one value
/// each), its sums on AVX2 vectors when impl allows it
/// (Implementation::automatic: when the CPU has AVX2). The same bits either
/// way. Implementation::avx2 on a CPU or build without the AVX2 path throws
/// std::invalid_argument.
norm_math::Statistics run_statistics(const float* x, std::int64_t n,
                                     Implementation impl = Implementation::automatic);

/// The forward of a norm over layout l, y = x̂·γ + β rounded into `out`:
///
/// - stats non-null: batch statistics. stats[c] (l.channels entries) as
///   norm_math::statistics computes them on x widened, and mean[c],
///   invstd[c] as norm_math::mean_invstd with eps.
/// - stats null: mean and invstd (l.channels entries each) are given, as in
///   BatchNorm's eval mode; eps is not used.
///
/// weight and bias hold norm_math::affine_size(l, axis) values or are
/// nullptr (γ = 1, β = 0). x is read as Tensor::to_f32 reads it (its scale
/// undone); y has x's shape and dtype `out`, its values those of
/// norm_math::forward on the widened x, rounded once into `out` (RNE, as
/// Tensor::from_f32). Throws std::invalid_argument when x's element count is
/// not l.numel().
Tensor forward(const Tensor& x, const norm_math::Layout& l, norm_math::AffineAxis axis, const float* weight,
               const float* bias, float eps, DType out, norm_math::Statistics* stats, float* mean,
               float* invstd, Implementation impl = Implementation::automatic);

}  // namespace mpt::norm_cpu

namespace mpt::detail {

// The AVX2 loops (norm_cpu_avx2.cpp, compiled with -mavx2 -mf16c; call only
// when avx2_available()). x and y are f32 values or fp16 codes, read and
// written as load_from and store_as do.

/// norm_math::add_run_sums over the first n − n mod 16 values of x, lanes
/// (kSumLanes doubles) added to; returns that count (the caller adds the
/// rest with the portable loop). An fp16 NaN is read as the canonical quiet
/// NaN with its sign, as decode() gives it.
std::int64_t add_run_sums_avx2(const float* x, std::int64_t n, double* lanes);
/// The same on fp16 codes, widened exactly.
std::int64_t add_run_sums_avx2(const std::uint16_t* x, std::int64_t n, double* lanes);
/// norm_math::add_run_squares likewise.
std::int64_t add_run_squares_avx2(const float* x, std::int64_t n, double mean, double* lanes);
/// The same on fp16 codes, widened exactly.
std::int64_t add_run_squares_avx2(const std::uint16_t* x, std::int64_t n, double mean, double* lanes);

/// One run's normalization: its channel's statistics and its weights.
struct NormalizeRun {
  float mean = 0;                 ///< the channel's (or row's) mean
  float invstd = 1;               ///< 1/√(var + eps)
  const float* weight = nullptr;  ///< γ of each position of the run, or nullptr: weight_all
  const float* bias = nullptr;    ///< β of each position of the run, or nullptr: bias_all
  float weight_all = 1;           ///< γ of every position when weight is nullptr
  float bias_all = 0;             ///< β of every position when bias is nullptr
  /// Whether a y may be a NaN with a payload, which fp16 output must make
  /// canonical (checked 8 values at a time). Such a NaN can only come from
  /// an x that is one; false is for a run whose mean and invstd are finite
  /// and came from statistics that include that run, so that no x of it is
  /// NaN.
  bool nan_payloads = true;
};

/// y[i] = scale_shift(normalize(x[i], mean, invstd), γ, β) for i in
/// [0, n − n mod 8); returns that count (the caller does the rest).
std::int64_t normalize_run_avx2(const float* x, float* y, std::int64_t n, const NormalizeRun& r);
/// The same, f32 values in, fp16 codes out.
std::int64_t normalize_run_avx2(const float* x, std::uint16_t* y, std::int64_t n, const NormalizeRun& r);
/// The same, fp16 codes in, f32 values out.
std::int64_t normalize_run_avx2(const std::uint16_t* x, float* y, std::int64_t n, const NormalizeRun& r);
/// The same, fp16 codes in and out.
std::int64_t normalize_run_avx2(const std::uint16_t* x, std::uint16_t* y, std::int64_t n,
                                const NormalizeRun& r);

}  // namespace mpt::detail
