// Chapter 06 — exercises: grader tests for exercise 6.3 (one step of the measured search's greedy pass).
// Depends on: grader.hpp (reference_step: the rule of mpt's search_policy,
// src/mpt/train/policy_search.cpp, step 4), mpt/train/policy_search.hpp
// (the search itself, on the blobs MLP).
// Six test cases: one seed against the relative limit; several seeds (the
// mean decides, not the best seed); a seed that is not finite; a whole
// greedy pass over a seeded evaluator; mpt's own search replayed with the
// student's steps; bad input (one point).
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "grader.hpp"
#include "mpt/train/policy_search.hpp"

namespace {

using namespace mpt::ex06;
using namespace mpt::ex06::grading;

const std::vector<std::string> kLayers = {"fc1", "relu1", "fc2", "relu2", "fc3", "head"};

// One step trying kLayers[next] on top of `lowered`.
StepCase step(double l32, double budget, std::vector<double> losses, std::size_t next = 2,
              std::vector<std::string> lowered = {"fc1"}) {
  StepCase c;
  c.order = kLayers;
  c.next = next;
  c.lowered = std::move(lowered);
  c.fp32_loss = l32;
  c.budget = budget;
  c.losses = std::move(losses);
  return c;
}

// The blobs MLP's search as the chapter runs it, shortened (mlp, 2 seeds,
// the dynamic scaler): milliseconds a candidate.
mpt::train::SearchOptions mlp_search(mpt::DType low, std::int64_t steps, double budget) {
  mpt::train::SearchOptions o;
  o.model = "mlp";
  o.low = low;
  o.budget = budget;
  o.steps = steps;
  o.seeds = 2;
  return o;
}

// The searches replayed: bf16 for 30 steps with budget 0 refuses one of the
// five layers, one whose better seed is below the limit and whose mean is
// not; the others lower all five.
struct Search {
  mpt::DType low;
  std::int64_t steps;
  double budget;
};
const Search kSearches[] = {{mpt::DType::bf16, 30, 0.0},
                            {mpt::DType::bf16, 30, 0.002},
                            {mpt::DType::f16, 12, 0.01},
                            {mpt::DType::f16, 30, 0.0}};

}  // namespace

