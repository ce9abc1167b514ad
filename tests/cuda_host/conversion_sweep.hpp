// Chapter 01 — floating-point formats and their limits (test support): the
// sweep of inputs that mpt's rounding is compared on with independent
// implementations (Eigen in test_ch01_eigen_conversions.cpp, CUDA's host
// conversions in test_ch01_cuda_host_conversions.cpp), mpt's codes for it,
// and the llm.c-style comparison. Depends on: mpt (rounding.hpp,
// format.hpp), sweep_values.hpp, doctest; no CUDA header.
#pragma once

#include <doctest/doctest.h>

#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mpt/formats/format.hpp"
#include "mpt/formats/rounding.hpp"
#include "sweep_values.hpp"

namespace mpt::test {

inline std::uint64_t test_seed() {
  const char* s = std::getenv("MPT_SEED");
  return s ? std::strtoull(s, nullptr, 0) : 20240101u;
}

// Every input the sweep covers, built once: hand-picked boundaries, every
// code and every tie of the four formats (±1 float ulp), random bit
// patterns, and random values spread over each format's range.
inline const std::vector<float>& sweep_inputs() {
  static const std::vector<float> inputs = [] {
    std::vector<float> v = mpt::test::adversarial_values();
    for (const mpt::FormatSpec& f :
         {mpt::formats::fp16, mpt::formats::bf16, mpt::formats::e4m3, mpt::formats::e5m2}) {
      const std::vector<float> b = mpt::test::code_boundaries(f);
      v.insert(v.end(), b.begin(), b.end());
    }
    // every float from just below fp16's max to past 2^16: the whole
    // overflow neighbourhood, one float ulp (2^-8) apart
    for (float x = 65000.0f; x <= 66000.0f; x = std::nextafter(x, 1e9f)) {
      v.push_back(x);
      v.push_back(-x);
    }
    std::mt19937_64 rng(test_seed());
    mpt::test::append_random_bits(v, 4'000'000, rng);
    for (const mpt::FormatSpec& f :
         {mpt::formats::fp16, mpt::formats::bf16, mpt::formats::e4m3, mpt::formats::e5m2}) {
      mpt::test::append_random_in_range(v, f, 1'000'000, rng);
    }
    return v;
  }();
  return inputs;
}

/// mpt's codes for all inputs through the array API, checked on the way
/// against the one-value API and against round_array (which takes the
/// AVX2/F16C path where the CPU has it), so CUDA checks all three.
inline std::vector<std::uint32_t> mpt_codes(const mpt::Format& f, mpt::OverflowMode overflow) {
  const std::vector<float>& in = sweep_inputs();
  mpt::RoundingOptions o;
  o.overflow = overflow;
  std::vector<std::uint32_t> codes(in.size());
  mpt::encode_array(in.data(), codes.data(), in.size(), f, o);
  std::vector<float> rounded(in.size());
  mpt::round_array(in.data(), rounded.data(), in.size(), f, o);

  std::size_t bad = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::uint32_t one = mpt::encode_exact(mpt::round_value(in[i], f, o), f.spec);
    const std::uint32_t arr = mpt::encode_exact(rounded[i], f.spec);
    if ((one != codes[i] || arr != codes[i]) && bad++ == 0) {
      std::printf("  %s: mpt's own paths differ at [%zu] x=%a: encode_array %#" PRIx32
                  ", round_value %#" PRIx32 ", round_array %#" PRIx32 "\n",
                  std::string(f.name).c_str(), i, in[i], codes[i], one, arr);
    }
  }
  CHECK_MESSAGE(bad == 0, "encode_array vs round_value vs round_array: ", bad, " mismatches");
  return codes;
}

/// Compare mpt's codes with a reference's, llm.c style: the first few
/// mismatches with index, input, expected (mpt) and got (reference), then
/// the count. With nan_bitwise false, two NaN codes of any sign and payload
/// count as equal.
inline void compare(const char* what, const mpt::FormatSpec& f, const std::vector<std::uint32_t>& ours,
                    const std::vector<std::uint32_t>& theirs, bool nan_bitwise) {
  const std::vector<float>& in = sweep_inputs();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (ours[i] == theirs[i]) continue;
    if (!nan_bitwise && std::isnan(mpt::decode(ours[i], f)) && std::isnan(mpt::decode(theirs[i], f))) {
      continue;
    }
    if (bad++ < 5) {
      std::printf(
          "  %s mismatch at [%zu]: x=%a (%.9g) mpt=%#" PRIx32 " (%.9g) reference=%#" PRIx32 " (%.9g)\n", what,
          i, in[i], in[i], ours[i], mpt::decode(ours[i], f), theirs[i], mpt::decode(theirs[i], f));
    }
  }
  if (bad)
    std::printf("  %s: %zu of %zu inputs differ (seed %" PRIu64 ")\n", what, bad, in.size(), test_seed());
  CHECK_MESSAGE(bad == 0, std::string(what), ": ", bad, " mismatches of ", in.size());
}

template <class Fn>
inline std::vector<std::uint32_t> reference_codes(Fn&& fn) {
  const std::vector<float>& in = sweep_inputs();
  std::vector<std::uint32_t> out(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = fn(in[i]);
  return out;
}

template <class T>
inline std::uint16_t bits16(const T& h) {
  static_assert(sizeof(T) == 2, "a 16-bit format");
  std::uint16_t u;
  std::memcpy(&u, &h, sizeof u);
  return u;
}

}  // namespace mpt::test
