// Chapter 05 — the multi-rank suites' communicator (defined in
// mpi_test_main.cpp). Depends on: the dist tier's MPI backend.
#pragma once

#include "mpt/dist/mpi_communicator.hpp"

namespace mpt_test {
/// MPI_COMM_WORLD, made once (60 s timeout, calls checked).
mpt::dist::MpiCommunicator& world();
}  // namespace mpt_test
