// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: what the
// chapter's training runs share (the pitfalls running-stats-fp16 and
// bn-skipped-step-not-skipped).
// Depends on: ../02-loss-scaling/training.hpp (Batches, kBatchSeed, the data
// sets), mpt/amp/grad_scaler.hpp, mpt/core/context.hpp, mpt/core/policy.hpp,
// mpt/core/random.hpp, mpt/core/tensor.hpp, mpt/nn/layers/activations.hpp (ReLU),
// mpt/nn/layers/batch_norm.hpp, mpt/nn/layers/linear.hpp, mpt/nn/layers/losses.hpp,
// mpt/nn/module.hpp (Sequential), mpt/optim/sgd.hpp; <cmath>, <cstddef>,
// <cstdint>, <memory>, <string>, <utility>, <vector>.
//
// A small MLP with BatchNorm as tabular models use it: a BatchNorm on the raw
// input features (bn0), then Linear → BatchNorm → ReLU blocks and a Linear
// head, trained with SGD and Chapter 2's GradScaler exactly as Chapter 2's
// runs (forward, scale, backward from S, step, update, refresh the model
// copies). The precision comes from the policy alone: uniform f16 is
// model.half(), KeepF32Policy by op "batch_norm" is apex's
// keep_batchnorm_fp32. The batches reach the model in the dtype the run
// says (an fp16 run's data loader hands it x.half()). Everything is inline in
// namespace mpt::ch03.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../02-loss-scaling/training.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/nn/layers/activations.hpp"
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/layers/linear.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/module.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ch03 {

using ch02::Batches;
using ch02::kBatchSeed;

/// bn0 (on the inputs), then fc{i} → bn{i} → relu{i} for every hidden size,
/// and the head fc{L}: sizes {inputs, hidden..., classes}. The Linear layers
/// are initialised as PyTorch's (Rng(seed), in order); every BatchNorm gets
/// `options`.
inline Sequential bn_mlp(const std::vector<int>& sizes, std::uint64_t seed,
                         const BatchNorm::Options& options) {
  Sequential net;
  Rng rng(seed);
  net.emplace<BatchNorm>("bn0", sizes.front(), options).set_input_grad(false);  // the input is data: no dx
  for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
    const std::string i = std::to_string(l + 1);
    net.emplace<Linear>("fc" + i, sizes[l], sizes[l + 1], rng);
    if (l + 2 == sizes.size()) break;
    net.emplace<BatchNorm>("bn" + i, sizes[l + 1], options);
    net.emplace<ReLU>("relu" + i);
  }
  return net;
}

/// Every BatchNorm of a Sequential (direct children), in order.
inline std::vector<BatchNorm*> batch_norms(Sequential& net) {
  std::vector<BatchNorm*> out;
  for (std::size_t i = 0; i < net.size(); ++i)
    if (auto* bn = dynamic_cast<BatchNorm*>(&net.child(i))) out.push_back(bn);
  return out;
}

/// A training run of a bn_mlp: the network, its Context (the policy), SGD
/// with momentum 0.9, the batches and the dtype batches are handed over in.
struct BnRun {
  Sequential net;   ///< bn_mlp(sizes, seed, options), the policy applied
  Context ctx;      ///< the policy every op asks
  SGD opt;          ///< SGD, momentum 0.9, learning rate lr
  Batches batches;  ///< batches of `batch` rows of the training set, kBatchSeed
  DType input;      ///< the dtype the batches are handed to the model in
  /// A fresh run on `train` with `policy`, inputs in `input`.
  BnRun(const Dataset& train, const std::vector<int>& sizes, std::uint64_t seed,
        const BatchNorm::Options& options, std::shared_ptr<const Policy> policy, DType input_dtype, double lr,
        Eigen::Index batch)
      : net(bn_mlp(sizes, seed, options)),
        ctx(std::move(policy)),
        opt(net.parameters(),
            [lr] {
              SgdOptions o;
              o.lr = lr;
              o.momentum = 0.9;
              return o;
            }()),
        batches(train, batch, kBatchSeed),
        input(input_dtype) {
    net.apply_policy(ctx.policy());
  }
  /// The batch's inputs as the model receives them.
  Tensor inputs(const MatrixF& x) const { return Tensor::from_matrix(x, input); }
};

/// What one training step saw.
struct StepResult {
  bool stepped = true;      ///< the optimizer step ran (false: the scaler skipped it)
  double accuracy = 0;      ///< accuracy on the batch, in training mode (batch statistics)
  bool finite_loss = true;  ///< the batch's loss was finite
};

/// One loss-scaled training step on batch `b`: forward in training mode,
/// S·loss, backward from S, scaler.step (skipped on inf/NaN), update, and
/// the refresh of every model copy. A scaler that is not enabled gives the
/// plain FP32 step.
inline StepResult scaled_step(BnRun& run, GradScaler& scaler, const Dataset& b) {
  StepResult r;
  run.net.train();
  const Tensor out = run.net.forward(run.inputs(b.x), run.ctx);
  const float loss = cross_entropy_loss(out, b.labels);
  r.finite_loss = std::isfinite(loss);
  r.accuracy = accuracy(out, b.labels);
  (void)scaler.scale(loss);
  run.opt.zero_grad();
  run.net.backward(cross_entropy_backward(out, b.labels, scaler.get_scale()), run.ctx);
  r.stepped = scaler.step(run.opt);
  scaler.update();
  for (Parameter* p : run.net.parameters()) p->refresh();
  return r;
}

/// A GradScaler that is a pass-through (the FP32 baselines).
inline GradScaler no_scaler() {
  GradScaler::Options o;
  o.enabled = false;
  return GradScaler(o);
}

/// The accuracy on `d` in eval mode (running estimates), the logits that
/// were not finite and how many classes were predicted; the run is back in
/// training mode afterwards.
struct Evaluation {
  double accuracy = 0;           ///< on d, eval mode
  double nonfinite = 0;          ///< logits that are inf or NaN
  double classes_predicted = 0;  ///< distinct classes among the predictions (argmax of the logits)
};
/// See Evaluation.
inline Evaluation evaluate(BnRun& run, const Dataset& d) {
  run.net.eval();
  const Tensor out = run.net.forward(run.inputs(d.x), run.ctx);
  run.net.train();
  Evaluation e;
  e.accuracy = accuracy(out, d.labels);
  const MatrixF z = out.to_matrix();
  e.nonfinite = static_cast<double>((!z.array().isFinite()).count());
  std::vector<bool> seen(static_cast<std::size_t>(z.cols()), false);
  for (Eigen::Index i = 0; i < z.rows(); ++i) {
    Eigen::Index arg = 0;
    z.row(i).maxCoeff(&arg);
    seen[static_cast<std::size_t>(arg)] = true;
  }
  for (bool s : seen) e.classes_predicted += s;
  return e;
}

/// Running estimates (means and variances of every BatchNorm) that are inf or NaN.
inline double nonfinite_running_stats(BnRun& run) {
  double n = 0;
  for (BatchNorm* bn : batch_norms(run.net))
    for (const Tensor* t : {&bn->running_mean, &bn->running_var})
      for (std::int64_t i = 0; i < t->numel(); ++i) n += !std::isfinite(t->value(i));
  return n;
}

}  // namespace mpt::ch03
