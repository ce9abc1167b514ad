// Chapter 07 — FP8 training: the policy fp8:RECIPE and its named base.
// Depends on: fp8_policy.hpp, text.hpp (shown, split_at).
#include "mpt/core/fp8_policy.hpp"

#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "mpt/core/text.hpp"

namespace mpt {

namespace {
constexpr const char* kRecipes[] = {"delayed", "current", "mx-floor", "mx-rceil", nullptr};
constexpr const char* kPrefix = "fp8:";
constexpr std::size_t kDefaultHistory = Fp8RecipeOptions{}.history;

bool is_mx(const std::string& recipe) { return recipe.rfind("mx-", 0) == 0; }

/// The options `recipe` takes, as its error messages list them ("" for none).
std::string option_syntax(const std::string& recipe) {
  std::string margin = "margin=0.." + std::to_string(kFp8PolicyMaxMargin);
  if (recipe == "delayed")
    return margin + ",history=1.." + std::to_string(kFp8PolicyMaxHistory) + ",algo=max|most_recent";
  if (recipe == "current") return margin;
  return "";
}

/// One line: what was wrong with fp8:RECIPE:OPTIONS and what `recipe` takes.
[[noreturn]] void refuse_option(const std::string& text, const std::string& recipe, const std::string& what) {
  const std::string syntax = option_syntax(recipe);
  throw std::invalid_argument("named policy " + shown(text) + ": " + what + "; fp8:" + recipe +
                              (syntax.empty() ? " takes no options"
                                              : " takes the options " + syntax +
                                                    " (each at most once), e.g. "
                                                    "fp8:delayed:margin=1,history=16,algo=most_recent"));
}

/// value as a whole number from lo to hi (digits only), or nullopt.
std::optional<std::size_t> whole_number(const std::string& value, std::size_t lo, std::size_t hi) {
  if (value.empty() || value.size() > 9) return std::nullopt;
  std::size_t n = 0;
  for (const char c : value) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + static_cast<std::size_t>(c - '0');
  }
  if (n < lo || n > hi) return std::nullopt;
  return n;
}

/// The recipe and options of "fp8:RECIPE" or "fp8:RECIPE:OPT=VALUE,..." (text starts with "fp8:").
Fp8Recipe parse_recipe(const std::string& text) {
  const std::string rest = text.substr(std::char_traits<char>::length(kPrefix));
  const std::size_t colon = rest.find(':');
  Fp8Recipe r;
  r.name = rest.substr(0, colon);
  bool known = false;
  for (const char* const* k = kRecipes; *k != nullptr; ++k) known = known || r.name == *k;
  if (!known)
    throw std::invalid_argument("named policy " + shown(text) + ": fp8 takes fp8:RECIPE with RECIPE one of " +
                                fp8_recipe_choices() + ", and options fp8:delayed:" +
                                option_syntax("delayed") + " or fp8:current:" + option_syntax("current"));
  if (colon == std::string::npos) return r;
  const std::string list = rest.substr(colon + 1);
  if (is_mx(r.name)) refuse_option(text, r.name, "options given to an MX recipe (its scales are per block)");
  if (list.empty())
    refuse_option(text, r.name, "an empty option list (fp8:" + r.name + " alone takes the defaults)");
  bool seen_margin = false, seen_history = false, seen_algo = false;
  for (const std::string& item : split_at(list, ',')) {
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) refuse_option(text, r.name, "option " + shown(item) + " is not NAME=VALUE");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    bool* seen = nullptr;
    if (key == "margin") {
      seen = &seen_margin;
      const auto n = whole_number(value, 0, static_cast<std::size_t>(kFp8PolicyMaxMargin));
      if (!n)
        refuse_option(text, r.name,
                      "margin " + shown(value) + " is not a whole number from 0 to " +
                          std::to_string(kFp8PolicyMaxMargin));
      r.options.margin = static_cast<int>(*n);
    } else if (key == "history" && r.name == "delayed") {
      seen = &seen_history;
      const auto n = whole_number(value, 1, kFp8PolicyMaxHistory);
      if (!n)
        refuse_option(text, r.name,
                      "history " + shown(value) + " is not a whole number from 1 to " +
                          std::to_string(kFp8PolicyMaxHistory));
      r.options.history = *n;
    } else if (key == "algo" && r.name == "delayed") {
      seen = &seen_algo;
      if (value != "max" && value != "most_recent")
        refuse_option(text, r.name, "algo " + shown(value) + " is neither max nor most_recent");
      r.options.most_recent = value == "most_recent";
    } else {
      refuse_option(text, r.name, "unknown option " + shown(key));
    }
    if (*seen) refuse_option(text, r.name, "option " + shown(key) + " given twice");
    *seen = true;
  }
  return r;
}

