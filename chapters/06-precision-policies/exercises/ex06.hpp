// Chapter 06 — exercises: the adapter header, the student's specification.
// Depends on: the C++17 standard library for 6.1 to 6.3 (the grader
// compares them with mpt's parse_policy_string and PathPattern,
// src/mpt/core/policy_string.hpp and path_pattern.hpp; with its type
// promotion, src/mpt/core/autocast.hpp; and with the greedy pass of its
// measured search, src/mpt/train/policy_search.hpp); mpt/core/dtype.hpp for
// the dtypes; mpt/core/policy.hpp for 6.4 (a Policy out; the grader compares
// it with mpt's KeepF32Policy on a 12-block TinyTransformer).
// The grader includes this file and calls exactly these functions; the
// student writes them in ex06.cpp. Changing a signature breaks the grader.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/core/policy.hpp"

/// Chapter 6 exercises: a per-layer policy string and the dtype it gives a
/// layer, the promote rule of an op whose inputs arrive in different
/// dtypes, one step of the measured greedy search, and a policy that picks
/// its FP32 layers by name substring to diagnose and fix.
namespace mpt::ex06 {

/// One rule of a layer policy: the layers `pattern` covers store in `dtype`.
struct Rule {
  std::string pattern;            ///< as written in the text, e.g. "block*.mlp" or "**.ln1"
  mpt::DType dtype = DType::f32;  ///< f32, f16 or bf16
};

/// A parsed layer policy: a base dtype and rules, in the order written.
struct LayerPolicy {
  mpt::DType base = DType::f32;  ///< what a layer no rule covers stores in
  std::vector<Rule> rules;       ///< in the order written: the last that covers a layer decides
};

/// Exercise 6.1, part 1 — parse a layer policy string, Chapter 6's
/// `mpt train --policy` grammar cut down to its per-layer rules:
///
///     POLICY  := DTYPE ( "+" PATTERN "=" DTYPE )*
///     DTYPE   := "f32" | "f16" | "bf16"                (exactly these spellings)
///     PATTERN := SEGMENT ( "." SEGMENT )*
///     SEGMENT := one or more of letters, digits, "_" and "*", or exactly "**"
///
/// "f16" is f16 everywhere; "f16+block1=f32+**.ln1=f32" keeps block1 and
/// every ln1 in FP32; "bf16+block*.mlp=f32+block0.mlp.fc2=bf16" keeps every
/// block's MLP but one projection in FP32. No spaces anywhere. The result
/// holds the base and every rule, with its pattern exactly as written, in
/// the order written.
///
/// Bad text throws std::invalid_argument (one line, saying what is wrong):
/// an empty string; a base or a rule's dtype other than f32, f16, bf16
/// ("fp16", "F16", "e4m3" and "tf32" included); a "+" with nothing after
/// it, or a "+" too many; a clause without "=", or with more than one; an
/// empty pattern; an empty segment ("a..b", ".a", "a."); a character
/// other than letters, digits, "_", "*" and "."; "**" inside a longer
/// segment ("a**", "**b"); the same pattern given twice (a second rule for
/// one pattern is a typo, not an override). mpt's parse_policy_string
/// refuses the same texts (and accepts more: presets, keep-f32 clauses,
/// FP8 dtypes, the Chapter 1 names).
///
/// Graded against mpt's parse_policy_string on the same text (base and
/// rules equal), and on texts it must refuse.
LayerPolicy parse_layer_policy(const std::string& text);

/// Exercise 6.1, part 2 — the dtype the layer at `path` stores in.
///
/// `path` is a layer path, NAME ( "." NAME )* ("block0.mlp.fc1"); `policy`
/// holds patterns parse_layer_policy() accepts. A pattern *matches* a path
/// segment by segment: a plain segment matches a name equal to it; "*"
/// inside a segment matches any run of characters within one name, none
/// included ("block*" matches "block" and "block12", never "block0.mlp");
/// the segment "**" matches any number of whole names, none included
/// ("**.ln1" matches "ln1", "block0.ln1" and "a.b.ln1"). A pattern *covers*
/// a path when it matches the path or a path above it: "block1" covers
/// "block1" and "block1.mlp.fc1" (a rule for a module holds for its parts),
/// and never "block10" or "block1x" ("block1" is no substring test). The
/// last rule whose pattern covers `path` decides; none covers it: the base.
///
/// Graded against mpt's PathPattern::covers and PathRulePolicy (the dtype
/// its parameter_dtype() answers) on the paths of a 12-block Transformer,
/// with hand-written and seeded random policies.
///
/// In 6.1 do not call mpt's parse_policy_string, PathPattern, PathRulePolicy
/// or dtype_named: the grader uses them as its reference.
mpt::DType layer_dtype(const LayerPolicy& policy, const std::string& path);

/// Exercise 6.2 — the dtype an op on autocast's "promote" list runs in,
/// given the dtypes its floating inputs arrive in (torch.cat's inputs, an
/// elementwise add's two operands): PyTorch's type promotion, the dtype
/// every input is cast to and the result stored in.
///
/// The rule is c10's promotion table (c10/core/ScalarType.cpp, promoteTypes
/// and its lookup table; in releases before 2.1 it sat in
/// c10/core/ScalarType.h), folded over the inputs: two equal dtypes stay;
/// f32 with f16 or bf16 is f32; and f16 with bf16 is f32 too, not either of
/// them: torch.promote_types(torch.float16, torch.bfloat16) is
/// torch.float32, because neither 16-bit format holds the other's values
/// (f16 has the digits, bf16 the range). One input: its own dtype.
///
/// Inside torch.autocast the promote list first casts to the widest input
/// (aten/src/ATen/autocast_mode.h, promote_type and prioritize: f32 wins
/// over the low dtype), and refuses a mix of f16 and bf16 ("Unexpected
/// floating ScalarType in at::autocast::prioritize"); where autocast is off
/// the op's own type promotion decides, as here. This function is that
/// type promotion, which agrees with autocast's cast wherever autocast
/// accepts the inputs.
///
/// Bad input throws std::invalid_argument: no input at all; a dtype other
/// than f32, f16 and bf16 (e4m3, e5m2: PyTorch refuses to promote its FP8
/// types with others).
///
/// Graded against mpt's type promotion (as_arrives in mpt/core/autocast.hpp)
/// on every list of one to five inputs, and against AutocastPolicy's cast
/// of "cat" on the CPU, inside an autocast region and outside it. In 6.2 do
/// not call as_arrives or a Policy: the grader uses them as its reference.
mpt::DType promote_dtypes(const std::vector<mpt::DType>& inputs);

/// The per-seed final losses of one candidate assignment: the layers at the
/// paths in `lowered` run in the low dtype, every other layer in FP32 (the
/// measured search's evaluate_policy, src/mpt/train/policy_search.hpp).
using CandidateLosses = std::function<std::vector<double>(const std::vector<std::string>& lowered)>;

/// What one greedy step decided.
struct StepVerdict {
  bool kept = false;     ///< the layer tried stays lowered
  double mean_loss = 0;  ///< the mean of every seed's final loss of the candidate tried
};

/// Exercise 6.3 — one step of the measured search's greedy pass (step 4 of
/// src/mpt/train/policy_search.hpp).
///
/// `order` is the searchable layers from the least to the most sensitive;
/// the layers order[0 .. next−1] have been tried, and those of them kept
/// are in `lowered`. Try order[next]: the candidate is `lowered` with
/// order[next] appended; call `losses` exactly once, with that candidate,
/// to get its per-seed final losses (one or more). The layer is kept when
///
///   every seed's final loss is finite (no inf, no NaN), and
///   their mean is at most the limit L32 + budget·|L32|,
///
/// L32 being `fp32_loss`, the FP32 runs' mean final loss, and the mean
/// Σ losses / count in double. The budget is relative to L32: 0.02 allows
/// a final loss 2 % above FP32's. Equal to the limit is kept. A seed that
/// diverged refuses the layer whatever the others did, and so does a mean
/// above the limit, however good the best seed was: the search keeps only
/// what holds on average over every seed. When kept, append order[next] to
/// `lowered`; otherwise leave `lowered` as it was. Return the verdict and
/// the candidate's mean loss (inf or NaN when a seed's loss is: a sum of
/// all of them, divided by their count).
///
/// Bad input throws std::invalid_argument, `lowered` unchanged: `next` not
/// below order.size(); a budget that is negative, inf or NaN; an
/// `fp32_loss` that is not finite; no losses returned for the candidate.
/// The first three are checked before `losses` is called.
///
/// Graded against the rule above (the one mpt's search_policy applies, in
/// double), with a counting evaluator (called once, with the right
/// candidate), and against mpt's own search on the blobs MLP: your steps,
/// fed by evaluate_policy, must lower exactly the layers search_policy
/// lowers.
StepVerdict greedy_step(const std::vector<std::string>& order, std::size_t next,
                        std::vector<std::string>& lowered, double fp32_loss, double budget,
                        const CandidateLosses& losses);

/// Exercise 6.4 — DIAGNOSE: a policy that keeps some layers in FP32.
///
/// Not written from scratch: ex06.cpp comes with a body for this function
/// that compiles, runs, keeps the layers asked for in FP32 and has one real
/// bug. Find it and fix it, changing as little as you can (README.md lists
/// the symptoms the grader reports).
///
/// `paths` are layer paths (NAME ( "." NAME )*, each non-empty): "block1",
/// "lm_head", "block3.mlp". The policy returned stores everything in `low`
/// (f16 or bf16) and computes in FP32, as mpt's UniformPolicy(low) — except
/// the layers at `paths` and every layer under them ("block1" covers
/// "block1.attn.q" and "block1.mlp.fc2", never "block10" or "block11"):
/// those are FP32 islands, reading, computing and storing f32, their
/// parameters' model copy the FP32 master, as mpt's
/// KeepF32Policy(uniform_policy(low), paths) decides. No other layer is
/// FP32: a rule meant for one block must not silently keep three.
///
/// Graded against that KeepF32Policy on every path and op of a 12-block
/// TinyTransformer (decide() and parameter_dtype()), and in a traced
/// training step of that model: which layers ran in FP32.
std::shared_ptr<const mpt::Policy> keep_layers_f32(const std::vector<std::string>& paths, mpt::DType low);

}  // namespace mpt::ex06
