// Chapter 05 — helpers shared by the data-parallel suites (the one-process
// test_ch05_dist.cpp and the multi-rank tests/mpi/): a stand-in world whose
// other ranks hold copies of this rank's buffers, and the pieces of one
// data-parallel step of Chapter 2's blobs MLP.
// Header-only. Depends on: the dist tier (Communicator), the nn tier (Mlp,
// the blobs, the losses).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "mpt/dist/communicator.hpp"
#include "mpt/dist/ddp.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/models/mlp.hpp"

namespace mpt_test {

/// Rank `rank` of a world of `world` ranks in one process, in which every
/// other rank holds what this one holds: an all-reduce combines `world`
/// copies of the buffer in rank order; a broadcast keeps the buffer; an
/// all-gather repeats it. Optionally, the all-reduce of a single f32 value
/// (the found-inf flag) returns `peer_flag` combined with this rank's, as if
/// another rank had found an inf. Counts its calls.
class MirrorWorld final : public mpt::dist::Communicator {
 public:
  MirrorWorld(int rank, int world) : rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int size() const override { return world_; }
  const char* backend() const override { return "mirror"; }
  void all_reduce(void* data, std::int64_t count, mpt::DType dtype, mpt::dist::ReduceOp op) override {
    ++all_reduces;
    mpt::dist::check_buffer("all_reduce", count, dtype);
    const std::size_t bytes = static_cast<std::size_t>(count) * mpt::dist::element_bytes(dtype);
    if (count == 1 && dtype == mpt::DType::f32 && peer_flag) {
      float other = *peer_flag;
      mpt::dist::combine(data, &other, 1, dtype, op);
      return;
    }
    const std::vector<unsigned char> mine(static_cast<unsigned char*>(data),
                                          static_cast<unsigned char*>(data) + bytes);
    for (int r = 1; r < world_; ++r) mpt::dist::combine(data, mine.data(), count, dtype, op);
  }
  std::unique_ptr<mpt::dist::PendingAllReduce> start_all_reduce(void* data, std::int64_t count,
                                                                mpt::DType dtype,
                                                                mpt::dist::ReduceOp op) override {
    ++started;
    all_reduce(data, count, dtype, op);
    return mpt::dist::finished_all_reduce();
  }
  void broadcast(void*, std::size_t, int) override { ++broadcasts; }
  void all_gather(const void* send, void* recv, std::size_t bytes) override {
    for (int r = 0; r < world_; ++r) std::memcpy(static_cast<unsigned char*>(recv) + bytes * r, send, bytes);
  }
  void barrier() override {}

  std::optional<float> peer_flag;  ///< what "another rank" contributes to a one-float all-reduce
  int all_reduces = 0, started = 0, broadcasts = 0;

 private:
  int rank_, world_;
};

/// Chapter 2's blobs MLP 8-32-32-4 (weights seed 7) in `dtype`.
inline std::unique_ptr<mpt::Mlp> blobs_mlp(mpt::DType dtype = mpt::DType::f32) {
  mpt::MlpConfig c;
  c.sizes = {8, 32, 32, 4};
  c.dtype = dtype;
  c.seed = 7;
  return std::make_unique<mpt::Mlp>(c);
}

/// The blobs set (512 samples).
inline const mpt::Dataset& blobs() {
  static const mpt::Dataset d = mpt::make_blobs();
  return d;
}

/// Rank `rank`'s shard of `batch` (world ranks): forward, the mean
/// cross-entropy over the shard's rows, and backward from `scale` (the
/// gradients are added into the parameters' grads). Returns the loss.
inline float shard_backward(mpt::Model& net, const mpt::Dataset& batch, int rank, int world, float scale) {
  const auto [lo, hi] = mpt::dist::shard_rows(batch.size(), rank, world);
  const mpt::Dataset shard = batch.slice(lo, hi - lo);
  const mpt::Tensor& out = net.forward(shard.x);
  const float loss = mpt::cross_entropy_loss(out, shard.labels);
  net.backward(mpt::cross_entropy_backward(out, shard.labels, scale));
  return loss;
}

/// Every FP32 master of `net`, concatenated in parameter order.
inline std::vector<float> masters(mpt::Model& net) {
  std::vector<float> v;
  for (const mpt::Parameter* p : net.parameters())
    v.insert(v.end(), p->master.f32_data(), p->master.f32_data() + p->master.numel());
  return v;
}

/// Every FP32 grad of `net`, concatenated in parameter order.
inline std::vector<float> grads(mpt::Model& net) {
  std::vector<float> v;
  for (const mpt::Parameter* p : net.parameters())
    v.insert(v.end(), p->grad.f32_data(), p->grad.f32_data() + p->grad.numel());
  return v;
}

/// Elements whose bits differ.
inline std::size_t bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) throw std::invalid_argument("bits_differ: sizes differ");
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    std::uint32_t x = 0, y = 0;
    std::memcpy(&x, &a[i], sizeof x);
    std::memcpy(&y, &b[i], sizeof y);
    n += x != y;
  }
  return n;
}

}  // namespace mpt_test
