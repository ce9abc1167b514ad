// Chapter 02 — pitfall init-scale-skips: the first iterations skipped, the schedule not.
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// ../training.hpp (Batches, mlp_config, scaled_backward, target_power),
// mpt/amp/grad_scaler.hpp, mpt/nn/data/data.hpp (make_tiny_target_regression),
// mpt/nn/models/mlp.hpp, mpt/optim/adamw.hpp, Eigen (the weights as one vector);
// <algorithm>, <cstddef>, <cstdint>, <string>, <utility>, <vector>.
//
// From 2^16 the scaler needs a few overflowing iterations to find a scale
// that fits the gradients; it skips them. A learning-rate schedule stepped
// every iteration counts those skipped steps too, so the first real update
// starts partway into the warmup. Step the schedule only after a real step,
// told the way that works in PyTorch too: update() lowered the scale.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "../training.hpp"
#include "common.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/adamw.hpp"

namespace mpt::ch02 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace init_scale_skips {

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
  double first_step_size = 0;  ///< ||W after the first real step - W before|| / ||W before||
  double real_steps = 0;       ///< optimizer steps taken
};

/// The network's weights, every parameter in order, as one vector (double).
Eigen::VectorXd weights_of(Mlp& net) {
  std::vector<double> w;
  for (const Parameter* p : net.parameters()) {
    const MatrixF m = p->master.f32();
    w.insert(w.end(), m.data(), m.data() + m.size());
  }
  return Eigen::Map<const Eigen::VectorXd>(w.data(), static_cast<Eigen::Index>(w.size()));
}

/// The schedule's network (MLP 8-32-32-4 in precision p, weights from seed
/// 3) and its AdamW at the warmup's first learning rate, no weight decay.
MlpConfig schedule_net(DType p) { return mlp_config({8, 32, 32, 4}, p, 3); }
AdamWOptions schedule_adam() {
  AdamWOptions o;
  o.lr = warmup_lr(0);
  o.weight_decay = 0.0;
  return o;
}

/// The FP32 baseline: no scaler, so no iteration is skipped and the
/// schedule starts on the first step. Its relative loss after each step k
/// (index k - 1) and the size of its first step.
struct ScheduleBaseline {
  std::vector<double> loss_after;
  double first_step_size = 0;
};
ScheduleBaseline schedule_fp32() {
  Mlp net(schedule_net(DType::f32));
  AdamW opt(net.parameters(), schedule_adam());
  Batches batches(large_targets(), kScheduleBatch, kBatchSeed);
  ScheduleBaseline b;
  for (int step = 0; step < kScheduleIterations; ++step) {
    const Eigen::VectorXd before = weights_of(net);
    plain_step(net, opt, batches);
    opt.set_lr(warmup_lr(step + 1));
    if (step == 0) b.first_step_size = (weights_of(net) - before).norm() / before.norm();
    b.loss_after.push_back(set_loss(net, large_targets()) / target_power(large_targets()));
  }
  return b;
}

/// The outcomes of both runs (defined after the runs).
RunResult schedule_outcomes(const ScheduleRun& r, std::string setup);

// ---------------------------------------------------------------------------
// The broken run (the loop of both runs).

