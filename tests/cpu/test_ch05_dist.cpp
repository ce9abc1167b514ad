// Chapter 05 — loss scaling across ranks: the dist tier in one process.
// The reduction every backend applies (f16/bf16 rounding, overflow, NaN),
// the fixed-order all-reduce, bucket assignment, the gradient-ready hook
// (a tied weight's two contributions), no_sync, pre-division, the ZeRO
// partition and the found-inf seam of GradScaler; ThreadWorld (N ranks as
// threads: its collectives, its checks, DDP on it). The multi-process
// behaviour is tested under mpiexec (tests/mpi/).
// Depends on: the dist tier, the nn/optim/amp tiers, doctest, dist_support.hpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "dist_support.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/dist/communicator.hpp"
#include "mpt/dist/ddp.hpp"
#include "mpt/dist/sharded.hpp"
#include "mpt/dist/thread_world.hpp"
#include "mpt/formats/storage.hpp"
#include "mpt/nn/data/text_data.hpp"
#include "mpt/nn/layers/softmax.hpp"
#include "mpt/nn/models/transformer.hpp"
#include "mpt/optim/sgd.hpp"

using mpt::DType;
using mpt::dist::ReduceOp;
using mpt_test::MirrorWorld;

namespace {

std::vector<Eigen::half> halves(const std::vector<float>& v) {
  std::vector<Eigen::half> h(v.size());
  mpt::to_fp16(v.data(), h.data(), v.size());
  return h;
}
std::vector<float> floats(const std::vector<Eigen::half>& h) {
  std::vector<float> v(h.size());
  mpt::from_fp16(h.data(), v.data(), h.size());
  return v;
}

}  // namespace

TEST_CASE("combine: an f16 sum is rounded after every pair and overflows past 65504") {
  // 40000 + 40000 = 80000 is above f16's largest finite value: inf, although
  // both inputs are finite. 2048 + 1 = 2049 is not an f16 value (spacing 2
  // there): nearest-even gives 2048. In f32 both sums are exact.
  auto a = halves({40000.0f, 2048.0f, -3.0f});
  const auto b = halves({40000.0f, 1.0f, 1.0f});
  mpt::dist::combine(a.data(), b.data(), 3, DType::f16, ReduceOp::sum);
  const auto got = floats(a);
  CHECK(std::isinf(got[0]));
  CHECK(got[0] > 0);
  CHECK(got[1] == 2048.0f);
  CHECK(got[2] == -2.0f);
  std::vector<float> f{40000.0f, 2048.0f};
  const std::vector<float> g{40000.0f, 1.0f};
  mpt::dist::combine(f.data(), g.data(), 2, DType::f32, ReduceOp::sum);
  CHECK(f[0] == 80000.0f);
  CHECK(f[1] == 2049.0f);
}

TEST_CASE("combine: bf16 rounds to 8 significant bits; max keeps NaN") {
  std::vector<Eigen::bfloat16> a(2), b(2);
  const float av[2] = {1.0f, -5.0f}, bv[2] = {1.0f / 256.0f, 2.0f};
  mpt::to_bf16(av, a.data(), 2);
  mpt::to_bf16(bv, b.data(), 2);
  mpt::dist::combine(a.data(), b.data(), 2, DType::bf16, ReduceOp::sum);
  float out[2];
  mpt::from_bf16(a.data(), out, 2);
  CHECK(out[0] == 1.0f);  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even
  CHECK(out[1] == -3.0f);
  std::vector<float> m{1.0f, std::numeric_limits<float>::quiet_NaN(), -1.0f};
  const std::vector<float> n{std::numeric_limits<float>::quiet_NaN(), 2.0f, -2.0f};
  mpt::dist::combine(m.data(), n.data(), 3, DType::f32, ReduceOp::max);
  CHECK(std::isnan(m[0]));
  CHECK(std::isnan(m[1]));
  CHECK(m[2] == -1.0f);
}

