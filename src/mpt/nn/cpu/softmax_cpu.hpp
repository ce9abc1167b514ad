// Chapter 04 — numerically stable softmax and cross-entropy: the fused CPU
// kernel (loss and fp16 gradient of fp16 logits in one call), and the same
// computation as separate passes, to measure what fusing saves.
// Depends on: rounding.hpp (Implementation), softmax_math.hpp (the row's
// log-sum-exp), the standard library.
//
// A language model's last step turns logits [N, K] (K = the vocabulary)
// into a loss and into the gradient of the logits. Unfused, a framework
// writes log-probabilities, reads them back for the loss, reads them again
// for the gradient: 12 bytes moved per logit with FP32 log-probabilities
// (autocast's log_softmax is an FP32 op) where 4 would do: 2 to read an
// fp16 logit, 2 to write its fp16 gradient. The fused kernel reads each row
// from memory once and writes its gradient once:
//
//   pass 1 (from memory): m = max z;
//   pass 2 (row in the L2 cache): eⱼ = exp(zⱼ − m) into an FP32 row
//     buffer, s = Σ eⱼ, and Σ(zⱼ − m) for label smoothing;
//   loss of the row: (1 − ε)(log s − (z_y − m)) + ε(log s − Σ(z − m)/K),
//     in FP32: log-sum-exp minus a logit without forming either (the two
//     are large and close where the logits are, and would cancel);
//   pass 3: ∂/∂zⱼ = g·(eⱼ/s − ε/K − (1 − ε)[j = y]) rounded to fp16,
//     g = dloss / (rows not ignored) for the mean, dloss for the sum.
//
// Semantics are torch.nn.functional.cross_entropy's (ignore_index: the row
// adds no loss and gets a zero gradient, and the mean divides by the rows
// not ignored; label_smoothing as in aten/src/ATen/native/Loss.cpp). A row
// whose maximum or sum is not finite — a NaN or a +inf logit, or every
// logit −inf — is done again through softmax_math.hpp's MaxSum, as the
// library's reference does it, and gives what PyTorch gives: NaN.
//
// exp is mpt's own: e^x = 2ⁿ·e^r with n = round(x·log₂e), r = x − n·ln 2
// in two fused steps (Cody and Waite's split of ln 2), e^r by the degree-6
// polynomial that interpolates it at the 7 Chebyshev points of
// [−ln2/2, ln2/2] (coefficients computed for this file and rounded to
// float; its own error is below 2^-25 relative), in Horner's form with
// fused multiply-adds, and n added to the exponent bits. The kernel's
// arguments are z − max ≤ 0 and finite (rows with NaN or inf are handled
// apart), and exp_shifted clamps them at −87: exp(−87) ≈ 1.6e-38 stands for
// anything smaller, nothing a sum of terms ≥ 1 or an fp16 gradient can
// show. exp_fused is the general function (0 below −87, +inf above 88 —
// float's exp overflows at 88.72 —, NaN for NaN). The portable loop and the
// AVX2 loop (softmax_cpu_avx2.cpp) do the same IEEE operations in the same
// order, std::fma where the vector unit fuses, so they give the same bits;
// glibc's expf could not be vectorized bit for bit.
#pragma once

#include <cstdint>

#include "mpt/formats/rounding.hpp"

