// Chapter 01 — floating-point formats and their limits: the GPU casts
// (kernels/formats/casts.cu) against the CPU reference, bit for bit.
// Depends on: mpt (rounding.hpp: encode_array; round_element.hpp: decode),
// mpt::kernels, tests/cuda_host/sweep_values.hpp, gpu_test_support.hpp.
// Without a usable GPU it prints why and exits 77 (CTest: Skipped).
#define DOCTEST_CONFIG_IMPLEMENT
#include "gpu_test_support.hpp"

#include <random>

#include "mpt/formats/format.hpp"
#include "mpt/formats/rounding.hpp"
#include "sweep_values.hpp"

namespace {

using mpt::cuda::KernelVersion;
using mpt::test::version_name;

constexpr std::size_t kN = 65536 + 13;  // not a multiple of 4: the vector kernels' tail runs

/// Every code of the four formats, every tie between neighbours and the
/// floats either side of it (about half a million values).
std::vector<float> boundary_inputs() {
  std::vector<float> v = mpt::test::adversarial_values();
  for (const mpt::FormatSpec& f :
       {mpt::formats::fp16, mpt::formats::bf16, mpt::formats::e4m3, mpt::formats::e5m2}) {
    const std::vector<float> b = mpt::test::code_boundaries(f);
    v.insert(v.end(), b.begin(), b.end());
  }
  while (v.size() % 4 != 3) v.push_back(65520.0f);
  return v;
}

template <class Code>
using EncodeFn = void (*)(const float*, Code*, std::size_t, KernelVersion);
template <class Code>
using DecodeFn = void (*)(const Code*, float*, std::size_t, KernelVersion);

/// Run one GPU cast on in[offset..) (offset 1 makes the pointers unaligned,
/// so the vectorized entry point must fall back) into a buffer poisoned with
/// `poison_byte` and compare every code with mpt::encode_array. Elements
/// before `offset` must still hold the poison: the kernel may not write
/// outside its range.
template <class Code>
void check_encode(const char* name, EncodeFn<Code> cast, const char* format, mpt::OverflowMode overflow,
                  const std::vector<float>& in, KernelVersion v, std::size_t offset,
                  unsigned char poison_byte) {
  const mpt::Format& f = mpt::format_named(format);
  mpt::RoundingOptions o;
  o.overflow = overflow;
  std::vector<std::uint32_t> expected(in.size());
  mpt::encode_array(in.data(), expected.data(), in.size(), f, o);

  mpt::test::DeviceArray<float> d_in(in);
  mpt::test::DeviceArray<Code> d_out(in.size());
  d_out.poison(poison_byte);
  cast(d_in.get() + offset, d_out.get() + offset, in.size() - offset, v);
  const std::vector<std::uint32_t> got = mpt::test::code_bits(d_out.download());
  const std::uint32_t poison = mpt::test::code_bits(mpt::test::poison_value<Code>(poison_byte));

  std::size_t bad = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::uint32_t want = i < offset ? poison : expected[i];
    if (got[i] == want) continue;
    if (bad++ == 0) {
      std::printf("%s (%s, offset %zu): mismatch at [%zu]: x=%a (%.9g) expected %#" PRIx32 " got %#" PRIx32
                  " (poison %#x)\n",
                  name, version_name(v), offset, i, in[i], in[i], want, got[i], poison_byte);
    }
  }
  if (bad)
    std::printf("%s: %zu of %zu differ (seed %" PRIu64 ")\n", name, bad, in.size(), mpt::test::test_seed());
  CHECK_MESSAGE(bad == 0, std::string(name), " ", version_name(v), " offset ", offset, ": ", bad,
                " mismatches of ", in.size());
}

/// Decode every code of the format (and 13 more, for the tail) on the GPU
/// and compare the floats' bits with mpt::decode on the host.
template <class Code>
void check_decode(const char* name, DecodeFn<Code> cast, const mpt::FormatSpec& f, KernelVersion v,
                  std::size_t offset) {
  std::vector<Code> codes;
  const std::uint32_t count = 1u << (8 * sizeof(Code));
  for (std::uint32_t c = 0; c < count; ++c) codes.push_back(mpt::test::code_from_bits<Code>(c));
  for (std::uint32_t c = 0; c < 13; ++c) codes.push_back(mpt::test::code_from_bits<Code>(count - 1 - 7 * c));

  mpt::test::DeviceArray<Code> d_in(codes);
  mpt::test::DeviceArray<float> d_out(codes.size());
  d_out.poison();
  cast(d_in.get() + offset, d_out.get() + offset, codes.size() - offset, v);
  const std::vector<float> got = d_out.download();

  std::size_t bad = 0;
  for (std::size_t i = 0; i < codes.size(); ++i) {
    const std::uint32_t want =
        i < offset ? 0xffffffffu : mpt::test::bits_from_float(mpt::decode(mpt::test::code_bits(codes[i]), f));
    const std::uint32_t have = mpt::test::bits_from_float(got[i]);
    if (have == want) continue;
    if (bad++ == 0) {
      std::printf("%s (%s, offset %zu): mismatch at [%zu]: code %#x expected %a (%#" PRIx32
                  ") got %a (%#" PRIx32 ")\n",
                  name, version_name(v), offset, i, mpt::test::code_bits(codes[i]),
                  mpt::test::float_from_bits(want), want, got[i], have);
    }
  }
  if (bad) std::printf("%s: %zu of %zu differ\n", name, bad, codes.size());
  CHECK_MESSAGE(bad == 0, std::string(name), " ", version_name(v), " offset ", offset, ": ", bad,
                " mismatches of ", codes.size());
}

