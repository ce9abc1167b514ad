// Chapter 06 — exercises: REFERENCE SOLUTION (MPT-REFERENCE-SOLUTION), never shipped to students.
// Depends on: ex06.hpp, the C++ standard library; for 6.4 mpt's Policy and
// UniformPolicy (mpt/core/policy.hpp), as the given body.
// 6.1 to 6.3 are written from the specification, not from mpt's
// policy_string.cpp, path_pattern.cpp or policy_search.cpp, so that grading
// them against mpt is a real check. 6.4 is the given body with its one line
// fixed. tools/make_handout.sh refuses to produce a handout that contains
// these lines.
#include "ex06.hpp"

#include <cctype>
#include <cmath>
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mpt/core/policy.hpp"

namespace mpt::ex06 {

namespace {

// ---- 6.1 ----------------------------------------------------------------------

const char* const kGrammar =
    "DTYPE(+PATTERN=DTYPE)* with DTYPE one of f32, f16, bf16 and PATTERN names joined by '.', each of "
    "letters, digits, _ and *, or the name **";

[[noreturn]] void refuse_text(const std::string& text, const std::string& why) {
  throw std::invalid_argument("layer policy '" + text + "': " + why + "; valid: " + kGrammar);
}

// The three dtypes of the grammar, spelled exactly; false for anything else.
bool read_dtype(const std::string& word, mpt::DType& out) {
  if (word == "f32") out = mpt::DType::f32;
  else if (word == "f16") out = mpt::DType::f16;
  else if (word == "bf16") out = mpt::DType::bf16;
  else return false;
  return true;
}

// Pieces of `s` between the separators, empty pieces kept ("a..b" is three).
std::vector<std::string> pieces(const std::string& s, char separator) {
  std::vector<std::string> out(1);
  for (const char c : s) {
    if (c == separator) out.emplace_back();
    else out.back() += c;
  }
  return out;
}

bool pattern_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '*'; }

// Throws for a pattern the grammar does not allow.
void check_pattern(const std::string& text, const std::string& pattern) {
  if (pattern.empty()) refuse_text(text, "a rule with an empty pattern");
  for (const std::string& segment : pieces(pattern, '.')) {
    if (segment.empty()) refuse_text(text, "the pattern '" + pattern + "' has an empty name");
    for (const char c : segment)
      if (!pattern_char(c)) refuse_text(text, "the pattern '" + pattern + "' holds a character not allowed");
    if (segment != "**" && segment.find("**") != std::string::npos)
      refuse_text(text, "in the pattern '" + pattern + "', '**' must be a name of its own");
  }
}

// One segment of a pattern against one name: '*' is any run of characters.
// reach[k]: the pattern read so far matches the first k characters.
bool segment_matches(const std::string& segment, const std::string& name) {
  std::vector<char> reach(name.size() + 1, 0);
  reach[0] = 1;
  for (const char p : segment) {
    std::vector<char> after(name.size() + 1, 0);
    if (p == '*') {
      char any = 0;
      for (std::size_t k = 0; k <= name.size(); ++k) after[k] = any = static_cast<char>(any || reach[k]);
    } else {
      for (std::size_t k = 1; k <= name.size(); ++k)
        after[k] = static_cast<char>(reach[k - 1] && name[k - 1] == p);
    }
    reach.swap(after);
  }
  return reach[name.size()] != 0;
}

// Whether the pattern matches the path or a path above it. `at` holds how
// many of the path's names the segments read so far can have consumed.
bool pattern_covers(const std::string& pattern, const std::string& path) {
  const std::vector<std::string> names = pieces(path, '.');
  std::vector<std::size_t> at{0};
  for (const std::string& segment : pieces(pattern, '.')) {
    std::vector<std::size_t> after;
    if (segment == "**") {
      for (std::size_t j = at.front(); j <= names.size(); ++j) after.push_back(j);  // at is ascending
    } else {
      for (const std::size_t j : at)
        if (j < names.size() && segment_matches(segment, names[j])) after.push_back(j + 1);
    }
    if (after.empty()) return false;
    at.swap(after);
  }
  return true;  // the pattern is used up against a path at or above `path`
}

// ---- 6.2 ----------------------------------------------------------------------

// c10's promotion table restricted to the three (rows and columns f32, f16,
// bf16): equal stays, anything mixed is f32, f16 with bf16 included.
mpt::DType promote_pair(mpt::DType a, mpt::DType b) {
  using mpt::DType;
  const auto index = [](DType d) { return d == DType::f32 ? 0 : d == DType::f16 ? 1 : 2; };
  static const DType table[3][3] = {{DType::f32, DType::f32, DType::f32},
                                    {DType::f32, DType::f16, DType::f32},
                                    {DType::f32, DType::f32, DType::bf16}};
  return table[index(a)][index(b)];
}

// ---- 6.4 ----------------------------------------------------------------------

// True when the layer at `path` is `name` or under it, by whole names.
bool at_or_under(std::string_view path, std::string_view name) {
  if (path.size() < name.size() || path.substr(0, name.size()) != name) return false;
  return path.size() == name.size() || path[name.size()] == '.';
}

// low everywhere, f32 at the layers named in `keep`.
class KeepNamedPolicy final : public mpt::Policy {
 public:
  KeepNamedPolicy(std::vector<std::string> keep, mpt::DType low)
      : keep_(std::move(keep)), low_(mpt::uniform_policy(low)), f32_(mpt::uniform_policy(mpt::DType::f32)) {}
  std::string describe() const override { return low_->describe() + "; f32 at the layers named"; }