TEST_CASE("a collective refuses fp8 buffers and negative counts with one line") {
  CHECK_THROWS_WITH(mpt::dist::element_bytes(DType::e4m3),
                    "a collective moves f32, f16 or bf16 buffers, not e4m3");
  mpt::dist::LocalCommunicator one;
  float x = 1;
  CHECK_THROWS_WITH(one.all_reduce(&x, -1, DType::f32, ReduceOp::sum),
                    "all_reduce: a count of -1 elements; it must be >= 0");
  CHECK_THROWS_WITH(one.broadcast(&x, 4, 1), "broadcast: root 1 in a world of 1 rank (valid: 0)");
}

TEST_CASE("the fixed-order all-reduce adds the ranks' buffers one after another") {
  // In a mirror world of 3 the result must be ((x + x) + x), each pair
  // rounded to f16: what two combine() calls give.
  MirrorWorld three(0, 3);
  auto a = halves({21000.0f, 0.1f});
  mpt::dist::all_reduce_fixed_order(three, a.data(), 2, DType::f16, ReduceOp::sum);
  auto expect = halves({21000.0f, 0.1f});
  const auto once = expect;
  mpt::dist::combine(expect.data(), once.data(), 2, DType::f16, ReduceOp::sum);
  mpt::dist::combine(expect.data(), once.data(), 2, DType::f16, ReduceOp::sum);
  CHECK(floats(a) == floats(expect));
  mpt::dist::LocalCommunicator one;
  std::vector<float> v{1.5f, -2.0f};
  mpt::dist::all_reduce_fixed_order(one, v.data(), 2, DType::f32, ReduceOp::sum);
  CHECK(v == std::vector<float>{1.5f, -2.0f});
}

TEST_CASE("buckets: parameters in reverse order, the first bucket capped at first_bucket_cap_mb") {
  // The blobs MLP: fc1.weight 256, fc1.bias 32, fc2.weight 1024, fc2.bias 32,
  // fc3.weight 128, fc3.bias 4 elements. 1/1024 MiB holds 256 f32 elements.
  auto net = mpt_test::blobs_mlp();
  MirrorWorld two(0, 2);
  mpt::dist::DdpOptions o;
  o.bucket_cap_mb = 2.0 / 1024;  // 512 elements
  o.first_bucket_cap_mb = 1.0 / 1024;
  mpt::dist::DistributedDataParallel ddp(*net, two, o);
  const auto& b = ddp.buckets();
  REQUIRE(b.size() == 3);
  CHECK(b[0].params == std::vector<std::size_t>{5, 4, 3});  // 164 elements; fc2.weight would pass 256
  CHECK(b[0].elements == 164);
  CHECK(b[1].params == std::vector<std::size_t>{2});     // 1024: alone, above the cap
  CHECK(b[2].params == std::vector<std::size_t>{1, 0});  // 32 + 256 = 288 <= 512
  CHECK(b[2].elements == 288);
  CHECK(two.broadcasts == 6);  // every master from rank 0 (no BatchNorm here)
}

TEST_CASE("DDP in a world of one changes nothing, and its buckets start during backward") {
  auto plain = mpt_test::blobs_mlp(DType::f16);
  auto dp = mpt_test::blobs_mlp(DType::f16);
  mpt::dist::LocalCommunicator one;
  mpt::dist::DdpOptions o;
  o.bucket_cap_mb = 1.0 / 1024;
  mpt::dist::DistributedDataParallel ddp(*dp, one, o);
  mpt::SGD sp(plain->parameters(), {0.05, 0.9}), sd(dp->parameters(), {0.05, 0.9});
  mpt::Batches bp(mpt_test::blobs(), 64, 1234), bd(mpt_test::blobs(), 64, 1234);
  for (int step = 0; step < 5; ++step) {
    sp.zero_grad();
    sd.zero_grad();
    (void)mpt_test::shard_backward(*plain, bp.next(), 0, 1, 1024.0f);
    ddp.before_forward();
    (void)mpt_test::shard_backward(*dp, bd.next(), 0, 1, 1024.0f);
    ddp.finish_backward();
    CHECK(mpt_test::bits_differ(mpt_test::grads(*plain), mpt_test::grads(*dp)) == 0);
    if (step == 0)
      CHECK(ddp.stats().buckets_started_at_finish == static_cast<std::int64_t>(ddp.buckets().size()));
    else CHECK(ddp.stats().buckets_started_in_backward == static_cast<std::int64_t>(ddp.buckets().size()));
    for (auto* p : plain->parameters()) p->grad.f32() *= 1.0f / 1024;
    for (auto* p : dp->parameters()) p->grad.f32() *= 1.0f / 1024;
    sp.step();
    sd.step();
    plain->refresh_model_copies();
    dp->refresh_model_copies();
  }
  CHECK(mpt_test::bits_differ(mpt_test::masters(*plain), mpt_test::masters(*dp)) == 0);
}

