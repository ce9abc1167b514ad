// Chapter 07 — FP8 training (test helpers): quantize_into and
// quantize_mx_into, through one of their loops (portable, AVX2, AVX-512),
// against quantize_with_scale and quantize_mx (the Fp8Tensor reference),
// bit for bit, on adversarial and random inputs; shared by
// test_ch07_quantize_raw.cpp (portable), test_ch07_quantize_raw_avx2.cpp
// and test_ch07_quantize_raw_avx512.cpp.
// Depends on: mpt/fp8/quantize_raw.hpp, quantize_raw_impl.hpp (the vector
// loops by name), mpt/fp8/quantize.hpp, doctest.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mpt/fp8/quantize.hpp"
#include "mpt/fp8/quantize_raw.hpp"
#include "mpt/fp8/quantize_raw_impl.hpp"

namespace fp8_raw {

/// Which loop runs: the portable one, or the AVX2 or AVX-512 one by name
/// (quantize_into picks the widest the CPU has; the tests pick each).
enum class Path { portable, avx2, avx512 };

inline float run_tensor(Path p, const float* x, std::size_t n, mpt::DType d, float scale, bool sat,
                        std::uint8_t* codes, mpt::fp8::Fp8Counts& counts) {
  if (p == Path::portable)
    return mpt::fp8::quantize_into(x, n, d, scale, sat, codes, counts, mpt::Implementation::portable);
  return mpt::fp8::detail::quantize_into_simd(
      x, n, mpt::fp8::fp8_spec(d), scale, sat, codes, counts,
      p == Path::avx2 ? mpt::fp8::detail::SimdWidth::avx2 : mpt::fp8::detail::SimdWidth::avx512);
}

inline void run_mx(Path p, const float* x, std::size_t rows, std::size_t cols, mpt::DType d,
                   mpt::fp8::MxScaleRule rule, bool sat, std::uint8_t* codes, std::uint8_t* e8m0, float* amax,
                   mpt::fp8::Fp8Counts& counts) {
  if (p == Path::portable) {
    mpt::fp8::quantize_mx_into(x, rows, cols, d, rule, sat, codes, e8m0, amax, counts,
                               mpt::Implementation::portable);
    return;
  }
  mpt::fp8::detail::quantize_mx_into_simd(
      x, rows, cols, mpt::fp8::fp8_spec(d), rule, sat, codes, e8m0, amax, counts,
      p == Path::avx2 ? mpt::fp8::detail::SimdWidth::avx2 : mpt::fp8::detail::SimdWidth::avx512);
}

inline std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

/// The values where FP8 goes wrong when it does, with both signs: zeros,
/// inf, NaNs with payloads, E4M3's 448, the tie 464 and just above,
/// E5M2's 57344 and tie 61440, FP8 subnormals and their ties, fp32
/// subnormals and max.
inline std::vector<float> adversarial() {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> p = {0.0f,
                                inf,
                                std::numeric_limits<float>::quiet_NaN(),
                                float_of(0x7f800001u),
                                float_of(0x7fc12345u),
                                448.0f,
                                464.0f,
                                std::nextafter(464.0f, inf),
                                std::nextafter(464.0f, 0.0f),
                                480.0f,
                                57344.0f,
                                61440.0f,
                                std::nextafter(61440.0f, 0.0f),
                                0x1p-9f,
                                0x1p-10f,
                                0x1.8p-10f,
                                0x1p-6f,
                                0x1p-16f,
                                0x1p-17f,
                                0x1.8p-17f,
                                std::numeric_limits<float>::max(),
                                std::numeric_limits<float>::min(),
                                float_of(1u),
                                float_of(0x007fffffu),
                                1.0f,
                                3.0f,
                                0.1f};
  std::vector<float> out;
  for (float x : p) {
    out.push_back(x);
    out.push_back(-x);
  }
  return out;
}

/// n values: the adversarial ones at both ends, random bit patterns (a
/// fifth), and random values spread from below E5M2's smallest subnormal
/// to above its max (every class: flushed, subnormal, normal, beyond).
inline std::vector<float> mixed(std::size_t n, std::uint64_t seed) {
  const std::vector<float> adv = adversarial();
  std::mt19937_64 rng(seed);
  std::vector<float> v;
  for (std::size_t i = 0; i < n; ++i) {
    if (i < adv.size()) {
      v.push_back(adv[i]);
    } else if (n - i <= adv.size()) {
      v.push_back(adv[n - i - 1]);
    } else if (rng() % 5 == 0) {
      v.push_back(float_of(static_cast<std::uint32_t>(rng())));
    } else {
      const int e = static_cast<int>(rng() % 44) - 27;  // 2^-27 .. 2^16
      const float m = 1.0f + static_cast<float>(rng() % (1u << 23)) * 0x1p-23f;
      v.push_back(std::ldexp(rng() % 2 ? -m : m, e));
    }
  }
  return v;
}

inline void same_counts(const mpt::fp8::Fp8Counts& a, const mpt::fp8::Fp8Counts& b, const std::string& what) {
  CHECK_MESSAGE(a.saturated == b.saturated, what);
  CHECK_MESSAGE(a.overflowed == b.overflowed, what);
  CHECK_MESSAGE(a.nan == b.nan, what);
  CHECK_MESSAGE(a.flushed == b.flushed, what);
}

inline std::size_t differ(const std::vector<std::uint8_t>& want, const std::vector<std::uint8_t>& got,
                          const std::vector<float>* x, const std::string& what) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (want[i] != got[i] && bad++ < 5)
      std::printf("%s: [%zu] x=%a want %#04x got %#04x\n", what.c_str(), i, x ? (*x)[i] : 0.0f, want[i],
                  got[i]);
  return bad;
}

