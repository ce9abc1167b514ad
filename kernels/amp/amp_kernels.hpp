// Chapter 02 — loss scaling and FP32 master weights: the CUDA kernels of
// the amp tier (mpt::kernels_amp): fused multi-tensor unscale-and-check and
// the scale update, in kernels/amp/scaler.cu.
// Depends on: kernels/formats/formats_kernels.hpp (KernelVersion). Host-only: no CUDA
// types, so CPU code and cling notebooks can include it.
//
// Every pointer named d_* is a DEVICE pointer (cudaMalloc'd). All work goes
// to the default stream. A CUDA error throws std::runtime_error carrying
// CUDA's error name and text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/formats/formats_kernels.hpp"

namespace mpt::cuda {

// The GPU side of a GradScaler step, with no host synchronisation anywhere:
// the scale, its inverse, the growth tracker and the found-inf flag all live
// in device memory, and the host only queues kernels. Per step:
//
//   reset_found_inf(d_found_inf);                        // 0.0f
//   inverse_scale(d_scale, d_inv_scale);                 // (float)(1.0 / (double)scale)
//   unscale_and_check(grads, d_inv_scale, d_found_inf);  // one launch, every tensor
//   ... a device optimizer step would read *d_found_inf and skip itself ...
//   update_scale(d_scale, d_tracker, d_found_inf, 2.0, 0.5, 2000);
//
// The per-element and per-step math is scaler_math.hpp's, the code the CPU
// GradScaler and tests/cpu run.

/// One FP32 gradient tensor in device memory: d_data[0..n).
struct DeviceTensor {
  float* d_data = nullptr;  ///< device pointer to the first element
  std::size_t n = 0;        ///< number of elements
};

/// A list of device gradient tensors, prepared for unscale_and_check: a
/// table of {pointer, size, first element, first chunk} per non-empty tensor
/// is built on the host and uploaded ONCE here (a synchronous cudaMemcpy).
/// Gradient buffers keep their addresses for the whole run, so a training
/// step then costs one kernel launch and no host-to-device traffic. The
/// tensors must not overlap; the list does not own them and must not outlive
/// them.
class DeviceTensorList {
 public:
  /// Build and upload the table. Throws std::invalid_argument for a
  /// non-empty tensor with a null pointer, std::runtime_error on a CUDA error.
  explicit DeviceTensorList(const std::vector<DeviceTensor>& tensors);
  /// Frees the device table (not the tensors).
  ~DeviceTensorList();
  DeviceTensorList(const DeviceTensorList&) = delete;             ///< owns a device buffer
  DeviceTensorList& operator=(const DeviceTensorList&) = delete;  ///< owns a device buffer

  /// Non-empty tensors in the table (empty ones are dropped).
  std::size_t tensors() const { return count_; }
  /// Elements over all tensors.
  std::size_t elements() const { return elements_; }
  /// Chunks of kernels/amp/scaler.cu's vectorized version (blocks it launches).
  std::size_t chunks() const { return chunks_; }
  /// The device table (opaque; read by kernels/amp/scaler.cu).
  const void* d_table() const { return d_table_; }

 private:
  void* d_table_ = nullptr;
  std::size_t count_ = 0, elements_ = 0, chunks_ = 0;
};

/// *d_found_inf = 0.0f, queued (cudaMemsetAsync on the default stream).
void reset_found_inf(float* d_found_inf);

/// *d_inv_scale = (float)(1.0 / (double)*d_scale): the inverse computed in
/// double and rounded once to float, as torch.amp.GradScaler.unscale_ does.
/// One thread; queued, no host synchronisation.
void inverse_scale(const float* d_scale, float* d_inv_scale);

/// Fused multi-tensor unscale and non-finite check, ONE launch for the whole
/// list: every element of every tensor is read once and multiplied by
/// *d_inv_scale (left untouched when it is exactly 1), and *d_found_inf is
/// set to 1.0f when any element was ±inf or NaN *before* the multiply (it is
/// never cleared: call reset_found_inf first). Element for element this is
/// mpt::unscale_and_check (scaler_math.hpp), so the CPU's mpt::unscale_and_check
/// arrays give the same bits — except NaN payloads: a GPU multiply returns
/// the canonical NaN, x86 keeps the input's payload. Queued, no host sync.
///   simple:     one thread per element of the concatenated list.
///   vectorized: one block per chunk of one tensor, 16-byte loads where the
///               tensor is 16-byte aligned (scalar otherwise).
void unscale_and_check(const DeviceTensorList& grads, const float* d_inv_scale, float* d_found_inf,
                       KernelVersion v = KernelVersion::vectorized);

/// The scale update of one step, on the device by one thread:
/// mpt::update_scale(*d_scale, *d_growth_tracker, *d_found_inf != 0, ...).
/// Overflow: scale *= backoff_factor, tracker = 0; otherwise the tracker
/// counts, and at growth_interval the scale grows (only if still finite in
/// FP32) and the tracker resets. The factors are doubles, as in the CPU
/// GradScaler (GradScaler::Options) and PyTorch's _amp_update_scale_ (Python
/// floats): each product is formed in double and rounded once to the FP32
/// scale, so a factor that is no FP32 value (0.3, 1.7) gives the CPU's bits;
/// rounding it to float first would drift from the CPU's scale after a few
/// backoffs. Arguments are not validated here (the GradScaler does that).
/// Queued, no host synchronisation.
void update_scale(float* d_scale, std::int32_t* d_growth_tracker, const float* d_found_inf,
                  double growth_factor, double backoff_factor, std::int32_t growth_interval);

}  // namespace mpt::cuda
