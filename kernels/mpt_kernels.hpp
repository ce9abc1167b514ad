// Chapter 01 — floating-point formats and their limits: the CUDA kernels.
// Depends on: src/mpt/format_spec.hpp and range_classify.hpp (plain C++17).
// Host-only: no CUDA types, so CPU code and cling notebooks can include it;
// the definitions live in kernels/*.cu and need the library mpt::kernels.
//
// Every pointer named d_* is a DEVICE pointer (cudaMalloc'd). All work goes
// to the default stream. A CUDA error throws std::runtime_error carrying
// CUDA's error name and text. The casts return as soon as the kernel is
// queued: a fault inside a kernel shows up at the next synchronising call
// (a cudaMemcpy back to the host, or mpt::cuda::synchronize()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mpt/format_spec.hpp"
#include "mpt/range_classify.hpp"

namespace mpt::cuda {

// --- the device -----------------------------------------------------------

/// True when the CUDA runtime sees a device and this build holds kernel code
/// it can run (CMAKE_CUDA_ARCHITECTURES, 80 and 90 by default). Otherwise
/// false, with the reason (no driver, no device, no kernel image, with
/// CUDA's own error text) in *why if given.
bool device_available(std::string* why = nullptr);

/// Wait for all queued work; throws on any pending CUDA error.
void synchronize();

// --- casts (kernels/casts.cu) --------------------------------------------

/// Each kernel family comes in two versions, llm.c style: the simplest
/// correct one, and a faster one that must give identical bits.
enum class KernelVersion : int {
  simple = 1,      ///< one thread per element, scalar loads and stores
  vectorized = 2,  ///< four elements per thread, 16-byte loads
};

/// fp32 → fp16 codes (IEEE binary16 bits): round to nearest even, overflow
/// to ±inf, subnormals kept, NaN → canonical quiet NaN 0x7E00 with the sign
/// kept. Bit for bit mpt::encode_array(in, .., format_named("fp16")).
/// The vectorized version needs d_in 16-byte and d_out 8-byte aligned (as
/// cudaMalloc gives); for other pointers it falls back to the simple one.
void cast_fp32_to_fp16(const float* d_in, std::uint16_t* d_out, std::size_t n,
                       KernelVersion v = KernelVersion::vectorized);
/// fp16 codes → fp32 (exact; NaN → quiet NaN with the sign kept).
void cast_fp16_to_fp32(const std::uint16_t* d_in, float* d_out, std::size_t n,
                       KernelVersion v = KernelVersion::vectorized);

/// fp32 → bf16 codes: as cast_fp32_to_fp16 (RNE, overflow to ±inf, NaN →
/// 0x7FC0 with the sign kept).
void cast_fp32_to_bf16(const float* d_in, std::uint16_t* d_out, std::size_t n,
                       KernelVersion v = KernelVersion::vectorized);
/// bf16 codes → fp32 (exact; NaN → quiet NaN with the sign kept).
void cast_bf16_to_fp32(const std::uint16_t* d_in, float* d_out, std::size_t n,
                       KernelVersion v = KernelVersion::vectorized);

/// fp32 → OCP E4M3 codes, saturating (CUDA's __NV_SATFINITE): RNE, finite
/// values beyond ±448 and ±inf become ±448; NaN → 0x7F/0xFF (S.1111.111).
void cast_fp32_to_e4m3_sat(const float* d_in, std::uint8_t* d_out, std::size_t n,
                           KernelVersion v = KernelVersion::vectorized);
/// E4M3 codes → fp32 (exact; S.1111.111 → quiet NaN with the sign kept).
void cast_e4m3_to_fp32(const std::uint8_t* d_in, float* d_out, std::size_t n,
                       KernelVersion v = KernelVersion::vectorized);

/// fp32 → OCP E5M2 codes, saturating: RNE, beyond ±57344 and ±inf become
/// ±57344; NaN → 0x7E/0xFE.
void cast_fp32_to_e5m2_sat(const float* d_in, std::uint8_t* d_out, std::size_t n,
                           KernelVersion v = KernelVersion::vectorized);
/// E5M2 codes → fp32 (exact; NaN → quiet NaN with the sign kept).
void cast_e5m2_to_fp32(const std::uint8_t* d_in, float* d_out, std::size_t n,
                       KernelVersion v = KernelVersion::vectorized);

// --- range report (kernels/range_report.cu) -------------------------------

/// What storing d_x[0..n) in format f would do, counted on the device: one
/// count per mpt::RangeClass (see range_classify.hpp for the exact rules:
/// overflow, nonfinite, subnormal result, flushed to zero, exact, rounded,
/// zero) and the histogram of floor(log2|x|) over the finite nonzero inputs,
/// bins -149..127 (mpt::kLog2BinMin..kLog2BinMax, nothing clamped).
/// Equal, field for field, to calling RangeCounts::add(x, f) on every
/// element on the host. Synchronous: returns once the counts are copied back.
/// The vectorized version uses 16-byte loads when d_x is 16-byte aligned.
RangeCounts range_counts(const float* d_x, std::size_t n, const FormatSpec& f,
                         KernelVersion v = KernelVersion::vectorized);

// ===========================================================================
// Chapter 02 — loss scaling and FP32 master weights
// ===========================================================================
//
// The GPU side of a GradScaler step, with no host synchronisation anywhere:
// the scale, its inverse, the growth tracker and the found-inf flag all live
// in device memory, and the host only queues kernels. Per step:
//
//   reset_found_inf(d_found_inf);                        // 0.0f
//   inverse_scale(d_scale, d_inv_scale);                 // (float)(1.0 / (double)scale)
//   unscale_and_check(grads, d_inv_scale, d_found_inf);  // one launch, every tensor
//   ... a device optimizer step would read *d_found_inf and skip itself ...
//   update_scale(d_scale, d_tracker, d_found_inf, 2.0f, 0.5f, 2000);
//
// The per-element and per-step math is scaler_math.hpp's, the code the CPU
// GradScaler and tests/cpu run.

/// One FP32 gradient tensor in device memory: d_data[0..n).
struct DeviceTensor {
  float* d_data = nullptr;  ///< device pointer to the first element
  std::size_t n = 0;         ///< number of elements
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
  /// Chunks of kernels/scaler.cu's vectorized version (blocks it launches).
  std::size_t chunks() const { return chunks_; }
  /// The device table (opaque; read by kernels/scaler.cu).
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
void unscale_and_check(const DeviceTensorList& grads, const float* d_inv_scale,
                       float* d_found_inf, KernelVersion v = KernelVersion::vectorized);

/// The scale update of one step, on the device by one thread:
/// mpt::update_scale(*d_scale, *d_growth_tracker, *d_found_inf != 0, ...).
/// Overflow: scale *= backoff_factor, tracker = 0; otherwise the tracker
/// counts, and at growth_interval the scale grows (only if still finite in
/// FP32) and the tracker resets. Arguments are not validated here (the
/// GradScaler does that). Queued, no host synchronisation.
void update_scale(float* d_scale, std::int32_t* d_growth_tracker, const float* d_found_inf,
                  float growth_factor, float backoff_factor, std::int32_t growth_interval);

// --- FP16-input, FP32-accumulate GEMM (kernels/gemm_fp16.cu) ----------------

/// Whether a GEMM operand is read as stored (no) or transposed (yes).
enum class Trans : int {
  no = 0,   ///< op(X) = X
  yes = 1,  ///< op(X) = X^T
};

/// The GEMM kernels, simplest first.
enum class GemmVersion : int {
  naive = 1,  ///< one thread per output, operands read straight from global memory
  tiled = 2,  ///< 16x16 shared-memory tiles: each operand value loaded once per tile
};

/// C = op(A) · op(B), all row-major and contiguous, fp16 inputs given as
/// IEEE binary16 codes, products and sums in FP32:
///   op(A): M x K — A stored as [M, K] (ta = no) or [K, M] (ta = yes)
///   op(B): K x N — B stored as [K, N] (tb = no) or [N, K] (tb = yes)
///   C:     M x N, FP32
/// A Linear layer y = x W^T with x [batch, in], W [out, in] (PyTorch's
/// layout) is gemm_fp16(no, yes, batch, out, in, x, W, y); its backward is
/// dx = dy W: (no, no, batch, in, out, dy, W, dx) and dW = dy^T x:
/// (yes, no, out, in, batch, dy, x, dW).
/// Each output sums its K products in order k = 0..K-1 with one FMA each.
/// A product of two fp16 values is exact in FP32, so an FMA equals "round
/// the sum once": the result is bit for bit a CPU loop acc += a*b in the same
/// order (NaN payloads aside). M, N, K >= 0; K == 0 gives zeros. Queued.
void gemm_fp16(Trans ta, Trans tb, int M, int N, int K, const std::uint16_t* d_a,
               const std::uint16_t* d_b, float* d_c, GemmVersion v = GemmVersion::tiled);

/// As above with C stored as fp16 codes: the FP32 sum rounded once to fp16
/// (nearest-even, overflow to ±inf, subnormals kept, NaN → 0x7E00 with its
/// sign), via round_element.hpp's round_to_format, as mpt::encode_array does.
void gemm_fp16(Trans ta, Trans tb, int M, int N, int K, const std::uint16_t* d_a,
               const std::uint16_t* d_b, std::uint16_t* d_c,
               GemmVersion v = GemmVersion::tiled);

}  // namespace mpt::cuda
