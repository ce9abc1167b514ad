// Chapter 02 — loss scaling and FP32 master weights: what the chapter's
// programs share (the pitfalls, pitfalls/*.cpp, numbers.cpp, and the Chapter 2
// notebook, which includes it through a Cling include path to this folder).
// Depends on: the Chapter 2 training stack (mpt/data.hpp, layers.hpp, mlp.hpp,
// optim.hpp).
//
// The batching, the training steps every run repeats, the chapter's one
// definition of a zero fraction, the blobs classification set, the real
// digits set, and the tiny-target regression run that the pitfall
// no-loss-scaling trains and that numbers.cpp's paper figure collects its
// activation gradients from: one definition, so the figure shows the
// gradients of exactly the run the pitfall compares with (and, for the
// digits, of the run the pitfall clip-before-unscale compares with).
// Everything is inline in namespace mpt::ch02, so the pitfalls' files share
// one copy (one blobs(), one digits() and one tiny_targets() per process).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "mpt/nn/data/data.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/adamw.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ch02 {

/// Mini-batches from a fresh seeded permutation each epoch (the library's,
/// mpt/nn/data/data.hpp, where `mpt train` finds it too).
using mpt::Batches;
/// The batch order's seed, the same in every run.
inline constexpr std::uint64_t kBatchSeed = 1234;

/// An MLP configuration: layer sizes, the precision of its activations and
/// gradients, and the seed of its initial weights.
inline MlpConfig mlp_config(std::vector<int> sizes, DType p, std::uint64_t seed) {
  MlpConfig c;
  c.sizes = std::move(sizes);
  c.dtype = p;
  c.seed = seed;
  return c;
}

// --- the zero fraction ---------------------------------------------------------

/// What the chapter calls the zero fraction, wherever it reports one; the
/// programs print this sentence next to the number.
inline constexpr const char* kZeroFractionDefinition =
    "exact zeros among the dense activation gradients (dlogits and the gradient w.r.t. each "
    "activation's output; those behind a ReLU, zero in every precision, left out), pooled over "
    "all steps";

/// The dense tensors of Mlp::activation_gradients() (dlogits, then per
/// hidden layer d(activation output) and d(pre-activation)): dlogits and
/// every d(activation output), indices 0, 1, 3, 5, ... The d(pre-activation)
/// tensors sit behind a ReLU, which zeroes them wherever its input was
/// negative, in every precision.
inline std::vector<const Tensor*> dense_activation_gradients(const Mlp& net) {
  const std::vector<Tensor>& g = net.activation_gradients();
  std::vector<const Tensor*> out;
  for (std::size_t k = 0; k < g.size(); k += (k == 0 ? 1 : 2)) out.push_back(&g[k]);
  return out;
}

/// The zero fraction (kZeroFractionDefinition) of a run: add() the network
/// after each backward pass, read fraction() at the end.
class ZeroFraction {
 public:
  /// Count the zeros of the last backward pass's dense activation gradients.
  void add(const Mlp& net) {
    for (const Tensor* t : dense_activation_gradients(net)) add(t->to_matrix());
  }
  /// Count the zeros of one tensor's values (already chosen as dense).
  void add(const MatrixF& values) {
    zeros_ += static_cast<double>((values.array() == 0.0f).count());
    values_ += static_cast<double>(values.size());
  }
  /// Zeros over all values counted, pooled; 0 before anything was added.
  double fraction() const { return values_ > 0 ? zeros_ / values_ : 0.0; }
  /// Values counted.
  double values() const { return values_; }

 private:
  double zeros_ = 0, values_ = 0;
};

// --- the largest gradient ------------------------------------------------------

/// The largest |value| among the gradients of the last backward pass: every
/// activation gradient (stored in the activations' dtype) and every
/// parameter's FP32 gradient (sums of gradients rounded into the weights'
/// dtype). Read before unscaling, it is what a loss-scaled step must fit into
/// fp16; inf or NaN when one of them is.
inline double largest_gradient(Model& net) {
  double m = 0;
  const auto take = [&m](const MatrixF& g) {
    if (!g.array().isFinite().all()) m = std::numeric_limits<double>::infinity();
    else if (g.size() > 0) m = std::max(m, static_cast<double>(g.cwiseAbs().maxCoeff()));
  };
  for (const Tensor& t : net.activation_gradients()) take(t.to_matrix());
  for (const Parameter* p : net.parameters()) take(p->grad.f32());
  return m;
}

