// Chapter 01 — floating-point formats and their limits (CUDA plumbing).
// Depends on: kernels/formats/formats_kernels.hpp, cuda_check.cuh. The two device-wide calls of
// the host-only API: is there a GPU these kernels can run on, and wait for
// queued work.
#include "kernels/formats/cuda_check.cuh"
#include "kernels/formats/formats_kernels.hpp"

namespace mpt::cuda {
namespace {
// Never launched: asking for its attributes tells whether this binary holds
// code the current device can run (sm_80/sm_90 SASS, or PTX it can JIT).
__global__ void probe_kernel() {}
}  // namespace

bool device_available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // Without a driver this is cudaErrorInsufficientDriver or
    // cudaErrorNoDevice; clear it so later calls do not inherit it.
    cudaGetLastError();
    if (why) *why = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    return false;
  }
  if (count == 0) {
    if (why) *why = "the CUDA runtime reports 0 devices";
    return false;
  }
  cudaFuncAttributes attributes{};
  const cudaError_t image = cudaFuncGetAttributes(&attributes, probe_kernel);
  if (image != cudaSuccess) {
    cudaGetLastError();
    if (why) {
      *why = std::string("no kernel image for this device (") + cudaGetErrorName(image) + ": " +
             cudaGetErrorString(image) + "); the build targets CMAKE_CUDA_ARCHITECTURES";
    }
    return false;
  }
  return true;
}

void synchronize() { detail::check(cudaDeviceSynchronize(), "synchronize"); }

}  // namespace mpt::cuda
