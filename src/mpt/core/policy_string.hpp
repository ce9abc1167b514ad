// Chapters 02 onwards — the policy string: a precision policy written as one
// line of text, for the command line (`mpt train --policy`, `mpt op`) and for
// checkpoints, which record the policy a run was trained with.
// Depends on: dtype.hpp, policy.hpp (UniformPolicy, KeepF32Policy,
// PathRulePolicy), ops.hpp (the op names a string may keep in FP32),
// path_pattern.hpp (Chapter 6's rules).
//
// The grammar, whole (no spaces anywhere):
//
//     POLICY  := BASE ( "+" CLAUSE )*
//     BASE    := DTYPE | NAMED
//     DTYPE   := a dtype name: f32, bf16, f16, e4m3, e5m2 (dtype_names())
//     NAMED   := Chapter 6's presets (presets.hpp): "autocast:" DEVICE [":" DTYPE],
//                O0 | O1 | O2 | O3 (apex), mixed_float16 | mixed_bfloat16 (Keras),
//                "jmp:" a jmp policy string (jmp's own grammar),
//                "fp8:" RECIPE [":" OPTIONS], RECIPE delayed | current | mx-floor | mx-rceil,
//                OPTIONS for delayed margin=M,history=H,algo=max|most_recent, for
//                current margin=M, comma-separated, each at most once (Chapter 7)
//     CLAUSE  := "keep-f32:" OP ( "," OP )*             ops by PyTorch name
//              | "keep-f32-layers:" PATH ( "," PATH )*  layers by path
//              | PATTERN "=" DTYPE                      layers by pattern (Chapter 6)
//              | PATTERN "=autocast-off" | PATTERN "=autocast-on"
//                                                       autocast regions (autocast bases only)
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
// to this grammar: a named base decides where the uniform dtype did, and the
// clauses wrap it as they wrap a dtype.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/core/path_pattern.hpp"
#include "mpt/core/policy.hpp"

namespace mpt {

/// One `PATTERN=DTYPE` clause of a policy string, as written, or (Chapter
/// 6's autocast regions) `PATTERN=autocast-off` / `PATTERN=autocast-on`.
struct LayerRule {
  /// What the rule does to the layers it covers.
  enum class Kind {
    dtype,         ///< store in `dtype` (PathRulePolicy)
    autocast_off,  ///< torch.autocast(enabled=False) around them: ops run in what arrives
    autocast_on,   ///< autocast on again inside a region that is off
  };
  std::string pattern;      ///< path_pattern.hpp's syntax
  DType dtype;              ///< what the layers it covers store (Kind::dtype)
  Kind kind = Kind::dtype;  ///< see Kind
  /// Same pattern text, kind and dtype.
  bool operator==(const LayerRule& o) const {
    return pattern == o.pattern && kind == o.kind && (kind != Kind::dtype || dtype == o.dtype);
  }
};

/// What a named policy (Chapter 6's presets) asks of a training run besides
/// the policy itself.
struct PolicyNeeds {
  /// False when the weights exist only in their model dtype (apex O3's
  /// master_weights=False, jmp with params below f32): MasterWeights::none.
  bool master_weights = true;
  /// The loss scaler it comes with, in mpt train's --scaler spelling
  /// ("dynamic", "static:1"), or "" when it names none.
  std::string scaler;
  /// Where the preset comes from and what it sets, one line for people.
  std::string origin;
};

/// Chapter 6's named policies as the grammar sees them. Declared here, for
/// the parser; defined with the presets in presets.cpp.
struct NamedBase {
  /// The autocast regions of a policy string: (pattern, on).
  using Regions = std::vector<std::pair<PathPattern, bool>>;
  /// Builds the base's policy with the string's regions (none unless `autocast`).
  using Make = std::function<std::shared_ptr<const Policy>(const Regions&)>;
  std::string canonical;  ///< "O2", "autocast:cuda:f16", "mixed_float16", "jmp:p=f32,c=f16,o=f32"
  bool autocast = false;  ///< true for an autocast policy (O1 and autocast:...): regions apply
  PolicyNeeds needs;      ///< what it asks of a run
  Make make;              ///< its policy (see Make)
};
/// The named policy `text` spells ("O1", "autocast:cpu", "jmp:c=half"), or
/// nullopt when `text` is none (a dtype, or unknown). Throws
/// std::invalid_argument, one line, for a malformed autocast: or jmp: text.
std::optional<NamedBase> named_base(const std::string& text);
/// Chapter 7: the named policy "fp8:RECIPE[:OPTIONS]" (RECIPE delayed, current, mx-floor, mx-rceil),
/// or nullopt when `text` does not start with "fp8:". Throws
/// std::invalid_argument, one line, for an unknown recipe. Declared here,
/// for named_base(); defined in fp8_policy.cpp.
std::optional<NamedBase> fp8_named_base(const std::string& text);
/// The names named_base() knows, for messages: "O0-O3, mixed_float16, ...".
std::string named_base_choices();

/// A parsed policy string: the uniform dtype, its FP32 islands and its rules.
struct PolicySpec {
  DType dtype = DType::f32;              ///< what the uniform policy stores everything in (no named base)
  std::optional<NamedBase> base;         ///< a named base (Chapter 6) instead of the uniform dtype
  std::vector<std::string> keep_ops;     ///< ops kept in FP32, by PyTorch name (known_ops())
  std::vector<std::string> keep_layers;  ///< layers kept in FP32, by path
  std::vector<LayerRule> rules;          ///< PATTERN=DTYPE, in the order given (the last that covers wins)
  /// The canonical text: parse_policy_string(text()) gives this spec again.
  std::string text() const;
  /// The policy: UniformPolicy(dtype) or the named base, inside a
  /// KeepF32Policy when there are islands and no rules, inside a
  /// PathRulePolicy when there are dtype rules.
  std::shared_ptr<const Policy> make() const;
  /// What the named base asks of a run (nothing for a dtype base).
  PolicyNeeds needs() const { return base ? base->needs : PolicyNeeds{}; }
};

/// Chapter 6: every layer pattern of `spec` (its rules and keep-f32-layers
/// paths) must cover at least one of `paths`, the paths a model's ops ask
/// with (Sequential::paths(), and "loss" where the loss runs): a pattern that
/// selects nothing is a typo that would change nothing. Throws
/// std::invalid_argument, one line naming the pattern and listing `paths`.
void check_patterns_select(const PolicySpec& spec, const std::vector<std::string>& paths);

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
