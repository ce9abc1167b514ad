// Chapters 02 onwards — the policy string: a precision policy written as one
// line of text, for the command line (`mpt train --policy`, `mpt op`) and for
// checkpoints, which record the policy a run was trained with.
// Depends on: dtype.hpp, policy.hpp (UniformPolicy, KeepF32Policy,
// PathRulePolicy), ops.hpp (the op names a string may keep in FP32),
// path_pattern.hpp (Chapter 6's rules).
//
// The grammar, whole (no spaces anywhere):
//
//     POLICY  := DTYPE ( "+" CLAUSE )*
//     DTYPE   := a dtype name: f32, bf16, f16, e4m3, e5m2 (dtype_names())
//     CLAUSE  := "keep-f32:" OP ( "," OP )*             ops by PyTorch name
//              | "keep-f32-layers:" PATH ( "," PATH )*  layers by path
//              | PATTERN "=" DTYPE                      layers by pattern (Chapter 6)
//     PATH    := NAME ( "." NAME )*, NAME of letters, digits and "_"
//     PATTERN := a PATH whose NAMEs may hold "*", or be "**" (path_pattern.hpp)
//
// `f16` is Chapter 2's uniform policy (everything stored in f16, computed in
// f32); `f16+keep-f32:layer_norm` keeps every LayerNorm in FP32 inside it
// (Chapter 3's advice); `bf16+keep-f32-layers:fc3` keeps one layer. Each
// clause appears at most once, a name at most once, and the canonical text
// (PolicySpec::text) lists the op clause before the layer clause, names in
// the order given. Chapter 6's rules (`f16+block*.mlp=f32`, `bf16+**.ln1=f32`):
// the last rule whose pattern covers a layer decides its dtype
// (PathRulePolicy); `keep-f32-layers:P` is the rule `P=f32` written before
// every PATTERN rule (so a later rule may override it), and stays as it is
// in the canonical text, which lists the op clause, the layer clause, then
// the rules in the order given. Chapter 6 adds autocast lists and presets
// to this grammar.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/core/policy.hpp"

namespace mpt {

/// One `PATTERN=DTYPE` clause of a policy string, as written.
struct LayerRule {
  std::string pattern;  ///< path_pattern.hpp's syntax
  DType dtype;          ///< what the layers it covers store
  /// Same pattern text and dtype.
  bool operator==(const LayerRule& o) const { return pattern == o.pattern && dtype == o.dtype; }
};

/// A parsed policy string: the uniform dtype, its FP32 islands and its rules.
struct PolicySpec {
  DType dtype = DType::f32;              ///< what the uniform policy stores everything in
  std::vector<std::string> keep_ops;     ///< ops kept in FP32, by PyTorch name (known_ops())
  std::vector<std::string> keep_layers;  ///< layers kept in FP32, by path
  std::vector<LayerRule> rules;          ///< PATTERN=DTYPE, in the order given (the last that covers wins)
  /// The canonical text: parse_policy_string(text()) gives this spec again.
  std::string text() const;
  /// The policy: UniformPolicy(dtype), inside a KeepF32Policy when there are
  /// islands and no rules, inside a PathRulePolicy when there are rules.
  std::shared_ptr<const Policy> make() const;
};

/// The longest policy string accepted, in characters.
inline constexpr std::size_t kMaxPolicyStringLength = 4096;

/// Parse a policy string (the grammar above). Throws std::invalid_argument,
/// one line naming what is wrong and what is valid, for: an empty string; a
/// string longer than kMaxPolicyStringLength; an unknown dtype; an unknown
/// clause; a clause given twice; an empty name list, an empty name or a
/// trailing comma; an unknown op; a malformed path; a name given twice; a
/// malformed pattern, a rule's unknown dtype, a pattern given twice.
PolicySpec parse_policy_string(const std::string& text);

/// The grammar in one line, for error messages and help texts:
/// "DTYPE[+keep-f32:OP[,OP...]][+keep-f32-layers:PATH[,PATH...]] with DTYPE one of ...".
std::string policy_string_syntax();

}  // namespace mpt
