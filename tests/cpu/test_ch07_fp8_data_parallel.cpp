// Chapter 07 — FP8 training under data parallelism: the delayed states'
// amaxes reduced (max) across the ranks before each update, as Transformer
// Engine's reduce_amax, on ThreadWorld's in-process ranks.
// Depends on: mpt/train/fp8_parallel.hpp, mpt/train/run.hpp,
// mpt/train/checkpoint.hpp, mpt/fp8/linear_scaling.hpp, mpt/fp8/recipes.hpp,
// mpt/dist/thread_world.hpp, mpt/nn/models/model_factory.hpp,
// mpt/core/policy_string.hpp, test_support.hpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/core/policy_string.hpp"
#include "mpt/dist/communicator.hpp"
#include "mpt/dist/thread_world.hpp"
#include "mpt/fp8/linear_scaling.hpp"
#include "mpt/fp8/recipes.hpp"
#include "mpt/nn/models/model_factory.hpp"
#include "mpt/train/checkpoint.hpp"
#include "mpt/train/fp8_parallel.hpp"
#include "mpt/train/run.hpp"
#include "test_support.hpp"

namespace {

using mpt::DType;
using mpt_test::bits;
using mpt_test::same_bits;

mpt::train::RunConfig run_config(const std::string& policy, std::int64_t steps) {
  mpt::train::RunConfig c;
  c.model = "mlp";
  c.policy = policy;
  c.scaler = "none";
  c.steps = steps;
  return c;
}

// The blobs MLP (8-32-32-4) under `policy`, with its FP8 state.
struct FpModel {
  std::unique_ptr<mpt::Model> net;
  std::unique_ptr<mpt::fp8::Fp8Training> fp8;
};
FpModel blobs_mlp(const std::string& policy) {
  mpt::ModelSpec m;
  m.name = "mlp";
  m.mlp_sizes = {8, 32, 32, 4};
  m.seed = 7;
  const std::string canonical = mpt::parse_policy_string(policy).text();
  m.policy = mpt::parse_policy_string(canonical).make();
  FpModel out;
  out.net = mpt::make_model(m);
  out.fp8 = mpt::fp8::attach_fp8(*out.net, canonical);
  return out;
}

// A run's delayed states, from its checkpoint: name -> values (the history
// "fp8.amax_history/<path>.<role>", the scale "fp8.scale/<path>.<role>").
using States = std::map<std::string, std::vector<float>>;
States fp8_states(const mpt::train::TrainRun& run) {
  States s;
  for (const mpt::train::TensorRecord& t : run.checkpoint().tensors)
    if (t.name.rfind("fp8.", 0) == 0) s[t.name] = t.values;
  return s;
}

bool same_states(const States& a, const States& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, v] : a) {
    const auto it = b.find(name);
    if (it == b.end() || !same_bits(v, it->second)) return false;
  }
  return true;
}

// The checkpoint's state names in pending_amaxes() order: layers in model
// order, roles input, weight, grad_output (the checkpoint's own order).
std::vector<std::string> state_names(const mpt::train::TrainRun& run) {
  std::vector<std::string> names;
  for (const mpt::train::TensorRecord& t : run.checkpoint().tensors)
    if (t.name.rfind("fp8.scale/", 0) == 0) names.push_back(t.name.substr(10));
  return names;
}

DType dtype_of_role(const std::string& name) {
  return name.size() > 12 && name.compare(name.size() - 12, 12, ".grad_output") == 0 ? DType::e5m2
                                                                                     : DType::e4m3;
}

}  // namespace

