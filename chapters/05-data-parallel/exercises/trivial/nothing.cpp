// Chapter 05 — exercises: trivial stub "do nothing".
// Depends on: ex05.hpp. A grader that gave it full marks for any exercise
// would be broken; CI requires a score below full marks on every exercise.
#include "ex05.hpp"

#include <vector>

namespace mpt::ex05 {

void average_gradients(mpt::dist::Communicator&, std::vector<std::vector<float>>&, mpt::DType, double) {}

bool found_inf_across(mpt::dist::Communicator&, const std::vector<std::vector<float>>&) { return false; }

mpt::GradScaler::FoundInfReduction found_inf_seam(mpt::dist::Communicator&) {
  return [](bool) { return false; };
}

void train_data_parallel(mpt::dist::Communicator&, mpt::Model&, int, int) {}

}  // namespace mpt::ex05