TEST_CASE("a tied weight is ready after its second contribution, not its first") {
  // The Transformer's token table feeds the embedding and the tied output
  // head: two contributions per backward. Were its bucket packed at the
  // first, the averaged gradient would lack the head's part.
  mpt::TransformerConfig c;
  c.vocab_size = 16;
  c.context = 8;
  c.d_model = 16;
  c.num_heads = 2;
  c.num_layers = 1;
  c.seed = 3;
  mpt::TinyTransformer plain(c), dp(c);
  mpt::dist::LocalCommunicator one;
  mpt::dist::DdpOptions o;
  o.bucket_cap_mb = 1.0 / 4096;  // 64 elements: many buckets
  o.first_bucket_cap_mb = 1.0 / 4096;
  mpt::dist::DistributedDataParallel ddp(dp, one, o);
  std::vector<int> tokens(200);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>((i * 7 + i / 5) % 16);
  mpt::Rng r1(1), r2(1);
  for (int step = 0; step < 2; ++step) {
    for (auto* net : {&plain, &dp}) {
      for (auto* p : net->parameters()) p->grad.fill_zero();
      const mpt::TokenBatch b = mpt::sample_windows(tokens, 0, tokens.size(), 4, 8, net == &plain ? r1 : r2);
      const mpt::Tensor& logits = net->forward_tokens(b.inputs, b.batch, b.context);
      mpt::Tensor dl(DType::f32, {});
      dl.f32_data()[0] = 1.0f;
      net->backward(mpt::cross_entropy_backward(logits, b.targets, {}, dl, net->context()));
    }
    ddp.finish_backward();
    CHECK(mpt_test::bits_differ(mpt_test::grads(plain), mpt_test::grads(dp)) == 0);
  }
  CHECK(ddp.stats().buckets_started_in_backward == static_cast<std::int64_t>(ddp.buckets().size()));
}

TEST_CASE("no_sync: gradients accumulate locally; the next synchronised backward reduces the sums") {
  auto net = mpt_test::blobs_mlp();
  MirrorWorld two(0, 2);  // the other rank holds the same gradients: the average is the local sum
  mpt::dist::DistributedDataParallel ddp(*net, two, {});
  mpt::Batches b(mpt_test::blobs(), 64, 1234);
  const mpt::Dataset b1 = b.next(), b2 = b.next();
  {
    auto guard = ddp.no_sync();
    (void)mpt_test::shard_backward(*net, b1, 0, 2, 1.0f);
    ddp.finish_backward();  // does nothing inside no_sync
  }
  const int reduces_before = two.all_reduces;
  const auto after_first = mpt_test::grads(*net);
  (void)mpt_test::shard_backward(*net, b2, 0, 2, 1.0f);
  ddp.finish_backward();
  CHECK(reduces_before == 0);
  CHECK(two.all_reduces == static_cast<int>(ddp.buckets().size()));
  // The reference: the same two shards accumulated without DDP.
  auto ref = mpt_test::blobs_mlp();
  (void)mpt_test::shard_backward(*ref, b1, 0, 2, 1.0f);
  CHECK(mpt_test::bits_differ(mpt_test::grads(*ref), after_first) == 0);
  (void)mpt_test::shard_backward(*ref, b2, 0, 2, 1.0f);
  // Mirror world of 2 with predivide 2: x/2 + x/2 = x exactly.
  CHECK(mpt_test::bits_differ(mpt_test::grads(*ref), mpt_test::grads(*net)) == 0);
}

