// Chapters 02 onwards — a trainable network: a Sequential that owns its Context.
// Depends on: model.hpp, losses.hpp (the loss of trace_step).
#include "mpt/nn/model.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include "mpt/nn/layers/losses.hpp"

namespace mpt {

Model::Model(std::string name, std::shared_ptr<const Policy> policy, Eigen::Index inputs,
             MasterWeights master_weights)
    : name_(std::move(name)),
      ctx_(policy ? std::move(policy) : uniform_policy(DType::f32)),
      inputs_(inputs),
      master_weights_(master_weights) {}

void Model::finish() {
  keep_output_gradients(true);
  set_policy(ctx_.shared_policy());
}

void Model::set_policy(std::shared_ptr<const Policy> policy) {
  ctx_ = Context(std::move(policy));
  apply_policy(ctx_.policy());
  // Without masters the weights ARE the rounded copy from the start.
  if (master_weights_ == MasterWeights::none)
    for (Parameter* p : parameters()) p->master = p->weights().to(DType::f32);
}

void Model::set_master_weights(MasterWeights m) {
  master_weights_ = m;
  if (master_weights_ == MasterWeights::none)
    for (Parameter* p : parameters()) p->master = p->weights().to(DType::f32);
}

const Tensor& Model::forward(const MatrixF& x) {
  if (inputs_ > 0 && x.cols() != inputs_)
    throw std::invalid_argument(name_ + "::forward: x has " + std::to_string(x.cols()) +
                                " columns, the network takes " + std::to_string(inputs_));
  out_ = Sequential::forward(Tensor::from_matrix(x, DType::f32), ctx_);
  // A policy with an output dtype (jmp's) casts the output where it leaves
  // the model; backward() casts the gradient back at the last layer.
  if (const std::optional<DType> o = ctx_.policy().model_output_dtype())
    out_ = ctx_.cast(out_, *o, "output", Phase::forward, "y");
  have_forward_ = true;
  return out_;
}

void Model::backward(const Tensor& dout) {
  if (!have_forward_) throw std::logic_error(name_ + "::backward: call forward() first");
  if (dout.shape() != out_.shape())
    throw std::invalid_argument(name_ + "::backward: the gradient is " + shape_string(dout.shape()) +
                                " but the output is " + shape_string(out_.shape()));
  (void)Sequential::backward(dout, ctx_);
}

RefreshStats Model::refresh_model_copies() {
  RefreshStats st;
  for (Parameter* p : parameters()) st += p->refresh(master_weights_);
  return st;
}

std::size_t Model::activation_bytes() const {
  std::vector<const Tensor*> kept = saved();
  kept.push_back(&out_);
  return distinct_bytes(kept);
}

Trace trace_step(Model& net, const MatrixF& x, const std::vector<int>& labels, bool forward_only) {
  Trace trace;
  Context& ctx = net.context();
  Trace* before = ctx.trace();
  ctx.set_trace(&trace);
  try {
    const Tensor& logits = net.forward(x);
    (void)cross_entropy_loss(logits, labels, ctx);
    if (!forward_only) net.backward(cross_entropy_backward(logits, labels, 1.0f, ctx));
  } catch (...) {
    ctx.set_trace(before);
    throw;
  }
  ctx.set_trace(before);
  return trace;
}

}  // namespace mpt
