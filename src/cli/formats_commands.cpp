// Chapter 01 — the number tools of the `mpt` program: formats, explain, round, range.
// Depends on: command.hpp (registry), cli_support.hpp, CLI11, and the mpt
// library's format, rounding, explain and range_report.
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_support.hpp"
#include "command.hpp"
#include "mpt/formats/explain.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/formats/range_report.hpp"
#include "mpt/formats/rounding.hpp"

namespace {

using mpt::cli::table;
using mpt::cli::UsageError;

// ---------------------------------------------------------------------------
// Input.

const mpt::Format& format_or_usage_error(const std::string& name) {
  if (const mpt::Format* f = mpt::find_format(name)) return *f;
  throw UsageError("unknown format '" + name + "'; valid formats: " + mpt::format_names());
}

// Every number on stdin, as fp32 values: `round` and `range` work on fp32
// tensors, exactly as the library's round_array does.
std::vector<float> read_all_floats(std::istream& in) {
  std::vector<float> values;
  std::string token;
  while (in >> token) {
    float v = 0;
    if (!mpt::cli::parse_number(token, v))
      throw UsageError(mpt::cli::not_a_number(token, "(input " + std::to_string(values.size() + 1) + ")"));
    values.push_back(v);
  }
  return values;
}

std::string hex_code(std::uint32_t code, const mpt::FormatSpec& s) {
  const int bits = 1 + s.exponent_bits + s.mantissa_bits;
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", (bits + 3) / 4, static_cast<unsigned>(code));
  return buf;
}

// "inf for fp32, tf32, bf16, fp16; sat for e4m3, e5m2", read from the table.
std::string overflow_conventions() {
  std::string inf, sat;
  for (const mpt::Format& f : mpt::all_formats()) {
    std::string& list = f.default_overflow == mpt::OverflowMode::infinity ? inf : sat;
    list += (list.empty() ? "" : ", ") + std::string(f.name);
  }
  return "inf for " + inf + "; sat for " + sat;
}

std::string power_with_decimal(double x) {
  const std::string p = mpt::power_of_two_or_decimal(x);
  // Eight digits rather than the shortest repr: 2^-149 reads back from
  // "1e-45", which is true but tells a reader nothing.
  char d[32];
  std::snprintf(d, sizeof d, "%.8g", x);
  return p == d ? p : p + " (" + d + ")";
}

// ---------------------------------------------------------------------------
// The subcommands.

int cmd_formats() {
  std::vector<std::vector<std::string>> rows = {{"format", "p", "exp bits", "emin", "emax", "max",
                                                 "min normal", "min subnormal", "epsilon", "unit roundoff",
                                                 "finite values", "inf", "bytes"}};
  for (const mpt::Format& f : mpt::all_formats()) {
    const mpt::Limits l = mpt::limits_of(f.spec);
    rows.push_back({std::string(f.name), std::to_string(l.precision), std::to_string(f.spec.exponent_bits),
                    std::to_string(l.emin), std::to_string(l.emax),
                    mpt::shortest_decimal(static_cast<float>(l.max)), power_with_decimal(l.min_normal),
                    power_with_decimal(l.min_subnormal), mpt::power_of_two_or_decimal(l.epsilon),
                    mpt::power_of_two_or_decimal(l.unit_roundoff), std::to_string(l.finite_values),
                    l.has_inf ? "yes" : "no", std::to_string(l.storage_bytes)});
  }
  std::cout << table(rows, "l");
  std::cout << "\np = precision in bits (with the implicit leading 1); epsilon = 2^(1-p), the gap "
               "from 1 to the next value;\nunit roundoff u = 2^-p, the largest relative error of "
               "round-to-nearest; finite values count ±0 once.\n";
  for (const mpt::Format& f : mpt::all_formats())
    std::cout << "  " << f.name << ": " << f.description << "\n";
  return 0;
}

int cmd_explain(const std::string& value_text, const std::string& format_name) {
  double x = 0;
  if (!mpt::cli::parse_number(value_text, x)) throw UsageError(mpt::cli::not_a_number(value_text));
  if (!format_name.empty()) {
    std::cout << mpt::render_text(mpt::explain(x, format_or_usage_error(format_name)));
    return 0;
  }
  // Every format side by side, one row each.
  std::cout << mpt::shortest_decimal(x) << " = " << mpt::exact_decimal(x) << " (exactly, as a double)\n\n";
  std::vector<std::vector<std::string>> rows = {{"format", "stored", "bits (sign exponent mantissa)", "code",
                                                 "outcome", "rel. error", "ulp", "next below", "next above"}};
  auto neighbour = [](const std::optional<float>& v) {
    return v ? mpt::shortest_decimal(*v) : std::string("none");
  };
  for (const mpt::Format& f : mpt::all_formats()) {
    const mpt::Explanation e = mpt::explain(x, f);
    char rel[32];
    std::snprintf(rel, sizeof rel, "%.3g", e.rel_error);
    rows.push_back({std::string(f.name), e.stored_shortest,
                    e.sign_field + " " + e.exponent_field + " " + e.mantissa_field, e.code_hex,
                    mpt::range_class_name(e.outcome), rel,
                    std::isnan(e.ulp) ? std::string("-") : mpt::power_of_two_or_decimal(e.ulp),
                    neighbour(e.next_below), neighbour(e.next_above)});
  }
  std::cout << table(rows, "lllll");
  std::cout << "\nRNE, each format's default overflow convention (FP8 saturates); "
               "'mpt explain VALUE --format F' shows one format in full.\n";
  return 0;
}

struct RoundArgs {
  std::string format;
  std::string mode = "rne";
  std::string seed = "0";  // parsed by cmd_round: CLI11 takes -1 and 2^64 for a uint64_t
  bool saturate = false;
  std::string overflow;
  bool flush = false;
};

int cmd_round(const RoundArgs& a) {
  const mpt::Format& f = format_or_usage_error(a.format);
  mpt::RoundingOptions o;
  o.mode = mpt::cli::invalid_argument_is_usage_error([&] { return mpt::rounding_mode_named(a.mode); });
  errno = 0;
  char* end = nullptr;
  o.seed = std::strtoull(a.seed.c_str(), &end, 10);
  if (a.seed.empty() || !std::isdigit(static_cast<unsigned char>(a.seed[0])) || errno == ERANGE ||
      end != a.seed.c_str() + a.seed.size())
    throw UsageError("--seed: '" + a.seed + "' is not an unsigned integer (0 to 18446744073709551615)");
  if (a.saturate) o.overflow = mpt::OverflowMode::saturate;
  if (a.overflow == "inf") o.overflow = mpt::OverflowMode::infinity;
  else if (a.overflow == "sat") o.overflow = mpt::OverflowMode::saturate;
  else if (!a.overflow.empty())
    throw UsageError("unknown overflow mode '" + a.overflow + "'; valid modes: inf, sat");
  if (a.flush) o.subnormals = mpt::SubnormalMode::flush;

  const std::vector<float> in = read_all_floats(std::cin);  // all of it, before any output
  std::string out;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const float v = mpt::round_value(in[i], f, o, i);
    out += mpt::shortest_decimal(v) + " " + hex_code(mpt::encode_exact(v, f.spec), f.spec) + "\n";
  }
  std::cout << out;
  return 0;
}

