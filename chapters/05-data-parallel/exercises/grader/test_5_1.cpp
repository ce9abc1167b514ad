// Chapter 05 — exercises: grader tests for exercise 5.1 (the averaging all-reduce with pre-division).
// Depends on: grader.hpp; the dist tier's DistributedDataParallel (ddp.hpp),
// whose reduction of the same gradients is the reference.
// Each rank's gradients differ (they follow from its rank); the answer must
// be DDP's average of them with the same comm dtype and pre-division factor:
// bit for bit on 2 ranks (a sum of two is the same in any order), within a
// few units of the comm dtype's rounding on more (the engine's summation
// order is its own). Then the overflow that pre-division exists to prevent,
// and bad input.
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "grader.hpp"
#include "mpt/dist/ddp.hpp"

namespace {

using namespace mpt::ex05;
using namespace mpt::ex05::grading;

// This rank's gradients for the blobs MLP's parameters: values of either
// sign spread over three decades (none an f16 subnormal), different on
// every rank.
std::vector<std::vector<float>> rank_gradients(mpt::Model& net) {
  std::vector<std::vector<float>> g;
  std::uint32_t state = 5101u + 7919u * static_cast<std::uint32_t>(world().rank());
  for (const mpt::Parameter* p : net.parameters()) {
    std::vector<float> v(static_cast<std::size_t>(p->grad.numel()));
    for (float& x : v) {
      state = state * 1664525u + 1013904223u;
      const float u = static_cast<float>(state >> 8) / 16777216.0f;  // [0, 1)
      x = (u < 0.5f ? -1.0f : 1.0f) * std::pow(10.0f, -3.0f * u) * 4.0f;
    }
    g.push_back(std::move(v));
  }
  return g;
}

// What DDP makes of `g` on this rank: the gradients copied into the
// parameters of a fresh replica, reduced by finish_backward().
std::vector<std::vector<float>> ddp_average(const std::vector<std::vector<float>>& g, mpt::DType dtype,
                                            double predivide) {
  auto net = blobs_mlp();
  mpt::dist::DdpOptions o;
  o.comm_dtype = dtype;
  o.predivide_factor = predivide;
  mpt::dist::DistributedDataParallel ddp(*net, world(), o);
  const auto params = net->parameters();
  for (std::size_t k = 0; k < params.size(); ++k)
    params[k]->grad.assign(g[k].data(), params[k]->grad.numel());
  ddp.finish_backward();
  std::vector<std::vector<float>> out;
  for (const mpt::Parameter* p : params)
    out.emplace_back(p->grad.f32_data(), p->grad.f32_data() + p->grad.numel());
  return out;
}

// Unit roundoff of the comm dtype, for the comparison on more than 2 ranks.
float roundoff(mpt::DType d) {
  return d == mpt::DType::f32 ? 0x1p-23f : d == mpt::DType::f16 ? 0x1p-10f : 0x1p-7f;
}

// Grades one (dtype, factor) case into `m`; every rank takes part.
void grade_case(Mismatches& m, mpt::DType dtype, double predivide) {
  auto net = blobs_mlp();
  const auto given = rank_gradients(*net);
  auto answer = given;
  on_every_rank([&] { average_gradients(world(), answer, dtype, predivide); });
  const auto expected = ddp_average(given, dtype, predivide);
  const std::string what = std::string(mpt::dtype_name(dtype)) + ", predivide_factor " +
                           std::to_string(predivide) + (predivide == 0 ? " (the world size)" : "");
  if (answer.size() != expected.size()) {
    m.add(what + ": " + std::to_string(answer.size()) + " buffers returned, " +
          std::to_string(expected.size()) + " given");
    return;
  }
  const bool exact = world().size() <= 2;
  const float tol = 4.0f * static_cast<float>(world().size()) * roundoff(dtype);
  for (std::size_t k = 0; k < expected.size(); ++k) {
    if (answer[k].size() != expected[k].size()) {
      m.add(what + ": buffer " + std::to_string(k) + " changed size");
      continue;
    }
    for (std::size_t i = 0; i < expected[k].size(); ++i) {
      m.checked();
      const float a = answer[k][i], e = expected[k][i];
      const bool ok = exact ? bits_of(a) == bits_of(e) : std::fabs(a - e) <= tol * (std::fabs(e) + 1e-3f);
      if (!ok && m.wrong())
        m.detail(what + ", buffer " + std::to_string(k) + "[" + std::to_string(i) + "]: got " + describe(a) +
                 ", DDP gives " + describe(e) + " (this rank gave " + describe(given[k][i]) + ")");
    }
  }
}

}  // namespace

