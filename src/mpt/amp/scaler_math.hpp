// Chapter 02 — loss scaling and FP32 master weights.
// Depends on: format_spec.hpp (for MPT_HD) only. Host-and-device: the
// GradScaler (src/mpt/grad_scaler.*) and the CUDA kernels (kernels/scaler.cu)
// call these exact functions, so the CPU tests cover the code the GPU runs.
//
// The per-element and per-step math of dynamic loss scaling, with the
// semantics of PyTorch's torch.amp.GradScaler (its CUDA helpers
// _amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_).
#pragma once

#include <cstdint>

#include "mpt/formats/format_spec.hpp"

namespace mpt {

/// True for a finite float (not ±inf, not NaN), by bits so that fast-math
/// flags cannot fold it away.
MPT_HD inline bool is_finite_bits(float x) {
#if defined(__CUDA_ARCH__)
  const std::uint32_t u = __float_as_uint(x);
#else
  std::uint32_t u;
  static_assert(sizeof u == sizeof x, "float is 32 bits");
  __builtin_memcpy(&u, &x, sizeof u);
#endif
  return (u & 0x7f800000u) != 0x7f800000u;
}

/// The inverse scale that unscale multiplies by: the reciprocal taken in
/// double, then rounded to float, as PyTorch does
/// (self._scale.double().reciprocal().float()). For IEEE division this equals
/// 1.0f / scale (a double is wide enough that the second rounding is
/// innocuous); PyTorch takes the detour because FP32 division may be
/// approximate under fast-math options.
MPT_HD inline float inverse_scale(float scale) {
  return static_cast<float>(1.0 / static_cast<double>(scale));
}

/// Unscale one gradient element in place and report whether it was
/// non-finite. As in PyTorch, finiteness is judged on the *scaled* value
/// (before the multiply), and the multiply happens either way; an
/// inv_scale of exactly 1 leaves the value untouched.
MPT_HD inline bool unscale_and_check(float& g, float inv_scale) {
  const bool bad = !is_finite_bits(g);
  if (inv_scale != 1.0f) g *= inv_scale;
  return bad;
}

/// The scale update rule, one step. On overflow the scale is multiplied by
/// backoff_factor and the growth tracker resets; otherwise the tracker counts
/// successful steps, and when it reaches growth_interval the scale is
/// multiplied by growth_factor — but only if the grown scale is finite in
/// FP32 — and the tracker resets either way. There is no floor: repeated
/// overflow can drive the scale to zero. The factors are doubles and each
/// product is formed in double then rounded to the FP32 scale, as PyTorch's
/// _amp_update_scale_ kernels do, so a factor such as 0.3 that is not a float
/// gives PyTorch's bits.
MPT_HD inline void update_scale(float& scale, std::int32_t& growth_tracker, bool found_inf,
                                double growth_factor, double backoff_factor, std::int32_t growth_interval) {
  if (found_inf) {
    scale = static_cast<float>(static_cast<double>(scale) * backoff_factor);
    growth_tracker = 0;
    return;
  }
  const std::int32_t successful = growth_tracker + 1;
  if (successful == growth_interval) {
    const float grown = static_cast<float>(static_cast<double>(scale) * growth_factor);
    if (is_finite_bits(grown)) scale = grown;
    growth_tracker = 0;
  } else {
    growth_tracker = successful;
  }
}

}  // namespace mpt
