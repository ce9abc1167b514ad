// Chapter 01 — pitfall fp16-sum-stagnation: stagnating sum: an fp16 accumulator stops growing
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/formats/format.hpp (Format), mpt/formats/rounding.hpp (round_value);
// <cmath>, <string>, <utility>.
//
// An fp16 accumulator rounds after every add; once half its spacing at the
// running sum exceeds the addend, sum + addend rounds back to sum and the
// sum stops growing for good. An fp32 accumulator (what tensor cores and GPU
// reductions use) over the same fp16 inputs keeps every addition.
#include <cmath>
#include <string>
#include <utility>

#include "common.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/formats/rounding.hpp"

namespace mpt::ch01 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace fp16_sum_stagnation {

// ---------------------------------------------------------------------------
// The constants.

constexpr int kSumSteps = 10000;
constexpr float kSumValue = 0.01f;  // before rounding: what the tensor was meant to hold

/// Measurements shared by both sides (defined after the runs).
RunResult stagnation_outcomes(float addend, double sum, double stalled, double first_stall,
                              const Format& accumulator, std::string setup);

// ---------------------------------------------------------------------------
// The broken run.

RunResult fp16_sum_stagnation_broken() {
  // The values come from an fp16 tensor, so the addend is fp16(0.01).
  const float addend = round_value(kSumValue, fp16());
  double stalled = 0, first_stall = 0;
  //! [fp16-sum-stagnation-broken]
  // An fp16 accumulator: each add is an fp32 add of two fp16 values whose
  // result is rounded back to fp16.
  float sum = 0.0f;
  for (int i = 0; i < kSumSteps; ++i) {
    const float next = round_value(sum + addend, fp16());
    if (next == sum && stalled++ == 0) first_stall = i + 1;
    sum = next;
  }
  //! [fp16-sum-stagnation-broken]
  return stagnation_outcomes(addend, sum, stalled, first_stall, fp16(),
                             "sum fp16(" + num(kSumValue) + ") " + std::to_string(kSumSteps) +
                                 " times in an fp16 accumulator (rounded after every add)");
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult fp16_sum_stagnation_fixed() {
  const float addend = round_value(kSumValue, fp16());
  double stalled = 0, first_stall = 0;
  //! [fp16-sum-stagnation-fixed]
  // Same fp16 inputs, fp32 accumulator (what tensor cores and GPU
  // reductions use): the sum is never rounded to fp16 along the way.
  float sum = 0.0f;
  for (int i = 0; i < kSumSteps; ++i) {
    const float next = sum + addend;
    if (next == sum && stalled++ == 0) first_stall = i + 1;
    sum = next;
  }
  //! [fp16-sum-stagnation-fixed]
  return stagnation_outcomes(addend, sum, stalled, first_stall, fp32(),
                             "sum the same fp16(" + num(kSumValue) + ") " + std::to_string(kSumSteps) +
                                 " times in an fp32 accumulator");
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult stagnation_outcomes(float addend, double sum, double stalled, double first_stall,
                              const Format& accumulator, std::string setup) {
  const double expected = kSumSteps * static_cast<double>(addend);
  const double ulp = ulp_in(accumulator, sum);
  const double rel_error = std::fabs(sum - expected) / expected;
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"addend", addend, "fp16(" + num(kSumValue) + "): the value actually added"},
      {"steps", static_cast<double>(kSumSteps), "number of additions"},
      {"final_sum", sum, "the accumulator at the end (where it stalled, if it did)"},
      {"expected_sum", expected, "steps * addend, in fp64"},
      {"rel_error", rel_error, "|final_sum - expected_sum| / expected_sum"},
      {"stalled_adds", stalled, "additions that left the accumulator unchanged"},
      {"first_stalled_step", first_stall, "first such addition, counting from 1 (0: none)"},
      {"ulp_at_final", ulp, "spacing of the accumulator format at final_sum"},
      {"half_ulp_at_final", ulp / 2, "half that spacing: smaller addends round away"},
  };
  r.explanation = stalled > 0
                      ? "From step " + num(first_stall) + " on, the sum stays at " + num(sum) +
                            ": there the " + std::string(accumulator.name) + " spacing is " + num(ulp) +
                            ", half of it (" + num(ulp / 2) + ") is more than the addend " + num(addend) +
                            ", so sum + addend rounds back to sum."
                      : "The " + std::string(accumulator.name) + " spacing at " + num(sum) + " is " +
                            num(ulp) + ", far below the addend " + num(addend) +
                            ", so every addition counts (relative error vs fp64: " + num(rel_error) + ").";
  return r;
}

}  // namespace fp16_sum_stagnation
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall fp16_sum_stagnation_pitfall() {
  using namespace fp16_sum_stagnation;
  return Pitfall{
      "fp16-sum-stagnation",
      1,
      "stagnating sum: an fp16 accumulator stops growing",
      "An fp16 accumulator rounds after every add; once half the fp16 spacing at the running "
      "sum exceeds the addend, sum + addend rounds back to sum and the sum stalls for good.",
      fp16_sum_stagnation_broken,
      fp16_sum_stagnation_fixed,
      {
          check("the sum stalls below half the expected value",
                [](const RunResult& r) { return r.get("final_sum") < 0.5 * r.get("expected_sum"); }),
          check("additions stopped changing the sum, and never resumed",
                [](const RunResult& r) {
                  return r.get("stalled_adds") > 0 &&
                         r.get("stalled_adds") == r.get("steps") - r.get("first_stalled_step") + 1;
                }),
          check("at the stall, half an ulp is at least the addend",
                [](const RunResult& r) { return r.get("half_ulp_at_final") >= r.get("addend"); }),
      },
      {
          check("no addition was lost", [](const RunResult& r) { return r.get("stalled_adds") == 0; }),
          check("the sum matches steps*addend within steps*u(fp32)",
                [](const RunResult& r) {
                  return r.get("rel_error") <= r.get("steps") * unit_roundoff(fp32());
                }),
      },
      {}};
}

}  // namespace mpt::ch01
