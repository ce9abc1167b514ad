// Chapter 06 — pitfall o3-everything-fp16: apex O3 (`model.half()`), and what fails first on each model
// Depends on: common.hpp (check, num, pct, this entry's declaration),
// mpt/core/policy_string.hpp (O2, O3), mpt/core/random.hpp, mpt/core/tensor.hpp
// (widened), mpt/nn/models/cnn.hpp,
// mpt/nn/models/mlp.hpp, mpt/nn/models/transformer.hpp, mpt/nn/layers/softmax.hpp
// (cross_entropy), mpt/optim/sgd.hpp; <algorithm>, <cmath>, <cstdint>, <memory>,
// <string>, <vector>.
//
// apex's O3 is `model.half()`: fp16 weights, fp16 activations, no FP32
// masters and a loss scale of 1. Nothing overflows on the chapters' models,
// so the question "which op fails first" has a quieter answer. One training
// step of each model (Chapter 2's MLP, Chapter 3's CNN, Chapter 4's tiny
// Transformer) runs on the same weights and batch three times: in FP32, as
// the reference, under O3, and under O2 (fp16 model, FP32 masters, loss scale
// 2^16, PyTorch's initial scale). Two things are counted against FP32 in
// step order:
//  - backward: weight-gradient elements that FP32 computes as non-zero and
//    that arrive as exactly 0 (an fp16 dW below 2^-25, half of fp16's
//    smallest subnormal, rounds to 0 at a loss scale of 1);
//  - the update: elements whose FP32 master the step moves and whose weight
//    here stays where it was (an update below half an ulp of the fp16
//    weight: lost for good without a master).
// The first of the two that loses anything is what fails first. O2's masters
// keep every update, and its scale lifts the gradients out of the
// subnormals.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/nn/layers/softmax.hpp"
#include "mpt/nn/models/cnn.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/nn/models/transformer.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ch06 {
namespace {
namespace o3_everything_fp16 {

constexpr int kBatch = 8;
constexpr int kTokens = 8;
constexpr double kLr = 1e-3;  // torch.optim.SGD's default learning rate
// A fraction of lost updates below this is the FP32 masters' own rounding
// (the gradient reaches them through fp16, so a few land below half an FP32
// ulp where FP32's own run does not).
constexpr double kNegligible = 1e-3;

enum class Kind { mlp, cnn, transformer };
const char* name_of(Kind k) { return k == Kind::mlp ? "mlp" : k == Kind::cnn ? "cnn" : "transformer"; }

std::unique_ptr<Model> make(Kind k, const std::string& policy) {
  const std::shared_ptr<const Policy> p = parse_policy_string(policy).make();
  if (k == Kind::mlp) {
    MlpConfig c;
    c.sizes = {8, 32, 32, 4};
    c.policy = p;
    c.seed = 7;
    return std::make_unique<Mlp>(c);
  }
  if (k == Kind::cnn) {
    CnnConfig c;
    c.policy = p;
    c.seed = 3;
    return std::make_unique<Cnn>(c);
  }
  TransformerConfig c;
  c.vocab_size = 32;
  c.context = kTokens;
  c.d_model = 32;
  c.num_heads = 2;
  c.policy = p;
  c.seed = 1;
  return std::make_unique<TinyTransformer>(c);
}

struct Step {
  std::vector<std::vector<float>> grads;   // per parameter, unscaled, FP32
  std::vector<std::vector<float>> before;  // the masters (without masters: the fp16 weights themselves)
  std::vector<std::vector<float>> after;   // the same after the step and the refresh
  bool finite = true;                      // the loss
};

//! [o3-everything-fp16-broken]
// O3: model.half(), no FP32 masters, loss scale 1
Step step_of(Kind k, const std::string& policy, bool masters, float scale) {
  std::unique_ptr<Model> net = make(k, policy);
  if (!masters) net->set_master_weights(MasterWeights::none);
  //! [o3-everything-fp16-broken]
  Rng rng(11);
  const Tensor* logits = nullptr;
  std::vector<int> targets;
  if (k == Kind::transformer) {
    std::vector<int> ids;
    for (int i = 0; i < kBatch * kTokens; ++i) {
      ids.push_back(static_cast<int>(rng.below(32)));
      targets.push_back(static_cast<int>(rng.below(32)));
    }
    logits = &static_cast<TinyTransformer&>(*net).forward_tokens(ids, kBatch, kTokens);
  } else {
    const int in = k == Kind::mlp ? 8 : 64, classes = k == Kind::mlp ? 4 : 10;
    MatrixF x(kBatch, in);
    for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = static_cast<float>(rng.normal());
    for (int i = 0; i < kBatch; ++i) targets.push_back(static_cast<int>(rng.below(classes)));
    logits = &net->forward(x);
  }
  Step s;
  s.finite = std::isfinite(cross_entropy(*logits, targets, {}, net->context()).value(0));
  Tensor dl(DType::f32, {});
  dl.f32_data()[0] = scale;
  SGD opt(net->parameters(), {kLr});
  opt.zero_grad();
  net->backward(cross_entropy_backward(*logits, targets, {}, dl, net->context()));
  for (Parameter* p : net->parameters()) {
    float* g = p->grad.f32_data();
    for (std::int64_t i = 0; i < p->grad.numel(); ++i) g[i] /= scale;  // unscale
    s.grads.push_back(widened(p->grad));
    s.before.push_back(widened(p->master));
  }
  opt.step();
  net->refresh_model_copies();
  for (Parameter* p : net->parameters()) s.after.push_back(widened(p->master));
  return s;
}

struct Losses {
  double grad_elements = 0, underflowed = 0;  // backward: FP32 non-zero, here exactly 0
  double moved = 0, lost = 0;                 // update: FP32's master moved, this run's weight stayed put
  bool finite = true;
};

Losses compare(Kind k, const std::string& policy, bool masters, float scale) {
  const Step ref = step_of(k, "f32", true, 1.0f);
  const Step s = step_of(k, policy, masters, scale);
  Losses l;
  l.finite = s.finite;
  for (std::size_t p = 0; p < s.grads.size(); ++p)
    for (std::size_t i = 0; i < s.grads[p].size(); ++i) {
      const bool nonzero = ref.grads[p][i] != 0;
      l.grad_elements += nonzero;
      l.underflowed += nonzero && s.grads[p][i] == 0;
      // An update FP32 keeps (its master moved) that this run loses.
      if (ref.after[p][i] != ref.before[p][i]) {
        ++l.moved;
        l.lost += s.after[p][i] == s.before[p][i];
      }
    }
  return l;
}

RunResult run(const std::string& policy, bool masters, float scale, std::string setup) {
  RunResult r;
  r.setup = std::move(setup);
  std::string first;
  double all_finite = 1, worst_lost = 0, worst_underflow = 0;
  for (Kind k : {Kind::mlp, Kind::cnn, Kind::transformer}) {
    const Losses l = compare(k, policy, masters, scale);
    const std::string n = name_of(k);
    const double under = l.underflowed / l.grad_elements, lost = l.moved > 0 ? l.lost / l.moved : 0;
    r.outcomes.push_back(
        {n + "_grad_underflow", under,
         "of the weight-gradient elements FP32 computes as non-zero, the fraction that is 0 here"});
    r.outcomes.push_back({n + "_lost_updates", lost,
                          "of the elements FP32's step moves, the fraction whose weight stays put here"});
    all_finite = all_finite * (l.finite ? 1 : 0);
    worst_lost = std::max(worst_lost, lost);
    worst_underflow = std::max(worst_underflow, under);
    std::string what;
    if (under > 0) what = "backward first (" + num(100 * under) + "% of its weight gradients flush to 0)";
    if (lost >= kNegligible)
      what += (what.empty() ? "the update (" : ", then the update (") + pct(lost) + " of its updates lost)";
    if (what.empty()) what = "nothing (under 0.1% of its updates lost)";
    first += (first.empty() ? "" : "; ") + n + ": " + what;
  }
  r.outcomes.push_back(
      {"losses_finite", all_finite, "1 when every model's loss is finite (nothing overflows)"});
  r.outcomes.push_back(
      {"worst_lost_updates", worst_lost, "the largest lost-update fraction of the three models"});
  r.outcomes.push_back({"worst_grad_underflow", worst_underflow, "the largest gradient-underflow fraction"});
  r.explanation = "What fails first, in step order, with nothing overflowing: " + first + ".";
  return r;
}

}  // namespace o3_everything_fp16
}  // namespace

