// Chapter 05 — loss scaling across ranks, on real ranks (run under
// `mpiexec -n N`, N = 1, 2 and 4; see CMakeLists.txt): the MPI backend's
// collectives in every dtype, DistributedDataParallel against one process
// (within a tolerance for MPI's own all-reduce, bit for bit with the
// fixed-order one), the scalers of plain DDP staying equal by themselves,
// and the sharded optimizer with and without the found-inf sync.
// Depends on: the dist tier and its MPI backend, the nn/optim/amp tiers,
// doctest, ../cpu/dist_support.hpp, mpi_world.hpp.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "../cpu/dist_support.hpp"
#include "mpi_world.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/dist/ddp.hpp"
#include "mpt/dist/sharded.hpp"
#include "mpt/formats/storage.hpp"
#include "mpt/optim/sgd.hpp"

using mpt::DType;
using mpt::dist::ReduceOp;

namespace {

constexpr int kSteps = 12;

// Every rank's vector, gathered (the same length on every rank).
std::vector<std::vector<float>> gather(const std::vector<float>& mine) {
  auto& comm = mpt_test::world();
  std::vector<float> all(mine.size() * static_cast<std::size_t>(comm.size()));
  comm.all_gather(mine.data(), all.data(), mine.size() * sizeof(float));
  std::vector<std::vector<float>> out;
  for (int r = 0; r < comm.size(); ++r)
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(mine.size()) * r,
                     all.begin() + static_cast<std::ptrdiff_t>(mine.size()) * (r + 1));
  return out;
}

struct Run {
  std::vector<float> masters;
  std::vector<float> scales;  // before each step
  int skipped = 0;
};

// A step's hook for the tests: called after backward (and, for DDP, after
// finish_backward), before the scaler's step.
using AfterBackward = void (*)(mpt::Model&, int step);

// The blobs MLP trained data-parallel on this rank: each step a batch of 64,
// this rank's 64/N rows, SGD (momentum 0.9), a GradScaler of PyTorch's defaults.
Run ddp_run(DType dtype, mpt::dist::DdpOptions o, AfterBackward poke = nullptr, bool sharded = false,
            bool synced_scaler = true) {
  auto& comm = mpt_test::world();
  auto net = mpt_test::blobs_mlp(dtype);
  mpt::dist::DistributedDataParallel ddp(*net, comm, o);
  std::unique_ptr<mpt::Optimizer> opt;
  mpt::dist::ShardedOptimizer* zero = nullptr;
  if (sharded) {
    auto z = std::make_unique<mpt::dist::ShardedOptimizer>(
        net->parameters(), comm, [](std::vector<mpt::Parameter*> p) {
          return std::make_unique<mpt::SGD>(std::move(p), mpt::SgdOptions{0.05, 0.9});
        });
    zero = z.get();
    opt = std::move(z);
  } else {
    opt = std::make_unique<mpt::SGD>(net->parameters(), mpt::SgdOptions{0.05, 0.9});
  }
  mpt::GradScaler plain;
  mpt::dist::ShardedGradScaler synced(comm);
  mpt::GradScaler& scaler = sharded && synced_scaler ? synced : plain;
  mpt::Batches batches(mpt_test::blobs(), 64, 1234);
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    comm.set_tag(step);
    for (auto* p : net->parameters()) p->grad.fill_zero();
    ddp.before_forward();
    run.scales.push_back(scaler.get_scale());
    (void)mpt_test::shard_backward(*net, batches.next(), comm.rank(), comm.size(), scaler.scale(1.0f));
    ddp.finish_backward();
    if (poke) poke(*net, step);
    run.skipped += !scaler.step(*opt);
    scaler.update();
    if (zero) zero->gather_masters();
    net->refresh_model_copies();
  }
  run.masters = mpt_test::masters(*net);
  return run;
}

