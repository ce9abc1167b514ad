// Chapter 04 — numerically stable softmax and cross-entropy: the fused CPU
// kernel (src/mpt/nn/softmax_cpu.*) against FP64 references written out
// here, its options, adversarial logits, and the unfused passes that the
// benchmark compares it with. Every check runs on the portable loops and on
// the automatic choice (the AVX2 loops where the CPU has them); the bit for
// bit comparison of the two is test_ch04_softmax_cpu_avx2.cpp.
// Depends on: mpt/nn/cpu/softmax_cpu.hpp, the core tier (dtype conversions, Rng).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "mpt/core/random.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/nn/cpu/softmax_cpu.hpp"

using namespace mpt;
using softmax_cpu::FusedOptions;

namespace {

const Implementation kImpls[] = {Implementation::portable, Implementation::automatic};

std::uint16_t f16(float v) {
  std::uint16_t c = 0;
  store_as(DType::f16, &v, &c, 1);
  return c;
}
float wide(std::uint16_t c) {
  float v = 0;
  load_from(DType::f16, &c, &v, 1);
  return v;
}

/// Distance in fp16 ulps between an fp16 code and a double, counted at the
/// double's binade (subnormal spacing 2^-24 below 2^-14).
double f16_ulps(std::uint16_t code, double ref) {
  const double a = std::fabs(ref);
  const double ulp = a < 6.103515625e-05 ? std::ldexp(1.0, -24) : std::ldexp(1.0, std::ilogb(a) - 10);
  return std::fabs(static_cast<double>(wide(code)) - ref) / ulp;
}

/// The FP64 loss of each row and dloss·∂(reduced loss)/∂z, written from the
/// definition: lse = log Σ exp z; loss = (1−ε)(lse − z_y) + ε(lse − mean z).
struct Reference {
  std::vector<double> row_loss, grad;
  double loss = 0;
};
Reference reference(const std::vector<std::uint16_t>& z, std::int64_t rows, std::int64_t k,
                    const std::vector<int>& y, const FusedOptions& o) {
  Reference r;
  r.row_loss.assign(static_cast<std::size_t>(rows), 0.0);
  r.grad.assign(z.size(), 0.0);
  std::int64_t counted = 0;
  for (int t : y) counted += t != o.ignore_index ? 1 : 0;
  const double g = o.mean ? o.dloss / static_cast<double>(counted) : o.dloss, eps = o.label_smoothing;
  double total = 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    if (y[static_cast<std::size_t>(i)] == o.ignore_index) continue;
    double m = -INFINITY, s = 0, zs = 0;
    for (std::int64_t j = 0; j < k; ++j)
      m = std::max(m, static_cast<double>(wide(z[static_cast<std::size_t>(i * k + j)])));
    for (std::int64_t j = 0; j < k; ++j) {
      const double v = wide(z[static_cast<std::size_t>(i * k + j)]);
      s += std::exp(v - m);
      zs += v;
    }
    const double lse = m + std::log(s);
    const int t = y[static_cast<std::size_t>(i)];
    const double zt = wide(z[static_cast<std::size_t>(i * k + t)]);
    r.row_loss[static_cast<std::size_t>(i)] =
        (1 - eps) * (lse - zt) + eps * (lse - zs / static_cast<double>(k));
    total += r.row_loss[static_cast<std::size_t>(i)];
    for (std::int64_t j = 0; j < k; ++j) {
      const double p = std::exp(static_cast<double>(wide(z[static_cast<std::size_t>(i * k + j)])) - lse);
      r.grad[static_cast<std::size_t>(i * k + j)] =
          g * (p - eps / static_cast<double>(k) - (j == t ? 1 - eps : 0));
    }
  }
  r.loss = o.mean ? total / static_cast<double>(counted) : total;
  return r;
}

std::vector<std::uint16_t> random_logits(std::int64_t n, double spread, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::uint16_t> z(static_cast<std::size_t>(n));
  for (auto& c : z) c = f16(static_cast<float>(rng.normal() * spread));
  return z;
}

/// Loss within rel_tol of FP64's, every row's too, every gradient within
/// max_ulps fp16 ulps of FP64's (the fp16 rounding itself is 0.5).
void check_against_reference(const std::vector<std::uint16_t>& z, std::int64_t rows, std::int64_t k,
                             const std::vector<int>& y, const FusedOptions& o, Implementation impl,
                             double rel_tol = 2e-6, double max_ulps = 0.51) {
  std::vector<std::uint16_t> grad(z.size());
  std::vector<float> rl(static_cast<std::size_t>(rows));
  const float loss =
      softmax_cpu::fused_cross_entropy_f16(z.data(), rows, k, y.data(), o, grad.data(), rl.data(), impl);
  const Reference r = reference(z, rows, k, y, o);
  CHECK(std::fabs(loss - r.loss) <= rel_tol * std::fabs(r.loss) + 1e-30);
  for (std::int64_t i = 0; i < rows; ++i)
    CHECK(std::fabs(rl[static_cast<std::size_t>(i)] - r.row_loss[static_cast<std::size_t>(i)]) <=
          rel_tol * std::fabs(r.row_loss[static_cast<std::size_t>(i)]) + 1e-6);
  double worst = 0;
  for (std::size_t j = 0; j < z.size(); ++j) worst = std::max(worst, f16_ulps(grad[j], r.grad[j]));
  CHECK(worst <= max_ulps);
}

}  // namespace