TEST_CASE("an f16 all-reduce that sums first overflows; pre-division keeps it finite") {
  // Two ranks whose f16 gradients are 40000 each: every rank's gradient is
  // finite, their sum is not. predivide_factor 1 (sum, then average) gives
  // inf; the default (divide by the world first) gives 40000.
  for (const double predivide : {1.0, 0.0}) {
    auto net = mpt_test::blobs_mlp(DType::f16);
    MirrorWorld two(0, 2);
    mpt::dist::DdpOptions o;
    o.comm_dtype = DType::f16;
    o.predivide_factor = predivide;
    mpt::dist::DistributedDataParallel ddp(*net, two, o);
    for (auto* p : net->parameters()) p->grad.fill_zero();
    std::vector<float> g(static_cast<std::size_t>(net->parameters()[0]->grad.numel()), 40000.0f);
    net->parameters()[0]->accumulate_grad(g.data(), static_cast<std::int64_t>(g.size()), DType::f16);
    for (std::size_t k = 1; k < net->parameters().size(); ++k) {
      auto* p = net->parameters()[k];
      std::vector<float> z(static_cast<std::size_t>(p->grad.numel()), 0.0f);
      p->accumulate_grad(z.data(), static_cast<std::int64_t>(z.size()), DType::f16);
    }
    ddp.finish_backward();
    const float got = net->parameters()[0]->grad.f32_data()[0];
    CAPTURE(predivide);
    if (predivide == 1.0) CHECK(std::isinf(got));
    else CHECK(got == 40000.0f);
  }
}

TEST_CASE("ZeRO's partition: largest first, each to the least-loaded rank") {
  CHECK(mpt::dist::partition_parameters({10, 100, 5, 50}, 2) == std::vector<int>{1, 0, 1, 1});
  CHECK(mpt::dist::partition_parameters({4, 4, 4}, 1) == std::vector<int>{0, 0, 0});
  CHECK(mpt::dist::partition_parameters({3, 3, 3, 3}, 4) == std::vector<int>{0, 1, 2, 3});
  CHECK_THROWS_WITH(mpt::dist::partition_parameters({1}, 0), "a world of 0 ranks; it must be >= 1");
}

TEST_CASE("the found-inf seam: a ShardedGradScaler skips when another rank found an inf") {
  // This rank's gradients are finite; the mirror world's "other rank" says
  // it found one. GradScaler (local verdict) steps; ShardedGradScaler (the
  // all-reduced verdict) skips and backs off, as every rank then does.
  for (const bool sharded : {false, true}) {
    auto net = mpt_test::blobs_mlp();
    MirrorWorld two(1, 2);
    two.peer_flag = 1.0f;
    mpt::dist::ShardedOptimizer opt(net->parameters(), two, [](std::vector<mpt::Parameter*> mine) {
      return std::make_unique<mpt::SGD>(std::move(mine), mpt::SgdOptions{0.05});
    });
    mpt::GradScaler plain;
    mpt::dist::ShardedGradScaler synced(two);
    mpt::GradScaler& scaler = sharded ? synced : plain;
    mpt::Batches b(mpt_test::blobs(), 64, 1234);
    opt.zero_grad();
    (void)mpt_test::shard_backward(*net, b.next(), 1, 2, scaler.scale(1.0f));
    const bool stepped = scaler.step(opt);
    scaler.update();
    CAPTURE(sharded);
    CHECK(stepped == !sharded);
    CHECK(scaler.get_scale() == (sharded ? 32768.0f : 65536.0f));
    // Rank 1 of 2 owns fc2.weight's partner shard: fc1.weight (256) goes to
    // rank 1 after fc2.weight (1024) went to rank 0.
    CHECK(opt.owners() == std::vector<int>{1, 1, 0, 1, 1, 1});
    CHECK(opt.params().size() == 5);
    // zero_grad() clears every gradient, also fc2.weight's, which rank 0 owns.
    opt.zero_grad();
    for (const float g : mpt_test::grads(*net)) REQUIRE(g == 0.0f);
  }
}

