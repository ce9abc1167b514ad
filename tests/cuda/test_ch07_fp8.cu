// Chapter 07 — FP8 training: the fp8 tier's kernels (kernels/fp8/fp8.cu)
// against the CPU reference (src/mpt/fp8/quantize.cpp), bit for bit.
// Depends on: mpt (fp8/quantize.hpp: quantize_with_scale, quantize_mx,
// dequantize, amax_of), mpt::kernels (fp8_kernels.hpp),
// tests/cuda_host/sweep_values.hpp (adversarial and random inputs),
// gpu_test_support.hpp. Without a usable GPU it prints why and exits 77
// (CTest: Skipped).
//
// Tolerance: none. Both sides run the same host-and-device functions
// (quantize_element, amax_step, mx_scale_code, e8m0_*) on the same fp32
// inputs, with no FTZ on either side, so codes, E8M0 codes, amax and counts
// must be equal; dequantized floats too, except that a NaN code may decode
// to any NaN. Every output buffer is poisoned before the run, once with
// each of the two poison bytes, and a guard of poisoned bytes after the
// codes must stay as it was: a code that is not written, or one written
// past the end, fails in at least one of the runs.
#define DOCTEST_CONFIG_IMPLEMENT
#include "gpu_test_support.hpp"
#include "kernels/fp8/fp8_kernels.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "mpt/fp8/quantize.hpp"
#include "sweep_values.hpp"

namespace {

using mpt::DType;
using mpt::cuda::Fp8DeviceCounts;
using mpt::cuda::KernelVersion;
using mpt::fp8::MxScaleRule;
using mpt::test::bits_from_float;
using mpt::test::DeviceArray;
using mpt::test::float_from_bits;
using mpt::test::kPoisonBytes;
using mpt::test::version_name;

constexpr std::size_t kGuard = 16;  // poisoned bytes after every code array
const float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

const char* dtype_label(DType d) { return d == DType::e4m3 ? "e4m3" : "e5m2"; }
const char* rule_label(MxScaleRule r) { return r == MxScaleRule::floor ? "floor" : "rceil"; }

/// n values: mixed_inputs (adversarial at both ends, random bit patterns,
/// random values over each narrow format's range) where n allows, else a
/// slice of the adversarial values.
std::vector<float> inputs(std::size_t n, std::uint64_t seed) {
  const std::vector<float> adv = mpt::test::adversarial_values();
  if (n >= 2 * adv.size() + 10) return mpt::test::mixed_inputs(n, seed);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = adv[(i * 7 + seed) % adv.size()];
  return v;
}

/// Gaussian values over a few binades: a tensor as training has them.
std::vector<float> gaussian(std::size_t n, std::uint64_t seed, float sigma) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

/// Rows of MX blocks built to hit each corner: all zero, only NaN, ±inf,
/// ±448 and ±464 beside small values, fp32 subnormals only, a single
/// non-zero value, amax at an exact power of two, E5M2's max; then random
/// blocks. cols need not be a multiple of 32 (the short last block).
std::vector<float> mx_adversarial(std::size_t rows, std::size_t cols, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v = inputs(rows * cols, seed);
  const std::size_t per_row = (cols + 31) / 32;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t b = 0; b < per_row; ++b) {
      const std::size_t begin = r * cols + b * 32, count = std::min<std::size_t>(32, cols - b * 32);
      float* x = v.data() + begin;
      const std::size_t kind = (r * per_row + b) % 12;
      for (std::size_t i = 0; i < count; ++i) {
        const float g =
            std::ldexp(static_cast<float>(rng() % 1000) / 500.0f - 1.0f, -static_cast<int>(rng() % 12));
        switch (kind) {
          case 0: x[i] = 0.0f; break;                                      // all-zero block
          case 1: x[i] = i % 2 ? -0.0f : 0.0f; break;                      // signed zeros
          case 2: x[i] = kNan; break;                                      // only NaN: amax 0
          case 3: x[i] = i == count / 2 ? kInf : g; break;                 // an inf
          case 4: x[i] = i == 0 ? 448.0f : (i == 1 ? -464.0f : g); break;  // E4M3's max and tie
          case 5:
            x[i] = float_from_bits(static_cast<std::uint32_t>(1 + rng() % 0x7fffff));
            break;                                             // fp32 subnormals
          case 6: x[i] = i == count - 1 ? 3.0f : 0.0f; break;  // one value
          case 7: x[i] = i == 0 ? 256.0f : g; break;           // amax a power of two
          case 8: x[i] = i == 0 ? 57344.0f : (i == 1 ? -61440.0f : g * 1000.0f); break;
          case 9: x[i] = i == 0 ? kNan : g * 1e30f; break;  // NaN beside huge
          case 10: x[i] = std::ldexp(g, -120); break;       // tiny, 2^-127 territory
          default: break;                                   // random (inputs())
        }
      }
    }
  return v;
}

