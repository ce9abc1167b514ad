// Chapter 06 — pitfall half-under-autocast: `model.half()` inside torch.autocast
// Depends on: common.hpp (check, num, this entry's declaration),
// mpt/core/autocast.hpp (AutocastPolicy), mpt/core/context.hpp,
// mpt/core/policy.hpp, mpt/core/trace.hpp, mpt/nn/layers/softmax.hpp (cross_entropy),
// mpt/core/random.hpp, mpt/nn/models/transformer.hpp, mpt/optim/sgd.hpp, mpt/core/tensor.hpp (widened);
// <algorithm>, <cmath>, <cstddef>, <memory>, <set>, <string>, <vector>.
//
// Autocast is meant for an FP32 model: it casts each op's inputs to what
// the op's list asks for, and keeps the FP32-to-fp16 casts of the weights in
// a cache for the rest of the step, so backward reuses what forward cast.
// Calling `.half()` on the model as well (or on its inputs) undoes both
// halves of that design:
//  - the fp32-list ops (layer_norm here) receive fp16 inputs: the residual
//    stream that feeds them, an FP32 add of FP32 values in the FP32 model,
//    is now an add of fp16 values stored in fp16, so the norms normalise
//    values that were rounded to 11 bits before autocast could widen them;
//  - the f16 γ and β of every layer norm are cast to FP32 at each call,
//    forward and backward, every step: autocast's cache keeps only the casts
//    of FP32 leaves to a lower precision, so nothing of these casts is
//    reused; meanwhile the casts it would cache (the Linear weights) have
//    disappeared, because the weights are fp16 already.
// Two training steps of Chapter 4's tiny Transformer, traced, under CUDA
// autocast: the FP32 model (the fix) and the same model after `.half()`
// (no FP32 masters: the optimizer updates the fp16 weights). The counts
// come from the precision trace.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common.hpp"
#include "mpt/core/autocast.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/nn/layers/softmax.hpp"
#include "mpt/nn/models/transformer.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ch06 {
namespace {
namespace half_under_autocast {

constexpr int kBatch = 4, kTokens = 8, kVocab = 32, kSteps = 2;

//! [half-under-autocast-broken]
// with torch.autocast("cuda", dtype=torch.float16): ... on a model.half()
// CUDA autocast's op decisions; every parameter stored in fp16.
class HalfModelUnderAutocast final : public Policy {
 public:
  std::string describe() const override { return "autocast cuda f16 on a model.half()"; }

 protected:
  OpPrecision decide_op(const OpInfo&, const OpQuery& q) const override { return autocast_.decide(q); }
  DType parameter_dtype_of(const OpInfo&, std::string_view) const override { return DType::f16; }

 private:
  AutocastPolicy autocast_{AutocastDevice::cuda, DType::f16};
};
//! [half-under-autocast-broken]

struct Counts {
  double norm_param_casts = 0;  // casts of γ, β at layer_norm, per step
  double norm_calls = 0;        // layer_norm forward calls, per step
  double norm_f16_inputs = 0;   // of them, calls whose x arrived in f16
  double cached = 0;            // weight casts the cache saved, per step
  double weight_casts = 0;      // casts of Linear/embedding weights, per step
  double losses_finite = 1;
  double logits_error = 0;  // first step: max |logit − FP32's| / max |FP32's logit|
};

// A cast of γ or β: a parameter cast at the path of a layer_norm.
bool is_norm_param(const TraceEntry& e, const std::set<std::string>& norms) {
  return e.op == "cast" && norms.count(e.path) > 0 && !e.inputs.empty() &&
         (e.inputs[0].name == "weight" || e.inputs[0].name == "bias");
}

TransformerConfig config(std::shared_ptr<const Policy> policy) {
  TransformerConfig c;
  c.vocab_size = kVocab;
  c.context = kTokens;
  c.d_model = 32;
  c.num_heads = 2;
  c.policy = std::move(policy);
  c.seed = 1;
  return c;
}

Counts run_steps(std::shared_ptr<const Policy> policy, bool masters) {
  TinyTransformer net(config(std::move(policy)));
  TinyTransformer fp32(config(uniform_policy(DType::f32)));
  if (!masters) net.set_master_weights(MasterWeights::none);
  SGD opt(net.parameters(), {1e-2});
  Rng rng(5);
  Counts k;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int> ids, targets;
    for (int i = 0; i < kBatch * kTokens; ++i) {
      ids.push_back(static_cast<int>(rng.below(kVocab)));
      targets.push_back(static_cast<int>(rng.below(kVocab)));
    }
    Trace trace;
    net.context().set_trace(&trace);
    const Tensor& logits = net.forward_tokens(ids, kBatch, kTokens);
    if (step == 0) {
      const std::vector<float> got = widened(logits),
                               ref = widened(fp32.forward_tokens(ids, kBatch, kTokens));
      double worst = 0, top = 0;
      for (std::size_t i = 0; i < ref.size(); ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - ref[i]));
        top = std::max(top, std::fabs(static_cast<double>(ref[i])));
      }
      k.logits_error = worst / top;
    }
    if (!std::isfinite(cross_entropy(logits, targets, {}, net.context()).value(0))) k.losses_finite = 0;
    Tensor dl(DType::f32, {});
    dl.f32_data()[0] = 1.0f;
    opt.zero_grad();
    net.backward(cross_entropy_backward(logits, targets, {}, dl, net.context()));
    net.context().set_trace(nullptr);
    opt.step();
    net.refresh_model_copies();
    std::set<std::string> norms;
    for (const TraceEntry& e : trace.entries())
      if (e.op == "layer_norm") norms.insert(e.path);
    for (std::size_t i = 0; i < trace.entries().size(); ++i) {
      const TraceEntry& e = trace.entries()[i];
      const bool norm_param = is_norm_param(e, norms);
      if (norm_param) ++k.norm_param_casts;
      if (e.op == "cached_cast") ++k.cached;
      if (e.op == "cast" && !norm_param && !e.inputs.empty() && e.inputs[0].name == "weight")
        ++k.weight_casts;
      if (e.op == "layer_norm" && e.phase == Phase::forward) {
        ++k.norm_calls;
        // Its x, if it arrived in another dtype, was cast just before it, at
        // its path (then γ and β, if they were cast).
        bool f16 = false;
        for (std::size_t j = i; j-- > 0 && !f16;) {
          const TraceEntry& b = trace.entries()[j];
          if (b.path != e.path || b.op != "cast") break;
          f16 = b.inputs[0].name == "x" && b.inputs[0].dtype == DType::f16;
        }
        k.norm_f16_inputs += f16;
      }
    }
  }
  for (double* v : {&k.norm_param_casts, &k.norm_calls, &k.norm_f16_inputs, &k.cached, &k.weight_casts})
    *v /= kSteps;
  return k;
}

