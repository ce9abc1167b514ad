// All chapters — what every command family of the `mpt` program shares:
// the usage error, number parsing, the aligned table, atomic file writes,
// outcome values for people, and the one-line report of a parse error.
// Depends on: CLI11 (report_parse_error); its .cpp also on the mpt library's
// format and pitfall registry (the valid choices an error line names).
//
// Conventions: every number printed comes from the library;
// bad input gets exactly one line on stderr naming what was wrong and the
// valid choices, and exit code 2; nothing is half-written (all input is read
// and checked before the first line of output, files are renamed into place).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace mpt::cli {

/// Bad input: becomes "mpt: <message>" on stderr and exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Runs `f`; the library's std::invalid_argument (its message names the bad
/// value and the valid ones) becomes a UsageError with the same message.
template <typename F>
decltype(auto) invalid_argument_is_usage_error(F&& f) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

// ---------------------------------------------------------------------------
// Numbers in.

// strtod/strtof accept decimal, hex-float, inf and nan; the whole token must
// be consumed. Out-of-range values are not errors: they round (to ±inf or
// toward zero) like any other value, which is the point of this program.
template <typename T>
bool parse_number(const std::string& token, T& out) {
  if (token.empty()) return false;
  const char* begin = token.c_str();
  char* end = nullptr;
  if constexpr (std::is_same_v<T, float>) out = std::strtof(begin, &end);
  else out = std::strtod(begin, &end);
  return end == begin + token.size();
}

/// "cannot parse 'TOKEN' as a number; use decimal (...) or hex-float (...)",
/// the message for every number that does not parse; `which` ("(input 3)"),
/// when given, follows the token. Control bytes of the token (NUL, line
/// breaks) are written as \\xHH, so the message is always one whole line; a
/// token longer than 40 characters is quoted by its first 40 and its length.
std::string not_a_number(const std::string& token, const std::string& which = "");

/// A whole number in [lo, hi], all of the token.
bool parse_integer(const std::string& token, long long lo, long long hi, long long& out);

/// The value of option `name` (e.g. "--steps"): a whole number in [lo, hi],
/// or a UsageError "--steps: '0' is not a whole number from 1 to 100000"
/// (the token quoted by mpt::shown).
long long whole_option(const std::string& name, const std::string& text, long long lo, long long hi);

// ---------------------------------------------------------------------------
// Text out.

/// "a, b, c".
std::string joined(const std::vector<std::string>& items);

/// Aligned columns, two spaces apart. `align` has one letter per column:
/// 'l' (text), 'r' (numbers) or 'c' (marks); columns beyond it are 'r'.
std::string table(const std::vector<std::vector<std::string>>& rows, const std::string& align);

/// An outcome value for people: integers in full, the rest to 7 digits.
std::string outcome_text(double v);

/// `s` with its line breaks made spaces and trailing spaces dropped.
std::string one_line(std::string s);

/// Write `text` to `path` atomically: a reader sees the old file or the new
/// one, never half of it. A path that is, or links to, anything but a
/// regular file (a directory, a device, a FIFO) is refused, a link is
/// written through (io/atomic_file.hpp says why). Failure or refusal is a
/// UsageError naming the path.
void write_atomically(const std::string& path, const std::string& text);

/// Refuse, before any work, an output path write_atomically() would refuse
/// (io/atomic_file.hpp's atomic_write_target()): a UsageError
/// "OPTION: <why>". For options whose file is written after a long run or
/// after output has begun (mpt train --plot, the tour's reports).
void check_output_path(const std::string& option, const std::string& path);

// ---------------------------------------------------------------------------
// Command-line errors: CLI11's messages, reduced to one line with the choices.

/// A CLI11 check for an option whose empty value would silently mean "not
/// given" (`--svg ''`): it refuses "", saying the value must be `what`.
CLI::Validator non_empty(const std::string& what);

/// Prints the one line for `e`, found while parsing `app`, to stderr; returns 2.
int report_parse_error(const CLI::App& app, const CLI::ParseError& e);

}  // namespace mpt::cli