template <class Code>
void check_encode_all(const char* name, EncodeFn<Code> cast, const char* format, mpt::OverflowMode overflow) {
  const std::vector<float> mixed = mpt::test::mixed_inputs(kN, mpt::test::test_seed());
  const std::vector<float> boundaries = boundary_inputs();
  for (KernelVersion v : {KernelVersion::simple, KernelVersion::vectorized}) {
    for (std::size_t offset : {0u, 1u})
      for (unsigned char poison : mpt::test::kPoisonBytes) {
        check_encode(name, cast, format, overflow, mixed, v, offset, poison);
        check_encode(name, cast, format, overflow, boundaries, v, offset, poison);
      }
  }
}

template <class Code>
void check_decode_all(const char* name, DecodeFn<Code> cast, const mpt::FormatSpec& f) {
  for (KernelVersion v : {KernelVersion::simple, KernelVersion::vectorized}) {
    for (std::size_t offset : {0u, 1u}) check_decode(name, cast, f, v, offset);
  }
}

}  // namespace

TEST_CASE("fp32 -> fp16 on the GPU == mpt::encode_array (RNE, overflow to inf)") {
  check_encode_all<mpt::Fp16Code>("cast_fp32_to_fp16", mpt::cuda::cast_fp32_to_fp16, "fp16",
                                  mpt::OverflowMode::infinity);
}
TEST_CASE("fp32 -> bf16 on the GPU == mpt::encode_array (RNE, overflow to inf)") {
  check_encode_all<mpt::Bf16Code>("cast_fp32_to_bf16", mpt::cuda::cast_fp32_to_bf16, "bf16",
                                  mpt::OverflowMode::infinity);
}
TEST_CASE("fp32 -> e4m3 on the GPU == mpt::encode_array (RNE, saturating)") {
  check_encode_all<mpt::Fp8E4M3>("cast_fp32_to_e4m3_sat", mpt::cuda::cast_fp32_to_e4m3_sat, "e4m3",
                                 mpt::OverflowMode::saturate);
}
TEST_CASE("fp32 -> e5m2 on the GPU == mpt::encode_array (RNE, saturating)") {
  check_encode_all<mpt::Fp8E5M2>("cast_fp32_to_e5m2_sat", mpt::cuda::cast_fp32_to_e5m2_sat, "e5m2",
                                 mpt::OverflowMode::saturate);
}

TEST_CASE("codes -> fp32 on the GPU == mpt::decode, every code") {
  check_decode_all<mpt::Fp16Code>("cast_fp16_to_fp32", mpt::cuda::cast_fp16_to_fp32, mpt::formats::fp16);
  check_decode_all<mpt::Bf16Code>("cast_bf16_to_fp32", mpt::cuda::cast_bf16_to_fp32, mpt::formats::bf16);
  check_decode_all<mpt::Fp8E4M3>("cast_e4m3_to_fp32", mpt::cuda::cast_e4m3_to_fp32, mpt::formats::e4m3);
  check_decode_all<mpt::Fp8E5M2>("cast_e5m2_to_fp32", mpt::cuda::cast_e5m2_to_fp32, mpt::formats::e5m2);
}

TEST_CASE("pinned values: the numbers chapter 01 quotes") {
  // Independent of encode_array: the codes written out by hand.
  // 0x1.8p-25 = 3*2^-26 is 0.75 of fp16's smallest subnormal (rounds up to
  // it); 0x1.8p-24 is the tie between 1 and 2 subnormal steps (goes to 2).
  const std::vector<float> in = {65504.0f,   std::nextafter(65520.0f, 0.0f),
                                 65520.0f,   0x1p-24f,
                                 0x1p-25f,   0x1.8p-25f,
                                 0x1.8p-24f, -0.0f,
                                 448.0f,     464.0f,
                                 1e6f,       -1e6f};
  mpt::test::DeviceArray<float> d_in(in);
  mpt::test::DeviceArray<mpt::Fp16Code> d_h(in.size());
  mpt::test::DeviceArray<mpt::Fp8E4M3> d_q(in.size());
  d_h.poison();
  d_q.poison();
  mpt::cuda::cast_fp32_to_fp16(d_in.get(), d_h.get(), in.size());
  mpt::cuda::cast_fp32_to_e4m3_sat(d_in.get(), d_q.get(), in.size());
  const std::vector<std::uint32_t> h = mpt::test::code_bits(d_h.download());
  const std::vector<std::uint32_t> q = mpt::test::code_bits(d_q.download());
  CHECK(h == std::vector<std::uint32_t>{0x7bff, 0x7bff, 0x7c00, 0x0001, 0x0000, 0x0001, 0x0002, 0x8000,
                                        0x5f00, 0x5f40, 0x7c00, 0xfc00});
  CHECK(q ==
        std::vector<std::uint32_t>{0x7e, 0x7e, 0x7e, 0x00, 0x00, 0x00, 0x00, 0x80, 0x7e, 0x7e, 0x7e, 0xfe});
}

TEST_CASE("bad arguments: n == 0 is a no-op, an unknown version throws") {
  CHECK_NOTHROW(mpt::cuda::cast_fp32_to_fp16(nullptr, nullptr, 0));
  mpt::test::DeviceArray<float> d(4);
  mpt::test::DeviceArray<mpt::Fp16Code> h(4);
  CHECK_THROWS_AS(mpt::cuda::cast_fp32_to_fp16(d.get(), h.get(), 4, static_cast<KernelVersion>(7)),
                  std::invalid_argument);
  CHECK_NOTHROW(mpt::cuda::synchronize());
}

int main(int argc, char** argv) { return mpt::test::gpu_test_main(argc, argv); }
