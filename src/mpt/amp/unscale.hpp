// Chapter 02 — loss scaling and FP32 master weights: unscale the gradients
// and look for inf/NaN, fused into one pass over the data.
// Depends on: scaler_math.hpp (the per-element unscale_and_check, shared with
// the CUDA kernel in kernels/scaler.cu), rounding.hpp (Implementation,
// avx2_available).
//
// unscale_and_check is what GradScaler::unscale runs on every gradient: one
// read and one write per element. The two-pass baseline (unscale, then
// any_nonfinite) is kept for the benchmark and the chapter's comparison: it
// reads every gradient twice. The array versions have a portable loop (the
// reference) and an AVX2 loop chosen at run time; both give the same bits.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "mpt/formats/rounding.hpp"

namespace mpt {

/// A list of gradient tensors as (pointer, element count) pairs; PyTorch's
/// multi-tensor calls take a list of tensors in the same way. The tensors
/// must not overlap (an element listed twice would be unscaled twice).
using TensorList = std::vector<std::pair<float*, std::size_t>>;

/// Multiply g[0..n) by inv_scale in place and return true when any g[i] was
/// non-finite (±inf or NaN) *before* the multiply — PyTorch's
/// _amp_foreach_non_finite_check_and_unscale_ for one tensor. Every element
/// is multiplied, also after a non-finite one was seen; inv_scale == 1
/// leaves the data untouched (not even rewritten). Element for element this
/// is mpt::unscale_and_check(float&, float) from scaler_math.hpp, bit for bit
/// (NaN payloads included) whichever implementation runs.
bool unscale_and_check(float* g, std::size_t n, float inv_scale,
                       Implementation impl = Implementation::automatic);

/// The multi-tensor version: every tensor of the list is unscaled (none is
/// skipped when an earlier one held an inf), and the result is true when any
/// element of any tensor was non-finite. One pass over each tensor.
bool unscale_and_check(const TensorList& tensors, float inv_scale,
                       Implementation impl = Implementation::automatic);

/// Pass one of the two-pass baseline: g[i] *= inv_scale (untouched when
/// inv_scale == 1). The products are the bits unscale_and_check writes.
void unscale(float* g, std::size_t n, float inv_scale, Implementation impl = Implementation::automatic);

/// Pass two of the baseline, and a check on its own: true when any g[i] is
/// ±inf or NaN. Read-only; may stop early once one is found.
bool any_nonfinite(const float* g, std::size_t n, Implementation impl = Implementation::automatic);

/// The two-pass baseline over a list: unscale every tensor, then check every
/// tensor — each gradient is read twice. It judges the *unscaled* values, so
/// it can disagree with unscale_and_check when the multiply itself overflows
/// (inv_scale > 1, a scale below 1) or inv_scale is 0 or inf; for a scale
/// >= 1 (inv_scale in (0, 1]) both report the same flag and write the same
/// bits. The chapter's benchmark compares the two (tests/bench/bench_ch02_unscale.cpp).
bool unscale_then_check(const TensorList& tensors, float inv_scale,
                        Implementation impl = Implementation::automatic);

namespace detail {
// The AVX2 loops (unscale_avx2.cpp, compiled with -mavx2; call only when
// avx2_available()). Same contracts as the public functions above.
bool unscale_and_check_avx2(float* g, std::size_t n, float inv_scale);
void unscale_avx2(float* g, std::size_t n, float inv_scale);
bool any_nonfinite_avx2(const float* g, std::size_t n);
}  // namespace detail

}  // namespace mpt
