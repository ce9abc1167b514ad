// Chapters 02 onwards — fuzz target: the policy-string parser
// (mpt::parse_policy_string, PolicySpec::text and make).
// Depends on: the mpt library's core tier (policy_string.hpp), fuzz_check.hpp.
//
// The input is the text. Properties:
//  - accepted: the text has no white space and is at most
//    kMaxPolicyStringLength long; its canonical text() parses again to the
//    same spec and the same text() (canonical is a fixed point), the
//    canonical text is no longer than the input, and make() builds a policy;
//  - refused: std::invalid_argument and nothing else, one line, starting
//    "policy '" and naming the valid syntax.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "fuzz_check.hpp"
#include "mpt/core/policy_string.hpp"

namespace {

using mpt::fuzz::fuzz_require;

bool same(const mpt::PolicySpec& a, const mpt::PolicySpec& b) {
  return a.dtype == b.dtype && a.base.has_value() == b.base.has_value() &&
         (!a.base || a.base->canonical == b.base->canonical) && a.keep_ops == b.keep_ops &&
         a.keep_layers == b.keep_layers && a.rules == b.rules;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text = mpt::fuzz::input_text(data, size);
  mpt::PolicySpec spec;
  try {
    spec = mpt::parse_policy_string(text);
  } catch (const std::invalid_argument& e) {
    const std::string line = e.what();
    fuzz_require(line.rfind("policy '", 0) == 0, "the error does not start with the policy: " + line);
    fuzz_require(mpt::fuzz::is_one_line(line), "the error is not one line: " + line);
    fuzz_require(line.find("valid: ") != std::string::npos || line.find("known ops: ") != std::string::npos,
                 "the error does not say what is valid: " + line);
    return 0;
  }
  fuzz_require(text.find_first_of(" \t\r\n\v\f") == std::string::npos, "accepted a policy with white space");
  fuzz_require(text.size() <= mpt::kMaxPolicyStringLength, "accepted a policy longer than the limit");
  const std::string canonical = spec.text();
  // A named base spells out the defaults it was given ("autocast:cpu" is
  // "autocast:cpu:bf16", "jmp:c=f16" is "jmp:p=f32,c=f16,o=f16"): a few
  // characters more, never more than that.
  fuzz_require(canonical.size() <= text.size() + (spec.base ? 24 : 0),
               "the canonical text '" + canonical + "' is longer than the input");
  mpt::PolicySpec again;
  try {
    again = mpt::parse_policy_string(canonical);
  } catch (const std::invalid_argument& e) {
    fuzz_require(false, "the canonical text '" + canonical + "' is refused: " + e.what());
  }
  fuzz_require(same(again, spec), "the canonical text '" + canonical + "' parses to another spec");
  fuzz_require(again.text() == canonical, "the canonical text is not a fixed point: " + again.text());
  const std::shared_ptr<const mpt::Policy> policy = spec.make();
  fuzz_require(policy != nullptr, "make() returned no policy");
  return 0;
}
