// Chapter 05 — loss scaling across ranks: ShardedOptimizer and
// ShardedGradScaler (see sharded.hpp).
// Depends on: sharded.hpp, communicator.hpp.
#include "mpt/dist/sharded.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace mpt::dist {

std::vector<int> partition_parameters(const std::vector<std::int64_t>& sizes, int world) {
  if (world < 1)
    throw std::invalid_argument("a world of " + std::to_string(world) + " ranks; it must be >= 1");
  std::vector<std::size_t> order(sizes.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(),
                   [&sizes](std::size_t a, std::size_t b) { return sizes[a] > sizes[b]; });
  std::vector<std::int64_t> load(static_cast<std::size_t>(world), 0);
  std::vector<int> owner(sizes.size(), 0);
  for (std::size_t k : order) {
    const auto r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[k] = r;
    load[static_cast<std::size_t>(r)] += sizes[k];
  }
  return owner;
}

namespace {
std::vector<Parameter*> owned(const std::vector<Parameter*>& all, const std::vector<int>& owners, int rank) {
  std::vector<Parameter*> mine;
  for (std::size_t k = 0; k < all.size(); ++k)
    if (owners[k] == rank) mine.push_back(all[k]);
  return mine;
}
std::vector<int> owners_of(const std::vector<Parameter*>& all, int world) {
  std::vector<std::int64_t> sizes;
  for (const Parameter* p : all) sizes.push_back(p->master.numel());
  return partition_parameters(sizes, world);
}
}  // namespace

ShardedOptimizer::ShardedOptimizer(
    const std::vector<Parameter*>& all, Communicator& comm,
    const std::function<std::unique_ptr<Optimizer>(std::vector<Parameter*>)>& make)
    : ShardedOptimizer(all, comm, make, owners_of(all, comm.size())) {}

// The partition is computed once: the base class gets the owned parameters,
// owners_ the whole list.
ShardedOptimizer::ShardedOptimizer(
    const std::vector<Parameter*>& all, Communicator& comm,
    const std::function<std::unique_ptr<Optimizer>(std::vector<Parameter*>)>& make, std::vector<int> owners)
    : Optimizer(owned(all, owners, comm.rank())),
      all_(all),
      comm_(&comm),
      owners_(std::move(owners)),
      local_(make(params_)) {
  if (!local_) throw std::invalid_argument("ShardedOptimizer: the factory returned no optimizer");
}

void ShardedOptimizer::step() { local_->step(); }

void ShardedOptimizer::zero_grad() {
  for (Parameter* p : all_) p->grad.fill_zero();
}

void ShardedOptimizer::gather_masters() {
  for (std::size_t k = 0; k < all_.size(); ++k)
    comm_->broadcast(all_[k]->master.f32_data(), all_[k]->master.bytes(), owners_[k]);
}

//! [found-inf-across]
GradScaler::FoundInfReduction found_inf_across(Communicator& comm) {
  return [&comm](bool here) {
    float flag = here ? 1.0f : 0.0f;
    comm.all_reduce(&flag, 1, DType::f32, ReduceOp::max);
    return flag != 0.0f;
  };
}
//! [found-inf-across]

ShardedGradScaler::ShardedGradScaler(Communicator& comm, const Options& options) : GradScaler(options) {
  set_found_inf_reduction(found_inf_across(comm));
}

ShardedGradScaler::ShardedGradScaler(Communicator& comm) : ShardedGradScaler(comm, Options{}) {}

}  // namespace mpt::dist
