// Chapter 06 — exercises: what every grader test file shares, instructors' hidden tests included.
// Depends on: doctest, grader_kit.hpp, ex06.hpp, mpt (policy_string.hpp,
// path_pattern.hpp, policy.hpp, autocast.hpp, ops.hpp, trace.hpp, the nn
// tier's TinyTransformer and trace_step, the train tier's policy search).
// The exercise list; the reference answers (mpt is the oracle: its policy
// string parser and path patterns for 6.1, its type promotion and autocast
// policy for 6.2, the greedy rule of its measured search for 6.3, its
// KeepF32Policy for 6.4); the 12-block Transformer 6.1 and 6.4 are graded
// on; the kit's helpers.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ex06.hpp"
#include "grader_kit.hpp"
#include "mpt/core/autocast.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/core/ops.hpp"
#include "mpt/core/path_pattern.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/nn/model.hpp"
#include "mpt/nn/models/transformer.hpp"

namespace mpt::ex06::grading {

// ---- the exercises --------------------------------------------------------
// A test case belongs to an exercise through its doctest test suite,
// "exercise-" + id; each test case that passes scores its exercise's points
// per test case (the last number below): 2 for a behaviour to write, 3 for
// one of the diagnose exercise, and 1 for the test cases whose name ends
// "[1 point]" (bad input in 6.2 and 6.3). The kit's grader main
// (grader_main.cpp) reads this list as exercise_kit::kChapter.

using exercise_kit::Exercise;
using exercise_kit::Kind;

inline constexpr Exercise kExercises[] = {
    {"6.1", "a layer policy string, and the dtype it gives a layer", Kind::write, 2},
    {"6.2", "the promote rule: one dtype for inputs that arrive in several", Kind::write, 2},
    {"6.3", "one step of the measured search's greedy pass", Kind::write, 2},
    {"6.4", "a policy that picks its FP32 layers by name", Kind::diagnose, 3},
};

using exercise_kit::describe;
using exercise_kit::Mismatches;

inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline const double kNaN = std::numeric_limits<double>::quiet_NaN();

/// "f16", "bf16", "f32".
inline std::string name_of(mpt::DType d) { return std::string(mpt::dtype_name(d)); }

/// "{f16, bf16, f32}".
inline std::string describe(const std::vector<mpt::DType>& ds) {
  std::string s = "{";
  for (std::size_t i = 0; i < ds.size(); ++i) s += (i ? ", " : "") + name_of(ds[i]);
  return s + "}";
}

/// "{a, b}".
inline std::string describe(const std::vector<std::string>& names) {
  std::string s = "{";
  for (std::size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s + "}";
}

/// What an exception escaping the code under test says, for a report.
inline std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// ---- the 12-block Transformer (6.1 and 6.4) -----------------------------------------

/// The chapter's pitfall name-substring-policy's model: a TinyTransformer of
/// 12 blocks (block0 .. block11: "block1" is a prefix of two other names),
/// D 16, 2 heads, 8 tokens, vocabulary 32, seed 1; `policy` asked by every op
/// (the uniform f32 policy when null).
inline mpt::TransformerConfig transformer12(std::shared_ptr<const mpt::Policy> policy) {
  mpt::TransformerConfig c;
  c.vocab_size = 32;
  c.context = 8;
  c.d_model = 16;
  c.num_heads = 2;
  c.num_layers = 12;
  c.seed = 1;
  c.policy = std::move(policy);
  return c;
}

/// Every path an op of the 12-block Transformer asks the policy with
/// (Sequential::paths(): "tok_emb", "block0", "block0.ln1", "block0.attn.q",
/// "block0.residual1", ..., "ln_f", "lm_head").
inline const std::vector<std::string>& transformer12_paths() {
  static const std::vector<std::string> paths = mpt::TinyTransformer(transformer12(nullptr)).paths();
  return paths;
}

/// One traced training step of the 12-block Transformer with `policy`: 8
/// tokens, fixed ids and targets (as the pitfall).
inline mpt::Trace transformer12_step(std::shared_ptr<const mpt::Policy> policy) {
  mpt::TinyTransformer net(transformer12(std::move(policy)));
  const int tokens = 8;
  mpt::MatrixF ids(1, tokens);
  std::vector<int> targets;
  for (int t = 0; t < tokens; ++t) {
    ids(0, t) = static_cast<float>((5 * t + 2) % 32);
    targets.push_back((3 * t + 1) % 32);
  }
  return mpt::trace_step(net, ids, targets);
}

/// Every (path, op) the 12-block Transformer's forward runs in an FP32 step,
/// casts and the loss left out, in the order they ran, each once.
inline const std::vector<std::pair<std::string, std::string>>& transformer12_ops() {
  static const std::vector<std::pair<std::string, std::string>> ops = [] {
    std::vector<std::pair<std::string, std::string>> out;
    const mpt::Trace trace = transformer12_step(mpt::uniform_policy(mpt::DType::f32));  // kept alive
    for (const mpt::TraceEntry& e : trace.entries()) {
      if (e.phase != mpt::Phase::forward || e.path == "loss" || e.op == "cast" || e.op == "cached_cast")
        continue;
      const std::pair<std::string, std::string> p{e.path, e.op};
      if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
    }
    return out;
  }();
  return ops;
}

// ---- the layer policy string (exercise 6.1) ---------------------------------------

/// The text of a LayerPolicy: "f16+block1=f32+**.ln1=bf16".
inline std::string text_of(const LayerPolicy& p) {
  std::string s = name_of(p.base);
  for (const Rule& r : p.rules) s += "+" + r.pattern + "=" + name_of(r.dtype);
  return s;
}

/// 6.1's answer for a text: mpt's parse_policy_string (a uniform base and
/// dtype rules only, for the texts 6.1 accepts).
inline LayerPolicy reference_parse(const std::string& text) {
  const mpt::PolicySpec spec = mpt::parse_policy_string(text);
  LayerPolicy p;
  p.base = spec.dtype;
  for (const mpt::LayerRule& r : spec.rules) p.rules.push_back({r.pattern, r.dtype});
  return p;
}

/// 6.1's answer for a path: the last rule whose mpt::PathPattern covers it,
/// else the base.
inline mpt::DType reference_dtype(const LayerPolicy& p, const std::string& path) {
  for (std::size_t i = p.rules.size(); i-- > 0;)
    if (mpt::PathPattern(p.rules[i].pattern).covers(path)) return p.rules[i].dtype;
  return p.base;
}

/// The same from the policy mpt builds of the text (PathRulePolicy's
/// parameter dtype for a Linear at `path`): a second, independent oracle.
inline mpt::DType library_policy_dtype(const mpt::Policy& policy, const std::string& path) {
  return policy.parameter_dtype("linear", path);
}

/// Grades one text 6.1 accepts: the student's parse equals mpt's.
inline void expect_parse(Mismatches& m, const std::string& text) {
  m.checked();
  const LayerPolicy want = reference_parse(text);
  LayerPolicy got;
  try {
    got = parse_layer_policy(text);
  } catch (const std::logic_error& e) {
    if (std::string(e.what()).find("not implemented") != std::string::npos) throw;  // the stub's message
    if (m.wrong()) m.detail("'" + text + "': threw '" + e.what() + "', expected " + text_of(want));
    return;
  } catch (...) {
    if (m.wrong())
      m.detail("'" + text + "': threw '" + what_of(std::current_exception()) + "', expected " +
               text_of(want));
    return;
  }
  bool same = got.base == want.base && got.rules.size() == want.rules.size();
  for (std::size_t i = 0; same && i < got.rules.size(); ++i)
    same = got.rules[i].pattern == want.rules[i].pattern && got.rules[i].dtype == want.rules[i].dtype;
  if (same || !m.wrong()) return;
  m.detail("'" + text + "': parsed as " + text_of(got) + " (" + std::to_string(got.rules.size()) +
           " rules), expected " + text_of(want) + " (" + std::to_string(want.rules.size()) + " rules)");
}

/// Grades one text 6.1 refuses: std::invalid_argument, nothing else.
inline void expect_refused(Mismatches& m, const std::string& text, const std::string& why) {
  m.checked();
  try {
    const LayerPolicy got = parse_layer_policy(text);
    if (m.wrong())
      m.detail("'" + text + "' (" + why + "): accepted as " + text_of(got) +
               ", expected std::invalid_argument");
  } catch (const std::invalid_argument&) {
  } catch (const std::logic_error& e) {
    if (std::string(e.what()).find("not implemented") != std::string::npos) throw;
    if (m.wrong())
      m.detail("'" + text + "' (" + why + "): threw '" + e.what() + "', not std::invalid_argument");
  } catch (...) {
    if (m.wrong())
      m.detail("'" + text + "' (" + why + "): threw '" + what_of(std::current_exception()) +
               "', not std::invalid_argument");
  }
}

/// Grades layer_dtype() for one policy (built by the grader, patterns as
/// parse_layer_policy accepts them) on every path of `paths`.
inline void expect_dtypes(Mismatches& m, const LayerPolicy& p, const std::vector<std::string>& paths) {
  for (const std::string& path : paths) {
    m.checked();
    const mpt::DType want = reference_dtype(p, path);
    const mpt::DType got = layer_dtype(p, path);
    if (got == want || !m.wrong()) continue;
    m.detail(text_of(p) + " at '" + path + "': " + name_of(got) + ", expected " + name_of(want));
  }
}

// ---- the promote rule (exercise 6.2) ----------------------------------------------

/// 6.2's answer: mpt's type promotion of an elementwise op's inputs
/// (as_arrives for "add": the dtype every input is read in).
inline mpt::DType reference_promote(const std::vector<mpt::DType>& inputs) {
  return mpt::as_arrives(mpt::op_info("add"), mpt::OpQuery{"add", "x", inputs}, "the grader asks").input;
}

/// Grades one list of inputs against `want`.
inline void expect_promote(Mismatches& m, const std::vector<mpt::DType>& inputs, mpt::DType want,
                           const std::string& why) {
  m.checked();
  const mpt::DType got = promote_dtypes(inputs);
  if (got == want || !m.wrong()) return;
  m.detail(why + ": " + describe(inputs) + " gave " + name_of(got) + ", expected " + name_of(want));
}

/// Every list of `n` dtypes drawn from f32, bf16, f16 (3^n lists).
inline std::vector<std::vector<mpt::DType>> all_lists(std::size_t n) {
  const mpt::DType three[] = {mpt::DType::f32, mpt::DType::bf16, mpt::DType::f16};
  std::vector<std::vector<mpt::DType>> out{{}};
  for (std::size_t k = 0; k < n; ++k) {
    std::vector<std::vector<mpt::DType>> next;
    for (const auto& l : out)
      for (mpt::DType d : three) {
        next.push_back(l);
        next.back().push_back(d);
      }
    out = std::move(next);
  }
  return out;
}

// ---- one greedy step (exercise 6.3) -------------------------------------------

/// One step to grade: the search's state, the limit's inputs and the
/// per-seed losses the evaluator returns for the candidate.
struct StepCase {
  std::vector<std::string> order;    ///< layers, least sensitive first
  std::size_t next = 0;              ///< the one to try
  std::vector<std::string> lowered;  ///< kept so far
  double fp32_loss = 2.0;            ///< L32
  double budget = 0.02;              ///< b
  std::vector<double> losses;        ///< the candidate's per-seed final losses
};

/// "L32 2.3, budget 0.02, seeds {2.31, 2.35}".
inline std::string describe(const StepCase& c) {
  std::string s = "L32 " + describe(c.fp32_loss) + ", budget " + describe(c.budget) + ", seeds {";
  for (std::size_t i = 0; i < c.losses.size(); ++i) s += (i ? ", " : "") + describe(c.losses[i]);
  return s + "}, trying " + c.order[c.next] + " on top of " + describe(c.lowered);
}

/// The verdict of mpt's search_policy for one candidate (policy_search.cpp,
/// step 4): every seed finite and the mean Σ/n at most L32 + b·|L32|.
inline StepVerdict reference_step(const StepCase& c) {
  StepVerdict v;
  bool finite = true;
  double sum = 0;
  for (double f : c.losses) {
    finite = finite && std::isfinite(f);
    sum += f;
  }
  v.mean_loss = sum / static_cast<double>(c.losses.size());
  const double limit = c.fp32_loss + c.budget * std::abs(c.fp32_loss);
  v.kept = finite && v.mean_loss <= limit;
  return v;
}

/// True when two means agree: equal within 1e-12 relative when finite
/// (the order of the sum may differ), both not finite otherwise.
inline bool same_mean(double got, double want) {
  if (!std::isfinite(want)) return !std::isfinite(got);
  return std::fabs(got - want) <= 1e-12 * std::max(1.0, std::fabs(want));
}

/// Grades one step: the evaluator called once with `lowered` plus the
/// layer tried (in any order), the verdict, the mean, `lowered` after.
inline void expect_step(Mismatches& m, const StepCase& c, const std::string& why) {
  m.checked();
  const StepVerdict want = reference_step(c);
  std::vector<std::string> lowered = c.lowered;
  int calls = 0;
  std::vector<std::string> seen;
  const CandidateLosses losses = [&](const std::vector<std::string>& candidate) {
    ++calls;
    seen = candidate;
    return c.losses;
  };
  const StepVerdict got = greedy_step(c.order, c.next, lowered, c.fp32_loss, c.budget, losses);
  std::vector<std::string> candidate = c.lowered;
  candidate.push_back(c.order[c.next]);
  std::vector<std::string> sorted_seen = seen, sorted_candidate = candidate;
  std::sort(sorted_seen.begin(), sorted_seen.end());
  std::sort(sorted_candidate.begin(), sorted_candidate.end());
  const std::vector<std::string> want_lowered = want.kept ? candidate : c.lowered;
  std::string problem;
  if (calls != 1) problem = "the evaluator was called " + std::to_string(calls) + " times, expected once";
  else if (sorted_seen != sorted_candidate)
    problem = "the evaluator was asked about " + describe(seen) + ", expected " + describe(candidate);
  else if (got.kept != want.kept)
    problem = std::string(got.kept ? "kept" : "refused") + ", expected " + (want.kept ? "kept" : "refused") +
              " (mean " + describe(want.mean_loss) + ", limit " +
              describe(c.fp32_loss + c.budget * std::abs(c.fp32_loss)) + ")";
  else if (!same_mean(got.mean_loss, want.mean_loss))
    problem = "mean loss " + describe(got.mean_loss) + ", expected " + describe(want.mean_loss);
  else if (lowered != want_lowered)
    problem = "lowered is " + describe(lowered) + " afterwards, expected " + describe(want_lowered);
  if (problem.empty() || !m.wrong()) return;
  m.detail(why + " (" + describe(c) + "): " + problem);
}

// ---- the FP32 layers by path (exercise 6.4) ---------------------------------------

/// 6.4's answer: mpt's KeepF32Policy over UniformPolicy(low).
inline std::shared_ptr<const mpt::Policy> reference_keep(const std::vector<std::string>& paths,
                                                         mpt::DType low) {
  return std::make_shared<mpt::KeepF32Policy>(mpt::uniform_policy(low), paths);
}

/// "{f16, f32, f16}".
inline std::string describe(const mpt::OpPrecision& p) {
  return "{" + name_of(p.input) + ", " + name_of(p.compute) + ", " + name_of(p.output) + "}";
}

/// What is wrong with the student's policy for `paths` in `low` on every
/// (path, op) of the 12-block Transformer ("" when nothing): decide() with
/// inputs arriving in `low` and in f32, and parameter_dtype(); the first
/// few paths that differ, and how many.
inline std::string keep_problem(const std::vector<std::string>& paths, mpt::DType low) {
  const std::shared_ptr<const mpt::Policy> want = reference_keep(paths, low);
  const std::shared_ptr<const mpt::Policy> got = keep_layers_f32(paths, low);
  if (!got) return "keep_layers_f32 returned no policy";
  std::vector<std::string> wrong;
  std::string first;
  for (const auto& [path, op] : transformer12_ops()) {
    std::string here;
    for (const std::vector<mpt::DType>& in :
         {std::vector<mpt::DType>{low}, std::vector<mpt::DType>{mpt::DType::f32}}) {
      const mpt::OpQuery q{op, path, in};
      const mpt::OpPrecision a = got->decide(q), b = want->decide(q);
      if (here.empty() && (a.input != b.input || a.compute != b.compute || a.output != b.output))
        here = op + " at " + path + " with inputs " + describe(in) + ": " + describe(a) + ", expected " +
               describe(b);
    }
    const mpt::DType pa = got->parameter_dtype(op, path), pb = want->parameter_dtype(op, path);
    if (here.empty() && pa != pb)
      here = op + " at " + path + ": parameters' model copy " + name_of(pa) + ", expected " + name_of(pb);
    if (!here.empty()) {
      if (std::find(wrong.begin(), wrong.end(), path) == wrong.end()) wrong.push_back(path);
      if (first.empty()) first = here;
    }
  }
  if (wrong.empty()) return "";
  std::string list;
  for (std::size_t i = 0; i < wrong.size() && i < 8; ++i) list += (i ? ", " : "") + wrong[i];
  if (wrong.size() > 8) list += ", ...";
  return std::to_string(wrong.size()) + " paths decided wrongly (" + list + "); the first: " + first;
}

/// The blocks (0 .. 11) whose MLP input projection read f32 activations
/// in a traced step, and the other top-level layers that did: what the
/// trace shows kept in FP32 ("block1, block10, lm_head").
inline std::string fp32_layers_of(const mpt::Trace& trace) {
  std::vector<std::string> seen;
  for (const mpt::TraceEntry& e : trace.entries()) {
    if (e.phase != mpt::Phase::forward || e.op == "cast" || e.op == "cached_cast" || e.path == "loss")
      continue;
    if (e.outputs.empty() || e.outputs.front().dtype != mpt::DType::f32) continue;
    const std::string top = e.path.substr(0, e.path.find('.'));
    if (std::find(seen.begin(), seen.end(), top) == seen.end()) seen.push_back(top);
  }
  std::string s;
  for (const std::string& t : seen) s += (s.empty() ? "" : ", ") + t;
  return s.empty() ? "none" : s;
}

/// What differs between the student's traced step and the reference's
/// ("" when nothing): per forward op, in order, the dtypes it read and
/// stored.
inline std::string trace_problem(const std::vector<std::string>& paths, mpt::DType low) {
  const mpt::Trace want = transformer12_step(reference_keep(paths, low));
  const mpt::Trace got = transformer12_step(keep_layers_f32(paths, low));
  const auto forward = [](const mpt::Trace& t) {
    std::vector<std::string> rows;
    for (const mpt::TraceEntry& e : t.entries()) {
      if (e.phase != mpt::Phase::forward) continue;
      std::string row = e.op + " at " + e.path + ": reads";
      for (const mpt::TracedValue& v : e.inputs) row += " " + v.name + " " + name_of(v.dtype);
      row += ", stores";
      for (const mpt::TracedValue& v : e.outputs) row += " " + name_of(v.dtype);
      rows.push_back(row);
    }
    return rows;
  };
  const std::vector<std::string> a = forward(got), b = forward(want);
  std::size_t at = 0;
  while (at < a.size() && at < b.size() && a[at] == b[at]) ++at;
  if (at == a.size() && at == b.size()) return "";
  return "FP32 ran in " + fp32_layers_of(got) + ", expected in " + fp32_layers_of(want) +
         "; the first forward op that differs: " + (at < a.size() ? a[at] : std::string("(none)")) +
         ", expected " + (at < b.size() ? b[at] : std::string("(none)"));
}

}  // namespace mpt::ex06::grading

namespace mpt::exercise_kit {
/// What the kit's grader main grades: Chapter 6 and its exercises.
inline constexpr Chapter kChapter{6, mpt::ex06::grading::kExercises,
                                  sizeof mpt::ex06::grading::kExercises / sizeof(Exercise)};
}  // namespace mpt::exercise_kit
