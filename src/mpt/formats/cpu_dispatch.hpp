// Chapters 01 onwards — private to src/mpt: the run-time choice between the
// portable loops and the AVX2 loops, shared by rounding.cpp, unscale.cpp, and
// the nn tier's CPU kernels (gemm.cpp, norm_cpu.cpp, softmax_cpu.cpp).
// Depends on: rounding.hpp (Implementation, avx2_available).
#pragma once

#include <stdexcept>

#include "mpt/formats/rounding.hpp"

namespace mpt::detail {

/// True when a call asking for `impl` should run the AVX2 loop: never for
/// Implementation::portable, whenever the CPU and build have it for
/// Implementation::automatic. An explicit Implementation::avx2 on a CPU or
/// build without it throws std::invalid_argument with `unavailable` as the
/// message.
inline bool use_avx2(Implementation impl, const char* unavailable) {
  switch (impl) {
    case Implementation::portable: return false;
    case Implementation::avx2:
      if (!avx2_available()) throw std::invalid_argument(unavailable);
      return true;
    case Implementation::automatic: break;
  }
  return avx2_available();
}

}  // namespace mpt::detail
