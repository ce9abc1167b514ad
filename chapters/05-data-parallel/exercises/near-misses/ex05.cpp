// Chapter 05 — exercises: plausible wrong answers, one classic mistake per exercise.
// Depends on: ex05.hpp, the dist tier, the formats tier (storage.hpp), the nn
// and optim tiers, the C++ standard library.
// CI requires some points but not full marks on every exercise: proof that
// the tests separate close from right.
#include "ex05.hpp"

#include <cmath>
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/dist/ddp.hpp"
#include "mpt/dist/sharded.hpp"
#include "mpt/formats/storage.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ex05 {

// Mistake: sum first, average after, whatever the factor says (apex's
// predivide 1 always). Right in f32 and, for the world size 2 or 4, in
// f16/bf16 too as long as nothing overflows; an f16 sum of 40000s is inf,
// and a factor of 3 rounds differently.
void average_gradients(mpt::dist::Communicator& comm, std::vector<std::vector<float>>& grads,
                       mpt::DType comm_dtype, double predivide_factor) {
  using mpt::DType;
  if (comm_dtype != DType::f32 && comm_dtype != DType::f16 && comm_dtype != DType::bf16)
    throw std::invalid_argument("average_gradients: comm dtype must be f32, f16 or bf16");
  if (!(predivide_factor >= 0) || std::isinf(predivide_factor))
    throw std::invalid_argument("average_gradients: predivide_factor must be finite and >= 0");
  for (auto& g : grads) {
    const auto n = static_cast<std::int64_t>(g.size());
    if (comm_dtype == DType::f32) {
      comm.all_reduce(g.data(), n, DType::f32, mpt::dist::ReduceOp::sum);
    } else if (comm_dtype == DType::f16) {
      std::vector<Eigen::half> h(g.size());
      mpt::to_fp16(g.data(), h.data(), g.size());
      comm.all_reduce(h.data(), n, DType::f16, mpt::dist::ReduceOp::sum);
      mpt::from_fp16(h.data(), g.data(), g.size());
    } else {
      std::vector<Eigen::bfloat16> h(g.size());
      mpt::to_bf16(g.data(), h.data(), g.size());
      comm.all_reduce(h.data(), n, DType::bf16, mpt::dist::ReduceOp::sum);
      mpt::from_bf16(h.data(), g.data(), g.size());
    }
    for (float& x : g) x /= static_cast<float>(comm.size());
  }
}

// Mistake: the local check looks for infinities only. An overflow that
// produced a NaN (inf − inf, 0 × inf) on one rank steps every rank.
bool found_inf_across(mpt::dist::Communicator& comm, const std::vector<std::vector<float>>& grads_here) {
  float flag = 0.0f;
  for (const auto& g : grads_here)
    for (float x : g)
      if (std::isinf(x)) flag = 1.0f;
  comm.all_reduce(&flag, 1, mpt::DType::f32, mpt::dist::ReduceOp::max);
  return flag != 0.0f;
}

mpt::GradScaler::FoundInfReduction found_inf_seam(mpt::dist::Communicator& comm) {
  return [&comm](bool here) {
    float flag = here ? 1.0f : 0.0f;
    comm.all_reduce(&flag, 1, mpt::DType::f32, mpt::dist::ReduceOp::max);
    return flag != 0.0f;
  };
}

// Half a fix: every gradient is cleared now, but before each micro-batch's
// backward, so gradient accumulation keeps only the last micro-batch. Right
// with one batch a step.
void train_data_parallel(mpt::dist::Communicator& comm, mpt::Model& net, int steps, int micro_batches) {
  const mpt::Dataset data = mpt::make_blobs();
  mpt::Batches batches(data, 64, 1234);
  mpt::dist::DistributedDataParallel ddp(net, comm);
  const std::vector<mpt::Parameter*> params = net.parameters();
  mpt::dist::ShardedOptimizer zero(params, comm, [](std::vector<mpt::Parameter*> own) {
    return std::make_unique<mpt::SGD>(std::move(own), mpt::SgdOptions{0.05, 0.9});
  });
  mpt::dist::ShardedGradScaler scaler(comm);
  const float per_micro = 1.0f / static_cast<float>(micro_batches);
  for (int step = 0; step < steps; ++step) {
    comm.set_tag(step);
    for (int m = 0; m < micro_batches; ++m) {
      zero.zero_grad();
      const mpt::Dataset batch = batches.next();
      const auto [lo, hi] = mpt::dist::shard_rows(batch.size(), comm.rank(), comm.size());
      const mpt::Dataset shard = batch.slice(lo, hi - lo);
      ddp.before_forward();
      const mpt::Tensor& out = net.forward(shard.x);
      const mpt::Tensor dout = mpt::cross_entropy_backward(out, shard.labels, scaler.scale(per_micro));
      if (m + 1 < micro_batches) {
        auto quiet = ddp.no_sync();  // accumulate here; the last micro-batch synchronises
        net.backward(dout);
      } else {
        net.backward(dout);
        ddp.finish_backward();
      }
    }
    scaler.step(zero);  // skipped on every rank if any rank's shard overflowed
    scaler.update();
    zero.gather_masters();  // every rank receives the owners' new masters
    net.refresh_model_copies();
  }
}

}  // namespace mpt::ex05
