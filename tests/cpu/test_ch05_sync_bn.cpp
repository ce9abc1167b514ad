// Chapter 05 — loss scaling across ranks: SyncBatchNorm on ThreadWorld.
// A BatchNorm, and Chapter 3's digits Cnn under DistributedDataParallel, on
// N = 2 and 4 shards of a batch: with SyncBatchNorm the same forward output,
// input gradient, parameter gradients and running estimates as one process
// on the whole batch (f32, within the tolerance derived below), the same
// bits on every rank; without it, the ranks' statistics differ (measured).
// The merge in rank order; the seam's argument checks.
// Depends on: the dist tier (ThreadWorld, DDP, sync_batch_norm.hpp), the nn
// tier (BatchNorm, Cnn, welford.hpp), the core tier (Context, Rng), doctest.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/random.hpp"
#include "mpt/dist/ddp.hpp"
#include "mpt/dist/sync_batch_norm.hpp"
#include "mpt/dist/thread_world.hpp"
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/layers/welford.hpp"
#include "mpt/nn/models/cnn.hpp"

using mpt::DType;
using mpt::Tensor;
using VecF = std::vector<float>;

namespace {

// Batch [16, 3, 4, 4]: per channel M = 256 values over the whole batch, 64
// on each of 4 shards, 128 on each of 2.
constexpr std::int64_t kB = 16, kC = 3, kH = 4, kW = 4;
constexpr std::int64_t kRow = kC * kH * kW;

VecF randn(std::size_t n, std::uint64_t seed, double mean, double sd) {
  mpt::Rng rng(seed);
  VecF v(n);
  for (float& x : v) x = static_cast<float>(mean + sd * rng.normal());
  return v;
}

VecF values(const Tensor& t) {
  VecF v(static_cast<std::size_t>(t.numel()));
  t.to_f32(v.data());
  return v;
}

float max_abs_diff(const VecF& a, const VecF& b) {
  REQUIRE(a.size() == b.size());
  float m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

bool same_bits(const VecF& a, const VecF& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// What one BatchNorm step leaves: y, dx, dγ, dβ, the running estimates, and
// the batch mean and invstd it normalized with.
struct BnResult {
  VecF y, dx, dw, db, running_mean, running_var, mean, invstd;
};

mpt::BatchNorm make_bn() {
  mpt::BatchNorm bn(static_cast<int>(kC));
  // γ, β away from 1 and 0 so that the affine terms take part.
  const VecF w{0.5f, 2.0f, -1.5f}, b{0.25f, -1.0f, 3.0f};
  bn.weight.master.assign(w.data(), kC);
  bn.bias.master.assign(b.data(), kC);
  bn.weight.refresh();
  bn.bias.refresh();
  return bn;
}

// rows [first, first + rows) of x and dy through a fresh layer (training).
BnResult run_bn(mpt::BatchNorm& bn, const VecF& x, const VecF& dy, std::int64_t first, std::int64_t rows) {
  mpt::Context ctx(mpt::uniform_policy(DType::f32));
  const auto at = static_cast<std::ptrdiff_t>(first * kRow), n = static_cast<std::ptrdiff_t>(rows * kRow);
  const VecF xs(x.begin() + at, x.begin() + at + n), dys(dy.begin() + at, dy.begin() + at + n);
  const Tensor xt = Tensor::from_f32(xs.data(), {rows, kC, kH, kW}, DType::f32);
  const Tensor dyt = Tensor::from_f32(dys.data(), {rows, kC, kH, kW}, DType::f32);
  BnResult r;
  r.y = values(bn.forward(xt, ctx));
  r.dx = values(bn.backward(dyt, ctx));
  r.dw = values(bn.weight.grad);
  r.db = values(bn.bias.grad);
  r.running_mean = values(bn.running_mean);
  r.running_var = values(bn.running_var);
  r.mean = values(bn.mean());
  r.invstd = values(bn.invstd());
  return r;
}

// Every rank's result of one BatchNorm step on its shard (with or without
// SyncBatchNorm), in rank order.
std::vector<BnResult> run_bn_ranks(int world, bool sync, const VecF& x, const VecF& dy) {
  std::vector<BnResult> out(static_cast<std::size_t>(world));
  mpt::dist::ThreadWorld(world, 30).run([&](mpt::dist::Communicator& comm) {
    mpt::BatchNorm bn = make_bn();
    if (sync) mpt::dist::sync_batch_norm(bn, comm);
    const std::int64_t rows = kB / world;
    out[static_cast<std::size_t>(comm.rank())] = run_bn(bn, x, dy, rows * comm.rank(), rows);
  });
  return out;
}

// Tolerance (f32, u = 2⁻²⁴ ≈ 6e-8). One process and N ranks compute the
// same per-channel mean and M2 over the same M = 256 values, merged in
// another order (runs and shards merged by Chan's formula instead of runs
// merged over the whole batch); likewise Σdy and Σdy·x̂, summed in another
// order. A sum of M terms in any order is within (M − 1)·u·Σ|terms| of the
// exact one (Higham, Accuracy and Stability, §4.2), so mean, variance and
// the sums differ by a relative ~M·u ≈ 1.5e-5 at worst. y = x̂·γ + β with
// |x̂| < 4 (Gaussian data, 256 values), |γ| ≤ 2, dx with |dy| < 4: an
// absolute difference of at most a few times 4·2·1.5e-5 ≈ 1.2e-4 in y and
// dx, and 256 × that in dγ, dβ (sums of 256 such terms, |term| < 16).
// Measured: at most 6e-7 in y, dx and the logits, 4e-6 in the sums (see
// the MESSAGEs): two orders below.
constexpr float kTolY = 2e-4f;
constexpr float kTolSum = 5e-3f;

}  // namespace

TEST_CASE("merge_in_rank_order: Chan's merge of rank 0, then 1, ...; its size check") {
  const std::vector<mpt::norm_math::Statistics> g{{2, 1.0, 2.0}, {0, 0.0, 0.0}, {2, 3.0, 2.0}, {4, 5.0, 0.0}};
  // 2 ranks x 2 channels: channel 0 = {2, 1, 2} ∪ {2, 3, 2}, channel 1 = {} ∪ {4, 5, 0}.
  const auto m = mpt::dist::merge_in_rank_order(g, 2, 2);
  REQUIRE(m.size() == 2);
  CHECK(m[0].count == 4);
  CHECK(m[0].mean == 2.0);
  CHECK(m[0].m2 == 8.0);  // 2 + 2 + δ²·nₐ·n_b/n = 4 + 4·2·2/4
  CHECK(m[1].count == 4);
  CHECK(m[1].mean == 5.0);
  CHECK(m[1].m2 == 0.0);
  CHECK_THROWS_WITH_AS(
      mpt::dist::merge_in_rank_order(g, 3, 2),
      "merge_in_rank_order: 4 statistics for 3 ranks of 2 channels; expected world x channels",
      std::invalid_argument);
}

TEST_CASE("BatchNorm's reduction seam: both or neither; unset, nothing is called and nothing changes") {
  mpt::BatchNorm bn(2);
  CHECK_FALSE(bn.has_statistics_reduction());
  CHECK_THROWS_WITH_AS(bn.set_statistics_reduction([](std::vector<mpt::norm_math::Statistics>&) {}, nullptr),
                       "BatchNorm: set_statistics_reduction needs both the statistics and the gradient-sums "
                       "reduction, or neither (clear_statistics_reduction)",
                       std::invalid_argument);
  // An identity reduction on one rank gives the bits of no reduction: the
  // statistics are taken in the order the unsynchronised forward takes them.
  const VecF x = randn(static_cast<std::size_t>(kB * kRow), 11, 0.5, 2.0);
  const VecF dy = randn(x.size(), 12, 0.0, 1.0);
  mpt::BatchNorm plain = make_bn(), hooked = make_bn();
  int stats_calls = 0, sums_calls = 0;
  hooked.set_statistics_reduction([&](std::vector<mpt::norm_math::Statistics>&) { ++stats_calls; },
                                  [&](VecF&) { ++sums_calls; });
  const BnResult a = run_bn(plain, x, dy, 0, kB), b = run_bn(hooked, x, dy, 0, kB);
  CHECK(stats_calls == 1);
  CHECK(sums_calls == 1);
  CHECK(same_bits(a.y, b.y));
  CHECK(same_bits(a.running_mean, b.running_mean));
  CHECK(same_bits(a.running_var, b.running_var));
  CHECK(same_bits(a.dw, b.dw));
  CHECK(same_bits(a.db, b.db));
  CHECK(max_abs_diff(a.dx, b.dx) < kTolY);  // dx from γ·Σdy instead of Σγ·dy: another rounding
  // Eval mode never calls it.
  hooked.eval();
  mpt::Context ctx(mpt::uniform_policy(DType::f32));
  (void)hooked.forward(Tensor::from_f32(x.data(), {kB, kC, kH, kW}, DType::f32), ctx);
  CHECK(stats_calls == 1);
}

TEST_CASE(
    "SyncBatchNorm on 2 and 4 ranks equals one BatchNorm on the whole batch; every rank the same bits") {
  const VecF x = randn(static_cast<std::size_t>(kB * kRow), 21, 3.0, 2.0);
  const VecF dy = randn(x.size(), 22, 0.0, 1.0);
  mpt::BatchNorm whole = make_bn();
  const BnResult ref = run_bn(whole, x, dy, 0, kB);
  for (int world : {2, 4}) {
    CAPTURE(world);
    const std::vector<BnResult> ranks = run_bn_ranks(world, true, x, dy);
    VecF y, dx, dw(kC, 0.0f), db(kC, 0.0f);
    for (const BnResult& r : ranks) {
      y.insert(y.end(), r.y.begin(), r.y.end());
      dx.insert(dx.end(), r.dx.begin(), r.dx.end());
      for (std::int64_t c = 0; c < kC; ++c) {  // what DDP's all-reduce sums
        dw[c] += r.dw[c];
        db[c] += r.db[c];
      }
      // The statistics every rank normalized with and folded in: rank 0's bits.
      CHECK(same_bits(r.mean, ranks[0].mean));
      CHECK(same_bits(r.invstd, ranks[0].invstd));
      CHECK(same_bits(r.running_mean, ranks[0].running_mean));
      CHECK(same_bits(r.running_var, ranks[0].running_var));
    }
    const float dy_max = max_abs_diff(y, ref.y), ddx = max_abs_diff(dx, ref.dx);
    const float ddw = std::max(max_abs_diff(dw, ref.dw), max_abs_diff(db, ref.db));
    const float drun = std::max(max_abs_diff(ranks[0].running_mean, ref.running_mean),
                                max_abs_diff(ranks[0].running_var, ref.running_var));
    MESSAGE("sync BN, " << world << " ranks vs one process: max |Δy| " << dy_max << ", |Δdx| " << ddx
                        << ", |Δdγ|,|Δdβ| " << ddw << ", |Δrunning| " << drun);
    CHECK(dy_max < kTolY);
    CHECK(ddx < kTolY);
    CHECK(ddw < kTolSum);
    // running = 0.9·old + 0.1·batch: the batch statistics' difference, shrunk.
    CHECK(drun < kTolY);
  }
}

TEST_CASE("without SyncBatchNorm the ranks normalize with their own statistics: measured, far outside") {
  const VecF x = randn(static_cast<std::size_t>(kB * kRow), 21, 3.0, 2.0);
  const VecF dy = randn(x.size(), 22, 0.0, 1.0);
  mpt::BatchNorm whole = make_bn();
  const BnResult ref = run_bn(whole, x, dy, 0, kB);
  for (int world : {2, 4}) {
    CAPTURE(world);
    const std::vector<BnResult> ranks = run_bn_ranks(world, false, x, dy);
    VecF y;
    float dmean = 0;
    for (const BnResult& r : ranks) {
      y.insert(y.end(), r.y.begin(), r.y.end());
      dmean = std::max(dmean, max_abs_diff(r.mean, ranks[0].mean));
    }
    const float dy_max = max_abs_diff(y, ref.y);
    MESSAGE("plain BN, " << world << " ranks: max |Δmean| between ranks " << dmean
                         << ", max |Δy| vs one process " << dy_max);
    // Shards of 64 or 128 values with sd 2: their means differ by ~2/√64 = 0.25.
    CHECK(dmean > 1e-2f);
    CHECK(dy_max > 100 * kTolY);
  }
}

TEST_CASE(
    "DDP(sync_batch_norm) of the digits Cnn equals one process: logits, every gradient, running stats") {
  constexpr std::int64_t kBatch = 16;
  const VecF xv = randn(static_cast<std::size_t>(kBatch * 64), 31, 4.0, 4.0);  // pixels ~ 0..16
  const VecF gv = randn(static_cast<std::size_t>(kBatch * 10), 32, 0.0, 1.0 / kBatch);
  const mpt::CnnConfig cfg{8, 16, 10, true, DType::f32, nullptr, 3};
  struct Out {
    VecF logits, grads, running;
    std::vector<VecF> means;
  };
  // rows [first, first + rows), dlogits scaled by `scale` (a rank's loss is
  // the mean over its rows: N times the whole batch's gradient per row).
  const auto step = [&](mpt::Cnn& cnn, std::int64_t first, std::int64_t rows, float scale,
                        mpt::dist::DistributedDataParallel* ddp) {
    mpt::MatrixF x(rows, 64);
    std::copy_n(xv.begin() + first * 64, rows * 64, x.data());
    VecF g(gv.begin() + first * 10, gv.begin() + (first + rows) * 10);
    for (float& v : g) v *= scale;
    if (ddp) ddp->before_forward();
    Out o;
    o.logits = values(cnn.forward(x));
    cnn.backward(Tensor::from_f32(g.data(), {rows, 10}, DType::f32));
    if (ddp) ddp->finish_backward();
    for (mpt::Parameter* p : cnn.parameters()) {
      const VecF v = values(p->grad);
      o.grads.insert(o.grads.end(), v.begin(), v.end());
    }
    for (const std::string& path : cnn.paths())
      if (auto* bn = dynamic_cast<mpt::BatchNorm*>(cnn.find(path))) {
        for (const Tensor* t : {&bn->running_mean, &bn->running_var}) {
          const VecF v = values(*t);
          o.running.insert(o.running.end(), v.begin(), v.end());
        }
        o.means.push_back(values(bn->mean()));
      }
    return o;
  };
  mpt::Cnn whole(cfg);
  const Out ref = step(whole, 0, kBatch, 1.0f, nullptr);
  REQUIRE(ref.means.size() == 2);
  for (bool sync : {true, false})
    for (int world : {2, 4}) {
      CAPTURE(sync);
      CAPTURE(world);
      std::vector<Out> outs(static_cast<std::size_t>(world));
      mpt::dist::ThreadWorld(world, 30).run([&](mpt::dist::Communicator& comm) {
        mpt::Cnn cnn(cfg);
        mpt::dist::DdpOptions o;
        o.sync_batch_norm = sync;
        o.fixed_order = true;
        mpt::dist::DistributedDataParallel ddp(cnn, comm, o);
        const std::int64_t rows = kBatch / world;
        outs[static_cast<std::size_t>(comm.rank())] =
            step(cnn, rows * comm.rank(), rows, static_cast<float>(world), &ddp);
      });
      VecF logits;
      for (const Out& o : outs) logits.insert(logits.end(), o.logits.begin(), o.logits.end());
      const float dl = max_abs_diff(logits, ref.logits), dg = max_abs_diff(outs[0].grads, ref.grads);
      const float dr = max_abs_diff(outs[0].running, ref.running);
      MESSAGE(std::string(sync ? "sync" : "plain")
              << " BN Cnn, " << world << " ranks vs one process: max |Δlogits| " << dl << ", |Δgrad| " << dg
              << ", |Δrunning| " << dr);
      if (sync) {
        // The same f32 values through conv, relu, pool and fc in both, the
        // BatchNorm statistics merged in another order (see kTolY), the
        // gradients of 16 rows summed over ranks in another order: the same
        // derivation, |logits| and |grad| of order 1 here.
        CHECK(dl < kTolY);
        CHECK(dg < kTolSum);
        CHECK(dr < kTolY);
        for (const Out& o : outs) {
          CHECK(same_bits(o.running, outs[0].running));
          for (std::size_t k = 0; k < o.means.size(); ++k) CHECK(same_bits(o.means[k], outs[0].means[k]));
        }
      } else {
        // Measured: logits 0.12 (2 ranks), 0.25 (4); running estimates
        // 0.014, 0.038 (a tenth of the batch statistics' difference).
        CHECK(dl > 100 * kTolY);
        CHECK(dr > 10 * kTolY);
      }
    }
}

TEST_CASE("SyncBatchNorm refuses one value per channel across all ranks, and takes one per rank") {
  mpt::dist::ThreadWorld(2, 30).run([](mpt::dist::Communicator& comm) {
    mpt::Context ctx(mpt::uniform_policy(DType::f32));
    mpt::BatchNorm bn(2);
    mpt::dist::sync_batch_norm(bn, comm);
    // [1, 2] on each rank: 2 values per channel across the ranks, allowed
    // (PyTorch's SyncBatchNorm checks the world, not the shard).
    const float v[2] = {static_cast<float>(comm.rank()), 1.0f + 2.0f * comm.rank()};
    const VecF y = values(bn.forward(Tensor::from_f32(v, {1, 2}, DType::f32), ctx));
    CHECK(std::fabs(y[0]) > 0.9f);  // ±1 up to eps: the global mean 0.5 and sd 0.5
  });
  mpt::dist::ThreadWorld world1(1, 30);
  world1.run([](mpt::dist::Communicator& comm) {
    mpt::Context ctx(mpt::uniform_policy(DType::f32));
    mpt::BatchNorm bn(2);
    mpt::dist::sync_batch_norm(bn, comm);
    const float v[2] = {1.0f, 2.0f};
    CHECK_THROWS_WITH_AS(
        bn.forward(Tensor::from_f32(v, {1, 2}, DType::f32), ctx),
        "BatchNorm: expected more than 1 value per channel when training, got 1 across the ranks (x of shape "
        "1x2 here)",
        std::invalid_argument);
  });
}
