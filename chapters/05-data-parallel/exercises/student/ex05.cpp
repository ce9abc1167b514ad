// Chapter 05 — exercises: YOUR FILE: write 5.1 and 5.2 here, and find and fix the bug in 5.3.
// Depends on: ex05.hpp (the specification), the dist tier (DDP, the sharded
// optimizer and scaler, for 5.3's given loop; mpt/formats/storage.hpp has the
// f16/bf16 conversions 5.1 needs), the nn and optim tiers, the C++ standard
// library. Each function of 5.1 and 5.2 throws until you replace its body;
// the grader reports the exercise as "not implemented" until then. 5.3's
// body runs, and scores nothing until it is fixed. See README.md for how to
// grade (under mpiexec).
#include "ex05.hpp"

#include <cmath>  // std::isfinite
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/dist/ddp.hpp"
#include "mpt/dist/sharded.hpp"
// storage.hpp: to_fp16, from_fp16, to_bf16, from_bf16 (for 5.1)
#include "mpt/formats/storage.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ex05 {

void average_gradients(mpt::dist::Communicator& comm, std::vector<std::vector<float>>& grads,
                       mpt::DType comm_dtype, double predivide_factor) {
  (void)comm;
  (void)grads;
  (void)comm_dtype;
  (void)predivide_factor;
  throw std::logic_error("exercise 5.1 not implemented");
}

bool found_inf_across(mpt::dist::Communicator& comm, const std::vector<std::vector<float>>& grads_here) {
  (void)comm;
  (void)grads_here;
  throw std::logic_error("exercise 5.2 not implemented");
}

mpt::GradScaler::FoundInfReduction found_inf_seam(mpt::dist::Communicator& comm) {
  (void)comm;
  throw std::logic_error("exercise 5.2 not implemented");
}

// 5.3: this loop runs, and its replicas stay equal to each other, yet they
// drift away from what one process computes. Find the bug and fix it.
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
    // Ready for the next step: the gradients this rank reduces and steps.
    for (std::size_t k = 0; k < params.size(); ++k)
      if (zero.owners()[k] == comm.rank()) params[k]->grad.fill_zero();
  }
}

}  // namespace mpt::ex05
