// Chapter 06 — what `mpt trace` offers the other commands: the trace of one
// training step of a chapter's model under a policy string, as `mpt trace
// --model M --policy P [--json]` prints it (`mpt policy show --model` uses it).
// Depends on: nothing but the standard library (trace_commands.cpp has the rest).
#pragma once

#include <ostream>
#include <string>

namespace mpt::cli {

/// Writes to `out` what `mpt trace --model model --policy policy [--json]`
/// prints. Bad input (an unknown model, a policy that does not parse or whose
/// patterns select none of the model's paths, an op the policy refuses)
/// throws mpt::cli::UsageError before anything is written.
void trace_under_policy(const std::string& model, const std::string& policy, bool json, std::ostream& out);

}  // namespace mpt::cli
