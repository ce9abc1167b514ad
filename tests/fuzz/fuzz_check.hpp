// All chapters — what every fuzz target shares: the property check that
// fails the run, and the input as text.
// Depends on: the C++ standard library only.
//
// A property that does not hold is a crash: fuzz_require() prints what was
// wrong and aborts, which libFuzzer reports (and keeps the input) and which
// fails the replay test of the committed corpus.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace mpt::fuzz {

/// Aborts with "property failed: <what>" on stderr unless `ok`.
inline void fuzz_require(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "property failed: %s\n", what.c_str());
  std::abort();
}

/// The fuzzer's bytes as a string (embedded NULs and all).
inline std::string input_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// The bits of a float, to compare two values bit for bit.
inline std::uint32_t bits_of(float v) {
  std::uint32_t b = 0;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

/// The bits of a double, to compare two values bit for bit.
inline std::uint64_t bits_of(double v) {
  std::uint64_t b = 0;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

/// Whether `s` is one line: no line break anywhere.
inline bool is_one_line(const std::string& s) { return s.find_first_of("\r\n") == std::string::npos; }

}  // namespace mpt::fuzz
