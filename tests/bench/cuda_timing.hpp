// Chapters 01 onwards — what the GPU benchmarks share: CUDA error checks that
// name the benchmark and exit, device memory freed at the end of its scope,
// the median time of a callable measured with CUDA events, and one table row
// of a kernel beside a copy of its bytes.
// Depends on: the CUDA runtime.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace bench {

/// The benchmark's name, printed in front of every CUDA error; each main()
/// sets it first.
inline const char* program_name = "bench";

/// Exit 1 with "PROGRAM: WHAT: CUDA error" on stderr unless e is cudaSuccess.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s: %s\n", program_name, what, cudaGetErrorString(e));
    std::exit(1);
  }
}

/// Device memory of `bytes` bytes (at least 1), freed when it goes out of
/// scope; a failed cudaMalloc exits through check().
struct Buffer {
  void* p = nullptr;
  explicit Buffer(std::size_t bytes) { check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc"); }
  ~Buffer() { cudaFree(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  /// The memory as an array of T.
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

/// Median milliseconds of `reps` runs of f, after two warm-up runs.
inline float median_ms(const std::function<void()>& f, int reps = 21) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  f();
  f();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(a), "cudaEventRecord");
    f();
    check(cudaEventRecord(b), "cudaEventRecord");
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
  return ms[reps / 2];
}

/// One row of a GPU benchmark's table: the kernel's name (left-aligned in
/// `width` columns), its time in ms, the GB/s of its minimum traffic `bytes`,
/// and that over the GB/s of `copy` (a device memcpy of the same bytes),
/// timed now.
inline void report_vs_copy(const std::string& name, float ms, double bytes, const std::function<void()>& copy,
                           int width) {
  const float copy_ms = median_ms(copy);
  const double gbps = bytes / (ms * 1e6), copy_gbps = bytes / (copy_ms * 1e6);
  std::printf("%-*s %9.3f %9.1f %9.2f\n", width, name.c_str(), ms, gbps, gbps / copy_gbps);
}

}  // namespace bench