TEST_CASE("reduce_fp8_amaxes: every pending amax becomes its max over the ranks, an inf kept") {
  const float inf = std::numeric_limits<float>::infinity();
  // Rank r's pending amaxes: 9 states (3 Linears x 3 roles), some larger on
  // rank 0, some on rank 1, one zero on both, one infinite on rank 1.
  const std::vector<std::vector<float>> given = {
      {1.0f, 0.5f, 3.0f, 0.0f, 2.0f, 7.0f, 0.25f, 4.0f, 1.5f},
      {2.0f, 0.5f, 1.0f, 0.0f, 8.0f, 6.0f, inf, 4.5f, 1.5f},
  };
  std::vector<std::vector<float>> reduced(2), scales(2);
  mpt::dist::ThreadWorld world(2);
  world.run([&](mpt::dist::Communicator& c) {
    FpModel m = blobs_mlp("fp8:delayed");
    const auto r = static_cast<std::size_t>(c.rank());
    m.fp8->set_pending_amaxes(given[r]);
    mpt::train::reduce_fp8_amaxes(*m.fp8, c);
    reduced[r] = m.fp8->pending_amaxes();
    m.fp8->update();
    for (const mpt::fp8::Fp8Training::Layer& l : m.fp8->layers())
      for (const mpt::Fp8Role role : mpt::fp8::kFp8Roles) scales[r].push_back(l.fp8->state(role).scale());
  });
  // One process holding every rank's amaxes: recorded into one state each
  // (fmaxf, as TE's cast kernels), then the update.
  FpModel one = blobs_mlp("fp8:delayed");
  std::vector<float> expect;
  std::vector<float> expect_scales;
  std::size_t i = 0;
  for (const mpt::fp8::Fp8Training::Layer& l : one.fp8->layers())
    for (const mpt::Fp8Role role : mpt::fp8::kFp8Roles) {
      mpt::fp8::DelayedScaling& s = l.fp8->state(role);
      s.record_amax(given[0][i]);
      s.record_amax(given[1][i]);
      expect.push_back(s.pending_amax());
      s.update();
      expect_scales.push_back(s.scale());
      ++i;
    }
  CHECK(expect == std::vector<float>{2.0f, 0.5f, 3.0f, 0.0f, 8.0f, 7.0f, inf, 4.5f, 1.5f});
  for (std::size_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(same_bits(reduced[r], expect));
    CHECK(same_bits(scales[r], expect_scales));
  }
  CHECK(expect_scales[3] == 1.0f);  // amax 0: the scale stays
  CHECK(expect_scales[6] == 1.0f);  // amax inf: the scale stays, as on one rank

  // What no rank can hold is refused, by count and by value.
  FpModel m = blobs_mlp("fp8:delayed");
  CHECK_THROWS_WITH_AS(m.fp8->set_pending_amaxes({1.0f}), doctest::Contains("1 pending amaxes for 9"),
                       std::invalid_argument);
  std::vector<float> nan(9, 1.0f);
  nan[4] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH_AS(m.fp8->set_pending_amaxes(nan), doctest::Contains("an amax is >= 0"),
                       std::invalid_argument);
  CHECK(same_bits(m.fp8->pending_amaxes(), std::vector<float>(9, 0.0f)));  // unchanged

  // Current scaling and MX keep no state: nothing to reduce, and no
  // collective — rank 0 alone calls it, then both meet at a barrier, which
  // an all-reduce of rank 0's would not match.
  for (const char* policy : {"fp8:current", "fp8:mx-rceil"}) {
    CAPTURE(policy);
    FpModel stateless = blobs_mlp(policy);
    CHECK(stateless.fp8->pending_amaxes().empty());
    mpt::dist::ThreadWorld w(2, 5.0);
    CHECK_NOTHROW(w.run([&](mpt::dist::Communicator& c) {
      FpModel mm = blobs_mlp(policy);
      if (c.rank() == 0) mpt::train::reduce_fp8_amaxes(*mm.fp8, c);
      c.barrier();
    }));
  }
}

