// All chapters — what the command families share (see cli_support.hpp).
// Depends on: cli_support.hpp, CLI11, and the mpt library's atomic writes
// (io/atomic_file.hpp), format (format_names) and pitfall registry (ids),
// for the choices in error lines.
#include "cli_support.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "mpt/core/text.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/io/atomic_file.hpp"
#include "mpt/registry/pitfall.hpp"

namespace mpt::cli {

namespace {

constexpr const char* kNumberHint = "use decimal (1.5e-3) or hex-float (0x1.8p-10)";

}  // namespace

std::string not_a_number(const std::string& token, const std::string& which) {
  // Control bytes (a NUL on stdin, a line break in an argument) are shown as
  // \xHH: the message stays one line, and a NUL does not end it early. A
  // token of a million characters is quoted by its first 40 and its length.
  constexpr std::size_t kQuoted = 40;
  std::string shown;
  for (std::size_t i = 0; i < token.size() && i < kQuoted; ++i) {
    const auto byte = static_cast<unsigned char>(token[i]);
    if (byte >= 0x20 && byte != 0x7f) {
      shown += token[i];
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned>(byte));
      shown += hex;
    }
  }
  const std::string quoted = token.size() <= kQuoted
                                 ? "'" + shown + "'"
                                 : "'" + shown + "...' (" + std::to_string(token.size()) + " characters)";
  return "cannot parse " + quoted + (which.empty() ? "" : " " + which) + " as a number; " + kNumberHint;
}

bool parse_integer(const std::string& token, long long lo, long long hi, long long& out) {
  if (token.empty() || std::isspace(static_cast<unsigned char>(token[0]))) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(token.c_str(), &end, 10);
  if (errno == ERANGE || end != token.c_str() + token.size() || v < lo || v > hi) return false;
  out = v;
  return true;
}

long long whole_option(const std::string& name, const std::string& text, long long lo, long long hi) {
  long long v = 0;
  if (!parse_integer(text, lo, hi, v))
    throw UsageError(name + ": " + shown(text) + " is not a whole number from " + std::to_string(lo) +
                     " to " + std::to_string(hi));
  return v;
}

std::string joined(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

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

std::string outcome_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.7g", v);
  return buf;
}

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

void write_atomically(const std::string& path, const std::string& text) {
  try {
    mpt::write_file_atomically(path, text);
  } catch (const mpt::FileWriteError& e) {
    throw UsageError(e.what());
  }
}

void check_output_path(const std::string& option, const std::string& path) {
  try {
    (void)mpt::atomic_write_target(path);
  } catch (const mpt::FileWriteError& e) {
    throw UsageError(option + ": " + one_line(e.what()));
  }
}

// ---------------------------------------------------------------------------
// Command-line errors.

CLI::Validator non_empty(const std::string& what) {
  return CLI::Validator(
      [what](std::string& value) {
        return value.empty() ? "the value is empty; give " + what : std::string();
      },
      "", "non-empty");
}

namespace {

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

// The chapters that have pitfalls, in registry order: "1, 2, 3, 4".
std::string pitfall_chapters() {
  std::vector<std::string> chapters;
  for (const mpt::Pitfall& p : mpt::pitfall_registry().all()) {
    const std::string c = std::to_string(p.chapter);
    if (chapters.empty() || chapters.back() != c) chapters.push_back(c);
  }
  return joined(chapters);
}

// What a missing or malformed item may be. The message is matched whatever
// the subcommand (`where`, "mpt fp8 quantize"), so an option of a later
// family that shares a name (or a prefix) with one below gets that one's
// choices, unless it is told apart here by its subcommand.
std::string choices_for(const std::string& message, const std::string& where) {
  // Chapter 7's FP8 commands take the two FP8 formats only.
  if (message.find("--format") != std::string::npos && where.rfind("mpt fp8", 0) == 0)
    return "valid formats: e4m3, e5m2";
  if (message.find("--format") != std::string::npos) return "valid formats: " + mpt::format_names();
  if (message.find("--mode") != std::string::npos) return "valid modes: rne, rtz, sr";
  if (message.find("--overflow") != std::string::npos) return "valid modes: inf, sat";
  if (message.find("--seed") != std::string::npos) return "the seed is an unsigned integer";
  if (message.find("--chapter") != std::string::npos)
    return "give a chapter number (0: all); chapters with pitfalls: " + pitfall_chapters();
  if (message.find("VALUE") != std::string::npos) return std::string("give a number: ") + kNumberHint;
  if (message.find("ID") != std::string::npos) return "valid ids: " + mpt::pitfall_registry().ids();
  return "";
}

}  // namespace

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
                                   !std::isdigit(static_cast<unsigned char>(first[1])) && first[1] != '.';
    if (sub && !groups) {
      message = std::string(looks_like_option ? "unknown option '" : "unexpected argument '") + first + "'";
      choices = valid_options(*sub);
    } else {
      message = std::string(looks_like_option ? "unknown option '" : "unknown subcommand '") + first + "'";
      choices = "valid subcommands: " + subcommand_names(sub ? *sub : app);
    }
  } else if (dynamic_cast<const CLI::RequiredError*>(&e) && (!sub || groups)) {
    message = "missing subcommand";
    choices = "valid subcommands: " + subcommand_names(sub ? *sub : app);
  } else {
    choices = choices_for(message, where);
    if (choices.empty() && sub) choices = valid_options(*sub);
  }
  std::cerr << where << ": " << message << (choices.empty() ? "" : "; " + choices) << "\n";
  return 2;
}

}  // namespace mpt::cli
