// Chapter 07 — `mpt fp8 quantize` and `mpt fp8 simulate`: FP8 scaling
// recipes from the command line.
// Depends on: command.hpp (registry), cli_support.hpp, CLI11, nlohmann_json,
// and the mpt library's fp8 tier (quantize, recipes), explain
// (shortest_decimal, power_of_two_or_decimal) and core/text.hpp (shown).
//
// Every option is taken as text and parsed here, so that each bad value gets
// a message naming the option, the value and what it may be; all of stdin
// is read and checked before the first line of output.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "command.hpp"
#include "mpt/core/text.hpp"
#include "mpt/formats/explain.hpp"
#include "mpt/fp8/quantize.hpp"
#include "mpt/fp8/recipes.hpp"

namespace {

using Json = nlohmann::ordered_json;
using mpt::cli::table;
using mpt::cli::UsageError;

constexpr const char* kFp8Formats = "e4m3, e5m2";
constexpr const char* kQuantizeRecipes = "current, mx-floor, mx-rceil";

struct Fp8QuantizeArgs {
  std::string format, recipe, margin, amax_epsilon, overflow;
  bool power_2 = false;
  bool json = false;
  const CLI::Option* margin_opt = nullptr;
  const CLI::Option* epsilon_opt = nullptr;
};

struct Fp8SimulateArgs {
  std::string format, recipe, history, algo, margin;
  bool json = false;
};

// ---------------------------------------------------------------------------
// Input.

mpt::DType fp8_format_option(const std::string& name) {
  if (name.empty()) throw UsageError("missing --format; give --format e4m3 or --format e5m2");
  if (name == "e4m3") return mpt::DType::e4m3;
  if (name == "e5m2") return mpt::DType::e5m2;
  throw UsageError("--format: unknown FP8 format " + mpt::shown(name) + "; valid formats: " + kFp8Formats);
}

int fp8_margin_option(const std::string& text) {
  if (text.empty()) return 0;
  return static_cast<int>(mpt::cli::whole_option("--margin", text, 0, mpt::fp8::kMaxMargin));
}

// The numbers on stdin, whitespace separated, as fp32 values; `what` names
// one of them in messages ("value", "amax").
std::vector<float> fp8_read_stdin(const std::string& what) {
  std::vector<float> values;
  std::string token;
  while (std::cin >> token) {
    float v = 0;
    if (!mpt::cli::parse_number(token, v))
      throw UsageError("stdin: " + mpt::cli::not_a_number(
                                       token, "(" + what + " " + std::to_string(values.size() + 1) + ")"));
    values.push_back(v);
  }
  return values;
}

std::string fp8_hex(std::uint8_t code) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", static_cast<unsigned>(code));
  return buf;
}

// A number for people: the shortest decimal that reads back to it, and every
// NaN "nan" (the sign bit of inf − inf differs between machines).
std::string fp8_text(float v) { return std::isnan(v) ? "nan" : mpt::shortest_decimal(v); }
std::string fp8_text(double v) { return std::isnan(v) ? "nan" : mpt::shortest_decimal(v); }

// A float as the shortest decimal that reads back to it (a double nlohmann
// writes back as that decimal); JSON has no inf or NaN: null.
Json fp8_json_number(float v) {
  if (!std::isfinite(v)) return nullptr;
  return std::strtod(mpt::shortest_decimal(v).c_str(), nullptr);
}
Json fp8_json_number(double v) {
  if (!std::isfinite(v)) return nullptr;
  return v;
}

// ---------------------------------------------------------------------------
// mpt fp8 quantize

struct Fp8QuantizeSetup {
  mpt::DType dtype = mpt::DType::e4m3;
  std::string recipe;
  bool saturate = true;
  mpt::fp8::CurrentScalingOptions current;
  mpt::fp8::MxScaleRule rule = mpt::fp8::MxScaleRule::floor;
};

