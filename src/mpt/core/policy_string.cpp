// Chapters 02 onwards — the policy string: parsing and the canonical text.
// Depends on: policy_string.hpp, ops.hpp (op_info: the known ops), dtype.hpp
// (dtype_named), path_pattern.hpp (the rules' patterns), text.hpp.
#include "mpt/core/policy_string.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "mpt/core/ops.hpp"
#include "mpt/core/path_pattern.hpp"
#include "mpt/core/text.hpp"

namespace mpt {
namespace {

constexpr const char* kOpClause = "keep-f32:";
constexpr const char* kLayerClause = "keep-f32-layers:";
constexpr const char* kAutocastOff = "autocast-off";
constexpr const char* kAutocastOn = "autocast-on";

[[noreturn]] void refuse(const std::string& text, const std::string& what) {
  throw std::invalid_argument("policy " + shown(text) + ": " + what + "; valid: " + policy_string_syntax());
}

bool is_path(const std::string& p) {
  if (p.empty()) return false;
  for (const std::string& name : split_at(p, '.')) {
    if (name.empty()) return false;
    for (const char c : name)
      if (std::isalnum(static_cast<unsigned char>(c)) == 0 && c != '_') return false;
  }
  return true;
}

// The names of one clause, each checked by `check` (which throws its own
// message for a bad name), none twice.
template <class Check>
std::vector<std::string> names_of(const std::string& text, const std::string& clause, const std::string& list,
                                  Check check) {
  if (list.empty()) refuse(text, "'" + clause + "' names nothing");
  std::vector<std::string> names = split_at(list, ',');
  for (const std::string& n : names) {
    if (n.empty()) refuse(text, "'" + clause + "' has an empty name (a comma too many)");
    check(n);
    if (std::count(names.begin(), names.end(), n) > 1) refuse(text, "'" + n + "' is named twice");
  }
  return names;
}

}  // namespace

std::string policy_string_syntax() {
  return "BASE[+keep-f32:OP[,OP...]][+keep-f32-layers:PATH[,PATH...]][+PATTERN=DTYPE|autocast-off|"
         "autocast-on...] with BASE a DTYPE or a preset, DTYPE one of " +
         dtype_names() + ", a preset one of " + named_base_choices() +
         ", and PATTERN a layer path whose names may hold * or be **, e.g. f16+keep-f32:layer_norm, "
         "f16+block*.mlp=f32, O1+head=autocast-off";
}

PolicySpec parse_policy_string(const std::string& text) {
  if (text.empty()) refuse(text, "empty");
  if (text.size() > kMaxPolicyStringLength)
    refuse(text, "longer than " + std::to_string(kMaxPolicyStringLength) + " characters");
  const std::vector<std::string> parts = split_at(text, '+');
  PolicySpec spec;
  try {
    spec.dtype = dtype_named(parts[0]);
  } catch (const std::invalid_argument& e) {
    // A named base (Chapter 6), else dtype_named's own explanation where it
    // has one (tf32 is no storage dtype).
    std::optional<NamedBase> named;
    try {
      named = named_base(parts[0]);
    } catch (const std::invalid_argument& bad) {
      refuse(text, bad.what());
    }
    if (!named) {
      const std::string why = e.what();
      refuse(text, why.rfind("unknown dtype", 0) == 0
                       ? "unknown dtype " + shown(parts[0]) + ", and no named policy"
                       : why);
    }
    spec.base = std::move(named);
    spec.dtype = DType::f32;
  }
  bool have_ops = false, have_layers = false;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const std::string& clause = parts[i];
    if (clause.rfind(kLayerClause, 0) == 0) {
      if (have_layers) refuse(text, std::string("'") + kLayerClause + "' given twice");
      have_layers = true;
      spec.keep_layers = names_of(
          text, kLayerClause, clause.substr(std::char_traits<char>::length(kLayerClause)),
          [&](const std::string& p) {
            if (!is_path(p))
              refuse(text, "layer path " + shown(p) + " is not NAME[.NAME...] of letters, digits and _");
          });
    } else if (clause.rfind(kOpClause, 0) == 0) {
      if (have_ops) refuse(text, std::string("'") + kOpClause + "' given twice");
      have_ops = true;
      spec.keep_ops = names_of(text, kOpClause, clause.substr(std::char_traits<char>::length(kOpClause)),
                               [&](const std::string& op) {
                                 try {
                                   (void)op_info(op);
                                 } catch (const std::invalid_argument&) {
                                   throw std::invalid_argument("policy " + shown(text) + ": unknown op " +
                                                               shown(op) + "; known ops: " + op_names());
                                 }
                               });
    } else if (const std::size_t eq = clause.find('='); eq != std::string::npos) {
      LayerRule rule{clause.substr(0, eq), DType::f32, LayerRule::Kind::dtype};
      try {
        (void)PathPattern(rule.pattern);
      } catch (const std::invalid_argument& e) {
        const std::string why = e.what();  // "layer pattern ...: WHY; valid: ..."
        const std::size_t from = why.find(": "), to = why.find("; valid: ");
        refuse(text, "rule " + shown(clause) + ": " +
                         (from == std::string::npos ? why : why.substr(from + 2, to - from - 2)) +
                         " (a PATTERN is " + path_pattern_syntax() + ")");
      }
      const std::string value = clause.substr(eq + 1);
      if (value == kAutocastOff || value == kAutocastOn) {
        if (!spec.base || !spec.base->autocast)
          refuse(text, "rule " + shown(clause) +
                           ": autocast regions need an autocast base (autocast:DEVICE:DTYPE "
                           "or O1), not " +
                           shown(parts[0]));
        rule.kind = value == kAutocastOff ? LayerRule::Kind::autocast_off : LayerRule::Kind::autocast_on;
      } else {
        try {
          rule.dtype = dtype_named(value);
        } catch (const std::invalid_argument&) {
          refuse(text, "rule " + shown(clause) + ": unknown dtype " + shown(value) + " (a DTYPE, " +
                           kAutocastOff + " or " + kAutocastOn + ")");
        }
      }
      for (const LayerRule& r : spec.rules)
        if (r.pattern == rule.pattern) refuse(text, "the pattern " + shown(rule.pattern) + " is given twice");
      spec.rules.push_back(std::move(rule));
    } else {
      refuse(text, clause.empty() ? std::string("a '+' with no clause after it")
                                  : "unknown clause " + shown(clause));
    }
  }
  // A named base spells out its defaults in the canonical text, which must
  // parse again: the limit holds for it too.
  if (spec.text().size() > kMaxPolicyStringLength)
    refuse(text,
           "longer than " + std::to_string(kMaxPolicyStringLength) + " characters in its canonical spelling");
  return spec;
}

