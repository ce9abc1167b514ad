// All chapters — the `mpt` program. Chapter 01 begins it (formats, explain,
// round, range, pitfalls, pitfall, tour); later chapters add their own
// subcommands.
// Depends on: the mpt library (format, rounding, explain, range_report,
// pitfall), mpt_chapters (the filled registry), CLI11, nlohmann_json;
// Chapter 02's `scaler simulate` uses scaler_sim (and grad_scaler).
//
// Conventions: every number printed comes from the library;
// bad input gets exactly one line on stderr naming what was wrong and the
// valid choices, and exit code 2; nothing is half-written (all input is read
// and checked before the first line of output, files are renamed into place).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "mpt/formats/explain.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/core/pitfall.hpp"
#include "mpt/formats/range_report.hpp"
#include "mpt/formats/rounding.hpp"
#include "mpt/amp/scaler_sim.hpp"

namespace {

using Json = nlohmann::ordered_json;  // keeps outcomes in their display order

/// Bad input: becomes "mpt: <message>" on stderr and exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr const char* kNumberHint = "use decimal (1.5e-3) or hex-float (0x1.8p-10)";

// ---------------------------------------------------------------------------
// Input.

const mpt::Format& format_or_usage_error(const std::string& name) {
  if (const mpt::Format* f = mpt::find_format(name)) return *f;
  throw UsageError("unknown format '" + name + "'; valid formats: " + mpt::format_names());
}

// strtod/strtof accept decimal, hex-float, inf and nan; the whole token must
// be consumed. Out-of-range values are not errors: they round (to ±inf or
// toward zero) like any other value, which is the point of this program.
template <typename T>
bool parse_number(const std::string& token, T& out) {
  if (token.empty()) return false;
  const char* begin = token.c_str();
  char* end = nullptr;
  if constexpr (std::is_same_v<T, float>)
    out = std::strtof(begin, &end);
  else
    out = std::strtod(begin, &end);
  return end == begin + token.size();
}

// Every number on stdin, as fp32 values: `round` and `range` work on fp32
// tensors, exactly as the library's round_array does.
std::vector<float> read_all_floats(std::istream& in) {
  std::vector<float> values;
  std::string token;
  while (in >> token) {
    float v = 0;
    if (!parse_number(token, v))
      throw UsageError("cannot parse '" + token + "' (input " + std::to_string(values.size() + 1) +
                       ") as a number; " + kNumberHint);
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

// ---------------------------------------------------------------------------
// Tables.

std::string joined(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

/// Aligned columns, two spaces apart. `align` has one letter per column:
/// 'l' (text), 'r' (numbers) or 'c' (marks); columns beyond it are 'r'.
std::string table(const std::vector<std::vector<std::string>>& rows, const std::string& align) {
  std::vector<std::size_t> width;
  // Column widths count UTF-8 code points, so ✓ and ± do not skew the table.
  auto length = [](const std::string& s) {
    std::size_t n = 0;
    for (unsigned char c : s) n += (c & 0xc0) != 0x80;
    return n;
  };
  for (const auto& r : rows)
    for (std::size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], length(r[i]));
    }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t i = 0; i < r.size(); ++i) {
      const std::string pad(width[i] - length(r[i]), ' ');
      if (i) line += "  ";
      const char a = i < align.size() ? align[i] : 'r';
      if (a == 'l') {
        line += r[i] + pad;
      } else if (a == 'c') {
        const std::size_t half = pad.size() / 2;
        line += std::string(half, ' ') + r[i] + std::string(pad.size() - half, ' ');
      } else {
        line += pad + r[i];
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string power_with_decimal(double x) {
  const std::string p = mpt::power_of_two_or_decimal(x);
  // Eight digits rather than the shortest repr: 2^-149 reads back from
  // "1e-45", which is true but tells a reader nothing.
  char d[32];
  std::snprintf(d, sizeof d, "%.8g", x);
  return p == d ? p : p + " (" + d + ")";
}

// An outcome value for people: integers in full, the rest to 7 digits.
std::string outcome_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.7g", v);
  return buf;
}

// ---------------------------------------------------------------------------
// Subcommands.

int cmd_formats() {
  std::vector<std::vector<std::string>> rows = {
      {"format", "p", "exp bits", "emin", "emax", "max", "min normal", "min subnormal", "epsilon",
       "unit roundoff", "finite values", "inf", "bytes"}};
  for (const mpt::Format& f : mpt::all_formats()) {
    const mpt::Limits l = mpt::limits_of(f.spec);
    rows.push_back({std::string(f.name), std::to_string(l.precision),
                    std::to_string(f.spec.exponent_bits), std::to_string(l.emin),
                    std::to_string(l.emax), mpt::shortest_decimal(static_cast<float>(l.max)),
                    power_with_decimal(l.min_normal), power_with_decimal(l.min_subnormal),
                    mpt::power_of_two_or_decimal(l.epsilon),
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
  if (!parse_number(value_text, x))
    throw UsageError("cannot parse '" + value_text + "' as a number; " + kNumberHint);
  if (!format_name.empty()) {
    std::cout << mpt::render_text(mpt::explain(x, format_or_usage_error(format_name)));
    return 0;
  }
  // Every format side by side, one row each.
  std::cout << mpt::shortest_decimal(x) << " = " << mpt::exact_decimal(x) << " (exactly, as a double)\n\n";
  std::vector<std::vector<std::string>> rows = {{"format", "stored", "bits (sign exponent mantissa)",
                                                 "code", "outcome", "rel. error", "ulp",
                                                 "next below", "next above"}};
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
  std::uint64_t seed = 0;
  bool saturate = false;
  std::string overflow;
  bool flush = false;
};

int cmd_round(const RoundArgs& a) {
  const mpt::Format& f = format_or_usage_error(a.format);
  mpt::RoundingOptions o;
  try {
    o.mode = mpt::rounding_mode_named(a.mode);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  o.seed = a.seed;
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

// Write `text` to `path` atomically: a reader sees the old file or the new
// one, never half of it.
void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream os(tmp, std::ios::binary | std::ios::trunc);
    if (!os) throw UsageError("cannot write '" + tmp + "': " + std::strerror(errno));
    os << text;
    os.flush();
    if (!os) {
      std::remove(tmp.c_str());
      throw UsageError("cannot write '" + tmp + "': " + std::strerror(errno));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw UsageError("cannot rename '" + tmp + "' to '" + path + "': " + why);
  }
}

int cmd_range(const std::string& format_name, const std::string& svg_path) {
  const mpt::Format& f = format_or_usage_error(format_name);
  const std::vector<float> in = read_all_floats(std::cin);
  const mpt::RangeReport r = mpt::range_report(in.data(), in.size(), f);
  if (!svg_path.empty()) write_atomically(svg_path, mpt::render_svg(r));
  std::cout << mpt::render_text(r);
  if (!svg_path.empty()) std::cout << "\nhistogram written to " << svg_path << "\n";
  return 0;
}

/// The registered pitfalls of one chapter, or all of them for chapter 0.
/// A chapter without pitfalls is a usage error naming the chapters that have some.
std::vector<const mpt::Pitfall*> pitfalls_of_chapter(int chapter) {
  std::vector<const mpt::Pitfall*> out;
  std::vector<int> chapters;
  for (const mpt::Pitfall& p : mpt::pitfall_registry().all()) {
    if (chapters.empty() || chapters.back() != p.chapter) chapters.push_back(p.chapter);
    if (chapter == 0 || p.chapter == chapter) out.push_back(&p);
  }
  if (out.empty()) {
    std::string valid;
    for (int c : chapters) valid += (valid.empty() ? "" : ", ") + std::to_string(c);
    throw UsageError("--chapter " + std::to_string(chapter) +
                     ": no pitfalls registered for that chapter; chapters with pitfalls: " + valid);
  }
  return out;
}

int cmd_pitfalls(int chapter) {
  std::vector<std::vector<std::string>> rows = {{"id", "chapter", "title"}};
  for (const mpt::Pitfall* p : pitfalls_of_chapter(chapter))
    rows.push_back({p->id, std::to_string(p->chapter), p->title});
  std::cout << table(rows, "lrl");
  std::cout << "\nrun one: mpt pitfall ID    run all: mpt tour\n";
  return 0;
}

const mpt::Pitfall& pitfall_or_usage_error(const std::string& id) {
  const mpt::Registry& reg = mpt::pitfall_registry();
  if (const mpt::Pitfall* p = reg.find(id)) return *p;
  throw UsageError("unknown pitfall '" + id + "'; valid ids: " + reg.ids());
}

// Outcome names of both runs, broken's order first.
std::vector<std::string> outcome_names(const mpt::Verdict& v) {
  std::vector<std::string> names;
  for (const auto* run : {&v.broken, &v.fixed})
    for (const mpt::Outcome& o : run->outcomes)
      if (std::find(names.begin(), names.end(), o.name) == names.end()) names.push_back(o.name);
  return names;
}

const mpt::Outcome* find_outcome(const mpt::RunResult& r, const std::string& name) {
  for (const mpt::Outcome& o : r.outcomes)
    if (o.name == name) return &o;
  return nullptr;
}

// JSON cannot hold NaN or inf: nlohmann writes them as null (documented in --help).
Json run_json(const mpt::RunResult& r) {
  Json outcomes = Json::object();
  for (const mpt::Outcome& o : r.outcomes) outcomes[o.name] = o.value;
  Json what = Json::object();
  for (const mpt::Outcome& o : r.outcomes) what[o.name] = o.what;
  Json j = {{"setup", r.setup}, {"outcomes", outcomes}, {"what", what}};
  if (!r.explanation.empty()) j["explanation"] = r.explanation;
  return j;
}

Json checks_json(const std::vector<std::pair<std::string, bool>>& checks) {
  Json a = Json::array();
  for (const auto& c : checks) a.push_back({{"claim", c.first}, {"held", c.second}});
  return a;
}

Json verdict_json(const mpt::Verdict& v) {
  const mpt::Pitfall& p = *v.pitfall;
  return {{"id", p.id},
          {"chapter", p.chapter},
          {"title", p.title},
          {"mechanism", p.mechanism},
          {"broken", run_json(v.broken)},
          {"fixed", run_json(v.fixed)},
          {"symptom", checks_json(v.symptom_checks)},
          {"cure", checks_json(v.cure_checks)},
          {"symptom_shown", v.symptom_shown()},
          {"fix_works", v.fix_works()},
          {"reproduced", v.reproduced()}};
}

std::string verdict_text(const mpt::Verdict& v) {
  const mpt::Pitfall& p = *v.pitfall;
  std::ostringstream o;
  o << p.id << " (chapter " << p.chapter << "): " << p.title << "\n";
  o << "mechanism: " << p.mechanism << "\n\n";
  o << "broken: " << v.broken.setup << "\n";
  o << "fixed:  " << v.fixed.setup << "\n\n";
  std::vector<std::vector<std::string>> rows = {{"outcome", "broken", "fixed", "what"}};
  for (const std::string& name : outcome_names(v)) {
    const mpt::Outcome* b = find_outcome(v.broken, name);
    const mpt::Outcome* f = find_outcome(v.fixed, name);
    rows.push_back({name, b ? outcome_text(b->value) : "-", f ? outcome_text(f->value) : "-",
                    b ? b->what : f->what});
  }
  o << table(rows, "lrrl");
  if (!v.broken.explanation.empty()) o << "\nwhy (broken): " << v.broken.explanation << "\n";
  if (!v.fixed.explanation.empty()) o << "why (fixed):  " << v.fixed.explanation << "\n";
  auto checks = [&](const char* heading, const std::vector<std::pair<std::string, bool>>& cs) {
    o << "\n" << heading << "\n";
    for (const auto& c : cs) o << "  " << (c.second ? "✓ " : "✗ ") << c.first << "\n";
  };
  checks("symptom (the broken run must show it):", v.symptom_checks);
  checks("cure (the fixed run must show it):", v.cure_checks);
  std::vector<std::string> failures;
  if (!v.symptom_shown()) failures.push_back("the symptom did not show");
  if (!v.fix_works()) failures.push_back("the fix did not work");
  o << "\nverdict: "
    << (failures.empty() ? "reproduced: the broken run shows the symptom and the fix works"
                         : "NOT reproduced: " + joined(failures))
    << "\n";
  return o.str();
}

int cmd_pitfall(const std::string& id, bool json) {
  const mpt::Pitfall& p = pitfall_or_usage_error(id);
  const mpt::Verdict v = mpt::run_pitfall(p);
  if (json)
    std::cout << verdict_json(v).dump(2) << "\n";
  else
    std::cout << verdict_text(v);
  return v.reproduced() ? 0 : 1;
}

int cmd_tour(bool json, int chapter) {
  const std::vector<const mpt::Pitfall*> all = pitfalls_of_chapter(chapter);
  std::vector<mpt::Verdict> verdicts;
  for (std::size_t i = 0; i < all.size(); ++i) {
    std::cerr << "[" << i + 1 << "/" << all.size() << "] " << all[i]->id << " ... " << std::flush;
    const auto t0 = std::chrono::steady_clock::now();
    verdicts.push_back(mpt::run_pitfall(*all[i]));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.2f s", s);
    std::cerr << (verdicts.back().reproduced() ? "reproduced" : "NOT REPRODUCED") << " (" << secs
              << ")" << std::endl;
  }
  bool all_ok = true;
  for (const auto& v : verdicts) all_ok = all_ok && v.reproduced();
  if (json) {
    Json list = Json::array();
    for (const auto& v : verdicts) list.push_back(verdict_json(v));
    std::cout << Json{{"pitfalls", list}, {"all_reproduced", all_ok}}.dump(2) << "\n";
    return all_ok ? 0 : 1;
  }
  std::vector<std::vector<std::string>> rows = {{"id", "chapter", "symptom shown", "fix works", "title"}};
  std::size_t failed = 0;
  for (const auto& v : verdicts) {
    failed += !v.reproduced();
    rows.push_back({v.pitfall->id, std::to_string(v.pitfall->chapter),
                    v.symptom_shown() ? "✓" : "✗", v.fix_works() ? "✓" : "✗", v.pitfall->title});
  }
  std::cout << table(rows, "lrccl") << "\n";
  if (failed == 0)
    std::cout << "all " << verdicts.size() << " pitfalls reproduced, and every fix works\n";
  else
    std::cout << failed << " of " << verdicts.size()
              << " pitfalls did not reproduce; run 'mpt pitfall ID' for details\n";
  return all_ok ? 0 : 1;
}

// ---------------------------------------------------------------------------
// Chapter 02 — `mpt scaler simulate`: the sawtooth of a dynamic loss scale.
// Every option is taken as text and parsed here, so that each bad value gets
// a message naming the option, the value and what it may be.

struct ScalerArgs {
  std::string init_scale, growth_factor, backoff_factor, growth_interval;
  std::string steps, overflow_at, overflow_prob, seed, plot;
  bool json = false;
};

constexpr const char* kOverflowChoice =
    "list the overflow steps (--overflow-at 3,7,8) or draw them (--overflow-prob P --seed N)";

// A whole number in [lo, hi], all of the token.
bool parse_integer(const std::string& token, long long lo, long long hi, long long& out) {
  if (token.empty() || std::isspace(static_cast<unsigned char>(token[0]))) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(token.c_str(), &end, 10);
  if (errno == ERANGE || end != token.c_str() + token.size() || v < lo || v > hi) return false;
  out = v;
  return true;
}

float scaler_float_option(const std::string& name, const std::string& text) {
  float v = 0;
  if (!parse_number(text, v))
    throw UsageError(name + ": cannot parse '" + text + "' as a number; " + kNumberHint);
  return v;
}

/// The factors are doubles, as PyTorch's (Python floats) are: parsed with strtod.
double scaler_double_option(const std::string& name, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) ||
      end != text.c_str() + text.size())
    throw UsageError(name + ": cannot parse '" + text + "' as a number; " + kNumberHint);
  return v;
}

mpt::ScalerSimulationSpec scaler_spec(const ScalerArgs& a) {
  mpt::ScalerSimulationSpec spec;
  mpt::GradScaler::Options& o = spec.options;
  if (!a.init_scale.empty()) o.init_scale = scaler_float_option("--init-scale", a.init_scale);
  if (!a.growth_factor.empty()) o.growth_factor = scaler_double_option("--growth-factor", a.growth_factor);
  if (!a.backoff_factor.empty())
    o.backoff_factor = scaler_double_option("--backoff-factor", a.backoff_factor);
  long long v = 0;
  if (!a.growth_interval.empty()) {
    if (!parse_integer(a.growth_interval, 1, std::numeric_limits<std::int32_t>::max(), v))
      throw UsageError("--growth-interval: '" + a.growth_interval +
                       "' is not a whole number of steps from 1 to 2147483647");
    o.growth_interval = static_cast<std::int32_t>(v);
  }
  try {
    mpt::GradScaler check(o);  // the scaler's own rules and messages, before anything else
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }

  const std::string steps_range = "from 1 to " + std::to_string(mpt::kMaxScalerSimulationSteps);
  if (a.steps.empty())
    throw UsageError("missing --steps; give the number of steps to simulate, " + steps_range +
                     " (e.g. --steps 20)");
  if (!parse_integer(a.steps, 1, mpt::kMaxScalerSimulationSteps, v))
    throw UsageError("--steps: '" + a.steps + "' is not a whole number of steps " + steps_range);
  spec.steps = v;

  if (!a.overflow_at.empty() && !a.overflow_prob.empty())
    throw UsageError(std::string("--overflow-at and --overflow-prob cannot be combined; ") +
                     kOverflowChoice);
  if (!a.seed.empty() && a.overflow_prob.empty())
    throw UsageError("--seed applies only to --overflow-prob; give --overflow-prob P with it, or "
                     "drop --seed");
  if (!a.overflow_at.empty()) {
    std::string item;
    std::istringstream items(a.overflow_at);
    while (std::getline(items, item, ',')) {
      if (!parse_integer(item, 1, std::numeric_limits<long long>::max(), v))
        throw UsageError("--overflow-at: '" + item +
                         "' is not a step number; give 1-based steps separated by commas, e.g. "
                         "--overflow-at 3,7,8");
      if (v > spec.steps)
        throw UsageError("--overflow-at: step " + item + " is past the end of the run; valid steps: 1 to " +
                         std::to_string(spec.steps) + " (--steps " + a.steps + ")");
      spec.overflow_at.push_back(v);
    }
    if (a.overflow_at.back() == ',')
      throw UsageError("--overflow-at: '" + a.overflow_at +
                       "' ends with a comma; give 1-based steps separated by commas, e.g. 3,7,8");
  }
  if (!a.overflow_prob.empty()) {
    double p = 0;
    if (!parse_number(a.overflow_prob, p) || !(p >= 0.0 && p <= 1.0))
      throw UsageError("--overflow-prob: '" + a.overflow_prob +
                       "' is not a probability; give a number from 0 to 1");
    spec.overflow_probability = p;
    if (!a.seed.empty()) {
      errno = 0;
      char* end = nullptr;
      const unsigned long long seed = std::strtoull(a.seed.c_str(), &end, 10);
      if (a.seed.empty() || !std::isdigit(static_cast<unsigned char>(a.seed[0])) || errno == ERANGE ||
          end != a.seed.c_str() + a.seed.size())
        throw UsageError("--seed: '" + a.seed + "' is not an unsigned integer (0 to 18446744073709551615)");
      spec.seed = seed;
    }
  }
  return spec;
}

int cmd_scaler_simulate(const ScalerArgs& a) {
  const mpt::ScalerSimulationSpec spec = scaler_spec(a);  // all input checked first
  mpt::ScalerSimulation sim;
  try {
    sim = mpt::simulate_scaler(spec);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (!a.plot.empty()) {
    try {
      mpt::write_plot_svg(sim, a.plot);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());  // an unwritable path is bad input; a missing gnuplot is not
    }
  }
  if (a.json) {
    std::cout << mpt::render_json(sim);
  } else {
    std::cout << mpt::render_text(sim);
    if (!a.plot.empty()) std::cout << "plot written to " << a.plot << "\n";
  }
  return 0;
}

// ---------------------------------------------------------------------------
// Command-line errors: CLI11's messages, reduced to one line with the choices.

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string subcommand_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(s->get_name());
  return joined(names);
}

std::string option_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options()) {
    const std::string n = o->get_name();  // the long name, or the positional's
    if (n != "--help" && !n.empty()) names.push_back(n);
  }
  return joined(names);
}

// What a missing or malformed item may be.
std::string choices_for(const std::string& message) {
  if (message.find("--format") != std::string::npos) return "valid formats: " + mpt::format_names();
  if (message.find("--mode") != std::string::npos) return "valid modes: rne, rtz, sr";
  if (message.find("--overflow") != std::string::npos) return "valid modes: inf, sat";
  if (message.find("--seed") != std::string::npos) return "the seed is an unsigned integer";
  if (message.find("VALUE") != std::string::npos)
    return std::string("give a number: ") + kNumberHint;
  if (message.find("ID") != std::string::npos) return "valid ids: " + mpt::pitfall_registry().ids();
  return "";
}

int report_parse_error(const CLI::App& app, const CLI::ParseError& e) {
  // The innermost subcommand being parsed (`mpt scaler simulate` nests), if
  // the parser got that far.
  const CLI::App* sub = nullptr;
  std::string where = "mpt";
  for (const CLI::App* level = &app; !level->get_subcommands().empty();) {
    level = sub = level->get_subcommands().back();
    where += " " + sub->get_name();
  }
  // A subcommand that only groups others (`mpt scaler`) is reported like the
  // top level: its choices are subcommands, not options.
  const bool groups = sub && !sub->get_subcommands([](const CLI::App*) { return true; }).empty();
  std::string message = one_line(e.what());
  std::string choices;
  // Arguments nobody claimed explain most errors better than what CLI11
  // noticed first ("--format is required" for `mpt round --fromat fp16`).
  std::vector<std::string> stray = sub ? sub->remaining() : app.remaining();
  stray.erase(std::remove(stray.begin(), stray.end(), "--"), stray.end());
  auto valid_options = [&where](const CLI::App& s) {
    const std::string names = option_names(s);
    return names.empty() ? "'" + where + "' takes no arguments" : "valid options: " + names;
  };
  if (!stray.empty()) {
    const std::string& first = stray.front();
    const bool looks_like_option = first.size() > 1 && first[0] == '-' &&
                                   !std::isdigit(static_cast<unsigned char>(first[1])) &&
                                   first[1] != '.';
    if (sub && !groups) {
      message = std::string(looks_like_option ? "unknown option '" : "unexpected argument '") +
                first + "'";
      choices = valid_options(*sub);
    } else {
      message = std::string(looks_like_option ? "unknown option '" : "unknown subcommand '") +
                first + "'";
      choices = "valid subcommands: " + subcommand_names(sub ? *sub : app);
    }
  } else if (dynamic_cast<const CLI::RequiredError*>(&e) && (!sub || groups)) {
    message = "missing subcommand";
    choices = "valid subcommands: " + subcommand_names(sub ? *sub : app);
  } else {
    choices = choices_for(message);
    if (choices.empty() && sub) choices = valid_options(*sub);
  }
  std::cerr << where << ": " << message << (choices.empty() ? "" : "; " + choices) << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mpt: mixed precision training, chapter by chapter. Formats, rounding and the "
               "pitfall registry from the command line.",
               "mpt"};
  app.require_subcommand(1);
  app.footer("Bad input exits with status 2 and one line on stderr.");

  // formats
  auto* formats = app.add_subcommand("formats", "The limits table of every format, derived from its descriptor");

  // explain
  std::string explain_value, explain_format;
  auto* explain = app.add_subcommand(
      "explain",
      "Store one number in a format and show every bit: fields, exact stored value, rounding error, "
      "ulp and neighbours. VALUE is read as a double (decimal or hex-float) and rounded once (RNE, "
      "the format's default overflow: FP8 saturates). Without --format: one row per format, side by side.");
  explain->add_option("VALUE", explain_value, "the number: decimal (0.1, -1e-8) or hex-float (0x1.ffcp+15)")
      ->required();
  explain->add_option("--format,-f", explain_format,
                      "one format to explain in full: " + mpt::format_names() + " (default: all)");

  // round
  RoundArgs round_args;
  auto* round = app.add_subcommand(
      "round",
      "Round the numbers on stdin (whitespace separated, decimal or hex-float) to a format. Each is "
      "read as an fp32 value, as in a tensor; one line per input: the rounded value as the shortest "
      "decimal that reads back as the same float, then the format's bit pattern in hex "
      "(65504 0x7bff). Element i (from 0) draws stochastic-rounding bits (seed, i).");
  round->add_option("--format,-f", round_args.format, "target format: " + mpt::format_names())->required();
  round->add_option("--mode,-m", round_args.mode, "rne (nearest, ties to even), rtz (toward zero), sr (stochastic)")
      ->capture_default_str();
  round->add_option("--seed", round_args.seed, "seed of stochastic rounding")->capture_default_str();
  auto* saturate = round->add_flag("--saturate", round_args.saturate, "same as --overflow sat");
  round->add_option("--overflow", round_args.overflow,
                    "inf (IEEE) or sat (clamp to ±max); default: the format's convention (" +
                        overflow_conventions() + ")")
      ->excludes(saturate);
  round->add_flag("--flush-subnormals", round_args.flush, "results below min normal become ±0");

  // range
  std::string range_format, range_svg;
  auto* range = app.add_subcommand(
      "range",
      "Range report of the numbers on stdin (read as fp32) against a format: how many overflow, "
      "become subnormal, flush to zero, are exact or rounded, and a log2 histogram.");
  range->add_option("--format,-f", range_format, "format: " + mpt::format_names())->required();
  range->add_option("--svg", range_svg, "also write the histogram as an SVG picture to this file");

  // pitfalls, pitfall, tour
  auto* pitfalls = app.add_subcommand("pitfalls", "List the registered pitfalls: id, chapter, title");
  int pitfalls_chapter = 0;
  pitfalls->add_option("--chapter", pitfalls_chapter, "only this chapter's pitfalls (default: all)");
  std::string pitfall_id;
  bool pitfall_json = false;
  auto* pitfall = app.add_subcommand(
      "pitfall",
      "Run one pitfall: its broken and its fixed run side by side, and every symptom and cure check. "
      "Exit status 0 when reproduced (symptom shown and fix works), 1 when not.");
  pitfall->add_option("ID", pitfall_id, "pitfall id (see 'mpt pitfalls')")->required();
  pitfall->add_flag("--json", pitfall_json,
                    "machine-readable output; outcome values that are NaN or inf are written as null");
  bool tour_json = false;
  auto* tour = app.add_subcommand(
      "tour",
      "Run every registered pitfall (progress on stderr) and print a summary table. Exit status 1 "
      "if any pitfall failed to reproduce.");
  int tour_chapter = 0;
  tour->add_option("--chapter", tour_chapter, "only this chapter's pitfalls (default: all)");
  tour->add_flag("--json", tour_json,
                 "machine-readable output: {\"pitfalls\": [...], \"all_reproduced\": bool}; NaN/inf "
                 "outcome values are written as null");

  // scaler simulate (Chapter 02)
  auto* scaler = app.add_subcommand("scaler", "Chapter 2's GradScaler from the command line")
                     ->require_subcommand(1);
  ScalerArgs scaler_args;
  const mpt::GradScaler::Options scaler_defaults;
  auto* simulate = scaler->add_subcommand(
      "simulate",
      "Run a real GradScaler (PyTorch's semantics) for --steps iterations in which the listed or "
      "drawn steps overflow (their gradient holds an inf), and print one row per step: step, "
      "overflow (0/1), the scale after update() (the shortest decimal that reads back to the same "
      "FP32 value), the growth tracker, and skipped (0/1: optimizer.step() was not called).");
  simulate->add_option("--init-scale", scaler_args.init_scale, "the first scale")
      ->default_str(mpt::shortest_decimal(scaler_defaults.init_scale))
      ->type_name("FLOAT");
  simulate->add_option("--growth-factor", scaler_args.growth_factor,
                       "scale *= this after growth_interval clean steps (> 1)")
      ->default_str(mpt::shortest_decimal(scaler_defaults.growth_factor))
      ->type_name("FLOAT");
  simulate->add_option("--backoff-factor", scaler_args.backoff_factor,
                       "scale *= this after an overflow (between 0 and 1)")
      ->default_str(mpt::shortest_decimal(scaler_defaults.backoff_factor))
      ->type_name("FLOAT");
  simulate->add_option("--growth-interval", scaler_args.growth_interval,
                       "clean steps in a row before the scale grows (>= 1)")
      ->default_str(std::to_string(scaler_defaults.growth_interval))
      ->type_name("INT");
  simulate->add_option("--steps", scaler_args.steps,
                       "iterations to simulate, 1 to " + std::to_string(mpt::kMaxScalerSimulationSteps) +
                           " (required)")
      ->type_name("K");
  simulate->add_option("--overflow-at", scaler_args.overflow_at,
                       "overflowing steps, 1-based, separated by commas: 3,7,8")
      ->type_name("LIST");
  simulate->add_option("--overflow-prob", scaler_args.overflow_prob,
                       "instead: each step overflows with this probability (0 to 1)")
      ->type_name("P");
  simulate->add_option("--seed", scaler_args.seed, "seed of the --overflow-prob draw")
      ->default_str("0")
      ->type_name("N");
  simulate->add_flag("--json", scaler_args.json,
                     "the same rows as JSON: {\"options\", \"steps\", \"overflow_at\" (or "
                     "\"overflow_probability\" and \"seed\"), \"rows\": [{\"step\", \"overflow\", "
                     "\"scale\", \"growth_tracker\", \"skipped\"}], \"skipped_steps\", \"final_scale\"}");
  simulate->add_option("--plot", scaler_args.plot,
                       "also draw the scale against the step (log2 axis), overflows marked, as an SVG "
                       "at this path, up to " + std::to_string(mpt::kMaxPlottedSteps) +
                           " steps (drawn by the library: same bytes on every machine)")
      ->type_name("FILE.svg");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help: the help text, status 0
    return report_parse_error(app, e);
  }

  try {
    if (*formats) return cmd_formats();
    if (*explain) return cmd_explain(explain_value, explain_format);
    if (*round) return cmd_round(round_args);
    if (*range) return cmd_range(range_format, range_svg);
    if (*pitfalls) return cmd_pitfalls(pitfalls_chapter);
    if (*pitfall) return cmd_pitfall(pitfall_id, pitfall_json);
    if (*tour) return cmd_tour(tour_json, tour_chapter);
    if (*simulate) return cmd_scaler_simulate(scaler_args);
  } catch (const UsageError& e) {
    std::cerr << "mpt: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "mpt: error: " << one_line(e.what()) << "\n";
    return 1;
  }
  return 2;  // unreachable: require_subcommand(1)
}