/// The canonical text: the options that are not the defaults, in the order margin, history, algo.
std::string canonical_of(const Fp8Recipe& r) {
  std::string options;
  const auto add = [&options](const std::string& o) { options += (options.empty() ? "" : ",") + o; };
  if (r.options.margin != 0) add("margin=" + std::to_string(r.options.margin));
  if (r.options.history != kDefaultHistory) add("history=" + std::to_string(r.options.history));
  if (r.options.most_recent) add("algo=most_recent");
  return kPrefix + r.name + (options.empty() ? "" : ":" + options);
}

/// Transformer Engine's spelling of the options that are not its defaults ("" when none).
std::string te_options(const Fp8Recipe& r) {
  std::string out;
  const auto add = [&out](const std::string& o) { out += (out.empty() ? "" : ", ") + o; };
  if (r.options.margin != 0) add("margin=" + std::to_string(r.options.margin));
  if (r.options.history != kDefaultHistory) add("amax_history_len=" + std::to_string(r.options.history));
  if (r.options.most_recent) add("amax_compute_algo=\"most_recent\"");
  return out.empty() ? "" : "(" + out + ")";
}

}  // namespace

const char* const* fp8_recipe_names() { return kRecipes; }

std::string fp8_recipe_choices() { return "delayed, current, mx-floor, mx-rceil"; }

std::string Fp8Policy::describe() const {
  const std::string& recipe = recipe_.name;
  const Fp8RecipeOptions& o = recipe_.options;
  const std::string scales =
      recipe == "delayed"
          ? "scales per layer and tensor from the amax history of earlier steps (" +
                std::to_string(o.history) + " steps, " + (o.most_recent ? "most_recent" : "max") +
                ", margin " + std::to_string(o.margin) + "), updated after each step"
      : recipe == "current"
          ? "each tensor scaled by its own amax as it is quantized" +
                (o.margin != 0 ? " (margin " + std::to_string(o.margin) + ")" : std::string())
          : "one E8M0 scale per block of 32 along each GEMM's k (" +
                std::string(recipe == "mx-floor" ? "OCP's FLOOR" : "NVIDIA's RCEIL") + " rule)";
  const std::string formats =
      is_mx(recipe) ? "x, W and dy e4m3 (MXFP8), " : "x and W e4m3 forward, dy e5m2 backward (HYBRID), ";
  return "FP8, recipe " + recipe + ": Linear layers' GEMMs in FP8 — " + formats + scales +
         ", FP32 accumulation, bf16 out; every other op bf16, parameters FP32";
}

OpPrecision Fp8Policy::decide_op(const OpInfo& op, const OpQuery& q) const {
  if (op.kind == OpKind::loss)
    return {q.inputs.empty() ? DType::bf16 : q.inputs.front(), DType::f32, DType::f32};
  if (q.fp8_gemm && op.name == "linear") return {DType::e4m3, DType::f32, DType::bf16};
  return {DType::bf16, DType::f32, DType::bf16};
}

DType Fp8Policy::parameter_dtype_of(const OpInfo&, std::string_view) const { return DType::f32; }

std::optional<NamedBase> fp8_named_base(const std::string& text) {
  if (text.rfind(kPrefix, 0) != 0) return std::nullopt;
  const Fp8Recipe r = parse_recipe(text);
  NamedBase b{canonical_of(r), false, {}, {}};
  b.needs.scaler = "none";
  b.needs.origin =
      "Transformer Engine fp8_autocast with recipe " +
      std::string(r.name == "delayed"   ? "DelayedScaling" + te_options(r) + " (Format.HYBRID)"
                  : r.name == "current" ? "Float8CurrentScaling" + te_options(r) + " (Format.HYBRID)"
                                        : "MXFP8BlockScaling (Format.E4M3)") +
      " inside bf16: Linear GEMMs in FP8, FP32 parameters, no loss scaler";
  b.make = [r](const NamedBase::Regions&) { return std::make_shared<Fp8Policy>(r); };
  return b;
}

std::string fp8_recipe_of_policy(const std::string& canonical_text) {
  if (canonical_text.rfind(kPrefix, 0) != 0) return "";
  const std::string base = canonical_text.substr(0, canonical_text.find('+'));
  return base.substr(
      std::char_traits<char>::length(kPrefix),
      base.find(':', std::char_traits<char>::length(kPrefix)) - std::char_traits<char>::length(kPrefix));
}

Fp8Recipe fp8_recipe_and_options_of_policy(const std::string& canonical_text) {
  if (canonical_text.rfind(kPrefix, 0) != 0)
    throw std::invalid_argument("policy " + shown(canonical_text) + " is not fp8:RECIPE");
  return parse_recipe(canonical_text.substr(0, canonical_text.find('+')));
}

}  // namespace mpt