int cmd_range(const std::string& format_name, const std::string& svg_path) {
  const mpt::Format& f = format_or_usage_error(format_name);
  const std::vector<float> in = read_all_floats(std::cin);
  const mpt::RangeReport r = mpt::range_report(in.data(), in.size(), f);
  if (!svg_path.empty()) mpt::cli::write_atomically(svg_path, mpt::render_svg(r));
  std::cout << mpt::render_text(r);
  if (!svg_path.empty()) std::cout << "\nhistogram written to " << svg_path << "\n";
  return 0;
}

// ---------------------------------------------------------------------------
// Their command lines.

void add_formats_commands(CLI::App& app, mpt::cli::Handlers& handlers) {
  // formats
  auto* formats =
      app.add_subcommand("formats", "The limits table of every format, derived from its descriptor");
  handlers.on(formats, [] { return cmd_formats(); });

  // explain
  struct ExplainArgs {
    std::string value, format;
  };
  auto e = std::make_shared<ExplainArgs>();
  auto* explain = app.add_subcommand(
      "explain",
      "Store one number in a format and show every bit: fields, exact stored value, rounding error, "
      "ulp and neighbours. VALUE is read as a double (decimal or hex-float) and rounded once (RNE, "
      "the format's default overflow: FP8 saturates). Without --format: one row per format, side by side.");
  explain->add_option("VALUE", e->value, "the number: decimal (0.1, -1e-8) or hex-float (0x1.ffcp+15)")
      ->required();
  explain
      ->add_option("--format,-f", e->format,
                   "one format to explain in full: " + mpt::format_names() + " (default: all)")
      ->check(mpt::cli::non_empty("a format name"));
  handlers.on(explain, [e] { return cmd_explain(e->value, e->format); });

  // round
  auto r = std::make_shared<RoundArgs>();
  auto* round = app.add_subcommand(
      "round",
      "Round the numbers on stdin (whitespace separated, decimal or hex-float) to a format. Each is "
      "read as an fp32 value, as in a tensor; one line per input: the rounded value as the shortest "
      "decimal that reads back as the same float, then the format's bit pattern in hex "
      "(65504 0x7bff). Element i (from 0) draws stochastic-rounding bits (seed, i).");
  round->add_option("--format,-f", r->format, "target format: " + mpt::format_names())->required();
  round->add_option("--mode,-m", r->mode, "rne (nearest, ties to even), rtz (toward zero), sr (stochastic)")
      ->capture_default_str();
  round->add_option("--seed", r->seed, "seed of stochastic rounding (0 to 18446744073709551615)")
      ->capture_default_str()
      ->type_name("UINT");
  auto* saturate = round->add_flag("--saturate", r->saturate, "same as --overflow sat");
  round
      ->add_option("--overflow", r->overflow,
                   "inf (IEEE) or sat (clamp to ±max); default: the format's convention (" +
                       overflow_conventions() + ")")
      ->excludes(saturate);
  round->add_flag("--flush-subnormals", r->flush, "results below min normal become ±0");
  handlers.on(round, [r] { return cmd_round(*r); });

  // range
  struct RangeArgs {
    std::string format, svg;
  };
  auto g = std::make_shared<RangeArgs>();
  auto* range = app.add_subcommand(
      "range",
      "Range report of the numbers on stdin (read as fp32) against a format: how many overflow, "
      "become subnormal, flush to zero, are exact or rounded, and a log2 histogram.");
  range->add_option("--format,-f", g->format, "format: " + mpt::format_names())->required();
  range->add_option("--svg", g->svg, "also write the histogram as an SVG picture to this file")
      ->check(mpt::cli::non_empty("a file name"));
  handlers.on(range, [g] { return cmd_range(g->format, g->svg); });
}

// Chapter 1, first family: listed first in `mpt --help`.
const mpt::cli::Registration formats_registered{{1, 1}, "formats", add_formats_commands};

}  // namespace
