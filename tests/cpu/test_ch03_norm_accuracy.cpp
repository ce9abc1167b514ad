// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the CPU
// layers' FP32 statistics against an exact reference, side by side with
// PyTorch's CPU methods (chapters/03-normalization/norm_methods.hpp, where
// they are written out with their sources), on inputs whose mean is far
// above their spread (mean/std from 10² to 10⁴).
// Depends on: mpt/nn/cpu/norm_cpu.hpp, norm_math.hpp, batch_norm.hpp,
// layer_norm.hpp, the core tier (Tensor, Context, Policy, Rng), the chapter's
// norm_methods.hpp, doctest.
//
// The reference is a two-pass computation in long double on the same FP32
// inputs. The library must be at least as accurate as PyTorch's method on
// every statistic (its worst error over the cases no larger than PyTorch's
// worst), and each of its FP32 statistics within one FP32 rounding of the
// exact value (2⁻²⁴ relative, plus 2⁻³⁰ for the double sums): no FP32 number
// is much closer.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../../chapters/03-normalization/norm_methods.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/random.hpp"
#include "mpt/nn/cpu/norm_cpu.hpp"
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/layers/layer_norm.hpp"
#include "mpt/nn/layers/norm_math.hpp"

using namespace mpt;
using VecF = std::vector<float>;

namespace {

const double kOneRounding = std::ldexp(1.0, -24) + std::ldexp(1.0, -30);

VecF normals(std::size_t n, double mean, double sd, std::uint64_t seed) {
  Rng rng(seed);
  VecF v(n);
  for (float& x : v) x = static_cast<float>(mean + sd * rng.normal());
  return v;
}

// The worst errors of one method over all cases.
struct Worst {
  double mean = 0, var_biased = 0, var_unbiased = 0, y = 0;
  void add(const ch03::MeanVar& got, const ch03::MeanVar& ref) {
    mean = std::max(mean, ch03::relative_error(got.mean, ref.mean));
    var_biased = std::max(var_biased, ch03::relative_error(got.var_biased, ref.var_biased));
    var_unbiased = std::max(var_unbiased, ch03::relative_error(got.var_unbiased, ref.var_unbiased));
  }
};

}  // namespace

TEST_CASE(
    "BatchNorm's FP32 statistics: within one rounding of exact, and no worse than PyTorch's CPU BatchNorm") {
  struct Case {
    std::int64_t n, c, hw;
    double mean, sd;
  };
  const Case cases[] = {{8, 4, 256, 100.0, 1.0},    {8, 4, 256, 1000.0, 1.0}, {8, 4, 256, 3000.0, 1.0},
                        {8, 4, 256, 1e4, 1.0},      {64, 3, 1, 1e4, 1.0},     {16, 2, 100, 5000.0, 0.5},
                        {4, 3, 1024, -2000.0, 0.2}, {32, 2, 64, 1e4, 1.0},    {2, 2, 4096, 300.0, 0.03}};
  Worst lib, torch;
  std::uint64_t seed = 100;
  for (const Case& k : cases) {
    CAPTURE(k.n);
    CAPTURE(k.hw);
    CAPTURE(k.mean / k.sd);
    const VecF x = normals(static_cast<std::size_t>(k.n * k.c * k.hw), k.mean, k.sd, ++seed);
    const norm_math::Layout l{k.n, k.c, k.hw};
    std::vector<norm_math::Statistics> st(static_cast<std::size_t>(k.c));
    VecF mean(st.size()), invstd(st.size());
    (void)norm_cpu::forward(Tensor::from_f32(x.data(), {k.n, k.c, k.hw}, DType::f32), l,
                            norm_math::AffineAxis::channel, nullptr, nullptr, 1e-5f, DType::f32, st.data(),
                            mean.data(), invstd.data());
    for (std::int64_t c = 0; c < k.c; ++c) {
      // The channel's values in the order PyTorch sums them: n, then h·w.
      VecF v;
      for (std::int64_t n = 0; n < k.n; ++n)
        for (std::int64_t i = 0; i < k.hw; ++i) v.push_back(x[static_cast<std::size_t>(l.offset(n, c, i))]);
      const ch03::MeanVar ref = ch03::exact_statistics(v.data(), l.count());
      const norm_math::Statistics& s = st[static_cast<std::size_t>(c)];
      const ch03::MeanVar got{mean[static_cast<std::size_t>(c)], norm_math::variance_biased<float>(s),
                              norm_math::variance_unbiased<float>(s)};
      CHECK(ch03::relative_error(got.mean, ref.mean) <= kOneRounding);
      CHECK(ch03::relative_error(got.var_biased, ref.var_biased) <= kOneRounding);
      CHECK(ch03::relative_error(got.var_unbiased, ref.var_unbiased) <= kOneRounding);
      lib.add(got, ref);
      torch.add(ch03::torch_batch_norm(v.data(), l.count()), ref);
    }
  }
  MESSAGE("worst relative error, mpt vs PyTorch's method: mean "
          << lib.mean << " vs " << torch.mean << ", biased var " << lib.var_biased << " vs "
          << torch.var_biased << ", unbiased var " << lib.var_unbiased << " vs " << torch.var_unbiased);
  CHECK(lib.mean <= torch.mean);
  CHECK(lib.var_biased <= torch.var_biased);
  CHECK(lib.var_unbiased <= torch.var_unbiased);
}

