// Chapter 05 — exercises: what every grader test file shares, instructors' hidden tests included.
// Depends on: doctest, grader_kit.hpp, ex05.hpp, the dist tier's MPI backend
// (mpt/dist/mpi_communicator.hpp, the target mpt::dist_mpi), the nn tier
// (the blobs MLP the references train).
// The exercise list; the world every rank grades in (MPI_COMM_WORLD, started
// before main() so that only rank 0 prints); the helpers that make every
// rank reach the same verdict: a test case passes on every rank or on none,
// so rank 0's score table is the job's.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ex05.hpp"
#include "grader_kit.hpp"
#include "mpt/dist/mpi_communicator.hpp"
#include "mpt/nn/models/mlp.hpp"

namespace mpt::ex05::grading {

// ---- the exercises --------------------------------------------------------
// A test case belongs to an exercise through its doctest test suite,
// "exercise-" + id; each test case that passes scores its exercise's points
// per test case (the last number below): 2 for a behaviour to write, 3 for
// one of the diagnose exercise, 1 for those whose name ends "[1 point]"
// (bad input, an empty shard, the seam when nothing overflows).

using exercise_kit::Exercise;
using exercise_kit::Kind;

inline constexpr Exercise kExercises[] = {
    {"5.1", "the averaging all-reduce with pre-division (f32, f16, bf16)", Kind::write, 2},
    {"5.2", "the found-inf flag of a sharded scaler, across ranks", Kind::write, 2},
    {"5.3", "a data-parallel training loop whose replicas drift from one process", Kind::diagnose, 3},
};

using exercise_kit::bits_of;
using exercise_kit::describe;
using exercise_kit::Mismatches;

// ---- the world --------------------------------------------------------------

/// MPI_COMM_WORLD, every collective checked across ranks and given up after
/// 20 s (a rank that skips a call ends the test case with a message instead
/// of a hang).
inline mpt::dist::MpiCommunicator& world() {
  static mpt::dist::MpiCommunicator comm(mpt::dist::MpiCommunicator::Options{20.0, true});
  return comm;
}

/// Starts MPI before main() and silences every rank's stdout but rank 0's:
/// the ranks grade the same test cases and agree on every verdict, so one
/// table is printed. What a rank writes to stderr still shows.
inline bool start_world() {
  if (world().rank() != 0 && std::freopen("/dev/null", "w", stdout) == nullptr)
    std::fprintf(stderr, "grader_ch05: rank %d could not silence its stdout\n", world().rank());
  return true;
}
inline const bool kWorldStarted = start_world();

/// True on every rank when `ok` is true on every rank (one all-reduce).
inline bool everyone(bool ok) {
  float failed = ok ? 0.0f : 1.0f;
  world().all_reduce(&failed, 1, mpt::DType::f32, mpt::dist::ReduceOp::max);
  return failed == 0.0f;
}

/// Runs `f` (the student's code) on this rank; if it throws here, the
/// exception goes on (so that a stub's "not implemented" is reported), and
/// if it threw on another rank only, this rank fails the test case too.
template <class F>
void on_every_rank(F&& f) {
  std::exception_ptr error;
  try {
    f();
  } catch (...) {
    error = std::current_exception();
  }
  const bool all_ran = everyone(error == nullptr);
  if (error) std::rethrow_exception(error);
  if (!all_ran) throw std::runtime_error("the code under test threw on another rank (its stderr says why)");
}

/// Every rank's `mine` (all the same size), rank r's at [r].
inline std::vector<std::vector<float>> gather(const std::vector<float>& mine) {
  const int n = world().size();
  std::vector<float> all(mine.size() * static_cast<std::size_t>(n));
  world().all_gather(mine.data(), all.data(), mine.size() * sizeof(float));
  std::vector<std::vector<float>> out;
  for (int r = 0; r < n; ++r)
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(mine.size()) * r,
                     all.begin() + static_cast<std::ptrdiff_t>(mine.size()) * (r + 1));
  return out;
}

/// True on every rank when every rank holds the same bits in `mine`.
inline bool same_on_every_rank(const std::vector<float>& mine) {
  const auto all = gather(mine);
  bool same = true;
  for (const auto& v : all)
    for (std::size_t i = 0; i < v.size(); ++i) same = same && bits_of(v[i]) == bits_of(all[0][i]);
  return same;
}

/// Chapter 2's blobs MLP 8-32-32-4 in FP32, weights seed 7: what 5.1's
/// gradients are shaped like and what 5.3 trains.
inline std::unique_ptr<mpt::Mlp> blobs_mlp() {
  mpt::MlpConfig c;
  c.sizes = {8, 32, 32, 4};
  c.seed = 7;
  return std::make_unique<mpt::Mlp>(c);
}

/// Every FP32 master of `net`, in parameter order.
inline std::vector<float> masters_of(mpt::Model& net) {
  std::vector<float> v;
  for (const mpt::Parameter* p : net.parameters())
    v.insert(v.end(), p->master.f32_data(), p->master.f32_data() + p->master.numel());
  return v;
}

}  // namespace mpt::ex05::grading

namespace mpt::exercise_kit {
inline constexpr Chapter kChapter{5, mpt::ex05::grading::kExercises,
                                  sizeof mpt::ex05::grading::kExercises / sizeof(Exercise)};
}  // namespace mpt::exercise_kit