Fp8QuantizeSetup fp8_quantize_setup(const Fp8QuantizeArgs& a) {
  Fp8QuantizeSetup s;
  s.dtype = fp8_format_option(a.format);
  if (a.recipe.empty()) throw UsageError(std::string("missing --recipe; valid recipes: ") + kQuantizeRecipes);
  if (a.recipe == "delayed")
    throw UsageError(
        "--recipe delayed: a delayed scale comes from earlier steps; play it with `mpt fp8 simulate --recipe "
        "delayed`; valid recipes here: " +
        std::string(kQuantizeRecipes));
  if (a.recipe != "current" && a.recipe != "mx-floor" && a.recipe != "mx-rceil")
    throw UsageError("--recipe: unknown recipe " + mpt::shown(a.recipe) +
                     "; valid recipes: " + kQuantizeRecipes);
  s.recipe = a.recipe;
  if (a.overflow.empty() || a.overflow == "sat") s.saturate = true;
  else if (a.overflow == "inf") s.saturate = false;
  else
    throw UsageError("--overflow: unknown overflow mode " + mpt::shown(a.overflow) +
                     "; valid modes: inf, sat");
  if (s.recipe == "current") {
    s.current.margin = fp8_margin_option(a.margin);
    s.current.power_2_scale = a.power_2;
    if (a.epsilon_opt && a.epsilon_opt->count() > 0) {
      float eps = 0;
      if (!mpt::cli::parse_number(a.amax_epsilon, eps))
        throw UsageError("--amax-epsilon: " + mpt::cli::not_a_number(a.amax_epsilon));
      if (!(std::isfinite(eps) && eps >= 0.0f))
        throw UsageError("--amax-epsilon: " + mpt::shown(a.amax_epsilon) + " is not a finite number >= 0");
      s.current.amax_epsilon = eps;
    }
  } else {
    const bool margin = a.margin_opt && a.margin_opt->count() > 0;
    const bool eps = a.epsilon_opt && a.epsilon_opt->count() > 0;
    if (margin || eps || a.power_2)
      throw UsageError(std::string(margin ? "--margin"
                                   : eps  ? "--amax-epsilon"
                                          : "--power-of-2") +
                       " applies to --recipe current only; an MX block's scale is the power of two its rule "
                       "gives (valid with mx-floor and mx-rceil: --format, --overflow, --json)");
    s.rule = s.recipe == "mx-floor" ? mpt::fp8::MxScaleRule::floor : mpt::fp8::MxScaleRule::rceil;
  }
  return s;
}

std::string fp8_recipe_line(const Fp8QuantizeSetup& s, const mpt::FormatSpec& f) {
  const std::string fmt =
      std::string(mpt::dtype_name(s.dtype)) + " (max " + fp8_text(mpt::format_max(f)) + ")";
  const std::string overflow =
      s.saturate ? "saturating" : (s.dtype == mpt::DType::e4m3 ? "overflow to NaN" : "overflow to inf");
  if (s.recipe == "current") {
    std::string rule = "scale = " + fp8_text(mpt::fp8::scaled_max(f, s.current.margin)) + " / amax";
    if (s.current.power_2_scale) rule += ", rounded down to a power of two";
    if (s.current.amax_epsilon > 0.0f) rule += ", amax at least " + fp8_text(s.current.amax_epsilon);
    return "current scaling (Transformer Engine's Float8CurrentScaling), " + fmt + ", " + overflow + ": " +
           rule + " (amax 0, inf or NaN: scale 1)\n";
  }
  const std::string emax = std::to_string(f.emax());
  const std::string rule =
      s.rule == mpt::fp8::MxScaleRule::floor
          ? "FLOOR (OCP MX v1.0): e = floor(log2 amax) - " + emax
          : "RCEIL (NVIDIA): e = ceil(log2(amax / " + fp8_text(mpt::format_max(f)) + "))";
  return "MX block scaling, blocks of " + std::to_string(mpt::fp8::kMxBlockSize) + ", " + fmt + ", " +
         overflow + ": " + rule + ", E8M0 2^e, scale 2^-e\n";
}