 protected:
  mpt::OpPrecision decide_op(const mpt::OpInfo& /*op*/, const mpt::OpQuery& q) const override {
    return pick(q.path).decide(q);
  }
  mpt::DType parameter_dtype_of(const mpt::OpInfo& op, std::string_view path) const override {
    return pick(path).parameter_dtype(op.name, path);
  }

 private:
  // The policy that decides for the layer at `path`.
  const mpt::Policy& pick(std::string_view path) const {
    for (const std::string& name : keep_)
      if (at_or_under(path, name)) return *f32_;  // the path's names, never a substring of them
    return *low_;
  }
  std::vector<std::string> keep_;
  std::shared_ptr<const mpt::Policy> low_, f32_;
};

}  // namespace

LayerPolicy parse_layer_policy(const std::string& text) {
  if (text.empty()) refuse_text(text, "empty");
  const std::vector<std::string> clauses = pieces(text, '+');
  LayerPolicy policy;
  if (!read_dtype(clauses.front(), policy.base))
    refuse_text(text, "the base '" + clauses.front() + "' is not a DTYPE");
  for (std::size_t i = 1; i < clauses.size(); ++i) {
    const std::string& clause = clauses[i];
    if (clause.empty()) refuse_text(text, "a '+' with no rule after it");
    const std::size_t eq = clause.find('=');
    if (eq == std::string::npos) refuse_text(text, "the clause '" + clause + "' is not PATTERN=DTYPE");
    if (clause.find('=', eq + 1) != std::string::npos)
      refuse_text(text, "the clause '" + clause + "' has more than one '='");
    Rule rule;
    rule.pattern = clause.substr(0, eq);
    check_pattern(text, rule.pattern);
    if (!read_dtype(clause.substr(eq + 1), rule.dtype))
      refuse_text(text, "the rule '" + clause + "' names no DTYPE after '='");
    for (const Rule& earlier : policy.rules)
      if (earlier.pattern == rule.pattern)
        refuse_text(text, "the pattern '" + rule.pattern + "' is given twice");
    policy.rules.push_back(rule);
  }
  return policy;
}

mpt::DType layer_dtype(const LayerPolicy& policy, const std::string& path) {
  for (std::size_t i = policy.rules.size(); i-- > 0;)  // the last rule that covers the path decides
    if (pattern_covers(policy.rules[i].pattern, path)) return policy.rules[i].dtype;
  return policy.base;
}

mpt::DType promote_dtypes(const std::vector<mpt::DType>& inputs) {
  if (inputs.empty()) throw std::invalid_argument("promote_dtypes: no input to promote");
  for (const mpt::DType d : inputs)
    if (d != mpt::DType::f32 && d != mpt::DType::f16 && d != mpt::DType::bf16)
      throw std::invalid_argument("promote_dtypes: " + std::string(mpt::dtype_name(d)) +
                                  " takes no part in type promotion; valid: f32, f16, bf16");
  mpt::DType out = inputs.front();
  for (const mpt::DType d : inputs) out = promote_pair(out, d);
  return out;
}

StepVerdict greedy_step(const std::vector<std::string>& order, std::size_t next,
                        std::vector<std::string>& lowered, double fp32_loss, double budget,
                        const CandidateLosses& losses) {
  if (next >= order.size())
    throw std::invalid_argument("greedy_step: next " + std::to_string(next) + " is past the " +
                                std::to_string(order.size()) + " layers");
  if (!std::isfinite(budget) || budget < 0)
    throw std::invalid_argument("greedy_step: the budget must be finite and >= 0");
  if (!std::isfinite(fp32_loss)) throw std::invalid_argument("greedy_step: the FP32 loss must be finite");
  std::vector<std::string> candidate = lowered;
  candidate.push_back(order[next]);
  const std::vector<double> seeds = losses(candidate);
  if (seeds.empty()) throw std::invalid_argument("greedy_step: the candidate came back with no loss");
  bool all_finite = true;
  double total = 0;
  for (const double f : seeds) {
    all_finite = all_finite && std::isfinite(f);
    total += f;
  }
  StepVerdict verdict;
  verdict.mean_loss = total / static_cast<double>(seeds.size());
  const double limit = fp32_loss + budget * std::abs(fp32_loss);
  verdict.kept = all_finite && verdict.mean_loss <= limit;
  if (verdict.kept) lowered = std::move(candidate);
  return verdict;
}

std::shared_ptr<const mpt::Policy> keep_layers_f32(const std::vector<std::string>& paths, mpt::DType low) {
  return std::make_shared<KeepNamedPolicy>(paths, low);
}

}  // namespace mpt::ex06