std::size_t code_mismatches(const std::vector<std::uint8_t>& want, const std::vector<std::uint8_t>& got,
                            const std::vector<float>* x, const std::string& what) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (want[i] == got[i]) continue;
    if (bad++ < 5)
      std::printf("%s: [%zu] x=%a want %#04x got %#04x\n", what.c_str(), i, x ? (*x)[i] : 0.0f, want[i],
                  got[i]);
  }
  if (bad)
    std::printf("%s: %zu of %zu codes differ (seed %llu)\n", what.c_str(), bad, want.size(),
                static_cast<unsigned long long>(mpt::test::test_seed()));
  return bad;
}

std::size_t guard_damage(const std::vector<std::uint8_t>& got, std::size_t n, unsigned char poison,
                         const std::string& what) {
  std::size_t bad = 0;
  for (std::size_t i = n; i < got.size(); ++i)
    if (got[i] != poison && bad++ == 0)
      std::printf("%s: the guard byte at [%zu] was written\n", what.c_str(), i);
  return bad;
}

void check_counts(const mpt::fp8::Fp8Counts& want, const Fp8DeviceCounts& got, const std::string& what) {
  CHECK_MESSAGE(got.saturated == want.saturated, what, ": saturated ", got.saturated, " want ",
                want.saturated);
  CHECK_MESSAGE(got.overflowed == want.overflowed, what, ": overflowed ", got.overflowed, " want ",
                want.overflowed);
  CHECK_MESSAGE(got.nan == want.nan, what, ": nan ", got.nan, " want ", want.nan);
  CHECK_MESSAGE(got.flushed == want.flushed, what, ": flushed ", got.flushed, " want ", want.flushed);
}

std::vector<std::uint8_t> with_guard(std::vector<std::uint8_t> v) {
  v.resize(v.size() - kGuard);
  return v;
}

// --- per tensor -------------------------------------------------------------------------

/// quantize_with_scale on the CPU against fp8_quantize_per_tensor, each
/// poison in turn; `offset` floats into the input buffer (1: misaligned,
/// the vectorized version falls back to the simple one).
void check_per_tensor(const std::vector<float>& x, DType d, float scale, bool saturate, KernelVersion v,
                      std::size_t offset, const std::string& label) {
  const mpt::fp8::Fp8Tensor want = mpt::fp8::quantize_with_scale(x.data(), x.size(), d, scale, saturate);
  std::vector<float> padded(offset, 1.0f);
  padded.insert(padded.end(), x.begin(), x.end());
  DeviceArray<float> d_x(padded);
  DeviceArray<float> d_scale(std::vector<float>{scale});
  const std::string what = label + " " + dtype_label(d) + " scale " + std::to_string(scale) +
                           (saturate ? " sat " : " nosat ") + version_name(v) + " offset " +
                           std::to_string(offset) + " n " + std::to_string(x.size());
  for (unsigned char poison : kPoisonBytes) {
    DeviceArray<std::uint8_t> d_codes(x.size() + kGuard);
    DeviceArray<float> d_amax(1);
    DeviceArray<Fp8DeviceCounts> d_counts(1);
    d_codes.poison(poison);
    d_amax.poison(poison);
    d_counts.poison(poison);
    mpt::cuda::fp8_quantize_per_tensor(d_x.get() + offset, x.size(), d, d_scale.get(), saturate,
                                       d_codes.get(), d_amax.get(), d_counts.get(), v);
    const std::vector<std::uint8_t> got = d_codes.download();
    CAPTURE(what);
    CHECK(code_mismatches(want.codes, with_guard(got), &x, what) == 0);
    CHECK(guard_damage(got, x.size(), poison, what) == 0);
    CHECK(bits_from_float(d_amax.download()[0]) == bits_from_float(want.amax[0]));
    check_counts(want.counts, d_counts.download()[0], what);

    // The codes read back, against mpt::fp8::dequantize.
    const std::vector<float> want_f = mpt::fp8::dequantize(want);
    DeviceArray<float> d_out(x.size() + 1);
    d_out.poison(poison);
    mpt::cuda::fp8_dequantize_per_tensor(d_codes.get(), x.size(), d, d_scale.get(), d_out.get(), v);
    const std::vector<float> got_f = d_out.download();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!mpt::test::same_float(want_f[i], got_f[i]) && bad++ < 5)
        std::printf("%s dequantize: [%zu] want %a got %a\n", what.c_str(), i, want_f[i], got_f[i]);
    CHECK(bad == 0);
    CHECK(bits_from_float(got_f[x.size()]) == bits_from_float(mpt::test::poison_value<float>(poison)));
  }
}