namespace mpt::softmax_cpu {

/// The options of a fused call (torch.nn.functional.cross_entropy's).
struct FusedOptions {
  int ignore_index = -100;       ///< a target with this value adds no loss and gets no gradient
  float label_smoothing = 0.0f;  ///< ε in [0, 1]
  bool mean = true;              ///< reduction 'mean' (true) or 'sum' (false)
  float dloss = 1.0f;            ///< the gradient arriving from above (1, or the loss scale)
};

/// The loss (FP32) of fp16 logits [rows, classes] (row-major codes) against
/// `targets` (rows class ids in [0, classes), or ignore_index), and its
/// gradient written to grad (rows·classes fp16 codes, RNE). row_loss, if
/// not null, gets each row's loss (0 for an ignored row). The mean of no
/// rows is NaN (0/0), as in PyTorch. Bad arguments (rows or classes < 1, a
/// target out of range, ε outside [0, 1]): std::invalid_argument, one line.
/// Implementation::avx2 on a CPU or build without it: std::invalid_argument.
float fused_cross_entropy_f16(const std::uint16_t* logits, std::int64_t rows, std::int64_t classes,
                              const int* targets, const FusedOptions& o, std::uint16_t* grad,
                              float* row_loss = nullptr, Implementation impl = Implementation::automatic);

/// The same loss and gradient the way an unfused framework computes them:
/// log_softmax into an FP32 [rows, classes] buffer (three sweeps: max, sum
/// of exp, z − lse), the loss gathered from it, and the gradient from the
/// log-probabilities read back (exp(log p)·g − onehot). The same exp_fused
/// and vector loops as the fused kernel, so the comparison measures the
/// memory traffic, not the arithmetic. For the benchmark; the values agree
/// with the fused kernel's to a few FP32 ulps (exp of a rounded log).
float unfused_cross_entropy_f16(const std::uint16_t* logits, std::int64_t rows, std::int64_t classes,
                                const int* targets, const FusedOptions& o, std::uint16_t* grad,
                                Implementation impl = Implementation::automatic);

/// mpt's exp of one float, as both loops compute it (see the top of the
/// file): for the tests, which compare it with double exp and with the
/// AVX2 loop.
float exp_fused(float x);

/// exp(max(d, −87)) for the kernels' shifted logits d = z − max ≤ 0: see
/// the top of the file.
float exp_shifted(float d);

/// exp_fused of n floats, 8 at a time with AVX2 when impl allows it; the
/// same bits either way.
void exp_fused_array(const float* x, float* y, std::int64_t n,
                     Implementation impl = Implementation::automatic);

}  // namespace mpt::softmax_cpu

namespace mpt::detail {

/// log₂ e, the range reduction's factor.
inline constexpr float kLog2e = 1.44269504088896341f;
/// ln 2 to 16 bits: n·kLn2Hi is exact for |n| < 2^8.
inline constexpr float kLn2Hi = 0.693145751953125f;
/// ln 2 − kLn2Hi.
inline constexpr float kLn2Lo = 1.42860682030941723e-06f;
/// e^r ≈ Σ kExpPoly[k]·r^k on [−ln2/2, ln2/2]: the interpolant at the 7
/// Chebyshev points, each coefficient rounded to float.
inline constexpr float kExpPoly[7] = {1.0f,          1.0f,           0.5f,          0.166664153f,
                                      0.0416663513f, 0.00837512594f, 0.00139411085f};

// The AVX2 + FMA + F16C loops (softmax_cpu_avx2.cpp; call only when
// avx2_available(), which checks FMA and F16C too).

/// Pass 1 of a row of fp16 codes: the maximum of the first n − n mod 8
/// values (the caller takes the rest). A NaN is passed over.
float row_max_avx2(const std::uint16_t* z, std::int64_t n);
/// Pass 2: e[j] = exp_fused(z[j] − m) for j < n − n mod 8, their sum and
/// the sum of z[j] − m, each in 8 lanes combined ((0 1)(2 3))((4 5)(6 7));
/// returns the count done.
std::int64_t row_exp_sum_avx2(const std::uint16_t* z, std::int64_t n, float m, float* e, float* sum,
                              float* shifted);
/// Pass 3: grad[j] = fp16(((e[j]·inv_s) − c)·g) for j < n − n mod 8;
/// returns the count done.
std::int64_t row_grad_avx2(const float* e, std::int64_t n, float inv_s, float c, float g,
                           std::uint16_t* grad);
/// The unfused log_softmax's third sweep: out[j] = z[j] − lse, as FP32.
std::int64_t row_log_prob_avx2(const std::uint16_t* z, std::int64_t n, float lse, float* out);
/// The unfused gradient: grad[j] = fp16((exp_fused(lp[j])·g) − c·g) for
/// j < n − n mod 8; returns the count done.
std::int64_t row_grad_from_log_prob_avx2(const float* lp, std::int64_t n, float g, float cg,
                                         std::uint16_t* grad);
/// exp_fused on 8 floats at a time; returns the count done.
std::int64_t exp_fused_avx2(const float* x, float* y, std::int64_t n);

}  // namespace mpt::detail