TEST_SUITE("exercise-6.3") {
  TEST_CASE("6.3 one seed: kept at or below L32 + budget*|L32|, refused above; the budget is relative") {
    Mismatches m;
    expect_step(m, step(2.0, 0.25, {2.5}), "exactly at the limit 2.5: kept");
    expect_step(m, step(2.0, 0.25, {2.5000001}), "just above the limit 2.5");
    expect_step(m, step(2.0, 0.25, {2.375}), "below the limit");
    expect_step(m, step(2.0, 0.25, {3.0}), "well above the limit");
    expect_step(m, step(2.0, 0.25, {1.5}), "below FP32's own loss");
    expect_step(m, step(0.1, 0.5, {0.3}), "L32 0.1, budget 0.5: the limit is 0.15, not 0.6");
    expect_step(m, step(0.1, 0.5, {0.14}), "L32 0.1, budget 0.5");
    expect_step(m, step(4.0, 0.02, {4.07}), "L32 4, budget 2 %: the limit is 4.08, not 4.02");
    expect_step(m, step(4.0, 0.02, {4.09}), "L32 4, budget 2 %");
    expect_step(m, step(2.3, 0.02, {2.34}), "L32 2.3, budget 2 %: the limit is 2.346");
    expect_step(m, step(2.3, 0.02, {2.35}), "L32 2.3, budget 2 %");
    expect_step(m, step(2.0, 0.0, {2.0}), "budget 0: FP32's loss itself is kept");
    expect_step(m, step(2.0, 0.0, {2.0000000001}), "budget 0: anything above FP32's loss is refused");
    expect_step(m, step(8.0, 10.0, {80.0}), "the largest budget, 10: up to 11·L32");
    expect_step(m, step(0.5, 0.25, {0.6}, 0, {}), "the first layer tried, nothing lowered yet");
    expect_step(m, step(0.5, 0.25, {0.7}, 5, {"fc1", "fc2", "relu2"}), "the last layer tried");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("6.3 several seeds: their mean decides, not the best seed nor the worst") {
    // The search keeps what holds on average: one lucky seed under the limit
    // does not keep a layer whose mean is above it.
    Mismatches m;
    expect_step(m, step(2.0, 0.25, {2.375, 2.75}), "mean 2.5625 above 2.5, the best seed below it");
    expect_step(m, step(2.0, 0.25, {2.25, 2.75}), "mean exactly 2.5, the worst seed above it: kept");
    expect_step(m, step(2.0, 0.25, {2.0, 2.0, 3.5}), "mean 2.5 of three seeds");
    expect_step(m, step(2.0, 0.25, {1.0, 4.125}), "mean 2.5625: one good seed, one bad");
    expect_step(m, step(2.0, 0.25, {2.75, 2.25, 2.5, 2.5}), "mean 2.5 of four seeds");
    expect_step(m, step(3.0, 0.1, {3.125, 3.625}), "L32 3, budget 10 %: mean 3.375");
    expect_step(m, step(3.0, 0.1, {3.25, 3.3125}), "L32 3, budget 10 %: mean 3.28125");
    expect_step(m, step(2.3, 0.02, {2.30, 2.40, 2.33}), "L32 2.3, budget 2 %: mean 2.3433");
    expect_step(m, step(2.3, 0.02, {2.20, 2.50}), "L32 2.3, budget 2 %: mean 2.35");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("6.3 a seed whose loss is not finite refuses the layer, whatever the others") {
    // A NaN compares false with everything, and -inf is below any limit: a
    // mean alone does not see a run that diverged, and the mean of the
    // finite seeds hides it.
    Mismatches m;
    expect_step(m, step(2.0, 0.25, {2.0, kInf}), "one seed diverged to inf");
    expect_step(m, step(2.0, 0.25, {kNaN, 2.0}), "one seed NaN");
    expect_step(m, step(2.0, 0.25, {-kInf, 2.0}), "one seed -inf (its mean is below the limit)");
    expect_step(m, step(2.0, 0.25, {2.0, 2.0, kNaN}), "two good seeds, one NaN");
    expect_step(m, step(2.0, 0.25, {kInf, -kInf}), "inf and -inf");
    expect_step(m, step(2.0, 0.25, {kNaN}), "the only seed NaN");
    expect_step(m, step(2.0, 0.25, {-kInf}), "the only seed -inf");
    expect_step(m, step(2.0, 0.25, {1.5, 1.75, kInf, 1.5}), "three good seeds, one inf");
    expect_step(m, step(2.0, 0.25, {2.0, 2.25}), "every seed finite: mean 2.125, kept");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("6.3 a whole greedy pass: each step on top of the last, with a seeded evaluator of 3 seeds") {
    // A candidate's loss: L32 plus a cost per lowered layer, and a seed's
    // noise; lowered set and verdicts followed step by step against the
    // rule. Twelve passes of 10 layers, budgets 0 to 0.1.
    Mismatches m;
    std::mt19937 rng(6301u);
    std::uniform_real_distribution<double> cost(-0.01, 0.04), noise(-0.06, 0.06);
    for (int pass = 0; pass < 12; ++pass) {
      std::vector<std::string> order;
      std::vector<double> layer_cost;
      for (int i = 0; i < 10; ++i) {
        order.push_back("block" + std::to_string(pass) + ".layer" + std::to_string(i));
        layer_cost.push_back(cost(rng));
      }
      std::vector<double> seed_noise(3);
      const double l32 = 1.5 + 0.1 * pass, budget = 0.01 * (pass % 11);
      std::vector<std::string> lowered;
      for (std::size_t next = 0; next < order.size(); ++next) {
        for (double& n : seed_noise) n = noise(rng);
        StepCase c;
        c.order = order;
        c.next = next;
        c.lowered = lowered;
        c.fp32_loss = l32;
        c.budget = budget;
        double total = l32;
        for (std::size_t i = 0; i < order.size(); ++i)
          if (i == next || std::find(lowered.begin(), lowered.end(), order[i]) != lowered.end())
            total += layer_cost[i];
        for (double n : seed_noise) c.losses.push_back(total + n);
        if (pass == 5 && next == 7) c.losses[1] = kNaN;  // one diverged run along the way
        expect_step(m, c, "pass " + std::to_string(pass) + ", step " + std::to_string(next));
        if (reference_step(c).kept) lowered.push_back(order[next]);
      }
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("6.3 mpt's own search on the blobs MLP, replayed with your steps: the same layers lowered") {
    // search_policy measures each layer alone, sorts, then runs the greedy
    // pass; here the same order, L32 and evaluate_policy drive your steps.
    // Every candidate is seeded: the same losses, bit for bit. The first
    // search refuses a layer whose better seed is within the limit.
    Mismatches m;
    for (const Search& search : kSearches) {
      const mpt::DType low = search.low;
      const double budget = search.budget;
      const mpt::train::SearchOptions o = mlp_search(low, search.steps, budget);
      const mpt::train::SearchResult r = mpt::train::search_policy(o);
      std::vector<std::string> paths, order;
      for (const auto& l : mpt::train::searchable_layers(o)) paths.push_back(l.first);
      for (const mpt::train::LayerResult& l : r.layers) order.push_back(l.path);
      const CandidateLosses losses = [&](const std::vector<std::string>& lowered) {
        return mpt::train::evaluate_policy(o, mpt::train::policy_for(paths, lowered, low)).final_losses;
      };
      std::vector<std::string> lowered;
      for (std::size_t next = 0; next < order.size(); ++next) {
        m.checked();
        const StepVerdict v = greedy_step(order, next, lowered, r.fp32.mean_loss, budget, losses);
        const mpt::train::LayerResult& want = r.layers[next];
        if (v.kept == want.lowered && same_mean(v.mean_loss, want.loss_when_tried)) continue;
        if (m.wrong())
          m.detail(std::string(mpt::dtype_name(low)) + ", " + std::to_string(search.steps) +
                   " steps, budget " + describe(budget) + ", " + want.path + ": " +
                   (v.kept ? "kept" : "refused") + " with mean " + describe(v.mean_loss) +
                   "; search_policy " + (want.lowered ? "kept" : "refused") + " it, mean " +
                   describe(want.loss_when_tried) + ", limit " + describe(r.loss_limit));
      }
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("6.3 bad input throws std::invalid_argument and leaves lowered as it was [1 point]") {
    int calls = 0;
    const CandidateLosses two = [&](const std::vector<std::string>&) {
      ++calls;
      return std::vector<double>{2.0, 2.0};
    };
    const CandidateLosses none = [&](const std::vector<std::string>&) {
      ++calls;
      return std::vector<double>{};
    };
    std::vector<std::string> lowered = {"fc1"};
    CHECK_THROWS_AS(greedy_step(kLayers, kLayers.size(), lowered, 2.0, 0.02, two), std::invalid_argument);
    CHECK_THROWS_AS(greedy_step(kLayers, 1, lowered, 2.0, -0.01, two), std::invalid_argument);
    CHECK_THROWS_AS(greedy_step(kLayers, 1, lowered, 2.0, kNaN, two), std::invalid_argument);
    CHECK_THROWS_AS(greedy_step(kLayers, 1, lowered, 2.0, kInf, two), std::invalid_argument);
    CHECK_THROWS_AS(greedy_step(kLayers, 1, lowered, kNaN, 0.02, two), std::invalid_argument);
    CHECK_THROWS_AS(greedy_step(kLayers, 1, lowered, kInf, 0.02, two), std::invalid_argument);
    CHECK(calls == 0);  // checked before the evaluator is asked
    CHECK_THROWS_AS(greedy_step(kLayers, 1, lowered, 2.0, 0.02, none), std::invalid_argument);
    CHECK(lowered == std::vector<std::string>{"fc1"});
  }
}  // TEST_SUITE