// --- MX ---------------------------------------------------------------------------------

void check_mx(const std::vector<float>& x, std::size_t rows, std::size_t cols, DType d, MxScaleRule rule,
              bool saturate, KernelVersion v, const std::string& label) {
  const mpt::fp8::Fp8Tensor want = mpt::fp8::quantize_mx(x.data(), rows, cols, d, rule, saturate);
  const std::size_t scales = want.e8m0.size();
  DeviceArray<float> d_x(x);
  const std::string what = label + " " + std::to_string(rows) + "x" + std::to_string(cols) + " " +
                           dtype_label(d) + " " + rule_label(rule) + (saturate ? " sat " : " nosat ") +
                           version_name(v);
  for (unsigned char poison : kPoisonBytes) {
    DeviceArray<std::uint8_t> d_codes(x.size() + kGuard), d_e8m0(scales + kGuard);
    DeviceArray<float> d_amax(scales + 1);
    DeviceArray<Fp8DeviceCounts> d_counts(1);
    d_codes.poison(poison);
    d_e8m0.poison(poison);
    d_amax.poison(poison);
    d_counts.poison(poison);
    mpt::cuda::fp8_quantize_mx(d_x.get(), rows, cols, d, rule, saturate, d_codes.get(), d_e8m0.get(),
                               d_amax.get(), d_counts.get(), v);
    const std::vector<std::uint8_t> got = d_codes.download(), got_e = d_e8m0.download();
    const std::vector<float> got_a = d_amax.download();
    CAPTURE(what);
    CHECK(code_mismatches(want.codes, with_guard(got), &x, what) == 0);
    CHECK(guard_damage(got, x.size(), poison, what) == 0);
    CHECK(code_mismatches(want.e8m0, with_guard(got_e), nullptr, what + " e8m0") == 0);
    CHECK(guard_damage(got_e, scales, poison, what + " e8m0") == 0);
    std::size_t amax_bad = 0;
    for (std::size_t s = 0; s < scales; ++s)
      if (bits_from_float(got_a[s]) != bits_from_float(want.amax[s]) && amax_bad++ < 5)
        std::printf("%s: block %zu amax want %a got %a\n", what.c_str(), s, want.amax[s], got_a[s]);
    CHECK(amax_bad == 0);
    CHECK(bits_from_float(got_a[scales]) == bits_from_float(mpt::test::poison_value<float>(poison)));
    check_counts(want.counts, d_counts.download()[0], what);

    const std::vector<float> want_f = mpt::fp8::dequantize(want);
    DeviceArray<float> d_out(x.size() + 1);
    d_out.poison(poison);
    mpt::cuda::fp8_dequantize_mx(d_codes.get(), d_e8m0.get(), rows, cols, d, d_out.get(), v);
    const std::vector<float> got_f = d_out.download();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!mpt::test::same_float(want_f[i], got_f[i]) && bad++ < 5)
        std::printf("%s dequantize: [%zu] want %a got %a\n", what.c_str(), i, want_f[i], got_f[i]);
    CHECK(bad == 0);
    CHECK(bits_from_float(got_f[x.size()]) == bits_from_float(mpt::test::poison_value<float>(poison)));
  }
}

}  // namespace

TEST_CASE("fp8_amax: mpt::fp8::amax_of bit for bit; NaN ignored, inf kept, 0 for nothing") {
  const std::uint64_t seed = mpt::test::test_seed();
  std::vector<std::vector<float>> cases = {
      {},
      {kNan, kNan, -kNan},
      {-0.0f, 0.0f, -0.0f},
      {1.0f, kNan, -3.0f, 2.0f, kNan},
      {float_from_bits(1u), -float_from_bits(3u), float_from_bits(2u)},
      {5.0f, -kInf, kNan, 7.0f},
      inputs(4099, seed),
      gaussian(1000003, seed + 1, 1.0f),
  };
  std::vector<float> big = gaussian(1 << 20, seed + 2, 0.5f);
  big[(1 << 20) - 1] = -1e6f;  // the largest value last: the vectorized grid's last float4
  cases.push_back(big);
  for (const std::vector<float>& x : cases)
    for (KernelVersion v : {KernelVersion::simple, KernelVersion::vectorized})
      for (std::size_t offset : {std::size_t{0}, std::size_t{1}})
        for (unsigned char poison : kPoisonBytes) {
          std::vector<float> padded(offset, 1e30f);  // before the array: must not count
          padded.insert(padded.end(), x.begin(), x.end());
          DeviceArray<float> d_x(padded);
          DeviceArray<float> d_amax(1);
          d_amax.poison(poison);
          mpt::cuda::fp8_amax(d_x.get() + offset, x.size(), d_amax.get(), v);
          const float want = mpt::fp8::amax_of(x.data(), x.size());
          const float got = d_amax.download()[0];
          CAPTURE(x.size());
          CAPTURE(version_name(v));
          CAPTURE(offset);
          CHECK_MESSAGE(bits_from_float(got) == bits_from_float(want), "want ", want, " got ", got);
        }
}

