// Chapter 05 — loss scaling across ranks: SyncBatchNorm (see sync_batch_norm.hpp).
// Depends on: sync_batch_norm.hpp, communicator.hpp; the nn tier (BatchNorm,
// Model, norm_math.hpp's Statistics, welford.hpp's merge).
#include "mpt/dist/sync_batch_norm.hpp"

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace mpt::dist {

namespace sync_batch_norm_wire {

// One channel's statistics on the wire: the count exactly (int64), mean and
// M2 as the doubles the layer computed. 24 bytes.
constexpr std::size_t kBytes = sizeof(std::int64_t) + 2 * sizeof(double);

void pack(const norm_math::Statistics& s, unsigned char* out) {
  std::memcpy(out, &s.count, sizeof s.count);
  std::memcpy(out + sizeof s.count, &s.mean, sizeof s.mean);
  std::memcpy(out + sizeof s.count + sizeof s.mean, &s.m2, sizeof s.m2);
}

norm_math::Statistics unpack(const unsigned char* in) {
  norm_math::Statistics s;
  std::memcpy(&s.count, in, sizeof s.count);
  std::memcpy(&s.mean, in + sizeof s.count, sizeof s.mean);
  std::memcpy(&s.m2, in + sizeof s.count + sizeof s.mean, sizeof s.m2);
  return s;
}

template <class F>
void for_each_batch_norm(Model& model, F f) {
  for (const std::string& path : model.paths())
    if (auto* bn = dynamic_cast<BatchNorm*>(model.find(path))) f(*bn);
}

}  // namespace sync_batch_norm_wire

std::vector<norm_math::Statistics> merge_in_rank_order(const std::vector<norm_math::Statistics>& gathered,
                                                       int world, std::size_t channels) {
  if (world < 1 || gathered.size() != static_cast<std::size_t>(world) * channels)
    throw std::invalid_argument("merge_in_rank_order: " + std::to_string(gathered.size()) +
                                " statistics for " + std::to_string(world) + " ranks of " +
                                std::to_string(channels) + " channels; expected world x channels");
  std::vector<norm_math::Statistics> merged(channels);
  for (std::size_t c = 0; c < channels; ++c) {
    norm_math::Statistics total;  // empty: merging rank 0 into it gives rank 0's exactly
    for (int r = 0; r < world; ++r)
      total = welford_merge(total, gathered[static_cast<std::size_t>(r) * channels + c]);
    merged[c] = total;
  }
  return merged;
}

void sync_batch_norm(BatchNorm& bn, Communicator& comm) {
  Communicator* cm = &comm;
  auto statistics = [cm](std::vector<norm_math::Statistics>& stats) {
    namespace w = sync_batch_norm_wire;
    const std::size_t channels = stats.size(), bytes = channels * w::kBytes;
    std::vector<unsigned char> mine(bytes), all(bytes * static_cast<std::size_t>(cm->size()));
    for (std::size_t c = 0; c < channels; ++c) w::pack(stats[c], mine.data() + c * w::kBytes);
    cm->all_gather(mine.data(), all.data(), bytes);
    std::vector<norm_math::Statistics> gathered(channels * static_cast<std::size_t>(cm->size()));
    for (std::size_t i = 0; i < gathered.size(); ++i) gathered[i] = w::unpack(all.data() + i * w::kBytes);
    stats = merge_in_rank_order(gathered, cm->size(), channels);
  };
  auto gradient_sums = [cm](std::vector<float>& sums) {
    all_reduce_fixed_order(*cm, sums.data(), static_cast<std::int64_t>(sums.size()), DType::f32,
                           ReduceOp::sum);
  };
  bn.set_statistics_reduction(statistics, gradient_sums);
}

int sync_batch_norms(Model& model, Communicator& comm) {
  int n = 0;
  sync_batch_norm_wire::for_each_batch_norm(model, [&](BatchNorm& bn) {
    sync_batch_norm(bn, comm);
    ++n;
  });
  return n;
}

void unsync_batch_norms(Model& model) {
  sync_batch_norm_wire::for_each_batch_norm(model, [](BatchNorm& bn) { bn.clear_statistics_reduction(); });
}

}  // namespace mpt::dist