/// quantize_into's loop `path` against quantize_with_scale, for both formats,
/// both saturation modes, several scales and lengths around the vector
/// width and the 2048-value tile.
inline void check_per_tensor(Path path) {
  using mpt::DType;
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{17}, std::size_t{127},
        std::size_t{128}, std::size_t{2047}, std::size_t{2048}, std::size_t{2049}, std::size_t{10007}}) {
    const std::vector<float> x = mixed(n, 1234 + n);
    for (DType d : {DType::e4m3, DType::e5m2})
      for (float scale : {1.0f, 0.37f, 0x1p-12f, 0x1p+12f, 3.0e30f})
        for (bool sat : {true, false}) {
          const mpt::fp8::Fp8Tensor want = mpt::fp8::quantize_with_scale(x.data(), n, d, scale, sat);
          std::vector<std::uint8_t> codes(n + 3, 0xA5);
          mpt::fp8::Fp8Counts counts;
          const float amax = run_tensor(path, x.data(), n, d, scale, sat, codes.data(), counts);
          const std::string what = std::string(d == DType::e4m3 ? "e4m3" : "e5m2") + " n " +
                                   std::to_string(n) + " scale " + std::to_string(scale) +
                                   (sat ? " sat" : " nosat");
          CAPTURE(what);
          CHECK(bits_of(amax) == bits_of(want.amax[0]));
          CHECK(bits_of(mpt::fp8::amax_vector(x.data(), n)) == bits_of(want.amax[0]));
          CHECK(differ(want.codes,
                       std::vector<std::uint8_t>(codes.begin(), codes.begin() + static_cast<long>(n)), &x,
                       what) == 0);
          CHECK(codes[n] == 0xA5);  // nothing written past the end
          same_counts(want.counts, counts, what);
        }
  }
}