TEST_CASE("fp8_quantize_per_tensor and dequantize: adversarial and random inputs, bit for bit") {
  const std::uint64_t seed = mpt::test::test_seed();
  const std::vector<float> mixed = inputs(100003, seed), small = inputs(37, seed + 3),
                           g = gaussian(65536 + 3, seed + 4, 2.0f);
  for (DType d : {DType::e4m3, DType::e5m2}) {
    const float fmax = d == DType::e4m3 ? 448.0f : 57344.0f;
    // 1; a recipe's scale for g (not a power of two); powers of two that
    // push many values over the top and many under the bottom.
    const float g_scale = fmax / mpt::fp8::amax_of(g.data(), g.size());
    for (float scale : {1.0f, g_scale, 0x1p-10f, 0x1p+20f})
      for (bool saturate : {true, false})
        for (KernelVersion v : {KernelVersion::simple, KernelVersion::vectorized}) {
          check_per_tensor(mixed, d, scale, saturate, v, 0, "mixed");
          check_per_tensor(g, d, scale, saturate, v, 0, "gaussian");
        }
    for (KernelVersion v : {KernelVersion::simple, KernelVersion::vectorized})
      for (std::size_t n :
           {std::size_t{1}, std::size_t{3}, std::size_t{4}, std::size_t{5}, std::size_t{37}}) {
        const std::vector<float> x(small.begin(), small.begin() + static_cast<std::ptrdiff_t>(n));
        check_per_tensor(x, d, 1.0f, true, v, 0, "tiny");
        check_per_tensor(x, d, 3.0f, true, v, 1, "tiny misaligned");
      }
    check_per_tensor(mixed, d, 0.75f, true, KernelVersion::vectorized, 3, "misaligned");
  }
}

TEST_CASE("fp8_quantize_per_tensor: counts, amax and codes on hand-made values") {
  // E4M3, scale 1, saturating: 464 is a tie that rounds to 448 (in range),
  // 464.00003 and inf saturate, 2^-10 (half the smallest subnormal) ties
  // to 0 (flushed), NaN counts as NaN and its code is 0x7F.
  const std::vector<float> x = {448.0f, 464.0f, std::nextafter(464.0f, kInf), kInf, -kInf, 0x1p-10f,
                                kNan,   0.0f};
  DeviceArray<float> d_x(x);
  DeviceArray<float> d_scale(std::vector<float>{1.0f});
  for (KernelVersion v : {KernelVersion::simple, KernelVersion::vectorized}) {
    DeviceArray<std::uint8_t> d_codes(x.size());
    DeviceArray<float> d_amax(1);
    DeviceArray<Fp8DeviceCounts> d_counts(1);
    d_codes.poison();
    mpt::cuda::fp8_quantize_per_tensor(d_x.get(), x.size(), DType::e4m3, d_scale.get(), true, d_codes.get(),
                                       d_amax.get(), d_counts.get(), v);
    const std::vector<std::uint8_t> c = d_codes.download();
    const std::vector<std::uint8_t> want = {0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x00, 0x7F, 0x00};
    CAPTURE(version_name(v));
    CHECK(c == want);
    CHECK(d_amax.download()[0] == kInf);
    const Fp8DeviceCounts n = d_counts.download()[0];
    CHECK(n.saturated == 3);
    CHECK(n.flushed == 1);
    CHECK(n.nan == 1);
    CHECK(n.overflowed == 0);
  }
}

