// Chapter 05 — tests of chapter 5's pitfalls
// Depends on: mpt/registry/pitfall.hpp, mpt::chapters (pitfall_registry),
// doctest, test_support.hpp.
//
// The pitfalls: an fp16 all-reduce that sums before dividing, ZeRO-1
// without a shared found-inf verdict, the scaler's state restored on rank 0
// only, gradients summed across ranks, accumulation without no_sync(),
// BatchNorm buffers per rank, ranks that disagree on skipping.
//
// Every entry must still show its failure and its fix, its checks must be
// able to fail, and its runs must be deterministic (each multi-rank run is
// a dist::ThreadWorld: collectives in rank order, the same bits every time).
// The numbers the chapter text builds on are pinned at the end, against
// values worked out here by hand (the blobs MLP's 1476 parameters, ZeRO's
// partition, the scaler's backoff arithmetic).
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "mpt/registry/pitfall.hpp"
#include "test_support.hpp"

namespace {

using mpt::Pitfall;
using mpt::RunResult;

const mpt_test::PitfallRuns& runs_of(const std::string& id) { return mpt_test::pitfall_runs(id); }

// The blobs MLP 8-32-32-4: 8·32 + 32 + 32·32 + 32 + 32·4 + 4 parameters.
constexpr double kParams = 8 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4;

}  // namespace

TEST_CASE("chapter 5 registers its pitfalls, in order, after the chapters before it") {
  mpt_test::check_chapter_registration(
      5,
      {"fp16-allreduce-overflow", "sharded-found-inf-unsynced", "scaler-state-one-rank",
       "loss-summed-across-ranks", "ddp-accumulation-sync", "bn-buffers-per-rank", "ranks-disagree-on-skip"});
}

// For each pitfall: the symptom on the broken run, the cure on the fixed
// run, the preconditions on both, every symptom check failing on the fixed
// run and every cure check on the broken run, the same outcomes, and a rerun
// with the same bits (mpt_test::check_pitfall).
TEST_CASE("chapter 5: every pitfall shows its symptom and its fix, and its checks tell the runs apart") {
  for (const Pitfall* p : mpt_test::chapter_pitfalls(5)) {
    SUBCASE(p->id.c_str()) { mpt_test::check_pitfall(*p); }
  }
}

// `mpt tour` runs every pitfall: each must stay well under a second for
// both runs (they take a few milliseconds; the bound leaves room for a
// loaded machine).
TEST_CASE("chapter 5: both runs of each pitfall take well under a second") {
  for (const Pitfall* p : mpt_test::chapter_pitfalls(5)) {
    const auto start = std::chrono::steady_clock::now();
    (void)p->broken();
    (void)p->fixed();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CAPTURE(p->id);
    CHECK(s < 1.0);
  }
}

TEST_CASE("chapter 5: the numbers the chapter states") {
  SUBCASE(
      "fp16-allreduce-overflow: each rank fits, the sum of four does not; pre-divided, the sum never exceeds "
      "a term") {
    const RunResult b = runs_of("fp16-allreduce-overflow").broken;
    const RunResult f = runs_of("fp16-allreduce-overflow").fixed;
    // The scale is the largest power of two at which every rank fits: twice
    // it would put the largest gradient past 65504.
    CHECK(b.get("largest_rank_grad") < 65504);
    CHECK(2 * b.get("largest_rank_grad") >= 65504);
    CHECK(b.get("largest_exact_sum") > 65504);
    CHECK(b.get("scale_after") == b.get("loss_scale") / 2);         // backoff_factor 0.5
    CHECK(f.get("reduced_largest") <= f.get("largest_rank_grad"));  // an average is at most the largest term
  }
  SUBCASE("sharded-found-inf-unsynced: rank 0 owns fc2.weight alone; the other 452 parameters step") {
    const RunResult b = runs_of("sharded-found-inf-unsynced").broken;
    // ZeRO's greedy partition over 4 ranks: fc2.weight (1024) to rank 0,
    // fc1.weight (256) to 1, fc3.weight (128) to 2, the biases to 3.
    CHECK(b.get("inf_owner") == 0);
    CHECK(b.get("ranks_skipped") == 1);
    CHECK(b.get("elements_updated_in_inf_step") <= kParams - 1024);  // a zero gradient leaves a few unchanged
    CHECK(b.get("elements_updated_in_inf_step") > 400);
    CHECK(b.get("scale_min") == 32768);  // rank 0 backed off once
    CHECK(b.get("scale_max") == 65536);  // the others never did (growth_interval 2000)
  }
  SUBCASE("scaler-state-one-rank: the checkpoint holds 2^15 and 3 clean steps") {
    const RunResult b = runs_of("scaler-state-one-rank").broken;
    // 5 steps, an inf in the second: 65536 · 0.5, then steps 3, 4, 5 counted.
    CHECK(b.get("checkpoint_scale") == 32768);
    CHECK(b.get("checkpoint_growth_tracker") == 3);
    CHECK(b.get("resumed_scale_max") == 65536);  // ranks 1-3: the initial scale
  }
  SUBCASE("loss-summed-across-ranks: N ranks' sum is N times the average") {
    const RunResult b = runs_of("loss-summed-across-ranks").broken;
    const RunResult f = runs_of("loss-summed-across-ranks").fixed;
    CHECK(b.get("largest_scaled_grad_n4") ==
          doctest::Approx(4 * b.get("largest_scaled_grad_n1")).epsilon(1e-5));
    CHECK(f.get("largest_scaled_grad_n4") == doctest::Approx(f.get("largest_scaled_grad_n1")).epsilon(1e-5));
  }
  SUBCASE("ddp-accumulation-sync: the gradient is 1476 f32 values, 5904 bytes, sent 4 times or once") {
    const RunResult b = runs_of("ddp-accumulation-sync").broken;
    const RunResult f = runs_of("ddp-accumulation-sync").fixed;
    CHECK(f.get("gradient_bytes") == 4 * kParams);
    CHECK(f.get("bytes") == 4 * kParams);
    CHECK(b.get("bytes") == 4 * 4 * kParams);
  }
  SUBCASE("ranks-disagree-on-skip: the message names both ranks and both calls") {
    const RunResult b = runs_of("ranks-disagree-on-skip").broken;
    CHECK(b.get("steps_completed") == 1);  // the inf is in the second step
    // Rank 0 skipped gather_masters and calls the next step's all-reduce of
    // the whole gradient; rank 1 waits in the first broadcast: fc1.weight,
    // 256 floats, from its owner, rank 1.
    CHECK(
        b.explanation.find("the ranks disagree on a collective: rank 0 calls all_reduce(f32 x 1476, sum)") !=
        std::string::npos);
    CHECK(b.explanation.find("rank 1 calls broadcast(1024 bytes from rank 1)") != std::string::npos);
  }
}
