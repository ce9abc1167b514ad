// Chapter 04 — numerically stable softmax and cross-entropy: the AVX2 loops
// of the fused CPU kernel (src/mpt/nn/cpu/softmax_cpu_avx2.cpp) give the
// portable loops' bits: exp, loss, every row's loss, every gradient code.
// Without AVX2 this program exits 77 (CTest: Skipped): there is nothing to
// compare, and nothing passed.
// Depends on: mpt/nn/cpu/softmax_cpu.hpp, avx2_test_main.hpp, the core tier.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "avx2_test_main.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/nn/cpu/softmax_cpu.hpp"

using namespace mpt;

namespace {
std::uint32_t bits(float v) {
  std::uint32_t b = 0;
  std::memcpy(&b, &v, sizeof b);
  return b;
}
}  // namespace

TEST_CASE("exp_fused: the AVX2 lanes give the portable bits on 2^20 arguments and the edges") {
  Rng rng(9);
  std::vector<float> x(1 << 20);
  for (auto& v : x) v = static_cast<float>(rng.uniform(-100.0, 95.0));
  x[0] = 0.0f;
  x[1] = -87.0f;
  x[2] = 88.0f;
  x[3] = -0.0f;
  x[4] = std::numeric_limits<float>::quiet_NaN();
  x[5] = -std::numeric_limits<float>::infinity();
  std::vector<float> a(x.size()), b(x.size());
  softmax_cpu::exp_fused_array(x.data(), a.data(), static_cast<std::int64_t>(x.size()),
                               Implementation::portable);
  softmax_cpu::exp_fused_array(x.data(), b.data(), static_cast<std::int64_t>(x.size()), Implementation::avx2);
  std::size_t differ = 0;
  for (std::size_t j = 0; j < x.size(); ++j) differ += bits(a[j]) != bits(b[j]) ? 1 : 0;
  CHECK(differ == 0);
}

TEST_CASE("fused and unfused cross-entropy: AVX2 and portable agree bit for bit, every option") {
  Rng rng(4);
  for (std::int64_t k : {7, 8, 1003, 4096}) {
    const std::int64_t rows = 6;
    std::vector<std::uint16_t> z(static_cast<std::size_t>(rows * k));
    std::vector<float> v(z.size());
    for (auto& f : v) f = static_cast<float>(rng.normal() * 6.0);
    store_as(DType::f16, v.data(), z.data(), v.size());
    std::vector<int> y(static_cast<std::size_t>(rows));
    for (auto& t : y) t = static_cast<int>(rng.below(static_cast<std::uint64_t>(k)));
    y[2] = -100;
    for (const float eps : {0.0f, 0.2f})
      for (const bool mean : {true, false}) {
        softmax_cpu::FusedOptions o;
        o.label_smoothing = eps;
        o.mean = mean;
        o.dloss = 65536.0f;
        std::vector<std::uint16_t> ga(z.size()), gb(z.size());
        std::vector<float> ra(y.size()), rb(y.size());
        const float la = softmax_cpu::fused_cross_entropy_f16(z.data(), rows, k, y.data(), o, ga.data(),
                                                              ra.data(), Implementation::portable);
        const float lb = softmax_cpu::fused_cross_entropy_f16(z.data(), rows, k, y.data(), o, gb.data(),
                                                              rb.data(), Implementation::avx2);
        CHECK(bits(la) == bits(lb));
        CHECK(ga == gb);
        for (std::size_t i = 0; i < y.size(); ++i) CHECK(bits(ra[i]) == bits(rb[i]));
        const float ua = softmax_cpu::unfused_cross_entropy_f16(z.data(), rows, k, y.data(), o, ga.data(),
                                                                Implementation::portable);
        const float ub = softmax_cpu::unfused_cross_entropy_f16(z.data(), rows, k, y.data(), o, gb.data(),
                                                                Implementation::avx2);
        CHECK(bits(ua) == bits(ub));
        CHECK(ga == gb);
      }
  }
}

int main(int argc, char** argv) { return mpt_test::avx2_test_main(argc, argv); }
