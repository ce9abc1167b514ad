// Chapter 03 — exercises: grader tests for exercise 3.2 (LayerNorm's backward, accumulated in FP32).
// Depends on: grader.hpp; mpt's norm formulas (norm_math.hpp) in double are
// the reference.
// Five test cases: dx on random rows; dgamma and dbeta, sums over rows;
// D = 1 (a detail, one point); rows far from 0 next to their spread; rows of
// D = 4096 whose sums reach thousands.
//
// Every error is measured in units of its scale: for dx[r][i],
// rstd·(|g| + (Σ|g| + |x̂|·Σ|g·x̂|)/D), the size of the terms it is made of;
// for dgamma[i] Σᵣ|dy·x̂|, for dbeta[i] Σᵣ|dy|. Float sums in any order are
// off by a few epsilons (2^-23) times √D of that; a sum rounded to fp16 after
// every add by 2^-11 and more.
#include <cstdint>
#include <string>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex03;
using namespace mpt::ex03::grading;

// Random rows: float sums in forward, reverse or 8-lane order, and mpt's
// float LayerNorm, measured within 5e-7 of the scale (D up to 768); an fp16
// accumulator misses by 5e-4 to 7e-3, a bf16 one by 4e-3 to 9e-2.
constexpr double kRandomTolerance = 1e-4;

// Rows far from 0: float statistics of values near c are off by about
// ε·|c|·√D, i.e. ε·(|c|/σ)·√D of a standard deviation, which x̂ and so dx
// inherit: 0.02 at |c|/σ = 10^4 and D = 256. Measured: 4.7e-3 at most over
// float sums in three orders, two passes or Welford's update (mpt's float
// LayerNorm 4.4e-3); the variance as E[x²] − E[x]² in float misses by 2.9 and
// more, an fp16 accumulator by 0.2 and more.
constexpr double kFarFromZeroTolerance = 3e-2;

// D = 4096 with dy of mean 1 to 3: Σg reaches thousands, where fp16's
// spacing is 2 to 4. Measured: float sums in any of three orders within
// 2e-6; an fp16 accumulator misses by 0.04 to 0.08.
constexpr double kLongRowTolerance = 1e-4;

}  // namespace