void check_patterns_select(const PolicySpec& spec, const std::vector<std::string>& paths) {
  std::vector<std::string> patterns = spec.keep_layers;
  for (const LayerRule& r : spec.rules) patterns.push_back(r.pattern);
  for (const std::string& p : patterns) {
    const PathPattern pattern(p);
    if (std::any_of(paths.begin(), paths.end(), [&](const std::string& q) { return pattern.covers(q); }))
      continue;
    std::string list;
    for (const std::string& q : paths) list += (list.empty() ? "" : ", ") + q;
    throw std::invalid_argument("policy " + spec.text() + ": the layer pattern '" + p +
                                "' selects no layer of this model; its paths: " + list);
  }
}

std::string PolicySpec::text() const {
  std::string out = base ? base->canonical : std::string(dtype_name(dtype));
  const auto list = [&out](const char* clause, const std::vector<std::string>& names) {
    if (names.empty()) return;
    out += '+';
    out += clause;
    for (std::size_t i = 0; i < names.size(); ++i) out += (i ? "," : "") + names[i];
  };
  list(kOpClause, keep_ops);
  list(kLayerClause, keep_layers);
  for (const LayerRule& r : rules)
    out += "+" + r.pattern + "=" +
           (r.kind == LayerRule::Kind::autocast_off  ? std::string(kAutocastOff)
            : r.kind == LayerRule::Kind::autocast_on ? std::string(kAutocastOn)
                                                     : std::string(dtype_name(r.dtype)));
  return out;
}

std::shared_ptr<const Policy> PolicySpec::make() const {
  NamedBase::Regions regions;  // the autocast regions go to the base
  std::vector<const LayerRule*> dtype_rules;
  for (const LayerRule& r : rules) {
    if (r.kind == LayerRule::Kind::dtype) dtype_rules.push_back(&r);
    else regions.emplace_back(PathPattern(r.pattern), r.kind == LayerRule::Kind::autocast_on);
  }
  std::shared_ptr<const Policy> first = base ? base->make(regions) : uniform_policy(dtype);
  if (keep_ops.empty() && keep_layers.empty() && dtype_rules.empty()) return first;
  if (dtype_rules.empty()) return std::make_shared<KeepF32Policy>(first, keep_layers, keep_ops);
  std::vector<PathRule> all;  // keep-f32-layers first: PATH=f32, so that a later rule may override it
  for (const std::string& p : keep_layers) all.push_back({PathPattern(p), DType::f32});
  for (const LayerRule* r : dtype_rules) all.push_back({PathPattern(r->pattern), r->dtype});
  return std::make_shared<PathRulePolicy>(first, std::move(all), keep_ops);
}

}  // namespace mpt
