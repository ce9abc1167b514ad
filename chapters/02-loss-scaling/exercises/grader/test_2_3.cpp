// Chapter 02 exercises — grader tests for exercise 2.3 (gradient clipping
// under loss scaling: unscale first). Depends on: grader.hpp, whose
// reference unscales with mpt's multi-tensor unscale_and_check and clips
// with PyTorch's coefficient. Six test cases, two points each.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex02;
using namespace mpt::ex02::grading;

using Tensors = std::vector<std::vector<float>>;

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::string shape(const Tensors& t) {
  std::string s = "tensors of sizes {";
  for (std::size_t i = 0; i < t.size(); ++i) s += (i ? ", " : "") + std::to_string(t[i].size());
  return s + "}";
}

// An unclipped gradient must be exactly the unscaled value; a clipped one
// may differ by a couple of ulps, from the last bits of the norm (summation
// order) reaching float(coef).
bool close(float got, float want, bool clipped) {
  if (!clipped) return same_float(got, want);
  if (same_float(got, want)) return true;
  const double d = std::fabs(static_cast<double>(got) - static_cast<double>(want));
  return d <= 0x1p-21 * std::fabs(static_cast<double>(want)) + 0x1p-147;
}

void expect_clip(Mismatches& m, const Tensors& input, float inv_scale, double max_norm,
                 const std::string& what) {
  m.checked();
  Tensors want = input, got = input;
  const ClipResult w = reference_unscale_and_clip(want, inv_scale, max_norm);
  const ClipResult g = student_unscale_and_clip(got, inv_scale, max_norm);
  std::string problem;
  if (g.found_inf != w.found_inf) {
    problem = std::string("found_inf ") + (g.found_inf ? "true" : "false") + ", expected " +
              (w.found_inf ? "true" : "false");
  } else if (g.clipped != w.clipped) {
    problem = std::string("clipped ") + (g.clipped ? "true" : "false") + ", expected " +
              (w.clipped ? "true" : "false") + " (the unscaled norm is " + describe(w.total_norm) + ")";
  } else if (w.found_inf ? !(g.total_norm == w.total_norm)
                         : !(std::fabs(g.total_norm - w.total_norm) <= 1e-12 * w.total_norm)) {
    problem = "total_norm " + describe(g.total_norm) + ", expected " + describe(w.total_norm) +
              (w.found_inf ? "" : " (the norm of the unscaled gradients, summed in double)");
  }
  for (std::size_t t = 0; t < input.size() && problem.empty(); ++t)
    for (std::size_t i = 0; i < input[t].size() && problem.empty(); ++i)
      if (!close(got[t][i], want[t][i], w.clipped))
        problem = "tensor " + std::to_string(t) + " element " + std::to_string(i) + " = " +
                  describe(input[t][i]) + " became " + describe(got[t][i]) + ", expected " +
                  describe(want[t][i]);
  if (problem.empty() || !m.wrong()) return;
  char buf[160];
  std::snprintf(buf, sizeof buf, ", inv_scale = %.9g, max_norm = %.17g): ", static_cast<double>(inv_scale),
                max_norm);
  m.detail(what + " (" + shape(input) + buf + problem);
}

// n gradients whose unscaled values have L2 norm `norm`, times `scale`.
std::vector<float> with_norm(std::size_t n, double norm, float scale, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<double> v(n);
  double sum = 0;
  for (double& x : v) {
    x = static_cast<double>(rng() % 2001u) / 1000.0 - 1.0;
    sum += x * x;
  }
  if (sum == 0 && n > 0) {  // all draws were 0: any direction will do
    v[0] = 1.0;
    sum = 1.0;
  }
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(v[i] / std::sqrt(sum) * norm) * scale;
  return out;
}

}  // namespace

