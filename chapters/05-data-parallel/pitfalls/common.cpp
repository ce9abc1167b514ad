// Chapter 05 — loss scaling across ranks: the pitfalls' shared helpers (described in common.hpp)
// Depends on: common.hpp, ../../02-loss-scaling/training.hpp (blobs()),
// mpt/dist/ddp.hpp (shard_rows), mpt/nn/layers/losses.hpp, mpt/optim/sgd.hpp;
// <algorithm>, <cmath>, <cstring>, <stdexcept>.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "../../02-loss-scaling/training.hpp"
#include "common.hpp"
#include "mpt/dist/ddp.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ch05 {

namespace {
namespace common_helpers {
constexpr std::uint64_t kBatchShuffle = 2026;  // the fixed shuffle every rank draws batches from

void same_size(const std::vector<float>& a, const std::vector<float>& b, const char* who) {
  if (a.size() != b.size())
    throw std::invalid_argument(std::string(who) + ": sizes differ (" + std::to_string(a.size()) + " and " +
                                std::to_string(b.size()) + "); valid: vectors of one model");
}
}  // namespace common_helpers
}  // namespace

std::unique_ptr<Mlp> blobs_mlp() {
  MlpConfig c;
  c.sizes = ch02::kBlobsNet;
  c.seed = ch02::kBlobsSeed;
  return std::make_unique<Mlp>(c);
}

Dataset blobs_batch(int index, Eigen::Index rows) {
  Batches b(ch02::blobs().train, rows, common_helpers::kBatchShuffle);
  Dataset d = b.next();
  for (int i = 0; i < index; ++i) d = b.next();
  return d;
}

float shard_backward(Model& net, const Dataset& batch, int rank, int world, float scale) {
  const auto [lo, hi] = dist::shard_rows(batch.size(), rank, world);
  const Dataset shard = batch.slice(lo, hi - lo);
  const Tensor& out = net.forward(shard.x);
  const float loss = cross_entropy_loss(out, shard.labels);
  net.backward(cross_entropy_backward(out, shard.labels, scale));
  return loss;
}

std::vector<float> masters(Model& net) {
  std::vector<float> v;
  for (const Parameter* p : net.parameters())
    v.insert(v.end(), p->master.f32_data(), p->master.f32_data() + p->master.numel());
  return v;
}

std::vector<float> grads(Model& net) {
  std::vector<float> v;
  for (const Parameter* p : net.parameters())
    v.insert(v.end(), p->grad.f32_data(), p->grad.f32_data() + p->grad.numel());
  return v;
}

void load_masters(Model& net, const std::vector<float>& values) {
  std::size_t at = 0;
  for (Parameter* p : net.parameters()) {
    const auto n = static_cast<std::size_t>(p->master.numel());
    if (at + n > values.size())
      throw std::invalid_argument("load_masters: " + std::to_string(values.size()) +
                                  " values for a larger model; valid: masters() of the same model");
    std::memcpy(p->master.f32_data(), values.data() + at, n * sizeof(float));
    at += n;
  }
  if (at != values.size())
    throw std::invalid_argument("load_masters: " + std::to_string(values.size()) + " values for a model of " +
                                std::to_string(at) + "; valid: masters() of the same model");
  net.refresh_model_copies();
}

double max_abs_finite(const std::vector<float>& v) {
  double m = 0;
  for (const float x : v)
    if (std::isfinite(x)) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

double nonfinite(const std::vector<float>& v) {
  double n = 0;
  for (const float x : v) n += !std::isfinite(x);
  return n;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  common_helpers::same_size(a, b, "max_diff");
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}

double norm_diff(const std::vector<float>& a, const std::vector<float>& b) {
  common_helpers::same_size(a, b, "norm_diff");
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    s += d * d;
  }
  return std::sqrt(s);
}

double bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
  common_helpers::same_size(a, b, "bits_differ");
  double n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    std::uint32_t x = 0, y = 0;  // the bits, compared as integers
    std::memcpy(&x, &a[i], sizeof x);
    std::memcpy(&y, &b[i], sizeof y);
    n += x != y;
  }
  return n;
}

std::function<std::unique_ptr<Optimizer>(std::vector<Parameter*>)> sgd_shard(double lr) {
  return [lr](std::vector<Parameter*> mine) -> std::unique_ptr<Optimizer> {
    SgdOptions o;
    o.lr = lr;
    return std::make_unique<SGD>(std::move(mine), o);
  };
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void CountingCommunicator::all_reduce(void* data, std::int64_t count, DType dtype, dist::ReduceOp op) {
  ++all_reduces;
  bytes += count * static_cast<std::int64_t>(dist::element_bytes(dtype));
  inner_->all_reduce(data, count, dtype, op);
}

std::unique_ptr<dist::PendingAllReduce> CountingCommunicator::start_all_reduce(void* data, std::int64_t count,
                                                                               DType dtype,
                                                                               dist::ReduceOp op) {
  ++all_reduces;
  bytes += count * static_cast<std::int64_t>(dist::element_bytes(dtype));
  return inner_->start_all_reduce(data, count, dtype, op);
}

}  // namespace mpt::ch05