/// Rows of MX blocks, each block of a kind: all zero, only NaN, an inf,
/// 448 and -464, fp32 subnormals, one value, a power-of-two amax, E5M2's
/// edges, tiny values; then the mixed values.
inline std::vector<float> mx_values(std::size_t rows, std::size_t cols, std::uint64_t seed) {
  std::vector<float> v = mixed(rows * cols, seed);
  std::mt19937_64 rng(seed);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::size_t per_row = (cols + 31) / 32;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t b = 0; b < per_row; ++b) {
      const std::size_t begin = r * cols + b * 32, count = std::min<std::size_t>(32, cols - b * 32);
      const std::size_t kind = (r * per_row + b) % 11;
      for (std::size_t i = 0; i < count; ++i) {
        const float g =
            std::ldexp(static_cast<float>(rng() % 1000) / 500.0f - 1.0f, -static_cast<int>(rng() % 12));
        float& x = v[begin + i];
        switch (kind) {
          case 0: x = i % 2 ? -0.0f : 0.0f; break;
          case 1: x = nan; break;
          case 2: x = i == count / 2 ? -inf : g; break;
          case 3: x = i == 0 ? 448.0f : (i == 1 ? -464.0f : g); break;
          case 4: x = float_of(static_cast<std::uint32_t>(1 + rng() % 0x7fffff)); break;
          case 5: x = i + 1 == count ? 3.0f : 0.0f; break;
          case 6: x = i == 0 ? 256.0f : g; break;
          case 7: x = i == 0 ? 57344.0f : (i == 1 ? -61440.0f : g * 1000.0f); break;
          case 8: x = std::ldexp(g, -120); break;
          default: break;
        }
      }
    }
  return v;
}

/// quantize_mx_into's loop `path` against quantize_mx.
inline void check_mx(Path path) {
  using mpt::DType;
  using mpt::fp8::MxScaleRule;
  // 512-value groups (the AVX-512 loop's unit): rows of whole groups end to
  // end in an even and an odd count ({3, 512}: two streams and one left
  // over; {1, 512}: one alone; {4, 1536}: twelve), and rows with groups and
  // blocks left over ({2, 1100}, {3, 2085}).
  const std::size_t shapes[][2] = {{1, 1},    {1, 31}, {3, 32},  {5, 33},  {7, 100},  {2, 2048},
                                   {3, 2085}, {0, 5},  {1, 512}, {3, 512}, {4, 1536}, {2, 1100}};
  for (const auto& s : shapes) {
    const std::size_t rows = s[0], cols = s[1], n = rows * cols, blocks = rows * ((cols + 31) / 32);
    const std::vector<float> x = mx_values(rows, cols, 77 + cols);
    for (DType d : {DType::e4m3, DType::e5m2})
      for (MxScaleRule rule : {MxScaleRule::floor, MxScaleRule::rceil})
        for (bool sat : {true, false}) {
          const mpt::fp8::Fp8Tensor want = mpt::fp8::quantize_mx(x.data(), rows, cols, d, rule, sat);
          std::vector<std::uint8_t> codes(n + 1, 0xA5), e8m0(blocks + 1, 0xA5);
          std::vector<float> amax(blocks + 1, -1.0f);
          mpt::fp8::Fp8Counts counts;
          run_mx(path, x.data(), rows, cols, d, rule, sat, codes.data(), e8m0.data(), amax.data(), counts);
          const std::string what =
              std::to_string(rows) + "x" + std::to_string(cols) + (d == DType::e4m3 ? " e4m3" : " e5m2") +
              (rule == MxScaleRule::floor ? " floor" : " rceil") + (sat ? " sat" : " nosat");
          CAPTURE(what);
          CHECK(differ(want.codes,
                       std::vector<std::uint8_t>(codes.begin(), codes.begin() + static_cast<long>(n)), &x,
                       what) == 0);
          CHECK(differ(want.e8m0,
                       std::vector<std::uint8_t>(e8m0.begin(), e8m0.begin() + static_cast<long>(blocks)),
                       nullptr, what + " e8m0") == 0);
          std::size_t amax_bad = 0;
          for (std::size_t b = 0; b < blocks; ++b) amax_bad += bits_of(amax[b]) != bits_of(want.amax[b]);
          CHECK(amax_bad == 0);
          CHECK(codes[n] == 0xA5);
          CHECK(e8m0[blocks] == 0xA5);
          CHECK(amax[blocks] == -1.0f);
          same_counts(want.counts, counts, what);
        }
  }
}

}  // namespace fp8_raw