// --- ThreadWorld: N ranks in one process --------------------------------------------

TEST_CASE("ThreadWorld: all-reduce, broadcast and all-gather on every rank, in rank order") {
  mpt::dist::ThreadWorld world(3);
  std::vector<std::vector<float>> sums(3), gathered(3), bcast(3);
  std::vector<std::vector<Eigen::half>> halfsums(3);
  world.run([&](mpt::dist::Communicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    CHECK(c.size() == 3);
    CHECK(std::string(c.backend()) == "threads");
    std::vector<float> v{1.0f + static_cast<float>(r), -2.0f * static_cast<float>(r)};
    c.all_reduce(v.data(), 2, DType::f32, ReduceOp::sum);
    sums[r] = v;
    // An f16 sum rounded after each pair, in rank order: 2048 + 1 + 1.
    std::vector<Eigen::half> h = halves({r == 0 ? 2048.0f : 1.0f});
    c.all_reduce(h.data(), 1, DType::f16, ReduceOp::sum);
    halfsums[r] = h;
    std::vector<float> b{static_cast<float>(r) * 10};
    c.broadcast(b.data(), sizeof(float), 2);
    bcast[r] = b;
    const float mine = static_cast<float>(r) + 0.5f;
    std::vector<float> all(3);
    c.all_gather(&mine, all.data(), sizeof(float));
    gathered[r] = all;
    c.barrier();
  });
  for (std::size_t r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(sums[r] == std::vector<float>{6.0f, -6.0f});
    // (2048 + 1) rounds to 2048 (ties to even), and again: 2048, not 2050.
    CHECK(floats(halfsums[r]) == std::vector<float>{2048.0f});
    CHECK(bcast[r] == std::vector<float>{20.0f});
    CHECK(gathered[r] == std::vector<float>{0.5f, 1.5f, 2.5f});
  }
}

TEST_CASE("ThreadWorld: ranks that make different calls end with both calls named, never a hang") {
  mpt::dist::ThreadWorld world(2, 5.0);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(
      world.run([](mpt::dist::Communicator& c) {
        c.set_tag(3);
        float flag = 0;
        if (c.rank() == 0) c.all_reduce(&flag, 1, DType::f32, ReduceOp::max);
        else c.barrier();
      }),
      "the ranks disagree on a collective: rank 0 calls all_reduce(f32 x 1, max) as collective #1 "
      "(tag 3), rank 1 calls barrier() as collective #1 (tag 3)");
  // A rank that returns while another waits in a call it never makes.
  CHECK_THROWS_WITH(world.run([](mpt::dist::Communicator& c) {
    float g = 1;
    if (c.rank() == 0) c.all_reduce(&g, 1, DType::f32, ReduceOp::sum);
  }),
                    "rank 1 of 2 returned without making all_reduce(f32 x 1, sum) as collective #1 (tag 0), "
                    "which rank 0 waits in");
  // A rank that throws: its message, not the waiting rank's.
  CHECK_THROWS_WITH(world.run([](mpt::dist::Communicator& c) {
    if (c.rank() == 1) throw std::runtime_error("out of memory in step 4");
    c.barrier();
  }),
                    "rank 1 of 2: out of memory in step 4");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(4));
  // A rank that is slow past the timeout.
  mpt::dist::ThreadWorld impatient(2, 0.2);
  CHECK_THROWS_WITH(
      impatient.run([](mpt::dist::Communicator& c) {
        if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(800));
        c.barrier();
      }),
      "rank 0 of 2: barrier() as collective #1 (tag 0) did not complete within 0.2 s: rank(s) 1 did "
      "not make this call");
  // The same world runs again afterwards, from collective #1.
  int ok = 0;
  std::atomic<int> done{0};
  world.run([&](mpt::dist::Communicator& c) {
    c.barrier();
    if (c.rank() == 0) ok = 1;
    ++done;
  });
  CHECK(ok == 1);
  CHECK(done == 2);
  CHECK_THROWS_WITH(mpt::dist::ThreadWorld(0), "ThreadWorld: 0 ranks; valid: 1 .. 64");
}

