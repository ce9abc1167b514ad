// Chapter 02 — loss scaling and FP32 master weights: fused unscale-and-check.
// Depends on: unscale.hpp, cpu_dispatch.hpp (the AVX2-or-portable choice),
// scaler_math.hpp (the per-element function the portable loops call, the
// same one kernels/scaler.cu runs on the GPU).
// The portable loops are the reference; the AVX2 loops (unscale_avx2.cpp)
// run when the CPU has AVX2, and tests/cpu/test_ch02_unscale.cpp holds the
// two to the same bits.
#include "mpt/amp/unscale.hpp"

#include <stdexcept>

#include "mpt/amp/scaler_math.hpp"
#include "mpt/formats/cpu_dispatch.hpp"

namespace mpt {
namespace {

/// detail::use_avx2 with this file's message for an unavailable AVX2 path.
bool use_avx2(Implementation impl) {
  return detail::use_avx2(impl,
                          "the AVX2 unscale path is not available on this CPU/build; use "
                          "Implementation::portable or automatic");
}

// The reference loop: one call of the shared per-element function per
// element. No early exit: every element is multiplied. The flag is OR-ed
// into an unsigned, not a bool: GCC vectorizes an integer OR reduction
// (SSE2 at -O3, checked with -fopt-info-vec) but not a bool one. The AVX2
// file does twice the width by hand.
bool unscale_and_check_portable(float* g, std::size_t n, float inv_scale) {
  unsigned found = 0;
  for (std::size_t i = 0; i < n; ++i) found |= mpt::unscale_and_check(g[i], inv_scale);
  return found != 0;
}

void unscale_portable(float* g, std::size_t n, float inv_scale) {
  if (inv_scale == 1.0f) return;  // as the per-element function: untouched
  for (std::size_t i = 0; i < n; ++i) g[i] *= inv_scale;
}

bool any_nonfinite_portable(const float* g, std::size_t n) {
  // Blocks of 1024 with a check after each: the inner loop stays
  // branch-free (vectorizable), and a found inf still ends the scan early.
  constexpr std::size_t kBlock = 1024;
  for (std::size_t start = 0; start < n; start += kBlock) {
    const std::size_t end = n - start < kBlock ? n : start + kBlock;
    unsigned found = 0;  // unsigned, not bool: see unscale_and_check_portable
    for (std::size_t i = start; i < end; ++i) found |= !is_finite_bits(g[i]);
    if (found) return true;
  }
  return false;
}

}  // namespace

bool unscale_and_check(float* g, std::size_t n, float inv_scale, Implementation impl) {
#if defined(MPT_HAVE_AVX2_PATH)
  if (use_avx2(impl)) return detail::unscale_and_check_avx2(g, n, inv_scale);
#else
  (void)use_avx2(impl);
#endif
  return unscale_and_check_portable(g, n, inv_scale);
}

bool unscale_and_check(const TensorList& tensors, float inv_scale, Implementation impl) {
  const Implementation chosen = use_avx2(impl) ? Implementation::avx2 : Implementation::portable;
  bool found = false;
  // No short cut once `found` is set: PyTorch unscales every tensor anyway,
  // and step() skipping the update is what makes the garbage harmless.
  for (const auto& [p, n] : tensors) found |= unscale_and_check(p, n, inv_scale, chosen);
  return found;
}

void unscale(float* g, std::size_t n, float inv_scale, Implementation impl) {
#if defined(MPT_HAVE_AVX2_PATH)
  if (use_avx2(impl)) {
    detail::unscale_avx2(g, n, inv_scale);
    return;
  }
#else
  (void)use_avx2(impl);
#endif
  unscale_portable(g, n, inv_scale);
}

bool any_nonfinite(const float* g, std::size_t n, Implementation impl) {
#if defined(MPT_HAVE_AVX2_PATH)
  if (use_avx2(impl)) return detail::any_nonfinite_avx2(g, n);
#else
  (void)use_avx2(impl);
#endif
  return any_nonfinite_portable(g, n);
}

bool unscale_then_check(const TensorList& tensors, float inv_scale, Implementation impl) {
  const Implementation chosen = use_avx2(impl) ? Implementation::avx2 : Implementation::portable;
  for (const auto& [p, n] : tensors) unscale(p, n, inv_scale, chosen);
  bool found = false;
  for (const auto& [p, n] : tensors) {
    if (any_nonfinite(p, n, chosen)) {
      found = true;
      break;  // a separate check pass may stop at the first inf: every element is unscaled already
    }
  }
  return found;
}

}  // namespace mpt