TEST_CASE("exp_fused: within 2 float ulps of exp over [−87, 88], exact at 0, its edges") {
  double worst = 0;
  for (int i = 0; i <= 350000; ++i) {
    const float x = std::min(88.0f, -87.0f + static_cast<float>(i) * (175.0f / 350000.0f));
    const double ref = std::exp(static_cast<double>(x));
    const double ulp = std::ldexp(1.0, std::ilogb(ref) - 23);
    worst = std::max(worst, std::fabs(static_cast<double>(softmax_cpu::exp_fused(x)) - ref) / ulp);
  }
  MESSAGE("exp_fused: worst error over [-87, 88] " << worst << " ulp");
  CHECK(worst <= 1.5);
  CHECK(softmax_cpu::exp_fused(0.0f) == 1.0f);
  CHECK(softmax_cpu::exp_fused(-87.5f) == 0.0f);
  CHECK(softmax_cpu::exp_fused(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(std::isinf(softmax_cpu::exp_fused(89.0f)));
  CHECK(std::isnan(softmax_cpu::exp_fused(std::numeric_limits<float>::quiet_NaN())));
  // exp_shifted: the same values on [−87, 0], exp(−87) below.
  for (int i = 0; i <= 87000; ++i) {
    const float d = std::max(-87.0f, -static_cast<float>(i) * 0.001f);
    CHECK(softmax_cpu::exp_shifted(d) == softmax_cpu::exp_fused(d));
  }
  CHECK(softmax_cpu::exp_shifted(-1000.0f) == softmax_cpu::exp_fused(-87.0f));
  std::vector<float> x = {-1.0f, -0.5f, 0.0f, 0.25f, -10.0f, -80.0f, -86.9f, 3.0f, -2.0f, -100.0f};
  std::vector<float> y(x.size());
  for (Implementation impl : kImpls) {
    softmax_cpu::exp_fused_array(x.data(), y.data(), static_cast<std::int64_t>(x.size()), impl);
    for (std::size_t j = 0; j < x.size(); ++j) CHECK(y[j] == softmax_cpu::exp_fused(x[j]));
  }
}

TEST_CASE("fused cross-entropy: loss and fp16 gradient as FP64 gives them, K not a multiple of 8") {
  for (Implementation impl : kImpls) {
    const std::int64_t rows = 5, k = 1003;
    const auto z = random_logits(rows * k, 3.0, 11);
    const std::vector<int> y = {0, 1002, 17, 500, 3};
    check_against_reference(z, rows, k, y, FusedOptions{}, impl);
    FusedOptions sum;
    sum.mean = false;
    sum.dloss = 1024.0f;  // a loss scale: the gradient scaled, nothing else
    check_against_reference(z, rows, k, y, sum, impl);
  }
}

TEST_CASE("fused cross-entropy: ignore_index and label smoothing, PyTorch's definitions") {
  for (Implementation impl : kImpls) {
    const std::int64_t rows = 4, k = 64;
    const auto z = random_logits(rows * k, 2.0, 5);
    FusedOptions o;
    o.ignore_index = -1;
    o.label_smoothing = 0.1f;
    const std::vector<int> y = {3, -1, 63, 0};
    check_against_reference(z, rows, k, y, o, impl);
    std::vector<std::uint16_t> grad(z.size(), 0x1234);
    std::vector<float> rl(4, 5.0f);
    softmax_cpu::fused_cross_entropy_f16(z.data(), rows, k, y.data(), o, grad.data(), rl.data(), impl);
    for (std::int64_t j = 0; j < k; ++j)
      CHECK(grad[static_cast<std::size_t>(k + j)] == 0);  // the ignored row
    CHECK(rl[1] == 0.0f);
    // All ignored: the mean of nothing is NaN (PyTorch: 0/0).
    const std::vector<int> none = {-1, -1, -1, -1};
    CHECK(std::isnan(
        softmax_cpu::fused_cross_entropy_f16(z.data(), rows, k, none.data(), o, grad.data(), nullptr, impl)));
  }
}

TEST_CASE("fused cross-entropy: adversarial rows — ±60000, all equal, one huge, NaN, +inf") {
  for (Implementation impl : kImpls) {
    const std::int64_t k = 40;
    std::vector<std::uint16_t> z(static_cast<std::size_t>(4 * k));
    for (std::int64_t j = 0; j < k; ++j) {
      z[static_cast<std::size_t>(j)] = f16(j % 2 ? 60000.0f : -60000.0f);  // exp overflows without the max
      z[static_cast<std::size_t>(k + j)] = f16(7.0f);                      // all equal
      z[static_cast<std::size_t>(2 * k + j)] = f16(j == 9 ? 65504.0f : 0.0f);  // one huge
      z[static_cast<std::size_t>(3 * k + j)] = f16(0.5f);
    }
    const std::vector<int> y = {1, 4, 9, 2};
    check_against_reference(z, 4, k, y, FusedOptions{}, impl);
    std::vector<std::uint16_t> grad(z.size());
    std::vector<float> rl(4);
    softmax_cpu::fused_cross_entropy_f16(z.data(), 4, k, y.data(), FusedOptions{}, grad.data(), rl.data(),
                                         impl);
    CHECK(rl[1] == doctest::Approx(std::log(40.0)).epsilon(1e-6));  // all equal: log K
    CHECK(rl[2] == 0.0f);                                           // the huge one is the target: p = 1
    // A NaN in row 3: that row's loss and gradient NaN, the others untouched.
    z[static_cast<std::size_t>(3 * k + 5)] = 0x7e00;
    const float loss = softmax_cpu::fused_cross_entropy_f16(z.data(), 4, k, y.data(), FusedOptions{},
                                                            grad.data(), rl.data(), impl);
    CHECK(std::isnan(loss));
    CHECK(std::isnan(rl[3]));
    CHECK(std::isfinite(rl[0]));
    CHECK(std::isfinite(rl[1]));
    for (std::int64_t j = 0; j < k; ++j) {
      CHECK(std::isnan(wide(grad[static_cast<std::size_t>(3 * k + j)])));
      CHECK(std::isfinite(wide(grad[static_cast<std::size_t>(j)])));
    }
    // +inf at a non-target position: NaN, as PyTorch's log_softmax gives for
    // the whole row (its sum takes exp(inf − inf)).
    z[static_cast<std::size_t>(3 * k + 5)] = 0x7c00;
    softmax_cpu::fused_cross_entropy_f16(z.data(), 4, k, y.data(), FusedOptions{}, grad.data(), rl.data(),
                                         impl);
    CHECK(std::isnan(rl[3]));
    CHECK(std::isnan(wide(grad[static_cast<std::size_t>(3 * k + 5)])));
  }
}

TEST_CASE("the unfused passes compute the same loss and gradient") {
  for (Implementation impl : kImpls) {
    const std::int64_t rows = 3, k = 2051;
    const auto z = random_logits(rows * k, 4.0, 3);
    const std::vector<int> y = {2050, 0, 999};
    FusedOptions o;
    o.label_smoothing = 0.05f;
    std::vector<std::uint16_t> ga(z.size()), gb(z.size());
    const float a =
        softmax_cpu::fused_cross_entropy_f16(z.data(), rows, k, y.data(), o, ga.data(), nullptr, impl);
    const float b = softmax_cpu::unfused_cross_entropy_f16(z.data(), rows, k, y.data(), o, gb.data(), impl);
    CHECK(b == doctest::Approx(a).epsilon(1e-5));
    int differ = 0;
    for (std::size_t j = 0; j < z.size(); ++j) {
      const float u = wide(ga[j]), v = wide(gb[j]);
      if (u != v) ++differ;
      CHECK(std::fabs(u - v) <= std::fabs(u) * 1e-3f + 6e-8f);  // one fp16 rounding apart at most
    }
    CHECK(differ < static_cast<int>(z.size()) / 20);
  }
}

TEST_CASE("bad input: one line naming the argument and what is valid") {
  const std::vector<std::uint16_t> z(6, f16(0.0f));
  std::vector<std::uint16_t> g(6);
  const std::vector<int> y = {0, 3};
  CHECK_THROWS_WITH_AS(
      softmax_cpu::fused_cross_entropy_f16(z.data(), 2, 3, y.data(), FusedOptions{}, g.data()),
      "fused_cross_entropy_f16: target 3 of row 1 is out of bounds (classes 0..2, or "
      "ignore_index -100)",
      std::invalid_argument);
  FusedOptions o;
  o.label_smoothing = 1.5f;
  const std::vector<int> ok = {0, 1};
  CHECK_THROWS_WITH_AS(softmax_cpu::fused_cross_entropy_f16(z.data(), 2, 3, ok.data(), o, g.data()),
                       "fused_cross_entropy_f16: label_smoothing 1.500000 is outside [0, 1]",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      softmax_cpu::fused_cross_entropy_f16(z.data(), 0, 3, ok.data(), FusedOptions{}, g.data()),
      "fused_cross_entropy_f16: logits are [0, 3]; both must be at least 1", std::invalid_argument);
}
