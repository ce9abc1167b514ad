// Chapter 05 — a multi-rank program that fails on purpose, for faults.sh:
// ranks all-reduce a small buffer every "step" (tagged with the step), and
// at step 3 rank 1 does what the case says:
//
//   throw      throws: run_rank prints "mpt: rank 1 of N: ..." and ends the job
//   kill       is killed with SIGKILL: mpiexec ends the job
//   disagree   skips its all-reduce and goes on to the next step's: the call
//              check reports both ranks' calls and tags
//   leave      stops calling (returns and finalizes): the others' collective
//              times out after TIMEOUT seconds and says which call
//   none       nothing: every rank finishes, exit 0 (the control case)
//
//   mpiexec -n 2 dist_faults CASE [TIMEOUT]
// Depends on: the dist tier's MPI backend.
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/dist/mpi_communicator.hpp"

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what != "throw" && what != "kill" && what != "disagree" && what != "leave" && what != "none") {
    std::cerr << "dist_faults: case '" << what << "' is not one of throw, kill, disagree, leave, none\n";
    return 2;
  }
  mpt::dist::MpiCommunicator::Options o;
  o.timeout_seconds = argc > 2 ? std::atof(argv[2]) : 5.0;
  mpt::dist::MpiCommunicator comm(o);
  return mpt::dist::run_rank(comm, [&] {
    std::vector<float> buffer(64, 1.0f);
    for (int step = 0; step < 8; ++step) {
      comm.set_tag(step);
      if (step == 3 && comm.rank() == 1) {
        if (what == "throw") throw std::runtime_error("a planted failure in step 3");
        if (what == "kill") std::raise(SIGKILL);
        if (what == "disagree") continue;
        if (what == "leave") return 0;
      }
      comm.all_reduce(buffer.data(), static_cast<std::int64_t>(buffer.size()), mpt::DType::f32,
                      mpt::dist::ReduceOp::max);
    }
    if (comm.rank() == 0) std::cout << "dist_faults: every rank finished\n";
    return 0;
  });
}
