// Chapter 05 — loss scaling across ranks: SyncBatchNorm on real ranks (run
// under `mpiexec -n 2`; see CMakeLists.txt). One data-parallel step of
// Chapter 3's digits Cnn with DdpOptions::sync_batch_norm, each rank on its
// half of a batch of 16, against the same Cnn in one process on the whole
// batch (computed on every rank): logits, gradients and running estimates
// within the tolerance test_ch05_sync_bn.cpp derives, the running estimates
// the same bits on every rank.
// Depends on: the dist tier and its MPI backend, the nn tier (Cnn,
// BatchNorm), the core tier (Rng), doctest, mpi_world.hpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "mpi_world.hpp"
#include "mpt/core/random.hpp"
#include "mpt/dist/ddp.hpp"
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/models/cnn.hpp"

using mpt::DType;
using mpt::Tensor;
using VecF = std::vector<float>;

namespace {

constexpr std::int64_t kBatch = 16;

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

struct Out {
  VecF logits, grads, running;
};

// One step on rows [first, first + rows) with dlogits × scale (a rank's
// loss is the mean over its rows: world × the whole batch's gradient).
Out step(mpt::Cnn& cnn, std::int64_t first, std::int64_t rows, float scale,
         mpt::dist::DistributedDataParallel* ddp) {
  const VecF xv = randn(static_cast<std::size_t>(kBatch * 64), 31, 4.0, 4.0);
  const VecF gv = randn(static_cast<std::size_t>(kBatch * 10), 32, 0.0, 1.0 / kBatch);
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
    if (auto* bn = dynamic_cast<mpt::BatchNorm*>(cnn.find(path)))
      for (const Tensor* t : {&bn->running_mean, &bn->running_var}) {
        const VecF v = values(*t);
        o.running.insert(o.running.end(), v.begin(), v.end());
      }
  return o;
}

}  // namespace

TEST_CASE("DDP with SyncBatchNorm under mpiexec equals the Cnn in one process on the whole batch") {
  auto& comm = mpt_test::world();
  const mpt::CnnConfig cfg{8, 16, 10, true, DType::f32, nullptr, 3};
  mpt::Cnn whole(cfg);
  const Out ref = step(whole, 0, kBatch, 1.0f, nullptr);
  mpt::Cnn cnn(cfg);
  mpt::dist::DdpOptions o;
  o.sync_batch_norm = true;
  mpt::dist::DistributedDataParallel ddp(cnn, comm, o);
  const std::int64_t rows = kBatch / comm.size();
  const Out mine = step(cnn, rows * comm.rank(), rows, static_cast<float>(comm.size()), &ddp);
  const VecF ref_rows(ref.logits.begin() + rows * comm.rank() * 10,
                      ref.logits.begin() + rows * (comm.rank() + 1) * 10);
  const float dl = max_abs_diff(mine.logits, ref_rows), dg = max_abs_diff(mine.grads, ref.grads);
  const float dr = max_abs_diff(mine.running, ref.running);
  MESSAGE("rank " << comm.rank() << " of " << comm.size() << ", sync BN vs one process: max |Δlogits| " << dl
                  << ", |Δgrad| " << dg << ", |Δrunning| " << dr);
  // The tolerances of test_ch05_sync_bn.cpp (derived there); MPI's own
  // all-reduce of the gradients only adds a reordering of 2 terms.
  CHECK(dl < 2e-4f);
  CHECK(dg < 5e-3f);
  CHECK(dr < 2e-4f);
  // The running estimates: the same bits on every rank.
  std::vector<float> all(mine.running.size() * static_cast<std::size_t>(comm.size()));
  comm.all_gather(mine.running.data(), all.data(), mine.running.size() * sizeof(float));
  for (int r = 0; r < comm.size(); ++r)
    CHECK(std::memcmp(all.data() + mine.running.size() * static_cast<std::size_t>(r), mine.running.data(),
                      mine.running.size() * sizeof(float)) == 0);
}