// --- one training step -------------------------------------------------------

/// The loss of one batch: cross-entropy for a classification set, MSE otherwise.
inline float batch_loss(const Tensor& out, const Dataset& b) {
  return b.is_classification() ? cross_entropy_loss(out, b.labels) : mse_loss(out, b.targets);
}
/// Its gradient, from dloss (1, or the loss scale S).
inline Tensor batch_loss_backward(const Tensor& out, const Dataset& b, float dloss = 1.0f) {
  return b.is_classification() ? cross_entropy_backward(out, b.labels, dloss)
                               : mse_backward(out, b.targets, dloss);
}

/// One training step without loss scaling, on the next batch: forward,
/// backward from dloss = 1, `inspect()` (it sees the fresh gradients), the
/// optimizer step, and the refresh of the fp16/bf16 model copy.
/// \return what refresh_model_copies() did.
template <class Inspect>
RefreshStats plain_step(Model& net, Optimizer& opt, Batches& batches, Inspect inspect) {
  const Dataset b = batches.next();
  const Tensor& out = net.forward(b.x);
  opt.zero_grad();
  net.backward(batch_loss_backward(out, b));
  inspect();
  opt.step();
  return net.refresh_model_copies();
}
/// The same step with nothing to inspect.
inline RefreshStats plain_step(Model& net, Optimizer& opt, Batches& batches) {
  return plain_step(net, opt, batches, [] {});
}

/// The loss-scaled forward and backward of the next batch: the scaler (a
/// GradScaler or a StaticScaler) scales the loss in FP32, and the backward
/// pass starts from its scale S, so every gradient comes out multiplied by S.
/// Unscaling, the step and update() are the caller's.
template <class Scaler>
void scaled_backward(Model& net, Optimizer& opt, Batches& batches, Scaler& scaler) {
  const Dataset b = batches.next();
  const Tensor& out = net.forward(b.x);
  (void)scaler.scale(batch_loss(out, b));
  opt.zero_grad();
  net.backward(batch_loss_backward(out, b, scaler.get_scale()));
}

// --- the tiny-target run ----------------------------------------------------

inline constexpr int kTinyTargetSteps = 200;           ///< optimizer steps of a tiny-target run
inline constexpr Eigen::Index kTinyTargetBatch = 128;  ///< its batch size
inline constexpr double kTinyTargetLr = 3e-4;          ///< its AdamW learning rate

/// The regression built for gradient underflow (data.hpp): targets of size
/// 1e-3 from a random teacher network, 512 samples.
inline const Dataset& tiny_targets() {
  static const Dataset d = make_tiny_target_regression();
  return d;
}
/// Mean squared target: the MSE of predicting zero, to make losses relative.
inline double target_power(const Dataset& d) { return d.targets.cast<double>().array().square().mean(); }

/// MLP 8-32-32-4 (ReLU) whose output layer starts at zero, so the output
/// starts at the targets' scale (data.hpp explains the choice).
inline Mlp tiny_target_net(DType p) {
  MlpConfig c = mlp_config({8, 32, 32, 4}, p, 3);
  c.zero_init_output = true;
  return Mlp(c);
}
/// AdamW (its update does not depend on the gradients' size, so FP32 trains
/// these tiny targets as it would large ones), no weight decay.
inline AdamW tiny_target_adam(Mlp& net) {
  AdamWOptions o;
  o.lr = kTinyTargetLr;
  o.weight_decay = 0.0;
  return AdamW(net.parameters(), o);
}
/// The network, optimizer and batches of one tiny-target run.
struct TinyTargetRun {
  Mlp net;          ///< tiny_target_net(p)
  AdamW opt;        ///< tiny_target_adam(net)
  Batches batches;  ///< batches of kTinyTargetBatch from tiny_targets()
  /// A fresh run in precision `p`.
  explicit TinyTargetRun(DType p)
      : net(tiny_target_net(p)),
        opt(tiny_target_adam(net)),
        batches(tiny_targets(), kTinyTargetBatch, kBatchSeed) {}
};