// The same steps in this one process: every shard's gradient computed in
// turn and combined as the fixed-order all-reduce combines them,
// ((g0/N + g1/N) + g2/N) + ... — or, with whole_batch, one backward over all
// 64 rows (what one process without data parallelism computes).
Run serial_run(DType dtype, int world, bool whole_batch) {
  auto net = mpt_test::blobs_mlp(dtype);
  mpt::SGD opt(net->parameters(), mpt::SgdOptions{0.05, 0.9});
  mpt::GradScaler scaler;
  mpt::Batches batches(mpt_test::blobs(), 64, 1234);
  Run run;
  const auto pre = static_cast<float>(1.0 / world);
  for (int step = 0; step < kSteps; ++step) {
    const mpt::Dataset b = batches.next();
    run.scales.push_back(scaler.get_scale());
    const float s = scaler.scale(1.0f);
    std::vector<float> total;
    if (whole_batch) {
      for (auto* p : net->parameters()) p->grad.fill_zero();
      (void)mpt_test::shard_backward(*net, b, 0, 1, s);
      total = mpt_test::grads(*net);
    } else {
      for (int r = 0; r < world; ++r) {
        for (auto* p : net->parameters()) p->grad.fill_zero();
        (void)mpt_test::shard_backward(*net, b, r, world, s);
        std::vector<float> g = mpt_test::grads(*net);
        for (float& x : g) x *= pre;
        if (r == 0) total = g;
        else
          for (std::size_t i = 0; i < g.size(); ++i) total[i] += g[i];
      }
    }
    std::size_t at = 0;
    for (auto* p : net->parameters()) {
      p->grad.assign(total.data() + at, p->grad.numel());
      at += static_cast<std::size_t>(p->grad.numel());
    }
    run.skipped += !scaler.step(opt);
    scaler.update();
    net->refresh_model_copies();
  }
  run.masters = mpt_test::masters(*net);
  return run;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::abs(double(a[i]) - b[i]) / std::max(1e-3, std::abs(double(b[i]))));
  return m;
}

}  // namespace

TEST_CASE("the MPI backend reduces f32, f16 and bf16 as combine() does") {
  auto& comm = mpt_test::world();
  const int n = comm.size(), r = comm.rank();
  std::vector<float> f{float(r + 1), float(-r)};
  comm.all_reduce(f.data(), 2, DType::f32, ReduceOp::sum);
  CHECK(f[0] == static_cast<float>(n * (n + 1)) / 2);
  CHECK(f[1] == -static_cast<float>(n * (n - 1)) / 2);
  std::vector<float> m{float(r), float(-r)};
  comm.all_reduce(m.data(), 2, DType::f32, ReduceOp::max);
  CHECK(m[0] == float(n - 1));
  CHECK(m[1] == 0.0f);
  // f16: every rank 40000. One rank: 40000; more: the sum passes 65504: inf.
  const float v[2] = {40000.0f, 0.5f};
  std::vector<Eigen::half> h(2);
  mpt::to_fp16(v, h.data(), 2);
  comm.all_reduce(h.data(), 2, DType::f16, ReduceOp::sum);
  float out[2];
  mpt::from_fp16(h.data(), out, 2);
  if (n == 1) CHECK(out[0] == 40000.0f);
  else CHECK(std::isinf(out[0]));
  CHECK(out[1] == 0.5f * n);
  std::vector<Eigen::bfloat16> b(1);
  const float bv = float(r + 1);
  mpt::to_bf16(&bv, b.data(), 1);
  comm.all_reduce(b.data(), 1, DType::bf16, ReduceOp::max);
  float bo = 0;
  mpt::from_bf16(b.data(), &bo, 1);
  CHECK(bo == float(n));
}

TEST_CASE("the fixed-order all-reduce gives every rank the serial sum x0 + x1 + ...") {
  auto& comm = mpt_test::world();
  // Values whose f32 sum depends on the order: 1e8 on rank 0, 1 on the others.
  std::vector<float> x{comm.rank() == 0 ? 1e8f : 3.0f};
  float serial = 1e8f;
  for (int q = 1; q < comm.size(); ++q) serial += 3.0f;
  mpt::dist::all_reduce_fixed_order(comm, x.data(), 1, DType::f32, ReduceOp::sum);
  CHECK(x[0] == serial);
  const auto all = gather(x);
  for (const auto& v : all) CHECK(v == all.front());
}

