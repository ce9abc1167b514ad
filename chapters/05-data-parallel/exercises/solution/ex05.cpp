// Chapter 05 — exercises: REFERENCE SOLUTION (MPT-REFERENCE-SOLUTION), never shipped to students.
// Depends on: ex05.hpp, the dist tier (DDP, the sharded optimizer and scaler
// for 5.3), the formats tier (storage.hpp: the f16/bf16 conversions of 5.1),
// the nn and optim tiers, the C++ standard library.
// 5.1 is written from the specification, not from ddp.cpp, so that grading
// it against DDP's own reduction is a real check.
// tools/make_handout.sh refuses to produce a handout that contains these lines.
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

void average_gradients(mpt::dist::Communicator& comm, std::vector<std::vector<float>>& grads,
                       mpt::DType comm_dtype, double predivide_factor) {
  using mpt::DType;
  if (comm_dtype != DType::f32 && comm_dtype != DType::f16 && comm_dtype != DType::bf16)
    throw std::invalid_argument("average_gradients: cannot all-reduce gradients in " +
                                std::string(mpt::dtype_name(comm_dtype)) +
                                "; valid comm dtypes: f32, f16, bf16");
  if (!(predivide_factor >= 0) || std::isinf(predivide_factor))
    throw std::invalid_argument("average_gradients: predivide_factor " + std::to_string(predivide_factor) +
                                " is not valid; give a finite number >= 0 (0: the world size)");
  const double factor = predivide_factor == 0 ? static_cast<double>(comm.size()) : predivide_factor;
  const float before = static_cast<float>(1.0 / factor);
  const float after = static_cast<float>(factor / comm.size());

  // Pack every buffer, divided by the factor, into one FP32 staging buffer.
  std::size_t total = 0;
  for (const auto& g : grads) total += g.size();
  std::vector<float> staged;
  staged.reserve(total);
  for (const auto& g : grads)
    for (float x : g) staged.push_back(x * before);

  // One sum in the communication dtype.
  const auto count = static_cast<std::int64_t>(total);
  if (comm_dtype == DType::f32) {
    comm.all_reduce(staged.data(), count, DType::f32, mpt::dist::ReduceOp::sum);
  } else if (comm_dtype == DType::f16) {
    std::vector<Eigen::half> wire(total);
    mpt::to_fp16(staged.data(), wire.data(), total);
    comm.all_reduce(wire.data(), count, DType::f16, mpt::dist::ReduceOp::sum);
    mpt::from_fp16(wire.data(), staged.data(), total);
  } else {
    std::vector<Eigen::bfloat16> wire(total);
    mpt::to_bf16(staged.data(), wire.data(), total);
    comm.all_reduce(wire.data(), count, DType::bf16, mpt::dist::ReduceOp::sum);
    mpt::from_bf16(wire.data(), staged.data(), total);
  }

  // Unpack, times factor / world: the average.
  std::size_t at = 0;
  for (auto& g : grads)
    for (float& x : g) x = staged[at++] * after;
}

namespace {

// One float across the ranks, the largest kept: 1 from any rank wins.
bool any_rank(mpt::dist::Communicator& comm, bool here) {
  float vote = here ? 1.0f : 0.0f;
  comm.all_reduce(&vote, 1, mpt::DType::f32, mpt::dist::ReduceOp::max);
  return vote > 0.5f;
}

}  // namespace

bool found_inf_across(mpt::dist::Communicator& comm, const std::vector<std::vector<float>>& grads_here) {
  bool here = false;
  for (const auto& g : grads_here)
    for (float x : g) here = here || !std::isfinite(x);  // inf, -inf and NaN alike
  return any_rank(comm, here);
}

mpt::GradScaler::FoundInfReduction found_inf_seam(mpt::dist::Communicator& comm) {
  return [&comm](bool found_here) { return any_rank(comm, found_here); };
}

// 5.3, fixed: the loop cleared only the gradients of the parameters this rank
// owns. The others kept theirs, and the next backward added to them: DDP
// then averaged two steps' worth into every rank's gradients, and the
// owners stepped from that. Every gradient the model accumulates into must
// be cleared, owned or not (ShardedOptimizer::zero_grad does).
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
    zero.zero_grad();  // every parameter's gradient, not only this rank's shard
  }
}

}  // namespace mpt::ex05