// --- the blobs -------------------------------------------------------------------

/// Gaussian blobs, 4 classes in 8 dimensions, split 768 / 256.
inline const Split& blobs() {
  static const Split s = [] {
    BlobsOptions o;
    o.samples = 1024;
    return train_test_split(make_blobs(o), 0.25, 5);
  }();
  return s;
}
inline const std::vector<int> kBlobsNet = {8, 32, 32, 4};  ///< the blobs classifier's layer sizes
inline constexpr std::uint64_t kBlobsSeed = 7;             ///< its initial weights' seed

// --- the digits -------------------------------------------------------------------

/// The real handwritten digits (1797 8x8 images, 10 classes; data.hpp),
/// split 1348 / 449. Loaded on first use; throws DataFileMissing, whose
/// message says how to fetch the file, when it is absent.
inline const Split& digits() {
  static const Split s = train_test_split(load_digits(), 0.25, 5);
  return s;
}
inline const std::vector<int> kDigitsNet = {64, 32, 32, 10};  ///< the digits classifier's layer sizes
inline constexpr std::uint64_t kDigitsSeed = 7;               ///< its initial weights' seed
inline constexpr int kDigitsSteps = 200;          ///< steps of a digits run (clip-before-unscale, the figure)
inline constexpr Eigen::Index kDigitsBatch = 64;  ///< its batch size
inline constexpr double kDigitsLr = 0.05;         ///< its SGD learning rate (momentum 0.9)

// --- SGD runs of a classifier ------------------------------------------------------

/// An SGD run of a classifier: the data, the network, its optimizer and its
/// batches.
struct SgdRun {
  const Split* data;  ///< the set it trains on (train) and is tested on (test)
  Mlp net;            ///< `sizes` in precision p, weights from `seed`
  SGD opt;            ///< SGD, momentum 0.9, learning rate lr
  Batches batches;    ///< batches of `batch` from data->train, kBatchSeed
  /// A fresh run on `d`: layer sizes `sizes`, weights from `seed`,
  /// precision `p`, learning rate `lr`, batch size `batch`, master weights `mw`.
  SgdRun(const Split& d, const std::vector<int>& sizes, std::uint64_t seed, DType p, double lr,
         Eigen::Index batch, MasterWeights mw = MasterWeights::fp32)
      : data(&d),
        net([&] {
          MlpConfig c = mlp_config(sizes, p, seed);
          c.master_weights = mw;
          return c;
        }()),
        opt(net.parameters(),
            [lr] {
              SgdOptions o;
              o.lr = lr;
              o.momentum = 0.9;
              return o;
            }()),
        batches(d.train, batch, kBatchSeed) {}
};

/// An SGD run on the blobs (kBlobsNet, kBlobsSeed).
struct BlobsRun : SgdRun {
  /// A fresh run: precision `p`, learning rate `lr`, batch size `batch`,
  /// master weights `mw`.
  BlobsRun(DType p, double lr, Eigen::Index batch, MasterWeights mw = MasterWeights::fp32)
      : SgdRun(blobs(), kBlobsNet, kBlobsSeed, p, lr, batch, mw) {}
};

/// An SGD run on the real digits (kDigitsNet, kDigitsSeed); throws
/// DataFileMissing, with the fetch commands, when the file is absent.
struct DigitsRun : SgdRun {
  /// A fresh run: precision `p`, learning rate `lr`, batch size `batch`,
  /// master weights `mw`.
  DigitsRun(DType p, double lr = kDigitsLr, Eigen::Index batch = kDigitsBatch,
            MasterWeights mw = MasterWeights::fp32)
      : SgdRun(digits(), kDigitsNet, kDigitsSeed, p, lr, batch, mw) {}
};

// --- the static-scale run ------------------------------------------------------------

/// The run of the pitfall static-scale-too-large (and of ch02_numbers
/// grad-growth): a BlobsRun in fp16 with a loss scale of 2^18 from step 1.
inline constexpr float kStaticScale = 262144.0f;  ///< 2^18
inline constexpr int kStaticSteps = 200;          ///< its iterations
inline constexpr Eigen::Index kStaticBatch = 64;  ///< its batch size
inline constexpr double kStaticLr = 0.05;         ///< its SGD learning rate

}  // namespace mpt::ch02
