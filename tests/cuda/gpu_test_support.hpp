// Chapter 01 onwards — what every GPU test needs: a main() that skips
// (exit 77, CTest "Skipped") when there is no usable device, device buffers
// that are poisoned before a kernel writes them, and llm.c-style reporting
// of the first mismatch, and the raw bits of the typed codes. Depends on:
// the CUDA runtime, doctest, kernels/formats/formats_kernels.hpp
// (device_available, and mpt/formats/codes.hpp); each test includes
// the kernel header of its own tier. Include after defining
// DOCTEST_CONFIG_IMPLEMENT.
#pragma once

#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include "kernels/formats/formats_kernels.hpp"

namespace mpt::test {

/// The raw bit pattern of a typed code (mpt/formats/codes.hpp), widened.
inline std::uint32_t code_bits(mpt::Fp16Code c) { return c.bits; }
/// The raw bit pattern of a bf16 code, widened.
inline std::uint32_t code_bits(mpt::Bf16Code c) { return c.bits; }
/// The raw bit pattern of an FP8 code, widened.
template <const mpt::FormatSpec& Spec>
std::uint32_t code_bits(mpt::Fp8<Spec> c) {
  return c.code;
}
/// The bit patterns of a vector of typed codes.
template <class Code>
std::vector<std::uint32_t> code_bits(const std::vector<Code>& codes) {
  std::vector<std::uint32_t> out;
  for (const Code& c : codes) out.push_back(code_bits(c));
  return out;
}
/// The typed code with the low 8 * sizeof(Code) bits of u.
template <class Code>
Code code_from_bits(std::uint32_t u) {
  Code c;
  if constexpr (sizeof(Code) == 2) {
    const auto b = static_cast<std::uint16_t>(u);
    std::memcpy(&c, &b, sizeof c);
  } else {
    const auto b = static_cast<std::uint8_t>(u);
    std::memcpy(&c, &b, sizeof c);
  }
  return c;
}

inline void cuda_ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
  }
}

/// n elements of T on the device, freed on scope exit.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) {
    cuda_ok(cudaMalloc(&p_, (n ? n : 1) * sizeof(T)), "cudaMalloc");
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    cuda_ok(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return p_; }
  /// Fill every byte with `byte`. 0xFF makes a skipped float a NaN and a
  /// skipped code all ones; kPoisonFinite makes both finite garbage. Either
  /// alone can equal a valid output (0xFF is E4M3's -NaN, and comparisons
  /// that accept any NaN accept a NaN poison), so a check that a kernel
  /// writes every element runs once with each: a skipped element then
  /// differs from the expected value in at least one of the two runs.
  void poison(unsigned char byte = 0xFF) {
    cuda_ok(cudaMemset(p_, byte, n_ * sizeof(T)), "cudaMemset poison");
  }
  std::vector<T> download() const {
    std::vector<T> out(n_);
    cuda_ok(cudaMemcpy(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost),
            "download (kernel errors surface here)");
    return out;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

/// The two poison bytes of DeviceArray::poison, in the order checks use them.
constexpr unsigned char kPoisonBytes[] = {0xFF, 0x5A};
/// A finite poison: 0x5A5A5A5A is about 1.5e16 as a float, 0x5A5A is 203.25
/// as fp16, 0x5A is 3.25 as E4M3 — never NaN, never zero.
constexpr unsigned char kPoisonFinite = 0x5A;

/// The value of a buffer element whose every byte is `byte`.
template <class T>
T poison_value(unsigned char byte) {
  unsigned char bytes[sizeof(T)];
  std::memset(bytes, byte, sizeof bytes);
  T v{};
  std::memcpy(&v, bytes, sizeof v);  // T is trivially copyable (a float, an integer, a code)
  return v;
}

/// The kernel version's name, for messages.
inline const char* version_name(mpt::cuda::KernelVersion v) {
  return v == mpt::cuda::KernelVersion::simple ? "simple" : "vectorized";
}

/// True when got has want's bits, or (with nan_any_payload) both are NaN:
/// a GPU returns the canonical NaN where x86 keeps the input's payload.
inline bool same_float(float want, float got, bool nan_any_payload = true) {
  std::uint32_t w, g;
  std::memcpy(&w, &want, 4);
  std::memcpy(&g, &got, 4);
  return w == g || (nan_any_payload && std::isnan(want) && std::isnan(got));
}

inline std::uint64_t test_seed() {
  const char* s = std::getenv("MPT_SEED");
  return s ? std::strtoull(s, nullptr, 0) : 20240101u;
}

/// main() for a GPU test executable.
inline int gpu_test_main(int argc, char** argv) {
  std::string why;
  if (!mpt::cuda::device_available(&why)) {
    std::printf("SKIPPED %s: no usable CUDA device (%s)\n", argc > 0 ? argv[0] : "gpu test", why.c_str());
    return 77;
  }
  cudaDeviceProp prop{};
  int device = 0;
  if (cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    std::printf("device %d: %s (sm_%d%d)\n", device, prop.name, prop.major, prop.minor);
  }
  doctest::Context context(argc, argv);
  return context.run();
}

}  // namespace mpt::test
