// Chapter 01 — pitfall fp16-lost-update: lost updates: an fp16 weight ignores small steps
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/formats/format.hpp (limits_of), mpt/formats/rounding.hpp (round_value);
// <cmath>, <string>, <utility>.
//
// A weight stored in fp16 ignores every update smaller than half its ulp:
// at 1.0 the fp16 neighbours are 2^-10 apart, so 1.0 + 1e-4 rounds back to
// 1.0 on every step. An fp32 master copy takes the updates, and the fp16
// weight is only a copy of it.
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
namespace fp16_lost_update {

// ---------------------------------------------------------------------------
// The constants.

constexpr int kUpdateSteps = 10000;
// lr * grad is 1e-4 in fp32: the size of a late-training SGD step on one
// weight (lr 1e-4, gradient -1 so the weight grows towards 2).
constexpr float kLearningRate = 1e-4f;
constexpr float kGradient = -1.0f;

/// Measurements shared by both sides (defined after the runs).
RunResult lost_update_outcomes(double final_weight, double final_fp16_copy, double changed,
                               double rounded_away, const Format& storage, std::string setup);

// ---------------------------------------------------------------------------
// The broken run.

RunResult fp16_lost_update_broken() {
  double changed = 0, rounded_away = 0;
  //! [fp16-lost-update-broken]
  // The weight lives in fp16 and the optimizer writes it back in fp16.
  float w = round_value(1.0f, fp16());
  for (int step = 0; step < kUpdateSteps; ++step) {
    const float updated = w - kLearningRate * kGradient;  // fp32 arithmetic
    const float stored = round_value(updated, fp16());    // stored in fp16
    changed += stored != w;
    rounded_away += std::fabs(static_cast<double>(updated) - stored);
    w = stored;
  }
  //! [fp16-lost-update-broken]
  return lost_update_outcomes(w, w, changed, rounded_away, fp16(),
                              "weight 1.0 stored in fp16; " + std::to_string(kUpdateSteps) +
                                  " steps of w -= lr*grad (fp32 math, result rounded to fp16)");
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult fp16_lost_update_fixed() {
  double changed = 0, rounded_away = 0;
  float w16 = 0.0f;
  //! [fp16-lost-update-fixed]
  // The optimizer updates an fp32 master copy; the fp16 weight is only a
  // copy of it, refreshed after every step for the next forward pass.
  float master = 1.0f;
  for (int step = 0; step < kUpdateSteps; ++step) {
    const float updated = master - kLearningRate * kGradient;  // fp32, stays fp32
    changed += updated != master;
    master = updated;
    w16 = round_value(master, fp16());
  }
  //! [fp16-lost-update-fixed]
  // The optimizer keeps the fp32 result as it is: storing the master rounds
  // nothing away, so rounded_away stays 0 here.
  return lost_update_outcomes(master, w16, changed, rounded_away, fp32(),
                              "fp32 master weight 1.0; " + std::to_string(kUpdateSteps) +
                                  " steps of master -= lr*grad; fp16 copy taken after each step");
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult lost_update_outcomes(double final_weight, double final_fp16_copy, double changed,
                               double rounded_away, const Format& storage, std::string setup) {
  const float update = -kLearningRate * kGradient;  // the fp32 step size both runs apply
  const double expected = 1.0 + kUpdateSteps * static_cast<double>(update);
  const double half_ulp_of_one = limits_of(storage.spec).epsilon / 2;
  const double rel_error = std::fabs(final_weight - expected) / expected;
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"steps", static_cast<double>(kUpdateSteps), "optimizer steps"},
      {"update", update, "lr * |grad| added each step (fp32)"},
      {"half_ulp_of_one", half_ulp_of_one,
       "half the spacing at 1.0 in the weight's storage format (epsilon/2)"},
      {"steps_that_changed_weight", changed, "steps after which the stored weight differed"},
      {"rounded_away_fraction", rounded_away / (kUpdateSteps * static_cast<double>(update)),
       "what storing the weight took off the updates, summed, over steps * update"},
      {"final_weight", final_weight, "the stored weight after the last step"},
      {"final_fp16_copy", final_fp16_copy, "the fp16 weight the next forward pass would use"},
      {"expected_weight", expected, "1 + steps * update, in fp64"},
      {"rel_error", rel_error, "|final_weight - expected| / expected"},
  };
  r.explanation =
      static_cast<double>(update) <= half_ulp_of_one
          ? "In " + std::string(storage.name) + " the neighbours of 1.0 are " + num(half_ulp_of_one * 2) +
                " apart; an update of " + num(update) + " is below half of that (" + num(half_ulp_of_one) +
                "), so 1.0 + update rounds back to 1.0 on every step."
          : "The update " + num(update) + " is far above half the " + std::string(storage.name) +
                " spacing at 1.0 (" + num(half_ulp_of_one) + "), so every step lands; what remains, " +
                num(rel_error) + " relative, is fp32 rounding accumulated over the steps.";
  return r;
}

}  // namespace fp16_lost_update
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall fp16_lost_update_pitfall() {
  using namespace fp16_lost_update;
  const Limits l16 = limits_of(fp16().spec);
  return Pitfall{
      "fp16-lost-update",
      1,
      "lost updates: an fp16 weight ignores small steps",
      "A weight of 1.0 stored in fp16 has neighbours " + p2(l16.epsilon) +
          " apart, so an update smaller than half of that (" + p2(l16.epsilon / 2) +
          ") rounds away on every step and the weight never moves; an fp32 master copy keeps "
          "every update.",
      fp16_lost_update_broken,
      fp16_lost_update_fixed,
      {
          check("storing the weight took the whole update away on every step (rounded away: "
                "steps * update, within 0.1%)",
                [](const RunResult& r) { return std::fabs(r.get("rounded_away_fraction") - 1.0) <= 1e-3; }),
          check("no step changed the weight",
                [](const RunResult& r) { return r.get("steps_that_changed_weight") == 0; }),
          check("the weight is still exactly 1.0",
                [](const RunResult& r) { return r.get("final_weight") == 1.0; }),
      },
      {
          check("every step changed the weight",
                [](const RunResult& r) { return r.get("steps_that_changed_weight") == r.get("steps"); }),
          check("the final weight matches 1 + steps*update within steps*u(fp32)",
                [](const RunResult& r) {
                  return r.get("rel_error") <= r.get("steps") * unit_roundoff(fp32());
                }),
          check("the fp16 copy the model uses moved too",
                [](const RunResult& r) { return r.get("final_fp16_copy") > 1.0; }),
      },
      {}};
}

}  // namespace mpt::ch01
