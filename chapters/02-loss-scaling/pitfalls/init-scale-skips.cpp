// Chapter 02 — pitfall init-scale-skips: init scale 2^16: the first iterations are skipped, the schedule is
// not Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// ../training.hpp (Batches, mlp_config, scaled_backward, target_power),
// mpt/amp/grad_scaler.hpp, mpt/nn/data.hpp (make_tiny_target_regression),
// mpt/nn/mlp.hpp, mpt/optim/adamw.hpp; <algorithm>, <string>, <utility>.
//
// From 2^16 the scaler needs a few overflowing iterations to find a scale
// that fits the gradients; it skips them. A learning-rate schedule stepped
// every iteration counts those skipped steps too, so the first real update
// starts partway into the warmup. Step the schedule only after a real step.
#include <algorithm>
#include <string>
#include <utility>

#include "../training.hpp"
#include "common.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/nn/data.hpp"
#include "mpt/nn/mlp.hpp"
#include "mpt/optim/adamw.hpp"

namespace mpt::ch02 {
namespace {

// ---------------------------------------------------------------------------
// The constants, the data, the schedule, and what a run measures.

constexpr int kWarmupSteps = 8;
constexpr double kPeakLr = 1e-2;
constexpr int kScheduleIterations = 100;
constexpr Eigen::Index kScheduleBatch = 64;
constexpr double kLargeTargetScale = 1000.0;

/// The teacher regression with targets in the thousands (unnormalised
/// targets): its gradients at step 1 are large enough that S = 2^16 overflows.
const Dataset& large_targets() {
  static const Dataset d = [] {
    TinyTargetOptions o;
    o.target_scale = kLargeTargetScale;
    return make_tiny_target_regression(o);
  }();
  return d;
}

/// Linear warmup to the peak over kWarmupSteps scheduler steps, then
/// constant; `count` is how many steps the scheduler has taken (0-based).
double warmup_lr(int count) { return kPeakLr * std::min(1.0, (count + 1.0) / kWarmupSteps); }

struct ScheduleRun {
  double initial_skips = 0, skipped = 0, first_update = 0, first_lr = 0, warmup_updates = 0,
         scheduler_steps = 0, scale = 0, loss = 0;
};

/// The outcomes of both runs (defined after the runs).
RunResult schedule_outcomes(const ScheduleRun& r, std::string setup);

// ---------------------------------------------------------------------------
// The broken run (the loop of both runs).

/// One run; `count_skipped` is the broken schedule (advance every iteration).
ScheduleRun schedule_run(bool count_skipped) {
  MlpConfig c = mlp_config({8, 32, 32, 4}, DType::f16, 3);
  Mlp net(c);
  AdamWOptions o;
  o.lr = warmup_lr(0);
  o.weight_decay = 0.0;
  AdamW opt(net.parameters(), o);
  Batches batches(large_targets(), kScheduleBatch, kBatchSeed);
  GradScaler scaler;
  int scheduler_count = 0;  // the scheduler's own step counter
  ScheduleRun r;
  for (int it = 1; it <= kScheduleIterations; ++it) {
    scaled_backward(net, opt, batches, scaler);  // forward, S * loss, backward
    const float scale_used = scaler.get_scale();
    const int position = scheduler_count;  // the schedule value this iteration's step uses
    bool stepped = false;
    if (count_skipped) {
      //! [init-scale-skips-broken]
      stepped = scaler.step(opt);
      scaler.update();
      opt.set_lr(warmup_lr(++scheduler_count));  // scheduler.step(): every iteration
      //! [init-scale-skips-broken]
    } else {
      //! [init-scale-skips-fixed]
      stepped = scaler.step(opt);
      scaler.update();
      if (stepped) opt.set_lr(warmup_lr(++scheduler_count));  // only after a real step
      //! [init-scale-skips-fixed]
    }
    if (!stepped) {
      ++r.skipped;
      if (r.first_update == 0) ++r.initial_skips;
    } else {
      if (r.first_update == 0) {
        r.first_update = it;
        r.first_lr = warmup_lr(position);
        r.scale = scale_used;
      }
      r.warmup_updates += position < kWarmupSteps;
    }
    net.refresh_model_copies();
  }
  r.scheduler_steps = scheduler_count;
  r.loss = set_loss(net, large_targets()) / target_power(large_targets());
  return r;
}

RunResult init_scale_skips_broken() {
  return schedule_outcomes(schedule_run(true),
                           "fp16 MLP, regression with targets ~1000, GradScaler from 2^16, warmup "
                           "counted per iteration");
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult init_scale_skips_fixed() {
  return schedule_outcomes(schedule_run(false), "the same run, warmup counted per optimizer step taken");
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult schedule_outcomes(const ScheduleRun& r, std::string setup) {
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"iterations", kScheduleIterations, "iterations (AdamW, batch 64)"},
      {"initial_scale", GradScaler::Options{}.init_scale, "GradScaler's default init_scale, 2^16"},
      {"initial_skips", r.initial_skips, "iterations skipped in a row from the first"},
      {"skipped_steps", r.skipped, "all skipped iterations"},
      {"scale_at_first_update", r.scale, "the scale that first fitted the gradients"},
      {"first_update_iteration", r.first_update, "iteration of the first optimizer step"},
      {"warmup_steps", kWarmupSteps, "linear warmup to lr " + num(kPeakLr) + ", in scheduler steps"},
      {"lr_at_first_update", r.first_lr, "the learning rate the first real step used"},
      {"warmup_updates", r.warmup_updates, "optimizer steps that used one of the warmup's learning rates"},
      {"scheduler_steps", r.scheduler_steps, "scheduler.step() calls at the end"},
      {"relative_loss", r.loss, "final MSE / mean target^2 (1: predicts 0)"},
  };
  out.explanation = r.first_lr > warmup_lr(0)
                        ? "The first " + num(r.initial_skips) +
                              " iterations overflowed and were skipped while the "
                              "scale fell from 2^16 to " +
                              num(r.scale) +
                              ", but the schedule counted them: the first "
                              "real step ran at lr " +
                              num(r.first_lr) + " (" + pct(r.first_lr / kPeakLr) +
                              " of the peak), and only " + num(r.warmup_updates) + " of the " +
                              num(kWarmupSteps) + " warmup values reached an optimizer step."
                        : "The same " + num(r.initial_skips) +
                              " skipped iterations, but the schedule only counts "
                              "steps that happened: the first real step ran at lr " +
                              num(r.first_lr) + " and all " + num(r.warmup_updates) +
                              " warmup values were used.";
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall init_scale_skips_pitfall() {
  return Pitfall{
      "init-scale-skips",
      2,
      "init scale 2^16: the first iterations are skipped, the schedule is not",
      "Starting at 2^16, the scaler skips iterations and halves the scale until the gradients fit "
      "fp16; a learning-rate schedule stepped every iteration counts those skipped steps, so the "
      "first real update starts partway into the warmup.",
      init_scale_skips_broken,
      init_scale_skips_fixed,
      {
          check("at least 3 iterations in a row were skipped from the start",
                [](const RunResult& r) { return r.get("initial_skips") >= 3; }),
          check("the first real step used a learning rate past the warmup's first value",
                [](const RunResult& r) {
                  return r.get("lr_at_first_update") > 1.0001 * kPeakLr / r.get("warmup_steps");
                }),
          check("warmup values were spent on skipped iterations",
                [](const RunResult& r) { return r.get("warmup_updates") < r.get("warmup_steps"); }),
      },
      {
          check("the first real step used the warmup's first learning rate",
                [](const RunResult& r) {
                  return within(r.get("lr_at_first_update"), kPeakLr / r.get("warmup_steps"), 1e-6);
                }),
          check("every warmup value reached an optimizer step",
                [](const RunResult& r) { return r.get("warmup_updates") == r.get("warmup_steps"); }),
          check("the schedule counted only real steps",
                [](const RunResult& r) {
                  return r.get("scheduler_steps") == r.get("iterations") - r.get("skipped_steps");
                }),
      },
      {}};
}

}  // namespace mpt::ch02
