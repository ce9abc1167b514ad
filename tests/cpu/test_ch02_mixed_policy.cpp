// Chapter 02 — precision as data: the MLP trained with a mixed policy (fc3
// kept in FP32 inside an f16 model), and the precision trace that shows it.
// Depends on: mpt/nn/models/mlp.hpp, losses.hpp, data.hpp, mpt/optim/sgd.hpp,
// mpt/amp/grad_scaler.hpp, the core tier (policies, trace).
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "mpt/amp/grad_scaler.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/sgd.hpp"

using namespace mpt;

namespace {

std::shared_ptr<const Policy> keep_fc3_f32() {
  return std::make_shared<KeepF32Policy>(uniform_policy(DType::f16), std::vector<std::string>{"fc3"});
}

MlpConfig config(DType d, std::shared_ptr<const Policy> policy = nullptr) {
  MlpConfig c;
  c.sizes = {8, 32, 32, 4};
  c.dtype = d;
  c.seed = 7;
  c.policy = std::move(policy);
  return c;
}

struct Trained {
  double accuracy = 0, loss = 0;
  std::size_t casts_per_step = 0;
  int skipped = 0;
};

/// SGD with momentum on the blobs, a GradScaler when the model stores f16.
Trained train(Mlp& net, bool scaled, int steps = 150) {
  BlobsOptions bo;
  bo.samples = 1024;
  const Split data = train_test_split(make_blobs(bo), 0.25, 5);
  SgdOptions so;
  so.lr = 0.05;
  so.momentum = 0.9;
  SGD opt(net.parameters(), so);
  GradScaler::Options go;
  go.enabled = scaled;
  GradScaler scaler(go);
  Trained r;
  for (int step = 0; step < steps; ++step) {
    const Dataset b = data.train.slice((step * 64) % 704, 64);
    net.context().reset_casts();
    const Tensor& out = net.forward(b.x);
    (void)scaler.scale(cross_entropy_loss(out, b.labels));
    opt.zero_grad();
    net.backward(cross_entropy_backward(out, b.labels, scaler.get_scale()));
    r.casts_per_step = net.context().casts().casts;
    r.skipped += !scaler.step(opt);
    scaler.update();
    net.refresh_model_copies();
  }
  r.accuracy = accuracy(net.forward(data.test.x), data.test.labels);
  r.loss = cross_entropy_loss(net.forward(data.train.x), data.train.labels);
  return r;
}

}  // namespace

TEST_CASE("an f16 MLP with fc3 kept in FP32 trains like FP32, and its parameters say so") {
  Mlp base(config(DType::f32));
  Mlp uniform(config(DType::f16));
  Mlp mixed(config(DType::f16, keep_fc3_f32()));
  // The policy gave every parameter its model copy's dtype.
  for (Parameter* p : mixed.parameters()) {
    CAPTURE(p->name);
    const bool in_fc3 = p->name.rfind("fc3.", 0) == 0;
    CHECK(p->model_dtype() == (in_fc3 ? DType::f32 : DType::f16));
    CHECK(p->model_bytes() == (in_fc3 ? 0 : 2 * static_cast<std::size_t>(p->master.numel())));
  }
  const Trained r32 = train(base, false), r16 = train(uniform, true), rmix = train(mixed, true);
  MESSAGE("test accuracy fp32 " << r32.accuracy << ", f16 " << r16.accuracy << ", f16 with fc3 in f32 "
                                << rmix.accuracy << "; casts per step " << r32.casts_per_step << " / "
                                << r16.casts_per_step << " / " << rmix.casts_per_step);
  CHECK(rmix.accuracy > 0.8);
  CHECK(std::fabs(rmix.accuracy - r32.accuracy) <= 0.02);
  CHECK(std::fabs(rmix.loss - r32.loss) <= 0.05 * r32.loss);
  // What each step costs in casts: none in FP32; the input in uniform f16;
  // and the island's two boundaries (fc3's input up, its input gradient
  // down) on top of that in the mixed model.
  CHECK(r32.casts_per_step == 0);
  CHECK(r16.casts_per_step == 1);
  CHECK(rmix.casts_per_step == 3);
  // The logits come out of the FP32 island in FP32.
  CHECK(mixed.forward(MatrixF::Zero(2, 8)).dtype() == DType::f32);
  CHECK(uniform.forward(MatrixF::Zero(2, 8)).dtype() == DType::f16);
}

TEST_CASE("the trace of the mixed MLP shows fc3 in FP32, the rest in f16, and every cast") {
  Mlp net(config(DType::f16, keep_fc3_f32()));
  const MatrixF x = MatrixF::Constant(4, 8, 0.5f);
  const std::vector<int> y{0, 1, 2, 3};
  const Trace t = trace_step(net, x, y);
  CHECK_FALSE(net.context().tracing());  // the trace was detached afterwards
  std::vector<std::string> casts;
  for (const TraceEntry& e : t.entries()) {
    if (e.op == "cast") {
      casts.push_back(std::string(phase_name(e.phase)) + " " + e.path + " " +
                      std::string(dtype_name(e.inputs[0].dtype)) + "->" +
                      std::string(dtype_name(e.outputs[0].dtype)));
      continue;
    }
    CAPTURE(e.path + " " + e.op + " " + phase_name(e.phase));
    CHECK(e.compute == DType::f32);
    if (e.op == "cross_entropy") continue;
    const DType want = e.path == "fc3" ? DType::f32 : DType::f16;
    for (const TracedValue& v : e.inputs) CHECK(v.dtype == want);
    for (const TracedValue& v : e.outputs) CHECK(v.dtype == want);
  }
  const std::vector<std::string> expected{"forward fc1 f32->f16", "forward fc3 f16->f32",
                                          "backward fc3 f32->f16"};
  CHECK(casts == expected);
  CHECK(t.casts() == 3);
  // Bytes written are the outputs' real sizes: fc2's forward writes 4x32 f16.
  bool saw_fc2 = false;
  for (const TraceEntry& e : t.entries())
    if (e.path == "fc2" && e.op == "linear" && e.phase == Phase::forward) {
      saw_fc2 = true;
      CHECK(e.bytes_written() == 4 * 32 * 2);
    }
  CHECK(saw_fc2);
  // The forward-only trace stops at the loss.
  const Trace f = trace_step(net, x, y, true);
  CHECK(f.entries().back().op == "cross_entropy");
  for (const TraceEntry& e : f.entries()) CHECK(e.phase == Phase::forward);
}
