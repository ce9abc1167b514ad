// Chapters 02 and 06 — what the policy-string suites ask of a policy string:
// the dtype an op stores its output in under it, and the line it is refused
// with. Header-only (the CMake glob picks up test_ch*_*.cpp only).
// Depends on: mpt/core/policy_string.hpp, policy.hpp, dtype.hpp.
#pragma once

#include <stdexcept>
#include <string>

#include "mpt/core/dtype.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/policy_string.hpp"

namespace mpt_test {

/// What an f16 input to `op` at `path` is stored as, under `policy`.
inline mpt::DType output_of(const std::string& policy, const char* op, const char* path) {
  return mpt::parse_policy_string(policy).make()->decide({op, path, {mpt::DType::f16}}).output;
}

/// The message parse_policy_string(text) refuses with; "" when it accepts it.
inline std::string refusal(const std::string& text) {
  try {
    (void)mpt::parse_policy_string(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace mpt_test