TEST_SUITE("exercise-5.1") {
  TEST_CASE("5.1 f32, the default pre-division (the world size): DDP's average on every rank") {
    Mismatches m;
    grade_case(m, mpt::DType::f32, 0);
    CHECK_MESSAGE(everyone(m.none()), m.report());
  }

  TEST_CASE("5.1 f16 and bf16, the default pre-division: DDP's average, summed in the comm dtype") {
    Mismatches m;
    grade_case(m, mpt::DType::f16, 0);
    grade_case(m, mpt::DType::bf16, 0);
    CHECK_MESSAGE(everyone(m.none()), m.report());
  }

  TEST_CASE("5.1 pre-division factors 1 and 3 in f32, f16 and bf16: DDP's average [15 points]") {
    Mismatches m;
    for (mpt::DType d : {mpt::DType::f32, mpt::DType::f16, mpt::DType::bf16})
      for (double f : {1.0, 3.0}) grade_case(m, d, f);
    CHECK_MESSAGE(everyone(m.none()), m.report());
  }

  TEST_CASE("5.1 f16: 40000 on every rank sums to inf with predivide 1, and averages to 40000 by default") {
    std::vector<std::vector<float>> by_default{{40000.0f, -40000.0f}, {1.0f}};
    std::vector<std::vector<float>> sum_first = by_default;
    on_every_rank([&] { average_gradients(world(), by_default, mpt::DType::f16, 0); });
    on_every_rank([&] { average_gradients(world(), sum_first, mpt::DType::f16, 1); });
    // A sum of one rank's 40000 is 40000 (a world of one, when run alone).
    const float big = world().size() > 1 ? std::numeric_limits<float>::infinity() : 40000.0f;
    const bool ok = by_default.size() == 2 && by_default[0].size() == 2 && by_default[0][0] == 40000.0f &&
                    by_default[0][1] == -40000.0f && by_default[1].size() == 1 && by_default[1][0] == 1.0f &&
                    sum_first.size() == 2 && sum_first[0].size() == 2 && sum_first[0][0] == big &&
                    sum_first[0][1] == -big && sum_first[1].size() == 1 && sum_first[1][0] == 1.0f;
    CHECK_MESSAGE(everyone(ok),
                  "expected {40000, -40000}, {1} by default and {inf, -inf}, {1} with predivide 1 "
                  "(f16's largest finite value is 65504); got {"
                      << (by_default[0].empty() ? 0.0f : by_default[0][0]) << ", ...} and {"
                      << (sum_first[0].empty() ? 0.0f : sum_first[0][0]) << ", ...}");
  }

  TEST_CASE("5.1 bad input: one-line std::invalid_argument for the comm dtype or the factor [1 point]") {
    std::vector<std::vector<float>> g{{1.0f, 2.0f}};
    std::string problems;
    const auto expect_rejected = [&](mpt::DType d, double f, const char* what) {
      try {
        average_gradients(world(), g, d, f);
        problems += std::string(" ") + what + ": accepted;";
      } catch (const std::invalid_argument& e) {
        const std::string msg = e.what();
        if (msg.empty() || msg.find('\n') != std::string::npos)
          problems += std::string(" ") + what + ": the message is not one line;";
      } catch (const std::exception& e) {
        problems += std::string(" ") + what + ": threw something else (" + e.what() + ");";
      }
    };
    expect_rejected(mpt::DType::e4m3, 0, "comm dtype e4m3");
    expect_rejected(mpt::DType::f32, -2, "predivide_factor -2");
    expect_rejected(mpt::DType::f16, std::numeric_limits<double>::quiet_NaN(), "predivide_factor NaN");
    expect_rejected(mpt::DType::bf16, std::numeric_limits<double>::infinity(), "predivide_factor inf");
    CHECK_MESSAGE(everyone(problems.empty()), "bad input must throw std::invalid_argument:" << problems);
  }
}  // TEST_SUITE