TEST_CASE(
    "a 2-rank fp8:delayed run: every rank's states after every step are the update of the ranks' max amax") {
  constexpr int kSteps = 8;
  const mpt::train::RunConfig c = run_config("fp8:delayed", kSteps);
  std::vector<std::string> names;
  {
    mpt::train::TrainRun probe(c);
    names = state_names(probe);
  }
  REQUIRE(names.size() == 9);
  // Per rank, per step: the states before and after, this rank's amaxes.
  std::vector<std::vector<States>> before(2), after(2);
  std::vector<std::vector<std::vector<float>>> amaxes(2);
  std::vector<std::uint64_t> checksums(2);
  mpt::dist::ThreadWorld world(2);
  world.run([&](mpt::dist::Communicator& comm) {
    mpt::train::DataParallel dp;
    dp.comm = &comm;
    mpt::train::TrainRun run(c, dp);
    const auto r = static_cast<std::size_t>(comm.rank());
    for (int k = 0; k < kSteps; ++k) {
      before[r].push_back(fp8_states(run));
      (void)run.step();
      amaxes[r].push_back(run.fp8_step_amaxes());
      after[r].push_back(fp8_states(run));
    }
    checksums[r] = run.masters_checksum();
  });
  CHECK(checksums[0] == checksums[1]);  // the masters: equal on both ranks
  int rank_local = 0;                   // states whose amaxes differed between the ranks
  for (int k = 0; k < kSteps; ++k) {
    CAPTURE(k + 1);
    const auto s = static_cast<std::size_t>(k);
    CHECK(same_states(after[0][s], after[1][s]));
    REQUIRE(amaxes[0][s].size() == names.size());
    REQUIRE(amaxes[1][s].size() == names.size());
    for (std::size_t i = 0; i < names.size(); ++i) {
      CAPTURE(names[i]);
      if (bits(amaxes[0][s][i]) != bits(amaxes[1][s][i])) ++rank_local;
      // One process: the state before the step, the max of the ranks'
      // amaxes recorded, one update.
      mpt::fp8::DelayedScaling ref(dtype_of_role(names[i]));
      ref.restore(before[0][s].at("fp8.scale/" + names[i]).at(0),
                  before[0][s].at("fp8.amax_history/" + names[i]));
      ref.record_amax(amaxes[0][s][i]);
      ref.record_amax(amaxes[1][s][i]);
      ref.update();
      for (std::size_t r = 0; r < 2; ++r) {
        CAPTURE(r);
        CHECK(same_bits(after[r][s].at("fp8.amax_history/" + names[i]), ref.amax_history()));
        CHECK(bits(after[r][s].at("fp8.scale/" + names[i]).at(0)) == bits(ref.scale()));
      }
    }
  }
  // The inputs and output gradients are each rank's own rows: their amaxes
  // differ, so the test would see a rank that kept its own.
  CHECK(rank_local > kSteps);
}

TEST_CASE("a checkpoint of a 2-rank fp8:delayed run, written by rank 0, resumes on 2 ranks bit for bit") {
  using mpt::train::parse_checkpoint;
  using mpt::train::serialize_checkpoint;
  const mpt::train::RunConfig c = run_config("fp8:delayed", 12);
  const auto two_ranks = [&](const std::string& from, int first, int last, std::string* saved,
                             std::vector<std::string>* finals, std::vector<std::uint64_t>* sums) {
    mpt::dist::ThreadWorld world(2);
    world.run([&](mpt::dist::Communicator& comm) {
      mpt::train::DataParallel dp;
      dp.comm = &comm;
      mpt::train::TrainRun run(c, dp);
      if (!from.empty()) run.restore(parse_checkpoint(from));
      for (int k = first; k < last; ++k) (void)run.step();
      const std::string bytes = serialize_checkpoint(run.checkpoint());
      const auto r = static_cast<std::size_t>(comm.rank());
      if (saved != nullptr && r == 0) *saved = bytes;
      if (finals != nullptr) (*finals)[r] = bytes;
      if (sums != nullptr) (*sums)[r] = run.masters_checksum();
    });
  };
  std::vector<std::string> straight(2), resumed(2);
  std::vector<std::uint64_t> straight_sums(2), resumed_sums(2);
  two_ranks("", 0, 12, nullptr, &straight, &straight_sums);
  std::string at5;
  two_ranks("", 0, 5, &at5, nullptr, nullptr);
  two_ranks(at5, 5, 12, nullptr, &resumed, &resumed_sums);
  CHECK(straight[0] == straight[1]);
  for (std::size_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(resumed_sums[r] == straight_sums[0]);
    CHECK(resumed[r] == straight[0]);  // every tensor, the fp8 states and the history included
  }
}
