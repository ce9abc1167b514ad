// Chapter 01 — floating-point formats and their limits (CUDA plumbing).
// Depends on: the CUDA runtime only. Private to kernels/*/*.cu: turns a CUDA
// error code into a std::runtime_error that names the call and CUDA's text,
// so the host-only headers (kernels/*/*_kernels.hpp) never leaks cudaError_t.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

namespace mpt::cuda::detail {

/// Throw std::runtime_error naming `where` and CUDA's error when err is not cudaSuccess.
inline void check(cudaError_t err, const char* where) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("mpt::cuda::") + where + ": " + cudaGetErrorName(err) + ": " +
                             cudaGetErrorString(err));
  }
}

/// A launch reports bad configurations at once; faults inside the kernel
/// appear at the next synchronising call (see mpt::cuda::synchronize).
inline void check_launch(const char* where) { check(cudaGetLastError(), where); }

/// Blocks needed for `work` items at `threads` per block, refusing grids
/// larger than CUDA allows in x instead of silently truncating.
inline unsigned int blocks_for(std::size_t work, unsigned int threads, const char* where) {
  const std::size_t blocks = (work + threads - 1) / threads;
  if (blocks > 0x7fffffffu) {
    throw std::length_error(std::string("mpt::cuda::") + where + ": " + std::to_string(work) +
                            " elements need more blocks than a 1-D grid holds");
  }
  return static_cast<unsigned int>(blocks == 0 ? 1 : blocks);
}

/// True when p is aligned for a vector access of `bytes` bytes.
inline bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

}  // namespace mpt::cuda::detail