Pitfall o3_everything_fp16_pitfall() {
  using namespace o3_everything_fp16;
  return Pitfall{
      "o3-everything-fp16",
      6,
      "everything in fp16 (apex O3, model.half()): nothing overflows, and the updates are lost first",
      "O3 stores weights, activations and gradients in fp16 with no FP32 masters and a loss scale of 1. On "
      "the "
      "chapters' models no value overflows; what fails first is quieter: an SGD update below half an ulp of "
      "its "
      "fp16 weight rounds back to the old value and is lost for good, and small weight gradients flush to 0. "
      "O2 keeps FP32 masters (every update kept) and scales the loss.",
      [] {
        return run(
            "O3", false, 1.0f,
            "one SGD step (lr 1e-3) of the MLP, the CNN and the Transformer under O3: fp16 weights, no "
            "masters, loss scale 1; compared with FP32 on the same weights and batch");
      },
      [] {
        //! [o3-everything-fp16-fixed]
        // O2: an fp16 model with FP32 masters, loss scale 2^16
        return run("O2", true, 65536.0f, "the same step under O2: FP32 masters, loss scale 2^16");
        //! [o3-everything-fp16-fixed]
      },
      {
          check("some model loses updates: its fp16 weights do not move although the update is not 0",
                [](const RunResult& r) { return r.get("worst_lost_updates") > 0.01; }),
      },
      {
          check("under 0.1% of any model's updates are lost",
                [](const RunResult& r) { return r.get("worst_lost_updates") < kNegligible; }),
      },
      {
          check("nothing overflows: every model's loss is finite",
                [](const RunResult& r) { return r.get("losses_finite") == 1; }),
      }};
}

}  // namespace mpt::ch06
