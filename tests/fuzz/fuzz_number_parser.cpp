// All chapters — fuzz target: the number parsing of the `mpt` program
// (mpt::cli::parse_number<float/double>, parse_integer, not_a_number).
// Depends on: src/cli/cli_support.hpp (its .cpp compiled in), fuzz_check.hpp.
//
// The input is one token. Properties:
//  - parse_number<float> and parse_number<double> accept the same tokens
//    (strtof and strtod read the same syntax), and never one with a NUL;
//  - a value that parses prints (as hex-float "%a", and in decimal with
//    enough digits: 9 for float, 17 for double) and parses back to the same
//    bits (a NaN to a NaN of the same sign);
//  - parse_integer over each range of a table: success means the value is
//    in [lo, hi] and std::to_string of it parses back to it; a narrow range
//    accepts exactly what the full range accepts and lies in it, with the
//    same value; on failure the output is left alone;
//  - the error line names the token, its control bytes (NUL, line breaks)
//    written as \xHH, and is one line.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "cli/cli_support.hpp"
#include "fuzz_check.hpp"

namespace {

using mpt::fuzz::fuzz_require;

template <typename T>
bool same_bits(T a, T b) {
  if (std::isnan(a) || std::isnan(b))
    return std::isnan(a) && std::isnan(b) && std::signbit(a) == std::signbit(b);
  return mpt::fuzz::bits_of(a) == mpt::fuzz::bits_of(b);
}

template <typename T>
void check_round_trip(const std::string& token, T v, const char* decimal_format) {
  char hex[64];
  char dec[64];
  std::snprintf(hex, sizeof hex, "%a", static_cast<double>(v));
  std::snprintf(dec, sizeof dec, decimal_format, static_cast<double>(v));
  for (const char* text : {hex, dec}) {
    T back = 0;
    fuzz_require(mpt::cli::parse_number(std::string(text), back),
                 "'" + token + "' parsed, but its printed value '" + text + "' does not");
    fuzz_require(same_bits(back, v), "'" + token + "' printed as '" + text + "' parses to other bits");
  }
}

// The token as the error line must show it: control bytes as \xHH.
std::string shown(const std::string& token) {
  std::string out;
  for (const char c : token) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      static const char digits[] = "0123456789abcdef";
      out += "\\x";
      out += digits[byte >> 4];
      out += digits[byte & 15];
    } else {
      out += c;
    }
  }
  return out;
}

struct Range {
  long long lo, hi;
};

constexpr long long kMin = std::numeric_limits<long long>::min();
constexpr long long kMax = std::numeric_limits<long long>::max();
constexpr Range kRanges[] = {
    {kMin, kMax}, {0, 0}, {1, 1LL << 24}, {-128, 127}, {0, 4294967295LL}, {-10, -1}, {kMax - 1, kMax},
};

void check_integer(const std::string& token) {
  constexpr long long kUntouched = 0x5eed5eedLL;
  long long full = kUntouched;
  const bool full_ok = mpt::cli::parse_integer(token, kMin, kMax, full);
  if (!full_ok)
    fuzz_require(full == kUntouched, "parse_integer('" + token + "') failed but wrote its output");
  if (full_ok) {
    fuzz_require(!token.empty() && token.front() != ' ',
                 "parse_integer accepted a token starting with a space");
    long long back = 0;
    fuzz_require(
        mpt::cli::parse_integer(std::to_string(full), kMin, kMax, back) && back == full,
        "parse_integer('" + token + "') = " + std::to_string(full) + " does not print and parse back");
  }
  for (const Range& r : kRanges) {
    long long v = kUntouched;
    const bool ok = mpt::cli::parse_integer(token, r.lo, r.hi, v);
    const std::string where =
        "parse_integer('" + token + "', " + std::to_string(r.lo) + ", " + std::to_string(r.hi) + ")";
    if (ok) {
      fuzz_require(r.lo <= v && v <= r.hi, where + " = " + std::to_string(v) + " is out of its range");
      fuzz_require(full_ok && v == full,
                   where + " accepted what the full range does not, or read another value");
    } else {
      fuzz_require(v == kUntouched, where + " failed but wrote its output");
      fuzz_require(!full_ok || full < r.lo || full > r.hi, where + " refused a value inside its range");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string token = mpt::fuzz::input_text(data, size);
  float f = 0;
  double d = 0;
  const bool f_ok = mpt::cli::parse_number(token, f);
  const bool d_ok = mpt::cli::parse_number(token, d);
  fuzz_require(f_ok == d_ok, "parse_number<float> and <double> disagree on '" + token + "'");
  if (token.find('\0') != std::string::npos) fuzz_require(!f_ok, "a token with a NUL byte parsed");
  if (f_ok) {
    check_round_trip(token, f, "%.9g");
    check_round_trip(token, d, "%.17g");
  } else {
    const std::string line = mpt::cli::not_a_number(token, "(input 1)");
    const std::string quoted = token.size() <= 40 ? "'" + shown(token) + "'"
                                                  : "'" + shown(token.substr(0, 40)) + "...' (" +
                                                        std::to_string(token.size()) + " characters)";
    fuzz_require(line.rfind("cannot parse " + quoted + " (input 1) as a number; ", 0) == 0,
                 "the error line does not name the token: " + line);
    fuzz_require(mpt::fuzz::is_one_line(line) && line.find('\0') == std::string::npos,
                 "the error line is not one line of text: " + line);
  }
  check_integer(token);
  return 0;
}