TEST_SUITE("exercise-2.3") {
  TEST_CASE("2.3 unscale first, then clip: the norm is measured on the unscaled gradients") {
    Mismatches m(20);
    // (3, 4) * 2^16: the unscaled norm is 5, clipped to 1 -> (0.6, 0.8).
    expect_clip(m, {{3.0f * 65536.0f, 4.0f * 65536.0f}}, 0x1p-16f, 1.0, "the 3-4-5 triangle at scale 2^16");
    expect_clip(m, {with_norm(100, 7.0, 1024.0f, 1u)}, 0x1p-10f, 2.5,
                "unscaled norm 7 at scale 2^10, max_norm 2.5");
    expect_clip(m, {with_norm(1000, 0.02, 0x1p20f, 2u)}, 0x1p-20f, 0.01, "small gradients at scale 2^20");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("2.3 below max_norm the gradients are only unscaled, bit for bit") {
    // The scaled norm is far above max_norm; the unscaled one is not.
    Mismatches m(20);
    expect_clip(m, {with_norm(64, 0.5, 65536.0f, 3u)}, 0x1p-16f, 1.0, "unscaled norm 0.5, max_norm 1");
    expect_clip(m, {with_norm(10, 0.999, 8.0f, 4u)}, 0.125f, 1.0, "unscaled norm just under max_norm");
    expect_clip(m, {{0.0f, -0.0f, 0.0f}}, 0x1p-16f, 1.0,
                "all-zero gradients (norm 0: coef = max_norm / 1e-6)");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("2.3 several tensors: one total norm and one coefficient for all, empty tensors included") {
    Mismatches m(20);
    const float s = 4096.0f;
    Tensors t = {
        with_norm(3, 2.0, s, 5u), {}, with_norm(5, 2.0, s, 6u), {1.0f * s}, with_norm(50, 1.0, s, 7u)};
    expect_clip(m, t, 1.0f / s, 1.0, "five tensors, one empty, total norm sqrt(10)");
    expect_clip(m, t, 1.0f / s, 3.0, "the same, max_norm 3");
    expect_clip(m, t, 1.0f / s, 4.0, "the same, max_norm 4: not clipped");
    expect_clip(m, {}, 1.0f / s, 1.0, "no tensors at all");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("2.3 an inf or NaN: every tensor unscaled, nothing clipped, the norm reported as inf") {
    Mismatches m(20);
    const float s = 65536.0f;
    Tensors t = {with_norm(4, 3.0, s, 8u), with_norm(6, 3.0, s, 9u), with_norm(5, 3.0, s, 10u)};
    for (float bad : {kInf, -kInf, kNaN})
      for (std::size_t where : {std::size_t{0}, std::size_t{1}, std::size_t{2}}) {
        Tensors u = t;
        u[where][where + 1] = bad;
        expect_clip(m, u, 1.0f / s, 1.0, "a non-finite gradient in tensor " + std::to_string(where));
      }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("2.3 inv_scale == 1 (a disabled scaler): plain clipping by total norm") {
    Mismatches m(20);
    expect_clip(m, {{3.0f, 4.0f}}, 1.0f, 1.0, "norm 5, max_norm 1");
    expect_clip(m, {with_norm(30, 10.0, 1.0f, 11u), with_norm(3, 10.0, 1.0f, 12u)}, 1.0f, 2.0,
                "norm sqrt(200), max_norm 2");
    expect_clip(m, {with_norm(30, 0.5, 1.0f, 13u)}, 1.0f, 2.0, "norm 0.5, max_norm 2: untouched");
    expect_clip(m, {{1.0f, kNaN}}, 1.0f, 1.0, "a NaN");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("2.3 random gradient lists against the reference") {
    std::mt19937 rng(777u);
    Mismatches m;
    for (int k = 0; k < 400; ++k) {
      const std::size_t count = 1 + rng() % 5u;
      const float scale = (rng() % 4u) ? std::ldexp(1.0f, static_cast<int>(rng() % 25u))
                                       : static_cast<float>(1 + rng() % 50000u);
      Tensors t(count);
      double total = 0;
      for (auto& v : t) {
        const double norm =
            std::ldexp(1.0 + static_cast<double>(rng() % 1000u) / 1000.0, static_cast<int>(rng() % 16u) - 10);
        v = with_norm(rng() % 200u, norm, scale, rng());
        total += v.empty() ? 0.0 : norm * norm;
      }
      if (rng() % 10u == 0 && !t[0].empty()) t[0][rng() % t[0].size()] = (rng() & 1u) ? kInf : kNaN;
      // max_norm between a tenth of the norm and ten times it, never within 1e-6 of it.
      double max_norm = std::sqrt(total) * std::pow(10.0, static_cast<double>(rng() % 2001u) / 1000.0 - 1.0);
      if (!(max_norm > 0)) max_norm = 1.0;
      if (std::fabs(max_norm / (std::sqrt(total) + 1e-6) - 1.0) < 1e-6) max_norm *= 1.01;
      expect_clip(m, t, 1.0f / scale, max_norm, "a random case");
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

}  // TEST_SUITE