TEST_CASE("ThreadWorld: DDP on 2 and 4 ranks keeps the replicas equal and matches one process") {
  // One SGD step of the blobs MLP on a batch of 64: the whole batch in one
  // process, against 2 and 4 ranks of 64/N rows each.
  mpt::Batches b0(mpt_test::blobs(), 64, 1234);
  const mpt::Dataset batch = b0.next();
  auto one = mpt_test::blobs_mlp();
  mpt::SGD opt1(one->parameters(), mpt::SgdOptions{0.05});
  opt1.zero_grad();
  (void)mpt_test::shard_backward(*one, batch, 0, 1, 1.0f);
  opt1.step();
  const std::vector<float> expect = mpt_test::masters(*one);
  for (const int n : {2, 4}) {
    mpt::dist::ThreadWorld world(n);
    std::vector<std::vector<float>> after(static_cast<std::size_t>(n));
    world.run([&](mpt::dist::Communicator& c) {
      auto net = mpt_test::blobs_mlp();
      mpt::dist::DistributedDataParallel ddp(*net, c, mpt::dist::DdpOptions{});
      mpt::SGD opt(net->parameters(), mpt::SgdOptions{0.05});
      opt.zero_grad();
      ddp.before_forward();
      (void)mpt_test::shard_backward(*net, batch, c.rank(), c.size(), 1.0f);
      ddp.finish_backward();
      opt.step();
      after[static_cast<std::size_t>(c.rank())] = mpt_test::masters(*net);
    });
    CAPTURE(n);
    for (int r = 1; r < n; ++r)
      CHECK(mpt_test::bits_differ(after[0], after[static_cast<std::size_t>(r)]) == 0);
    double worst = 0;
    for (std::size_t i = 0; i < expect.size(); ++i)
      worst = std::max(worst, static_cast<double>(std::fabs(after[0][i] - expect[i])));
    CHECK(worst > 0);     // a different order of sums: not the same bits,
    CHECK(worst < 1e-6);  // but within f32 rounding of them
  }
}