TEST_SUITE("exercise-3.2") {
  TEST_CASE("3.2 dx on random rows, against the formulas in double") {
    Mismatches m;
    std::uint32_t seed = 100;
    for (std::int64_t d : {2, 3, 5, 8, 64, 768})
      for (double offset : {0.0, 0.5, -2.0}) {
        LayerNormCase c = random_case(seed++, 8, d, offset, 1.0 + offset * offset, 0.3 * offset);
        // Only dx is graded here: the parameter gradients are the next test case's.
        solve_reference(c);
        const LayerNormAnswer got = student_backward(c);
        m.checked();
        std::size_t at = 0;
        const double e = worst_error(got.dx, c.dx, c.dx_scale, at);
        if (e <= kRandomTolerance || !m.wrong()) continue;
        m.detail("rows of mean " + short_number(offset) + " (rows 8, D " + std::to_string(d) + "): dx[" +
                 std::to_string(at) + "] = " + describe(got.dx[at]) + ", expected " + describe(c.dx[at]) +
                 " (error " + short_number(e) + " of its scale, allowed " + short_number(kRandomTolerance) +
                 ")");
      }
    // eps that matters: rows whose variance is about eps.
    for (std::int64_t d : {4, 32}) {
      LayerNormCase c = random_case(seed++, 8, d, 0.0, 3e-3, 0.0, 1e-5f);
      solve_reference(c);
      const LayerNormAnswer got = student_backward(c);
      m.checked();
      std::size_t at = 0;
      const double e = worst_error(got.dx, c.dx, c.dx_scale, at);
      if (e <= kRandomTolerance || !m.wrong()) continue;
      m.detail("rows of variance 1e-5 = eps (rows 8, D " + std::to_string(d) + "): dx[" + std::to_string(at) +
               "] = " + describe(got.dx[at]) + ", expected " + describe(c.dx[at]) + " (error " +
               short_number(e) + " of its scale, allowed " + short_number(kRandomTolerance) + ")");
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("3.2 dgamma and dbeta: sums over every row, written (not added to)") {
    Mismatches m;
    std::uint32_t seed = 200;
    for (std::int64_t rows : {1, 3, 64, 1000})
      for (std::int64_t d : {1, 8, 100}) {
        LayerNormCase c = random_case(seed++, rows, d, 0.25, 1.5, -0.2);
        solve_reference(c);
        const LayerNormAnswer got = student_backward(c);
        m.checked();
        std::size_t at_g = 0, at_b = 0;
        const double eg = worst_error(got.dgamma, c.dgamma, c.dgamma_scale, at_g);
        const double eb = worst_error(got.dbeta, c.dbeta, c.dbeta_scale, at_b);
        if ((eg <= kRandomTolerance && eb <= kRandomTolerance) || !m.wrong()) continue;
        const std::string size = "rows " + std::to_string(rows) + ", D " + std::to_string(d) + ": ";
        if (eg > kRandomTolerance)
          m.detail(size + "dgamma[" + std::to_string(at_g) + "] = " + describe(got.dgamma[at_g]) +
                   ", expected Σ dy·x̂ = " + describe(c.dgamma[at_g]) + " (error " + short_number(eg) +
                   " of Σ|dy·x̂|, allowed " + short_number(kRandomTolerance) + ")");
        else
          m.detail(size + "dbeta[" + std::to_string(at_b) + "] = " + describe(got.dbeta[at_b]) +
                   ", expected Σ dy = " + describe(c.dbeta[at_b]) + " (error " + short_number(eb) +
                   " of Σ|dy|, allowed " + short_number(kRandomTolerance) + ")");
      }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("3.2 D = 1: x̂ = 0, so dx and dgamma are exactly 0 and dbeta is Σ dy [1 point]") {
    Mismatches m;
    for (std::int64_t rows : {1, 7, 64}) {
      LayerNormCase c = random_case(300u + static_cast<std::uint32_t>(rows), rows, 1, 3.0, 2.0);
      solve_reference(c);
      const LayerNormAnswer got = student_backward(c);
      m.checked();
      std::string problem;
      for (std::size_t i = 0; i < got.dx.size() && problem.empty(); ++i)
        if (!(got.dx[i] == 0.0f))
          problem = "dx[" + std::to_string(i) + "] = " + describe(got.dx[i]) + ", expected 0";
      if (problem.empty() && !(got.dgamma[0] == 0.0f))
        problem = "dgamma[0] = " + describe(got.dgamma[0]) + ", expected 0";
      std::size_t at = 0;
      const double eb = worst_error(got.dbeta, c.dbeta, c.dbeta_scale, at);
      if (problem.empty() && !(eb <= kRandomTolerance))
        problem = "dbeta[0] = " + describe(got.dbeta[0]) + ", expected Σ dy = " + describe(c.dbeta[0]);
      if (!problem.empty() && m.wrong())
        m.detail("rows " + std::to_string(rows) +
                 ", D 1 (every row is its own mean; var 0, rstd 1/√eps): " + problem);
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE(
      "3.2 rows far from 0 next to their spread (x = c ± 1e-4·c): statistics that do not cancel [15 "
      "points]") {
    Mismatches m;
    struct Rows {
      double offset, spread;
    };
    const Rows sets[] = {{1000.0, 0.1}, {300.0, 0.03}, {100.0, 0.01}, {-500.0, 0.05}};
    std::uint32_t seed = 400;
    for (const Rows& s : sets)
      for (std::int64_t d : {16, 64, 256})
        expect_backward(
            m, random_case(seed++, 16, d, s.offset, s.spread), kFarFromZeroTolerance,
            "rows of mean " + short_number(s.offset) + " and standard deviation " + short_number(s.spread));
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("3.2 rows of D = 4096 whose sums reach thousands: FP32 accumulation") {
    Mismatches m;
    std::uint32_t seed = 500;
    for (double dy_mean : {1.0, 2.0, 3.0})
      expect_backward(m, random_case(seed++, 4, 4096, 0.0, 1.0, dy_mean), kLongRowTolerance,
                      "rows of 4096 values, dy of mean " + short_number(dy_mean));
    CHECK_MESSAGE(m.none(), m.report());
  }

}  // TEST_SUITE
