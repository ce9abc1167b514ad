// Chapter 01 onwards — what every GPU test needs: a main() that skips
// (exit 77, CTest "Skipped") when there is no usable device, device buffers
// that are poisoned before a kernel writes them, and llm.c-style reporting
// of the first mismatch. Depends on: the CUDA runtime, doctest,
// kernels/formats/formats_kernels.hpp (device_available); each test includes
// the kernel header of its own tier. Include after defining
// DOCTEST_CONFIG_IMPLEMENT.
#pragma once

#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include "kernels/formats/formats_kernels.hpp"

namespace mpt::test {

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
  /// Fill every byte with 0xFF, so an element the kernel skipped reads as a
  /// NaN (floats) or the all-ones code, never as a plausible zero.
  void poison() { cuda_ok(cudaMemset(p_, 0xFF, n_ * sizeof(T)), "cudaMemset poison"); }
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
    std::printf("SKIPPED %s: no usable CUDA device (%s)\n", argc > 0 ? argv[0] : "gpu test",
                why.c_str());
    return 77;
  }
  cudaDeviceProp prop{};
  int device = 0;
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    std::printf("device %d: %s (sm_%d%d)\n", device, prop.name, prop.major, prop.minor);
  }
  doctest::Context context(argc, argv);
  return context.run();
}

}  // namespace mpt::test
