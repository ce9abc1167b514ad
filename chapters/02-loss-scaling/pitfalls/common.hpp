// Chapter 02 — loss scaling and FP32 master weights: what the chapter's
// pitfalls share, and the declarations of their registry entries.
// Depends on: ../training.hpp (Batches, the runs SgdRun, BlobsRun,
// DigitsRun, the data sets), mpt/registry/pitfall.hpp (Check, Pitfall, RunResult), mpt/nn/data/data.hpp
// (Dataset), mpt/nn/models/mlp.hpp (Mlp), mpt/optim/sgd.hpp (SGD); <functional>,
// <string>.
//
// One file per pitfall, pitfalls/<id>.cpp: its broken run, its fixed run,
// their outcomes and its checks, ending with the function that returns its
// registry entry (declared here, called by pitfalls/register.cpp). What more
// than one pitfall uses is here and in common.cpp (the data sets and the
// training steps are in training.hpp, which numbers.cpp shares); the rest
// stays in its pitfall's file.
//
// Every run trains a small MLP on one of the synthetic sets of data.hpp or,
// for clip-before-unscale, on the real digits (the file tools/fetch_digits.sh
// fetches; a missing file is an error that says how to fetch it), seeded, in
// a fraction of a second. Each pitfall also
// trains an FP32 baseline where its checks need one ("tracks FP32"), with the
// same seed, batches and hyperparameters; a baseline is deterministic, so it
// is trained once per process and shared by the broken and the fixed run.
// The `//! [id-broken]` / `//! [id-fixed]` markers in each pitfall's file
// delimit the code the chapter text shows (its snippet blocks, written by
// chapters/generate_common.sh).
#pragma once

#include <functional>
#include <string>

#include "../training.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/sgd.hpp"
#include "mpt/registry/pitfall.hpp"

namespace mpt::ch02 {

// ---------------------------------------------------------------------------
// Small tools shared by the runs.

/// A number for generated text: up to 6 significant digits.
std::string num(double v);
/// A percentage with one decimal: 0.9426 -> "94.3%".
std::string pct(double fraction);

/// The loss over a whole set, one forward pass (batch_loss: training.hpp).
double set_loss(Mlp& net, const Dataset& d);
/// The accuracy over a whole set, one forward pass.
double set_accuracy(Mlp& net, const Dataset& d);

/// Master weights that are inf or NaN.
double nonfinite_weights(Mlp& net);

/// A check of an entry. Each check reads outcomes by name, so a renamed
/// outcome makes the check fail loudly instead of silently passing.
Check check(std::string claim, std::function<bool(const RunResult&)> holds);
/// |x - target| <= rel * |target|.
bool within(double x, double target, double rel);

// ---------------------------------------------------------------------------
// The chapter's registry entries, one per pitfalls/<id>.cpp, in the order
// pitfalls/register.cpp registers them.

/// no-loss-scaling: the small gradients of a regression with tiny targets
/// flush to zero in fp16 and the hidden layers stop learning.
Pitfall no_loss_scaling_pitfall();
/// static-scale-too-large: a constant scale that fits the early gradients
/// overflows once they grow; without skipping, the inf reaches the weights.
Pitfall static_scale_too_large_pitfall();
/// update-forgotten: without update() the scaler's per-optimizer state is
/// never reset, and the next iteration's step() refuses to run.
Pitfall update_forgotten_pitfall();
/// clip-before-unscale: clipping measures the norm of the scaled gradients,
/// S times the true norm, and clips (almost) every step to max_norm / S.
Pitfall clip_before_unscale_pitfall();
/// accumulation-unscale: accumulated gradients must stay scaled until the
/// last micro-batch is in.
Pitfall accumulation_unscale_pitfall();
/// fp16-weights-no-master: without FP32 master weights, updates below half
/// an fp16 ulp of their weight are lost.
Pitfall fp16_weights_no_master_pitfall();
/// init-scale-skips: the iterations skipped while the scale falls from 2^16
/// still advance a schedule that counts iterations.
Pitfall init_scale_skips_pitfall();
/// adam-eps-fp16: AdamW with fp16 state: eps = 1e-8 is 0 and v underflows,
/// so the update divides by zero.
Pitfall adam_eps_fp16_pitfall();
/// resume-without-scaler-state: a checkpoint without scaler.state_dict()
/// resumes at 2^16 with a tracker of 0, and skips iterations again.
Pitfall resume_without_scaler_state_pitfall();

}  // namespace mpt::ch02