int cmd_fp8_quantize(const Fp8QuantizeArgs& a) {
  const Fp8QuantizeSetup s = fp8_quantize_setup(a);
  const std::vector<float> x = fp8_read_stdin("value");  // all of it, before any output
  if (x.empty())
    throw UsageError(
        "stdin: no values to quantize; give the numbers on stdin, e.g. echo 1 -2 3.5 | mpt fp8 "
        "quantize --format e4m3 --recipe current");
  const mpt::fp8::Fp8Tensor t = mpt::cli::invalid_argument_is_usage_error([&] {
    return s.recipe == "current"
               ? mpt::fp8::quantize_current(x.data(), x.size(), s.dtype, s.current, s.saturate)
               : mpt::fp8::quantize_mx(x.data(), 1, x.size(), s.dtype, s.rule, s.saturate);
  });
  const mpt::FormatSpec& f = t.spec();
  const std::vector<float> values = mpt::fp8::dequantize(t);
  std::vector<double> errors(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    errors[i] = static_cast<double>(values[i]) - static_cast<double>(x[i]);
  const bool mx = t.block != 0;

  if (a.json) {
    Json j;
    j["format"] = mpt::dtype_name(s.dtype);
    j["recipe"] = s.recipe;
    j["saturate"] = s.saturate;
    if (!mx) {
      j["margin"] = s.current.margin;
      j["power_of_2"] = s.current.power_2_scale;
      j["amax_epsilon"] = fp8_json_number(s.current.amax_epsilon);
    }
    j["block"] = mx ? static_cast<Json>(t.block) : static_cast<Json>(nullptr);
    Json scales = Json::array(), amax = Json::array(), codes = Json::array(), vals = Json::array(),
         errs = Json::array();
    for (float v : t.scales) scales.push_back(fp8_json_number(v));
    for (float v : t.amax) amax.push_back(fp8_json_number(v));
    j["scales"] = scales;
    j["amax"] = amax;
    if (mx) j["e8m0"] = t.e8m0;
    for (std::uint8_t c : t.codes) codes.push_back(c);
    for (float v : values) vals.push_back(fp8_json_number(v));
    for (double e : errors) errs.push_back(fp8_json_number(e));
    j["codes"] = codes;
    j["values"] = vals;
    j["errors"] = errs;
    j["counts"] = {{"saturated", t.counts.saturated},
                   {"overflowed", t.counts.overflowed},
                   {"nan", t.counts.nan},
                   {"flushed", t.counts.flushed}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }

  std::string out = fp8_recipe_line(s, f);
  if (mx) {
    std::vector<std::vector<std::string>> blocks = {{"block", "values", "amax", "e8m0", "scale"}};
    for (std::size_t b = 0; b < t.scales.size(); ++b) {
      const std::size_t first = b * t.block;
      const std::size_t last = std::min(first + t.block, t.cols) - 1;
      blocks.push_back(
          {std::to_string(b), std::to_string(first) + "-" + std::to_string(last), fp8_text(t.amax[b]),
           fp8_hex(t.e8m0[b]) + " (" + mpt::power_of_two_or_decimal(mpt::fp8::e8m0_to_float(t.e8m0[b])) + ")",
           mpt::power_of_two_or_decimal(t.scales[b])});
    }
    out += "\n" + table(blocks, "rrrll");
  } else {
    out += "amax " + fp8_text(t.amax[0]) + ", scale " + fp8_text(t.scales[0]) +
           " (stored = value x scale; read back = code x (1 / scale))\n";
  }
  std::vector<std::vector<std::string>> rows = {{"i", "input", "scaled", "code", "value", "error"}};
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float scaled = x[i] * t.scales[t.scale_index(i)];
    rows.push_back({std::to_string(i), fp8_text(x[i]), fp8_text(scaled), fp8_hex(t.codes[i]),
                    fp8_text(values[i]), fp8_text(errors[i])});
  }
  out += "\n" + table(rows, "rrrlrr");
  const std::string max = fp8_text(mpt::format_max(f));
  out += "\n" + std::to_string(x.size()) + " values: " + std::to_string(t.counts.saturated) +
         " saturated to ±" + max + ", " + std::to_string(t.counts.overflowed) + " overflowed (" +
         (s.dtype == mpt::DType::e4m3 ? "NaN" : "±inf") + "), " + std::to_string(t.counts.nan) + " NaN, " +
         std::to_string(t.counts.flushed) + " flushed to zero\n";
  if (t.counts.saturated > 0)
    out += "warning: " + std::to_string(t.counts.saturated) + " value" +
           (t.counts.saturated == 1 ? " was" : "s were") + " beyond ±" + max +
           " (inf included) and now read back as ±" + max +
           " like any in-range value: saturation hides overflow\n";
  std::cout << out;
  return 0;
}

// ---------------------------------------------------------------------------
// mpt fp8 simulate

int cmd_fp8_simulate(const Fp8SimulateArgs& a) {
  if (a.recipe.empty()) throw UsageError("missing --recipe; give --recipe delayed");
  if (a.recipe != "delayed")
    throw UsageError("--recipe: " + mpt::shown(a.recipe) +
                     " cannot be simulated; valid recipes: delayed (mpt fp8 quantize takes " +
                     kQuantizeRecipes + ")");
  const mpt::DType dtype = fp8_format_option(a.format);
  mpt::fp8::DelayedScalingOptions o;
  if (!a.history.empty())
    o.amax_history_len = static_cast<std::size_t>(mpt::cli::whole_option(
        "--history", a.history, 1, static_cast<long long>(mpt::fp8::kMaxAmaxHistoryLen)));
  if (!a.algo.empty()) {
    if (a.algo != "max" && a.algo != "most_recent")
      throw UsageError("--algo: unknown amax_compute_algo " + mpt::shown(a.algo) +
                       "; valid: max, most_recent");
    o.algo = mpt::fp8::amax_compute_algo_named(a.algo);
  }
  o.margin = fp8_margin_option(a.margin);

  const std::vector<float> amaxes = fp8_read_stdin("amax");
  if (amaxes.empty())
    throw UsageError(
        "stdin: no amax values; give one amax per step (numbers >= 0), e.g. echo 1 1 8 1 | mpt fp8 "
        "simulate --recipe delayed --format e4m3");
  for (std::size_t i = 0; i < amaxes.size(); ++i)
    if (std::isnan(amaxes[i]) || amaxes[i] < 0.0f)
      throw UsageError("stdin: amax " + fp8_text(amaxes[i]) + " (step " + std::to_string(i + 1) +
                       ") is not an amax; give numbers >= 0 (inf allowed)");
  const std::vector<mpt::fp8::DelayedStep> steps =
      mpt::cli::invalid_argument_is_usage_error([&] { return mpt::fp8::simulate_delayed(amaxes, dtype, o); });
  const mpt::FormatSpec& f = mpt::fp8::fp8_spec(dtype);

  if (a.json) {
    Json j;
    j["format"] = mpt::dtype_name(dtype);
    j["recipe"] = "delayed";
    j["amax_history_len"] = o.amax_history_len;
    j["amax_compute_algo"] = mpt::fp8::amax_compute_algo_name(o.algo);
    j["margin"] = o.margin;
    Json amax = Json::array(), scales = Json::array(), saturated = Json::array(), chosen = Json::array();
    for (const mpt::fp8::DelayedStep& s : steps) {
      amax.push_back(fp8_json_number(s.amax));
      scales.push_back(fp8_json_number(s.scale));
      saturated.push_back(s.overflow);
      chosen.push_back(fp8_json_number(s.update_amax));
    }
    j["amax"] = amax;
    j["scales"] = scales;
    j["saturated"] = saturated;
    j["update_amax"] = chosen;
    j["next_scale"] = fp8_json_number(steps.back().next_scale);
    std::cout << j.dump(2) << "\n";
    return 0;
  }

  std::string out =
      "delayed scaling (Transformer Engine's DelayedScaling, its fused update), " +
      std::string(mpt::dtype_name(dtype)) + " (max " + fp8_text(mpt::format_max(f)) + "), amax_history_len " +
      std::to_string(o.amax_history_len) + ", amax_compute_algo " +
      std::string(mpt::fp8::amax_compute_algo_name(o.algo)) + ", margin " + std::to_string(o.margin) +
      "\nstep 1 quantizes with scale 1; after each step scale = " +
      fp8_text(mpt::fp8::scaled_max(f, o.margin)) + " / amax (" +
      (o.algo == mpt::fp8::AmaxComputeAlgo::max
           ? "the largest of the last " + std::to_string(o.amax_history_len) + " steps"
           : std::string("the step's own")) +
      "); a step whose amax is 0 leaves history and scale alone; an inf amax keeps the scale\n\n";
  std::vector<std::vector<std::string>> rows = {
      {"step", "amax", "scale", "amax x scale", "saturated", "update amax", "next scale"}};
  std::size_t saturated = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const mpt::fp8::DelayedStep& s = steps[i];
    saturated += s.overflow ? 1 : 0;
    rows.push_back({std::to_string(i + 1), fp8_text(s.amax), fp8_text(s.scale), fp8_text(s.amax * s.scale),
                    s.overflow ? "yes" : "no", fp8_text(s.update_amax), fp8_text(s.next_scale)});
  }
  out += table(rows, "rrrrcrr");
  out += "\n" + std::to_string(saturated) + " of " + std::to_string(steps.size()) +
         " steps saturated their largest value (amax x scale beyond ±" + fp8_text(mpt::format_max(f)) + ")\n";
  std::cout << out;
  return 0;
}