TEST_CASE("fp8_quantize_mx and dequantize: FLOOR and RCEIL, adversarial blocks, bit for bit") {
  const std::uint64_t seed = mpt::test::test_seed();
  const std::size_t shapes[][2] = {{1, 1},   {1, 31},  {3, 32},    {5, 33},
                                   {7, 100}, {12, 96}, {64, 1024}, {33, 4099}};
  for (const auto& s : shapes) {
    const std::vector<float> adv = mx_adversarial(s[0], s[1], seed + s[1]);
    const std::vector<float> g = gaussian(s[0] * s[1], seed + 11, 1.0f);
    for (DType d : {DType::e4m3, DType::e5m2})
      for (MxScaleRule rule : {MxScaleRule::floor, MxScaleRule::rceil})
        for (bool saturate : {true, false})
          for (KernelVersion v : {KernelVersion::simple, KernelVersion::vectorized}) {
            check_mx(adv, s[0], s[1], d, rule, saturate, v, "adversarial");
            check_mx(g, s[0], s[1], d, rule, saturate, v, "gaussian");
          }
  }
}

TEST_CASE(
    "fp8_quantize_mx: an all-zero block has E8M0 code 0 and codes 0; FLOOR saturates where RCEIL does not") {
  // Block 0: zeros. Block 1: 464 and 1 — FLOOR: e = 8 - 8 = 0, scale 1, 464
  // rounds to 448 (in range, the tie); 480 in block 2 saturates under
  // FLOOR (e = 0), while RCEIL picks 2^1 (480 / 448 > 1) and nothing saturates.
  std::vector<float> x(96, 0.0f);
  x[32] = 464.0f;
  x[33] = 1.0f;
  x[64] = 480.0f;
  x[65] = 1.0f;
  DeviceArray<float> d_x(x);
  for (KernelVersion v : {KernelVersion::simple, KernelVersion::vectorized}) {
    DeviceArray<std::uint8_t> d_codes(96), d_e8m0(3);
    DeviceArray<Fp8DeviceCounts> d_counts(1);
    d_codes.poison();
    d_e8m0.poison();
    mpt::cuda::fp8_quantize_mx(d_x.get(), 1, 96, DType::e4m3, MxScaleRule::floor, true, d_codes.get(),
                               d_e8m0.get(), nullptr, d_counts.get(), v);
    const std::vector<std::uint8_t> e = d_e8m0.download(), c = d_codes.download();
    CAPTURE(version_name(v));
    CHECK(e == std::vector<std::uint8_t>{0, 127, 127});
    CHECK(c[0] == 0);
    CHECK(c[31] == 0);
    CHECK(c[32] == 0x7E);
    CHECK(c[64] == 0x7E);
    CHECK(d_counts.download()[0].saturated == 1);
    mpt::cuda::fp8_quantize_mx(d_x.get(), 1, 96, DType::e4m3, MxScaleRule::rceil, true, d_codes.get(),
                               d_e8m0.get(), nullptr, d_counts.get(), v);
    CHECK(d_e8m0.download() == std::vector<std::uint8_t>{0, 128, 128});
    CHECK(d_counts.download()[0].saturated == 0);
  }
}

TEST_CASE("fp8 kernels: bad arguments and empty sizes") {
  DeviceArray<float> d(4);
  DeviceArray<std::uint8_t> c(4);
  DeviceArray<Fp8DeviceCounts> counts(1);
  counts.poison();
  CHECK_THROWS_AS(mpt::cuda::fp8_quantize_per_tensor(d.get(), 4, DType::f16, d.get(), true, c.get(), d.get(),
                                                     counts.get()),
                  std::invalid_argument);
  CHECK_THROWS_AS(mpt::cuda::fp8_quantize_mx(d.get(), 1, 4, DType::e4m3, static_cast<MxScaleRule>(7), true,
                                             c.get(), c.get(), nullptr, counts.get()),
                  std::invalid_argument);
  CHECK_THROWS_AS(mpt::cuda::fp8_amax(d.get(), 4, d.get(), static_cast<KernelVersion>(9)),
                  std::invalid_argument);
  // Empty: nothing written but the reset amax and counts.
  mpt::cuda::fp8_quantize_mx(d.get(), 0, 5, DType::e5m2, MxScaleRule::rceil, true, c.get(), c.get(), nullptr,
                             counts.get());
  const Fp8DeviceCounts z = counts.download()[0];
  CHECK(z.saturated + z.overflowed + z.nan + z.flushed == 0);
  mpt::cuda::fp8_dequantize_mx(c.get(), c.get(), 3, 0, DType::e4m3, d.get());
  mpt::cuda::fp8_dequantize_per_tensor(c.get(), 0, DType::e4m3, d.get(), d.get());
  mpt::cuda::synchronize();
}

int main(int argc, char** argv) { return mpt::test::gpu_test_main(argc, argv); }
