// Chapter 05 — the main() of the multi-rank doctest suites: MPI starts
// first (mpt::dist::MpiCommunicator), then every rank runs the same test
// cases in the same order (their collectives must match), and every rank
// exits with the worst status of all ranks, so that mpiexec's status is the
// suite's. world() is the communicator the test cases use.
// Depends on: the dist tier's MPI backend (mpt::dist_mpi), doctest.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "mpi_world.hpp"

namespace mpt_test {
mpt::dist::MpiCommunicator& world() {
  static mpt::dist::MpiCommunicator comm(mpt::dist::MpiCommunicator::Options{60.0, true});
  return comm;
}
}  // namespace mpt_test

int main(int argc, char** argv) {
  mpt::dist::MpiCommunicator& comm = mpt_test::world();
  doctest::Context context(argc, argv);
  float status = static_cast<float>(context.run());
  if (context.shouldExit()) return static_cast<int>(status);
  comm.all_reduce(&status, 1, mpt::DType::f32, mpt::dist::ReduceOp::max);
  return static_cast<int>(status);
}