// ---------------------------------------------------------------------------
// Their command lines.

void add_fp8_commands(CLI::App& app, mpt::cli::Handlers& handlers) {
  auto* fp8 = app.add_subcommand("fp8", "Chapter 7's FP8 scaling recipes from the command line")
                  ->require_subcommand(1);

  auto q = std::make_shared<Fp8QuantizeArgs>();
  auto* quantize = fp8->add_subcommand(
      "quantize",
      "Quantize the numbers on stdin (whitespace separated, decimal or hex-float, read as fp32) to FP8 with "
      "a "
      "scaling recipe, and print the scale(s), the amax each came from, every code, the value it reads back "
      "as "
      "and its error (value - input), and how many values saturated, overflowed, were NaN or flushed to "
      "zero. "
      "Scales multiply: code = round(value x scale), read back as code x (1 / scale). current: one scale "
      "for all, Transformer Engine's current scaling. mx-floor, mx-rceil: one power-of-two scale per block "
      "of 32, "
      "by the OCP MX rule (FLOOR) or NVIDIA's round-up (RCEIL); a last block of fewer than 32 is scaled as "
      "if "
      "padded with zeros.");
  quantize->add_option("--format,-f", q->format, "e4m3 or e5m2 (required)")->type_name("FMT");
  quantize->add_option("--recipe", q->recipe, std::string(kQuantizeRecipes) + " (required)")->type_name("R");
  q->margin_opt =
      quantize
          ->add_option("--margin", q->margin,
                       "current only: aim the amax at max / 2^M (TE's delayed-scaling margin; TE's "
                       "current scaling has none), 0 to " +
                           std::to_string(mpt::fp8::kMaxMargin))
          ->default_str("0")
          ->type_name("M");
  quantize->add_flag("--power-of-2", q->power_2, "current only: round the scale down to a power of two");
  q->epsilon_opt = quantize
                       ->add_option("--amax-epsilon", q->amax_epsilon,
                                    "current only: floor of the amax (TE's amax_epsilon), >= 0")
                       ->default_str("0")
                       ->type_name("E");
  quantize
      ->add_option("--overflow", q->overflow,
                   "sat: beyond ±max (and ±inf) clamps to ±max (OCP saturation, TE's casts); inf: it becomes "
                   "NaN in e4m3, ±inf in e5m2")
      ->default_str("sat")
      ->type_name("MODE");
  quantize->add_flag(
      "--json", q->json,
      "the same as JSON: {\"format\", \"recipe\", \"saturate\", (current:) \"margin\", "
      "\"power_of_2\", \"amax_epsilon\", \"block\" (32, or null for one scale), \"scales\": [...], "
      "\"amax\": [...] (one per scale), (MX:) \"e8m0\": [codes], \"codes\": [...], \"values\": "
      "[...], \"errors\": [...], \"counts\": {\"saturated\", \"overflowed\", \"nan\", "
      "\"flushed\"}}; inf and NaN as null");
  handlers.on(quantize, [q] { return cmd_fp8_quantize(*q); });

  auto s = std::make_shared<Fp8SimulateArgs>();
  auto* simulate = fp8->add_subcommand(
      "simulate",
      "Play delayed scaling (Transformer Engine's DelayedScaling, its fused amax-and-scale update) over one "
      "amax per step read from stdin (numbers >= 0, inf allowed): step 1 quantizes with scale 1, and after "
      "each step its amax enters the history and the scale is updated. One row per step: its amax, the "
      "scale it quantized with, amax x scale, whether that saturated, the amax the update chose and the "
      "next scale.");
  simulate->add_option("--recipe", s->recipe, "delayed (required)")->type_name("R");
  simulate->add_option("--format,-f", s->format, "e4m3 or e5m2 (required): the tensor's FP8 format")
      ->type_name("FMT");
  simulate
      ->add_option("--history", s->history,
                   "amax_history_len, the steps the history remembers, 1 to " +
                       std::to_string(mpt::fp8::kMaxAmaxHistoryLen))
      ->default_str("1024")
      ->type_name("N");
  simulate
      ->add_option("--algo", s->algo,
                   "amax_compute_algo: max (the largest amax in the history) or most_recent (the step's own)")
      ->default_str("max")
      ->type_name("A");
  simulate
      ->add_option("--margin", s->margin,
                   "scale = max / amax / 2^M, 0 to " + std::to_string(mpt::fp8::kMaxMargin))
      ->default_str("0")
      ->type_name("M");
  simulate->add_flag(
      "--json", s->json,
      "the same as JSON: {\"format\", \"recipe\", \"amax_history_len\", \"amax_compute_algo\", "
      "\"margin\", \"amax\": [...], \"scales\": [the scale each step quantized with], "
      "\"saturated\": [...], \"update_amax\": [...], \"next_scale\"}; inf as null");
  handlers.on(simulate, [s] { return cmd_fp8_simulate(*s); });
}

// Chapter 7's only family: after Chapter 6's in `mpt --help`.
const mpt::cli::Registration fp8_registered{{7, 1}, "fp8", add_fp8_commands};

}  // namespace
