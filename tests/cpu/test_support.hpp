// Chapters 01 onwards — small helpers shared by the CPU test suites: float
// bit patterns, and the failure-message helpers of the pitfall tests.
// Header-only (the CMake glob picks up test_ch*_*.cpp only). Depends on: the
// standard library, doctest (for the shared pitfall assertions), mpt/pitfall.hpp.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "mpt/core/pitfall.hpp"

namespace mpt_test {

/// The bit pattern of x.
inline std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

/// The float whose bit pattern is u.
inline float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

/// A pitfall's checks: each claim and whether it held.
using Checks = std::vector<std::pair<std::string, bool>>;

/// The claims that did not hold, one a line, for failure messages.
inline std::string failed_claims(const Checks& checks) {
  std::string out;
  for (const auto& c : checks)
    if (!c.second) out += "\n  - " + c.first;
  return out.empty() ? std::string(" (none; no checks ran?)") : out;
}

/// True when any claim did not hold.
inline bool any_fails(const Checks& checks) {
  for (const auto& c : checks)
    if (!c.second) return true;
  return false;
}

/// The assertions every chapter's pitfall suite makes about a pitfall's two
/// runs: the same outcome names in the same order (so the text and the JSON
/// can put them side by side), and both runs described.
inline void check_runs_comparable(const mpt::RunResult& broken, const mpt::RunResult& fixed) {
  REQUIRE(broken.outcomes.size() == fixed.outcomes.size());
  for (std::size_t i = 0; i < broken.outcomes.size(); ++i)
    CHECK(broken.outcomes[i].name == fixed.outcomes[i].name);
  CHECK(!broken.setup.empty());
  CHECK(!fixed.setup.empty());
  CHECK(!broken.explanation.empty());
  CHECK(!fixed.explanation.empty());
}

}  // namespace mpt_test