/// One run; `count_skipped` is the broken schedule (advance every iteration).
ScheduleRun schedule_run(bool count_skipped) {
  Mlp net(schedule_net(DType::f16));
  AdamW opt(net.parameters(), schedule_adam());
  Batches batches(large_targets(), kScheduleBatch, kBatchSeed);
  GradScaler scaler;
  int scheduler_count = 0;  // the scheduler's own step counter
  ScheduleRun r;
  for (int it = 1; it <= kScheduleIterations; ++it) {
    const Eigen::VectorXd before = r.first_update == 0 ? weights_of(net) : Eigen::VectorXd();
    scaled_backward(net, opt, batches, scaler);  // forward, S * loss, backward
    const float scale_used = scaler.get_scale();
    const int position = scheduler_count;              // the schedule value this iteration's step uses
    const std::int64_t adam_steps = opt.step_count();  // for the outcomes: did this iteration step?
    if (count_skipped) {
      //! [init-scale-skips-broken]
      scaler.step(opt);
      scaler.update();
      opt.set_lr(warmup_lr(++scheduler_count));  // scheduler.step(): every iteration
      //! [init-scale-skips-broken]
    } else {
      //! [init-scale-skips-fixed]
      // In PyTorch scaler.step() returns what optimizer.step() returned
      // (usually None), so its value cannot tell a skip. update() can: it
      // lowers the scale exactly when the step was skipped.
      const float scale_before = scaler.get_scale();
      scaler.step(opt);
      scaler.update();
      const bool skipped = scaler.get_scale() < scale_before;
      if (!skipped) opt.set_lr(warmup_lr(++scheduler_count));  // scheduler.step(): real steps only
      //! [init-scale-skips-fixed]
    }
    const bool stepped = opt.step_count() > adam_steps;
    if (!stepped) {
      ++r.skipped;
      if (r.first_update == 0) ++r.initial_skips;
    } else {
      if (r.first_update == 0) {
        r.first_update = it;
        r.first_lr = warmup_lr(position);
        r.scale = scale_used;
        r.first_step_size = (weights_of(net) - before).norm() / before.norm();
      }
      r.warmup_updates += position < kWarmupSteps;
      ++r.real_steps;
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
  static const ScheduleBaseline base = schedule_fp32();  // deterministic: train it once
  // FP32 after as many optimizer steps as this run took.
  const double base_final = base.loss_after[static_cast<std::size_t>(r.real_steps) - 1];
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
      {"first_step_size", r.first_step_size, "||W_after - W_before|| / ||W_before|| of the first real step"},
      {"fp32_first_step_size", base.first_step_size, "the same for the FP32 baseline's first step"},
      {"relative_loss", r.loss, "final MSE / mean target^2 (1: predicts 0)"},
      {"fp32_relative_loss", base_final,
       "the FP32 baseline (schedule from its first step) after as many steps"},
      {"loss_ratio", r.loss / base_final, "relative_loss / fp32_relative_loss"},
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
                              num(kWarmupSteps) +
                              " warmup values reached an optimizer step. That step moved the "
                              "weights " +
                              num(r.first_step_size / base.first_step_size) +
                              " times as far as FP32's first, and the loss ended at " +
                              num(r.loss / base_final) + " times FP32's after as many steps."
                        : "The same " + num(r.initial_skips) +
                              " skipped iterations, but the schedule only counts "
                              "steps that happened: the first real step ran at lr " +
                              num(r.first_lr) + " and all " + num(r.warmup_updates) +
                              " warmup values were used; the first step moved the weights " +
                              num(r.first_step_size / base.first_step_size) +
                              " times as far as FP32's first, and the loss ended at " +
                              num(r.loss / base_final) + " times FP32's after as many steps.";
  return out;
}

}  // namespace init_scale_skips
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall init_scale_skips_pitfall() {
  using namespace init_scale_skips;
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
          check("the first real step used a learning rate past the warmup's first value",
                [](const RunResult& r) {
                  return r.get("lr_at_first_update") > 1.0001 * kPeakLr / r.get("warmup_steps");
                }),
          check("warmup values were spent on skipped iterations",
                [](const RunResult& r) { return r.get("warmup_updates") < r.get("warmup_steps"); }),
          check("the first real step moved the weights more than twice as far as FP32's first step",
                [](const RunResult& r) {
                  return r.get("first_step_size") > 2 * r.get("fp32_first_step_size");
                }),
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
          check("the first real step is as large as FP32's first step (within 5%)",
                [](const RunResult& r) {
                  return within(r.get("first_step_size"), r.get("fp32_first_step_size"), 0.05);
                }),
          check("the loss ends within 10% of FP32's after as many optimizer steps",
                [](const RunResult& r) { return within(r.get("loss_ratio"), 1.0, 0.1); }),
      },
      {
          // The scaler is the same in both runs: only the schedule differs.
          check("at least 3 iterations in a row were skipped from the start",
                [](const RunResult& r) { return r.get("initial_skips") >= 3; }),
      }};
}

}  // namespace mpt::ch02
