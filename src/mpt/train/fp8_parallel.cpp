// Chapter 07 — FP8 training under data parallelism (see fp8_parallel.hpp).
// Depends on: fp8_parallel.hpp; fp8/linear_scaling.hpp (Fp8Training),
// dist/communicator.hpp (all_reduce, ReduceOp::max).
#include "mpt/train/fp8_parallel.hpp"

#include <cstdint>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/dist/communicator.hpp"
#include "mpt/fp8/linear_scaling.hpp"

namespace mpt::train {

void reduce_fp8_amaxes(fp8::Fp8Training& fp8, dist::Communicator& comm) {
  std::vector<float> amaxes = fp8.pending_amaxes();
  if (amaxes.empty()) return;  // current scaling, MX: no state to agree on
  comm.all_reduce(amaxes.data(), static_cast<std::int64_t>(amaxes.size()), DType::f32, dist::ReduceOp::max);
  fp8.set_pending_amaxes(amaxes);
}

}  // namespace mpt::train