RunResult result(const Counts& k, std::string setup) {
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"norm_calls", k.norm_calls, "layer_norm calls per step (forward)"},
      {"norm_f16_inputs", k.norm_f16_inputs,
       "of them, calls whose input x arrived in fp16 (layer_norm is on CUDA autocast's fp32 list)"},
      {"norm_param_casts", k.norm_param_casts,
       "casts of the layer norms' γ and β per step, none of them cached"},
      {"weight_casts", k.weight_casts, "casts of the Linear and embedding weights per step"},
      {"cached_casts", k.cached, "weight casts the autocast cache saved per step"},
      {"losses_finite", k.losses_finite, "1 when every step's loss is finite"},
      {"logits_error", k.logits_error,
       "first step: the largest logit error against the FP32 model's, over its largest |logit|"},
  };
  r.explanation = num(k.norm_f16_inputs) + " of " + num(k.norm_calls) +
                  " layer norms read fp16 inputs; γ and β are cast " + num(k.norm_param_casts) +
                  " times a step; the cache saves " + num(k.cached) + " casts a step.";
  return r;
}

RunResult broken_run() {
  return result(run_steps(std::make_shared<HalfModelUnderAutocast>(), false),
                "CUDA autocast in f16 on the tiny Transformer after model.half() (fp16 weights, no FP32 "
                "masters): 2 SGD steps of 4 sequences of 8 tokens, traced");
}

RunResult fixed_run() {
  //! [half-under-autocast-fixed]
  // the FP32 model under autocast: autocast decides, the weights stay FP32
  const std::shared_ptr<const Policy> policy =
      std::make_shared<AutocastPolicy>(AutocastDevice::cuda, DType::f16);
  //! [half-under-autocast-fixed]
  return result(run_steps(policy, true), "the same steps on the FP32 model under CUDA autocast in f16");
}

}  // namespace half_under_autocast
}  // namespace

Pitfall half_under_autocast_pitfall() {
  using namespace half_under_autocast;
  return Pitfall{
      "half-under-autocast",
      6,
      "model.half() under autocast: the fp32-list norms get fp16 inputs, and γ, β are cast at every call",
      "Autocast expects an FP32 model: it casts each op's inputs and caches the FP32-to-fp16 casts of the "
      "weights for the step. After .half() the residual stream is stored in fp16, so the layer norms "
      "autocast "
      "keeps in FP32 normalise values already rounded to fp16, and their fp16 γ and β are cast to FP32 at "
      "every "
      "call, forward and backward, with nothing cached. Leave the model in FP32 and let autocast cast.",
      broken_run,
      fixed_run,
      {
          check("every layer norm reads an fp16 input",
                [](const RunResult& r) {
                  return r.get("norm_calls") > 0 && r.get("norm_f16_inputs") == r.get("norm_calls");
                }),
          check("γ and β cast at each call, forward and backward (3 per norm per step)",
                [](const RunResult& r) { return r.get("norm_param_casts") == 3 * r.get("norm_calls"); }),
          check("the cache saves nothing", [](const RunResult& r) { return r.get("cached_casts") == 0; }),
      },
      {
          check("no layer norm reads an fp16 input",
                [](const RunResult& r) { return r.get("norm_calls") > 0 && r.get("norm_f16_inputs") == 0; }),
          check("γ and β are never cast", [](const RunResult& r) { return r.get("norm_param_casts") == 0; }),
          check("backward reuses forward's weight casts from the cache",
                [](const RunResult& r) { return r.get("cached_casts") > 0; }),
      },
      {
          check("both runs' losses are finite",
                [](const RunResult& r) { return r.get("losses_finite") == 1; }),
      }};
}

}  // namespace mpt::ch06