TEST_CASE("BatchNorm folds exactly those statistics into its running estimates") {
  // momentum 1: running = batch exactly ((1 − 1)·old + 1·batch).
  BatchNorm::Options o;
  o.momentum = 1.0;
  BatchNorm bn(3, o);
  Context ctx(uniform_policy(DType::f32));
  bn.apply_policy(ctx.policy());
  const VecF x = normals(std::size_t{16} * 3 * 100, 4000.0, 1.0, 7);
  const Tensor xt = Tensor::from_f32(x.data(), {16, 3, 10, 10}, DType::f32);
  (void)bn.forward(xt, ctx);
  std::vector<norm_math::Statistics> st(3);
  VecF mean(3), invstd(3);
  (void)norm_cpu::forward(xt, norm_math::Layout{16, 3, 100}, norm_math::AffineAxis::channel, nullptr, nullptr,
                          1e-5f, DType::f32, st.data(), mean.data(), invstd.data());
  for (std::int64_t c = 0; c < 3; ++c) {
    const auto k = static_cast<std::size_t>(c);
    CHECK(bn.running_mean.value(c) == mean[k]);
    CHECK(bn.running_var.value(c) == norm_math::variance_unbiased<float>(st[k]));
    CHECK(bn.invstd().value(c) == invstd[k]);
  }
}

TEST_CASE("LayerNorm's FP32 output and statistics: no worse than PyTorch's CPU LayerNorm") {
  struct Case {
    std::int64_t rows, d;
    double mean, sd;
  };
  const Case cases[] = {{4, 768, 100.0, 1.0},  {4, 768, 1000.0, 1.0}, {4, 768, 1e4, 1.0},
                        {8, 200, 3000.0, 1.0}, {2, 4096, 1e4, 1.0},   {16, 64, 500.0, 0.1},
                        {3, 1000, -2e3, 0.5}};
  Worst lib, torch;
  std::uint64_t seed = 200;
  const auto eps = static_cast<float>(1e-5);  // what LayerNorm computes with (its eps in FP32)
  for (const Case& k : cases) {
    CAPTURE(k.d);
    CAPTURE(k.mean / k.sd);
    const VecF x = normals(static_cast<std::size_t>(k.rows * k.d), k.mean, k.sd, ++seed);
    const VecF g = normals(static_cast<std::size_t>(k.d), 1.0, 0.2, ++seed);
    const VecF b = normals(static_cast<std::size_t>(k.d), 0.0, 0.2, ++seed);
    LayerNorm ln({k.d});
    ln.weight = Parameter("weight", Tensor::from_f32(g.data(), {k.d}, DType::f32));
    ln.bias = Parameter("bias", Tensor::from_f32(b.data(), {k.d}, DType::f32));
    Context ctx(uniform_policy(DType::f32));
    ln.apply_policy(ctx.policy());
    const Tensor y = ln.forward(Tensor::from_f32(x.data(), {k.rows, k.d}, DType::f32), ctx);
    for (std::int64_t r = 0; r < k.rows; ++r) {
      const float* row = x.data() + r * k.d;
      const ch03::MeanVar ref = ch03::exact_statistics(row, k.d);
      const ch03::MeanVar t = ch03::torch_layer_norm(row, k.d);
      // PyTorch's output: rstd = 1/√(var + eps) in float, y = (x − mean)·rstd·γ + β.
      const auto tmean = static_cast<float>(t.mean);
      const float trstd = 1.0f / std::sqrt(static_cast<float>(t.var_biased) + eps);
      const long double rstd = 1 / std::sqrt(static_cast<long double>(ref.var_biased) + eps);
      const double m = ch03::relative_error(ln.mean().value(r), ref.mean);
      CHECK(m <= kOneRounding);
      lib.mean = std::max(lib.mean, m);
      torch.mean = std::max(torch.mean, ch03::relative_error(t.mean, ref.mean));
      for (std::int64_t j = 0; j < k.d; ++j) {
        const auto gj = g[static_cast<std::size_t>(j)], bj = b[static_cast<std::size_t>(j)];
        const long double exact_y = (static_cast<long double>(row[j]) - ref.mean) * rstd * gj + bj;
        const float ty = (row[j] - tmean) * trstd * gj + bj;
        lib.y = std::max(lib.y, static_cast<double>(std::fabs(y.value(r * k.d + j) - exact_y)));
        torch.y = std::max(torch.y, static_cast<double>(std::fabs(ty - exact_y)));
      }
    }
  }
  MESSAGE("worst error, mpt vs PyTorch's method: mean (relative) "
          << lib.mean << " vs " << torch.mean << ", y (absolute) " << lib.y << " vs " << torch.y);
  CHECK(lib.mean <= torch.mean);
  CHECK(lib.y <= torch.y);
}
