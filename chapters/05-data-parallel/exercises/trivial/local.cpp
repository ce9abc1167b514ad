// Chapter 05 — exercises: trivial stub "every rank on its own" (no communication at all).
// Depends on: ex05.hpp, the dist tier (shard_rows), the nn and optim tiers.
// Each rank divides by the world size, keeps its own verdict and trains on
// its own shard: right in a world of one, wrong in any other. CI requires a
// score below full marks on every exercise.
#include "ex05.hpp"

#include <cmath>
#include <vector>

#include "mpt/dist/ddp.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ex05 {

void average_gradients(mpt::dist::Communicator& comm, std::vector<std::vector<float>>& grads, mpt::DType,
                       double) {
  for (auto& g : grads)
    for (float& x : g) x /= static_cast<float>(comm.size());
}

bool found_inf_across(mpt::dist::Communicator&, const std::vector<std::vector<float>>& grads_here) {
  for (const auto& g : grads_here)
    for (float x : g)
      if (!std::isfinite(x)) return true;
  return false;
}

mpt::GradScaler::FoundInfReduction found_inf_seam(mpt::dist::Communicator&) {
  return [](bool here) { return here; };
}

void train_data_parallel(mpt::dist::Communicator& comm, mpt::Model& net, int steps, int micro_batches) {
  const mpt::Dataset data = mpt::make_blobs();
  mpt::Batches batches(data, 64, 1234);
  mpt::SGD sgd(net.parameters(), mpt::SgdOptions{0.05, 0.9});
  mpt::GradScaler scaler;
  for (int step = 0; step < steps; ++step) {
    sgd.zero_grad();
    for (int m = 0; m < micro_batches; ++m) {
      const mpt::Dataset batch = batches.next();
      const auto [lo, hi] = mpt::dist::shard_rows(batch.size(), comm.rank(), comm.size());
      const mpt::Dataset shard = batch.slice(lo, hi - lo);
      const mpt::Tensor& out = net.forward(shard.x);
      net.backward(mpt::cross_entropy_backward(out, shard.labels, scaler.scale(1.0f / micro_batches)));
    }
    (void)scaler.step(sgd);
    scaler.update();
    net.refresh_model_copies();
  }
}

}  // namespace mpt::ex05
