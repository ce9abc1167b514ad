// Chapter 01 — floating-point formats and their limits: the host-only API of
// the lowest kernel tier (mpt_kernels_formats): is there a device, wait for
// it, the kernel-version switch every family shares, casts between fp32 and
// every storage format, and the range report counted on the device.
// Depends on: src/mpt/formats/format_spec.hpp, range_classify.hpp and
// codes.hpp (the typed codes; all plain C++17). Host-only: no CUDA types, so CPU code and cling notebooks can
// include it; the definitions are in kernels/formats/*.cu.
//
// Every pointer named d_* is a DEVICE pointer (cudaMalloc'd). All work goes
// to the default stream. A CUDA error throws std::runtime_error carrying
// CUDA's error name and text. The casts return as soon as the kernel is
// queued: a fault inside a kernel shows up at the next synchronising call
// (a cudaMemcpy back to the host, or mpt::cuda::synchronize()).
//
// Codes are typed (codes.hpp): fp16 data is Fp16Code*, bf16 data Bf16Code*,
// FP8 data Fp8E4M3* / Fp8E5M2*, so handing bf16 codes to an fp16 kernel does
// not compile. Each type is exactly its raw integer, so a buffer of
// n * sizeof(code) bytes from cudaMalloc holds n codes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "mpt/formats/codes.hpp"
#include "mpt/formats/format_spec.hpp"
#include "mpt/formats/range_classify.hpp"

namespace mpt::cuda {

/// True when the CUDA runtime sees a device and this build holds kernel code
/// it can run (CMAKE_CUDA_ARCHITECTURES, 80 and 90 by default). Otherwise
/// false, with the reason (no driver, no device, no kernel image, with
/// CUDA's own error text) in *why if given.
bool device_available(std::string* why = nullptr);

/// Wait for all queued work; throws on any pending CUDA error.
void synchronize();

/// Each kernel family comes in two versions, llm.c style: the simplest
/// correct one, and a faster one that must give identical bits.
enum class KernelVersion : int {
  simple = 1,      ///< one thread per element, scalar loads and stores
  vectorized = 2,  ///< four elements per thread, 16-byte loads
};

// --- casts (kernels/formats/casts.cu) ------------------------------------

/// fp32 → fp16 codes (IEEE binary16 bits): round to nearest even, overflow
/// to ±inf, subnormals kept, NaN → canonical quiet NaN 0x7E00 with the sign
/// kept. Bit for bit mpt::encode_array(in, .., format_named("fp16")).
/// The vectorized version needs d_in 16-byte and d_out 8-byte aligned (as
/// cudaMalloc gives); for other pointers it falls back to the simple one.
void cast_fp32_to_fp16(const float* d_in, Fp16Code* d_out, std::size_t n,
                       KernelVersion v = KernelVersion::vectorized);
/// fp16 codes → fp32 (exact; NaN → quiet NaN with the sign kept).
void cast_fp16_to_fp32(const Fp16Code* d_in, float* d_out, std::size_t n,
                       KernelVersion v = KernelVersion::vectorized);

/// fp32 → bf16 codes: as cast_fp32_to_fp16 (RNE, overflow to ±inf, NaN →
/// 0x7FC0 with the sign kept).
void cast_fp32_to_bf16(const float* d_in, Bf16Code* d_out, std::size_t n,
                       KernelVersion v = KernelVersion::vectorized);
/// bf16 codes → fp32 (exact; NaN → quiet NaN with the sign kept).
void cast_bf16_to_fp32(const Bf16Code* d_in, float* d_out, std::size_t n,
                       KernelVersion v = KernelVersion::vectorized);

/// fp32 → OCP E4M3 codes, saturating (CUDA's __NV_SATFINITE): RNE, finite
/// values beyond ±448 and ±inf become ±448; NaN → 0x7F/0xFF (S.1111.111).
void cast_fp32_to_e4m3_sat(const float* d_in, Fp8E4M3* d_out, std::size_t n,
                           KernelVersion v = KernelVersion::vectorized);
/// E4M3 codes → fp32 (exact; S.1111.111 → quiet NaN with the sign kept).
void cast_e4m3_to_fp32(const Fp8E4M3* d_in, float* d_out, std::size_t n,
                       KernelVersion v = KernelVersion::vectorized);

/// fp32 → OCP E5M2 codes, saturating: RNE, beyond ±57344 and ±inf become
/// ±57344; NaN → 0x7E/0xFE.
void cast_fp32_to_e5m2_sat(const float* d_in, Fp8E5M2* d_out, std::size_t n,
                           KernelVersion v = KernelVersion::vectorized);
/// E5M2 codes → fp32 (exact; NaN → quiet NaN with the sign kept).
void cast_e5m2_to_fp32(const Fp8E5M2* d_in, float* d_out, std::size_t n,
                       KernelVersion v = KernelVersion::vectorized);

// --- range report (kernels/formats/range_report.cu) ----------------------

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

/// The device-side counters of a range report (one RangeCounts worth of
/// device memory), allocated once and reused: with range_counts_into() a
/// caller counts many arrays, or times the counting kernel, without a
/// device allocation, clear and copy back per call.
class DeviceRangeCounts {
 public:
  /// Allocate the counters and set them to zero (synchronous).
  DeviceRangeCounts();
  /// Free them.
  ~DeviceRangeCounts();
  DeviceRangeCounts(const DeviceRangeCounts&) = delete;             ///< owns a device buffer
  DeviceRangeCounts& operator=(const DeviceRangeCounts&) = delete;  ///< owns a device buffer
  /// Set every counter to zero (queued: cudaMemsetAsync on the default stream).
  void clear();
  /// The counts so far (synchronous: waits for the queued work and copies back).
  RangeCounts download() const;
  /// The device counters (opaque; read by kernels/formats/range_report.cu).
  void* d_counters() const { return d_counters_; }

 private:
  void* d_counters_ = nullptr;
};

/// Add the counts of d_x[0..n) into `counters` (they are not cleared: call
/// counters.clear() first). Queued, no host synchronisation; what
/// range_counts() does between its allocation and its copy back.
void range_counts_into(const float* d_x, std::size_t n, const FormatSpec& f, DeviceRangeCounts& counters,
                       KernelVersion v = KernelVersion::vectorized);

}  // namespace mpt::cuda
