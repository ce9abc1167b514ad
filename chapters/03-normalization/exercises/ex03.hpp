// Chapter 03 — exercises: the adapter header, the student's specification.
// Depends on: the C++17 standard library for 3.1 and 3.2 (the grader compares
// them with mpt's Welford merge, src/mpt/nn/layers/welford.hpp, and the norm
// formulas of src/mpt/nn/layers/norm_math.hpp in double); mpt/core/tensor.hpp for
// 3.3 (a tensor in and out; the grader compares with mpt's BatchNorm).
// The grader includes this file and calls exactly these functions; the
// student writes them in ex03.cpp. Changing a signature breaks the grader.
#pragma once

#include <cstdint>
#include <vector>

#include "mpt/core/tensor.hpp"

/// Chapter 3 exercises: the merge of two partial Welford statistics, the
/// backward of LayerNorm accumulated in FP32, and a broken training-mode
/// BatchNorm forward to diagnose and fix.
namespace mpt::ex03 {

/// The statistics of a set of values as a parallel reduction carries them,
/// in FP32 (what norm kernels accumulate in): how many values, their mean,
/// and M2 = Σ (x − mean)², the sum of squared deviations from that mean. The
/// empty set is {0, 0, 0}; the biased variance is m2 / count.
struct Stats {
  std::int64_t count = 0;  ///< values in the set (>= 0)
  float mean = 0.0f;       ///< their mean
  float m2 = 0.0f;         ///< Σ (x − mean)² over them (>= 0)
};

/// Exercise 3.1 — merge two partial statistics (Chan, Golub and LeVeque).
///
/// `a` and `b` describe two disjoint sets of values; return the statistics
/// of their union. With nₐ, n_b the counts, n = nₐ + n_b and
/// δ = mean_b − meanₐ, the union has
///
///   count = n,   mean = meanₐ + δ·n_b/n,   M2 = M2ₐ + M2_b + δ²·nₐ·n_b/n.
///
/// Compute in float (the counts converted to float), and keep the digits:
/// the two means of a merge are often close, so form δ from them first and
/// let only δ carry their difference into M2. Going back to Σx and Σx²
/// (Σx² = M2 + n·mean², which E[x²] − E[x]² then cancels) loses them when
/// the means are large next to the spread: halves of mean 1e4 ± 1 are graded.
///
/// An empty operand (count 0) leaves the other exactly as it is, bit for
/// bit, whatever its magnitude; two empty operands give {0, 0, 0}. A
/// reduction relies on both: it pads with empty statistics.
///
/// Graded against mpt's merge in double on the same inputs: count exact,
/// mean within 8 float epsilons (2^-23) of the larger |mean| of a and b, M2
/// within 16 epsilons of the exact M2 (every term of M2 is >= 0). Trees of
/// merges are graded against a two-pass sum in double over all the values
/// (mean within 4e-6 of max(|mean|, standard deviation), M2 within 1e-3).
/// Preconditions (the grader keeps to them): counts >= 0 with a sum that
/// fits in int64, m2 >= 0, finite means; an empty operand is {0, 0, 0}.
///
/// Do not call mpt's welford_merge or welford_add (mpt/nn/layers/welford.hpp), the
/// norm formulas (mpt/nn/layers/norm_math.hpp) or the norm layers: the grader uses
/// them as its reference.
Stats merge_statistics(const Stats& a, const Stats& b);

/// Exercise 3.2 — LayerNorm's backward over a [rows, D] block, in FP32.
///
/// `x` and `dy` hold rows × D floats, row-major (row r starts at x + r·D);
/// `gamma` holds D. The forward normalized every row of x over its D values:
///
///   mean, var = the row's mean and biased variance Σ (x − mean)² / D,
///   rstd = 1 / √(var + eps),  x̂ = (x − mean)·rstd,  y = x̂·γ + β.
///
/// Recompute mean and rstd from x, then write, with g = γ·dy elementwise,
///
///   dx[r][i]  = rstd/D · (D·g[r][i] − Σⱼ g[r][j] − x̂[r][i]·Σⱼ g[r][j]·x̂[r][j]),
///   dgamma[i] = Σᵣ dy[r][i]·x̂[r][i],     dbeta[i] = Σᵣ dy[r][i],
///
/// into dx (rows × D), dgamma and dbeta (D each). Write them, do not add to
/// them: what they held before does not matter.
///
/// Precision: every sum accumulated in float (or wider), never in fp16 or
/// bf16; the row statistics by a method that does not cancel (two passes,
/// the mean first and then Σ (x − mean)², or Welford's update), never as
/// E[x²] − E[x]². Rows of D = 4096 and rows whose values sit far from 0
/// next to their spread are graded. D = 1 is allowed: x̂ = 0, so dx = 0.
///
/// Graded against mpt's norm formulas in double on the same inputs, each
/// error in units of the size of what the value is made of: for dx,
/// rstd·(|g| + (Σ|g| + |x̂|·Σ|g·x̂|)/D); for dgamma Σᵣ|dy·x̂|; for dbeta
/// Σᵣ|dy|. Allowed: 1e-4 (3e-2 for rows far from 0 next to their spread,
/// whose float statistics are only that good); for D = 1 dx and dgamma
/// exactly 0. Float sums in any order stay far below; an fp16 accumulator
/// or a cancelled variance misses by far more (the test files give the
/// measurements). Preconditions: rows >= 1, D >= 1, eps > 0, finite inputs.
///
/// Do not call mpt's norm formulas (mpt/nn/layers/norm_math.hpp), Welford's
/// functions (mpt/nn/layers/welford.hpp) or mpt::LayerNorm: the grader uses them.
void layer_norm_backward(const float* x, const float* dy, const float* gamma, std::int64_t rows,
                         std::int64_t d, float eps, float* dx, float* dgamma, float* dbeta);

/// The running estimates of exercise 3.3's BatchNorm: FP32 buffers of C
/// entries each, whatever dtype the activations are stored in (apex's
/// keep_batchnorm_fp32; under torch.autocast a BatchNorm's buffers stay FP32
/// too).
struct RunningStats {
  std::vector<float> mean;               ///< running_mean [C]
  std::vector<float> var;                ///< running_var [C], the unbiased estimate
  std::int64_t num_batches_tracked = 0;  ///< training forwards folded in
};

/// Exercise 3.3 — DIAGNOSE: one training-mode forward of a BatchNorm on
/// low-precision activations.
///
/// Not written from scratch: ex03.cpp comes with a body for this function
/// that compiles, runs, normalizes its batch correctly and has one real
/// mixed-precision bug. Find it and fix it, changing as little as you can
/// (README.md lists the symptoms the grader reports).
///
/// `x` is [N, C], [N, C, L] or [N, C, H, W] in f16, bf16 or f32, with at
/// least two values per channel (N·L or N·H·W >= 2); `gamma` and `beta` are
/// the FP32 affine parameters (C each), `running` the FP32 running
/// estimates (C each). One call, as torch.nn.BatchNorm2d.forward in
/// training mode:
///
///  - per channel c, the mean and the biased variance of its M values
///    (over N and L, or N, H and W), computed in FP32 from the widened
///    activations, without cancellation; invstd = 1/√(var + eps);
///  - y = (x − mean)·invstd·γ[c] + β[c], computed in FP32, stored in x's
///    dtype (rounded once): the returned tensor, x's shape and dtype;
///  - the running estimates, each update computed in FP32 and kept in FP32:
///    running.mean[c] = (1 − momentum)·running.mean[c] + momentum·mean and
///    running.var[c] = (1 − momentum)·running.var[c] + momentum·M2/(M − 1)
///    (the unbiased variance); running.num_batches_tracked + 1.
///
/// 0 < momentum <= 1, eps > 0. The given body's statistics and
/// normalization are right; compare what it does with each result against
/// this list.
mpt::Tensor batch_norm_train_forward(const mpt::Tensor& x, const std::vector<float>& gamma,
                                     const std::vector<float>& beta, float eps, float momentum,
                                     RunningStats& running);

}  // namespace mpt::ex03