TEST_CASE("DDP equals one process: within a tolerance with MPI's all-reduce, bit for bit in fixed order") {
  auto& comm = mpt_test::world();
  for (const DType d : {DType::f32, DType::f16}) {
    CAPTURE(mpt::dtype_name(d));
    mpt::dist::DdpOptions o;
    o.bucket_cap_mb = 1.0 / 1024;  // several buckets: the overlap path
    o.first_bucket_cap_mb = 1.0 / 1024;
    const Run mpi = ddp_run(d, o);
    o.fixed_order = true;
    const Run fixed = ddp_run(d, o);
    const Run shards = serial_run(d, comm.size(), false);
    const Run whole = serial_run(d, comm.size(), true);
    // Fixed order: the serial formula, bit for bit, scales and skips included.
    CHECK(mpt_test::bits_differ(fixed.masters, shards.masters) == 0);
    CHECK(fixed.scales == shards.scales);
    // MPI's reduction: the same run up to rounding. 12 SGD steps of the
    // blobs MLP; in f16 the weights are read rounded, so a last-bit
    // difference in a master can move a weight by an f16 ulp (2^-11 relative).
    const double tol = d == DType::f32 ? 1e-4 : 2e-2;
    if (comm.rank() == 0)
      MESSAGE(comm.size() << " ranks, " << mpt::dtype_name(d)
                          << ": MPI's all-reduce differs from the fixed order in "
                          << mpt_test::bits_differ(mpi.masters, fixed.masters) << " of " << mpi.masters.size()
                          << " masters; largest relative difference from one process over the whole batch "
                          << max_rel_diff(mpi.masters, whole.masters) << " (MPI), "
                          << max_rel_diff(fixed.masters, whole.masters) << " (fixed order)");
    CHECK(max_rel_diff(mpi.masters, whole.masters) < tol);
    CHECK(max_rel_diff(fixed.masters, whole.masters) < tol);
    CHECK(mpi.scales == whole.scales);
    // Every replica holds the same masters and scales.
    for (const auto& v : gather(mpi.masters)) CHECK(mpt_test::bits_differ(v, mpi.masters) == 0);
    for (const auto& v : gather(mpi.scales)) CHECK(v == mpi.scales);
  }
}

TEST_CASE("plain DDP: an inf on one rank reaches every rank, so every scaler skips and backs off alike") {
  auto& comm = mpt_test::world();
  // Rank 0 alone overflows at step 4, in its own gradient before the
  // all-reduce (overlap off, so that every bucket is packed at
  // finish_backward, after the poke); the sum carries the inf to every rank.
  auto net = mpt_test::blobs_mlp(DType::f16);
  mpt::dist::DdpOptions o;
  o.overlap = false;
  mpt::dist::DistributedDataParallel ddp(*net, comm, o);
  mpt::SGD opt(net->parameters(), mpt::SgdOptions{0.05, 0.9});
  mpt::GradScaler scaler;
  mpt::Batches batches(mpt_test::blobs(), 64, 1234);
  std::vector<float> scales;
  std::vector<float> skips;
  for (int step = 0; step < 8; ++step) {
    for (auto* p : net->parameters()) p->grad.fill_zero();
    ddp.before_forward();
    (void)mpt_test::shard_backward(*net, batches.next(), comm.rank(), comm.size(), scaler.scale(1.0f));
    if (step == 4 && comm.rank() == 0)
      net->parameters()[2]->grad.f32_data()[5] = std::numeric_limits<float>::infinity();
    ddp.finish_backward();
    skips.push_back(scaler.step(opt) ? 0.0f : 1.0f);
    scaler.update();
    scales.push_back(scaler.get_scale());
    net->refresh_model_copies();
  }
  for (const auto& v : gather(scales)) CHECK(v == scales);
  for (const auto& v : gather(skips)) CHECK(v == skips);
  CHECK(skips[4] == 1.0f);
}

TEST_CASE("the sharded optimizer: with ShardedGradScaler it is plain DDP; without, the ranks' scales part") {
  auto& comm = mpt_test::world();
  const Run plain = ddp_run(DType::f32, {});
  const Run zero = ddp_run(DType::f32, {}, nullptr, /*sharded=*/true);
  CHECK(mpt_test::bits_differ(zero.masters, plain.masters) == 0);
  if (comm.size() < 2) return;
  // An inf that only one shard's owner sees (after the all-reduce: what a
  // reduce-scattered gradient, ZeRO-2, gives): in fc2.weight, owned by rank 0.
  const auto poke = [](mpt::Model& net, int step) {
    if (step == 5 && mpt_test::world().rank() == 0)
      net.parameters()[2]->grad.f32_data()[0] = std::numeric_limits<float>::infinity();
  };
  const Run unsynced = ddp_run(DType::f32, {}, poke, true, /*synced_scaler=*/false);
  const Run synced = ddp_run(DType::f32, {}, poke, true, /*synced_scaler=*/true);
  const auto u = gather(unsynced.scales), s = gather(synced.scales);
  CHECK(u[0] != u[1]);  // rank 0 backed off, rank 1 did not
  CHECK(s[0] == s[1]);
  std::vector<float> skipped{float(unsynced.skipped)};
  const auto k = gather(skipped);
  CHECK(k[0][0] == 1.0f);
  CHECK(k[1][0] == 0.0f);
}
