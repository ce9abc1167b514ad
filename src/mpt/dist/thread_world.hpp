// Chapter 05 — loss scaling across ranks: a world of N ranks in one process.
// Depends on: communicator.hpp; the standard library's threads.
//
// The one-process backend for what needs more than one rank and no mpiexec:
// the chapter's pitfalls (in `mpt tour`), the notebook and the one-process
// tests. ThreadWorld(n).run(body) runs body on n threads, one per rank, each
// with its own Communicator. It is not a transport: the ranks share memory,
// and every collective is computed by the last rank to arrive, in rank order
// (the bits of all_reduce_fixed_order), while the others wait. What it adds
// over a plain loop is what makes it a world: the ranks run concurrently,
// every call is checked against the other ranks' (the same fields as
// MpiCommunicator's check_calls), and a rank that throws, returns early or
// makes a different call ends the others' waits with a message naming the
// rank and the call, never a hang. Real processes (one per rank, across
// machines) are MpiCommunicator's, under mpiexec.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mpt/dist/communicator.hpp"

namespace mpt::dist {

/// N ranks as threads of this process.
class ThreadWorld {
 public:
  /// A world of `size` ranks (1 .. 64); a collective that waits longer than
  /// `timeout_seconds` (a finite number > 0) for the other ranks throws.
  /// Throws std::invalid_argument (one line) for either out of range.
  explicit ThreadWorld(int size, double timeout_seconds = 30);
  ~ThreadWorld();
  ThreadWorld(const ThreadWorld&) = delete;
  ThreadWorld& operator=(const ThreadWorld&) = delete;

  /// The number of ranks.
  int size() const;

  /// Run body(comm) on size() threads, comm.rank() = 0 .. size() − 1, and
  /// return when every rank has returned. If a rank throws, every rank
  /// waiting in a collective throws too (naming that rank), and run()
  /// throws std::runtime_error "rank R of N: <what>" — of the lowest rank
  /// whose body threw of its own accord, so that the report does not depend
  /// on which thread came first. Otherwise it reports what ended the run:
  /// ranks whose calls disagree, a rank that returned while others wait in
  /// a collective it did not make, a timeout. Each call starts a fresh world
  /// (sequence numbers from 1).
  void run(const std::function<void(Communicator&)>& body);

  struct State;  ///< the .cpp's (the slots every rank's call fills)

 private:
  std::shared_ptr<State> state_;
};

}  // namespace mpt::dist
