// Chapter 05 — exercises: grader tests for exercise 5.3 (diagnose: a data-parallel training loop).
// Depends on: grader.hpp; the nn tier (the blobs, the losses), the optim
// tier's SGD and the amp tier's GradScaler for the one-process reference.
// Two test cases, three points each (a diagnose exercise's): one batch a
// step, and two micro-batches a step (no_sync). Each checks that every
// rank's replica holds the same bits and that they are the weights one
// process reaches with the same steps on whole batches, within rounding
// (the ranks' shard means, halved and summed, are the batch mean up to a
// few units in the last place). The given loop keeps its replicas equal,
// and its weights leave the one-process run's at the second step.
#include <cmath>
#include <string>
#include <vector>

#include "grader.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/optim/sgd.hpp"

namespace {

using namespace mpt::ex05;
using namespace mpt::ex05::grading;

// The same steps in this one process, every batch whole.
std::vector<float> one_process(int steps, int micro_batches) {
  auto net = blobs_mlp();
  const mpt::Dataset data = mpt::make_blobs();
  mpt::Batches batches(data, 64, 1234);
  mpt::SGD sgd(net->parameters(), mpt::SgdOptions{0.05, 0.9});
  mpt::GradScaler scaler;
  for (int step = 0; step < steps; ++step) {
    for (mpt::Parameter* p : net->parameters()) p->grad.fill_zero();
    for (int m = 0; m < micro_batches; ++m) {
      const mpt::Dataset b = batches.next();
      const mpt::Tensor& logits = net->forward(b.x);
      net->backward(mpt::cross_entropy_backward(logits, b.labels, scaler.scale(1.0f / micro_batches)));
    }
    (void)scaler.step(sgd);
    scaler.update();
    net->refresh_model_copies();
  }
  return masters_of(*net);
}

// Trains a replica on every rank with the student's loop and grades it.
void grade_loop(int steps, int micro_batches) {
  auto net = blobs_mlp();
  on_every_rank([&] { train_data_parallel(world(), *net, steps, micro_batches); });
  const std::vector<float> mine = masters_of(*net);
  CHECK_MESSAGE(everyone(same_on_every_rank(mine)), "the ranks' replicas hold different weights");
  const std::vector<float> reference = one_process(steps, micro_batches);
  Mismatches m;
  float worst = 0.0f;
  for (std::size_t i = 0; i < reference.size(); ++i) {
    m.checked();
    const float d = std::fabs(mine[i] - reference[i]);
    worst = std::fmax(worst, d);
    if (!(d <= 1e-5f * (1.0f + std::fabs(reference[i]))) && m.wrong())
      m.detail("weight " + std::to_string(i) + ": " + describe(mine[i]) +
               ", one process: " + describe(reference[i]));
  }
  CHECK_MESSAGE(everyone(m.none()), "after " << steps << " steps of " << micro_batches
                                             << " micro-batch(es), rank 0's weights are not one process's "
                                                "(largest difference "
                                             << worst << "): " << m.report());
}

}  // namespace

TEST_SUITE("exercise-5.3") {
  TEST_CASE("5.3 one batch a step, 6 steps: equal replicas, and one process's weights") { grade_loop(6, 1); }

  TEST_CASE(
      "5.3 two micro-batches a step (no_sync), 4 steps: equal replicas, and one process's weights [7 "
      "points]") {
    grade_loop(4, 2);
  }
}  // TEST_SUITE
