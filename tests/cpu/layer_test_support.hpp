// Chapters 03 onwards — what the layer suites share (test_ch03_batch_norm,
// test_ch03_layer_norm, test_ch04_attention, test_ch04_softmax): central
// differences in FP64, and a policy that asks for f16 compute, which the
// norms, the softmax ops and attention must refuse.
// Header-only (the CMake glob picks up test_ch*_*.cpp only). Depends on: the
// standard library, mpt/core/policy.hpp.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "mpt/core/policy.hpp"

namespace mpt_test {

/// ∂f/∂v by central differences in FP64, each element of v moved by ±h in
/// place and put back (h = 1e-6: error ~1e-10 on O(1) gradients).
inline std::vector<double> numeric_grad(const std::function<double()>& f, std::vector<double>& v,
                                        double h = 1e-6) {
  std::vector<double> g(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double keep = v[i];
    v[i] = keep + h;
    const double up = f();
    v[i] = keep - h;
    const double down = f();
    v[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

/// Every op read, computed and stored in f16, parameters too: what a layer
/// that keeps its arithmetic in FP32 refuses.
class HalfComputePolicy final : public mpt::Policy {
 public:
  /// "f16 compute".
  std::string describe() const override { return "f16 compute"; }

 protected:
  mpt::OpPrecision decide_op(const mpt::OpInfo&, const mpt::OpQuery&) const override {
    return {mpt::DType::f16, mpt::DType::f16, mpt::DType::f16};
  }
  mpt::DType parameter_dtype_of(const mpt::OpInfo&, std::string_view) const override {
    return mpt::DType::f16;
  }
};

}  // namespace mpt_test