TEST_CASE("gradient_as_bucket_view: the gradients live in their buckets, with the bits of the copies") {
  // Two ranks, one step, the same shards: once with the gradients as views of
  // the buckets (the default), once with copies. Every gradient is in its
  // bucket after construction; one replaced by the caller (a new tensor) and
  // one written through a copy of it (copy on write moves it out) are brought
  // back before their bucket is sent; the averages are the same bits either
  // way; the destructor gives every gradient a buffer of its own again.
  mpt::Batches b0(mpt_test::blobs(), 64, 99);
  const mpt::Dataset batch = b0.next();
  std::vector<std::vector<std::vector<float>>> got(2, std::vector<std::vector<float>>(2));
  std::vector<int> in_bucket(2, 0), out_after(2, 0);
  for (const bool views : {true, false}) {
    mpt::dist::ThreadWorld world(2);
    world.run([&](mpt::dist::Communicator& c) {
      auto net = mpt_test::blobs_mlp();
      const std::vector<mpt::Parameter*> params = net->parameters();
      mpt::dist::DdpOptions o;
      o.gradient_as_bucket_view = views;
      o.bucket_cap_mb = 1000;  // one bucket: its buffer holds every gradient
      std::vector<float> kept;
      std::vector<const void*> where;
      {
        mpt::dist::DistributedDataParallel ddp(*net, c, o);
        REQUIRE(ddp.buckets().size() == 1);
        int inside = 0;
        for (std::size_t k = 1; k < params.size(); ++k)  // neighbours in the buffer, in reverse order
          if (params[k - 1]->grad.f32_data() == params[k]->grad.f32_data() + params[k]->grad.numel())
            ++inside;
        if (c.rank() == 0) in_bucket[views ? 0 : 1] = inside;
        for (int step = 0; step < 2; ++step) {
          for (mpt::Parameter* p : params) p->grad.fill_zero();
          if (step == 1) {
            params[0]->grad = mpt::Tensor(DType::f32, params[0]->grad.shape());  // replaced
            const mpt::Tensor copy = params[1]->grad;                            // shared: the
            params[1]->grad.fill_zero();                                         // write copies
          }
          ddp.before_forward();
          (void)mpt_test::shard_backward(*net, batch, c.rank(), c.size(), 1.0f);
          ddp.finish_backward();
        }
        kept = mpt_test::grads(*net);
        for (mpt::Parameter* p : params) where.push_back(p->grad.raw());
      }
      // After the destructor: the averages are still there, in buffers of
      // their own (with views, none is still in the freed bucket).
      int moved = 0;
      for (std::size_t k = 0; k < params.size(); ++k) moved += params[k]->grad.raw() != where[k] ? 1 : 0;
      if (c.rank() == 0) {
        got[views ? 0 : 1] = {kept, mpt_test::grads(*net)};
        out_after[views ? 0 : 1] = moved;
      }
    });
  }
  CHECK(in_bucket[0] == static_cast<int>(mpt_test::blobs_mlp()->parameters().size()) - 1);  // views: one run
  CHECK(in_bucket[1] == 0);  // copies: gradients where they were allocated
  const int n_params = static_cast<int>(mpt_test::blobs_mlp()->parameters().size());
  CHECK(mpt_test::bits_differ(got[0][0], got[1][0]) == 0);  // the same averages, bit for bit
  CHECK(mpt_test::bits_differ(got[0][0], got[0][1]) == 0);  // kept by the destructor
  CHECK(out_after[0] == n_params);                          // views: every gradient moved out
  CHECK(out_after[1] == 0);                                 // copies: nothing to move
}

TEST_CASE(
    "gradient_as_bucket_view: what was accumulated before DDP existed is averaged as the copies average it") {
  // Gradients that hold 3 before the DDP is made (say, a backward run before
  // wrapping the model): in a mirrored world of two the average is 3 again,
  // with the views as with the copies. Then a backward without zero_grad
  // adds to those averages: the same bits either way.
  mpt::Batches b0(mpt_test::blobs(), 64, 7);
  const mpt::Dataset batch = b0.next();
  std::vector<std::vector<float>> after(2);
  for (const bool views : {true, false}) {
    CAPTURE(views);
    auto net = mpt_test::blobs_mlp();
    for (mpt::Parameter* p : net->parameters())
      std::fill(p->grad.f32_data(), p->grad.f32_data() + p->grad.numel(), 3.0f);
    MirrorWorld two(0, 2);
    mpt::dist::DdpOptions o;
    o.gradient_as_bucket_view = views;
    {
      mpt::dist::DistributedDataParallel ddp(*net, two, o);
      ddp.finish_backward();  // no backward: every bucket reduced as it is
      const std::vector<float> g = mpt_test::grads(*net);
      CHECK(std::count(g.begin(), g.end(), 3.0f) == static_cast<std::ptrdiff_t>(g.size()));
    }
    mpt::dist::DistributedDataParallel ddp(*net, two, o);
    for (int step = 0; step < 2; ++step) {  // no zero_grad: each adds to the averages before it
      (void)mpt_test::shard_backward(*net, batch, 0, 2, 1.0f);
      ddp.finish_backward();
    }
    after[views ? 0 : 1] = mpt_test::grads(*net);
  }
  CHECK(mpt_test::bits_differ(after[0], after[1]) == 0);
}
