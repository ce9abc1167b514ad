// Chapter 02 — the typed CUDA boundary, checked by the plain C++ compiler:
// the kernel API (kernels/*/*_kernels.hpp, host-only headers) takes fp16,
// bf16 and FP8 data as distinct code types, so a bf16 buffer handed to an
// fp16 kernel, or a raw std::uint16_t*, does not compile; and the scale
// update takes its factors as doubles, as mpt::update_scale and PyTorch do.
// Depends on: mpt/formats/codes.hpp, kernels/formats/formats_kernels.hpp,
// kernels/nn/nn_kernels.hpp, kernels/amp/amp_kernels.hpp, doctest. Nothing
// is called: every check is about types (static_assert, mirrored by CHECKs
// so the report lists them), so it needs no nvcc, no CUDA and no GPU, and
// links nothing of the kernels.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/amp/amp_kernels.hpp"
#include "kernels/formats/formats_kernels.hpp"
#include "kernels/nn/nn_kernels.hpp"
#include "mpt/formats/codes.hpp"

namespace {

using mpt::Bf16Code;
using mpt::Fp16Code;
using mpt::Fp8E4M3;
using mpt::Fp8E5M2;
using mpt::cuda::Trans;

// --- the code types ------------------------------------------------------

template <class From, class To>
constexpr bool converts = std::is_convertible_v<From, To>;

// No pointer to one code converts to a pointer to another code, nor to or
// from the raw integer: the typing is only worth anything if these hold.
static_assert(!converts<Fp16Code*, Bf16Code*> && !converts<Bf16Code*, Fp16Code*>);
static_assert(!converts<const Fp16Code*, const Bf16Code*> && !converts<const Bf16Code*, const Fp16Code*>);
static_assert(!converts<std::uint16_t*, Fp16Code*> && !converts<Fp16Code*, std::uint16_t*>);
static_assert(!converts<std::uint16_t*, Bf16Code*> && !converts<Bf16Code*, std::uint16_t*>);
static_assert(!converts<Fp8E4M3*, Fp8E5M2*> && !converts<Fp8E5M2*, Fp8E4M3*>);
static_assert(!converts<std::uint8_t*, Fp8E4M3*> && !converts<std::uint8_t*, Fp8E5M2*>);
static_assert(!std::is_same_v<Fp16Code, Bf16Code> && !std::is_same_v<Fp8E4M3, Fp8E5M2>);
static_assert(!std::is_same_v<Fp16Code, std::uint16_t> && !std::is_same_v<Bf16Code, std::uint16_t>);
// Nor do the values convert (no converting constructors sneak in).
static_assert(!converts<Fp16Code, Bf16Code> && !converts<Bf16Code, Fp16Code>);
static_assert(!converts<std::uint16_t, Fp16Code> && !converts<Fp16Code, std::uint16_t>);

// Exactly their raw integers, so cudaMalloc(n * sizeof(code)) holds n codes.
static_assert(sizeof(Fp16Code) == 2 && sizeof(Bf16Code) == 2 && sizeof(Fp8E4M3) == 1 && sizeof(Fp8E5M2) == 1);
static_assert(alignof(Fp16Code) == 2 && alignof(Bf16Code) == 2 && alignof(Fp8E4M3) == 1 &&
              alignof(Fp8E5M2) == 1);

// --- the cast API: each accepts its own code and nothing else -------------

// NAME is a type name and CALL an expression placed inside decltype():
// parentheses would change neither, so the macro check is off here.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define MPT_ACCEPTS(NAME, CALL)                                    \
  template <class P, class = void>                                 \
  struct NAME : std::false_type {};                                \
  template <class P>                                               \
  struct NAME<P, std::void_t<decltype(CALL)>> : std::true_type {}; \
  template <class P>                                               \
  constexpr bool NAME##_v = NAME<P>::value;
// NOLINTEND(bugprone-macro-parentheses)

// P is the pointer type handed over where the codes go.
MPT_ACCEPTS(to_fp16,
            mpt::cuda::cast_fp32_to_fp16(std::declval<const float*>(), std::declval<P>(), std::size_t{}))
MPT_ACCEPTS(from_fp16, mpt::cuda::cast_fp16_to_fp32(std::declval<P>(), std::declval<float*>(), std::size_t{}))
MPT_ACCEPTS(to_bf16,
            mpt::cuda::cast_fp32_to_bf16(std::declval<const float*>(), std::declval<P>(), std::size_t{}))
MPT_ACCEPTS(from_bf16, mpt::cuda::cast_bf16_to_fp32(std::declval<P>(), std::declval<float*>(), std::size_t{}))
MPT_ACCEPTS(to_e4m3,
            mpt::cuda::cast_fp32_to_e4m3_sat(std::declval<const float*>(), std::declval<P>(), std::size_t{}))
MPT_ACCEPTS(from_e4m3, mpt::cuda::cast_e4m3_to_fp32(std::declval<P>(), std::declval<float*>(), std::size_t{}))
MPT_ACCEPTS(to_e5m2,
            mpt::cuda::cast_fp32_to_e5m2_sat(std::declval<const float*>(), std::declval<P>(), std::size_t{}))
MPT_ACCEPTS(from_e5m2, mpt::cuda::cast_e5m2_to_fp32(std::declval<P>(), std::declval<float*>(), std::size_t{}))
// gemm_fp16 with both operands of type P, FP32 output; and with fp16
// operands and an output of type P.
MPT_ACCEPTS(gemm_inputs, mpt::cuda::gemm_fp16(Trans::no, Trans::no, 1, 1, 1, std::declval<P>(),
                                              std::declval<P>(), std::declval<float*>()))
MPT_ACCEPTS(gemm_output, mpt::cuda::gemm_fp16(Trans::no, Trans::no, 1, 1, 1, std::declval<const Fp16Code*>(),
                                              std::declval<const Fp16Code*>(), std::declval<P>()))
#undef MPT_ACCEPTS

static_assert(to_fp16_v<Fp16Code*> && !to_fp16_v<Bf16Code*> && !to_fp16_v<std::uint16_t*>);
static_assert(from_fp16_v<const Fp16Code*> && from_fp16_v<Fp16Code*> && !from_fp16_v<const Bf16Code*> &&
              !from_fp16_v<const std::uint16_t*>);
static_assert(to_bf16_v<Bf16Code*> && !to_bf16_v<Fp16Code*> && !to_bf16_v<std::uint16_t*>);
static_assert(from_bf16_v<const Bf16Code*> && !from_bf16_v<const Fp16Code*> &&
              !from_bf16_v<const std::uint16_t*>);
static_assert(to_e4m3_v<Fp8E4M3*> && !to_e4m3_v<Fp8E5M2*> && !to_e4m3_v<std::uint8_t*>);
static_assert(from_e4m3_v<const Fp8E4M3*> && !from_e4m3_v<const Fp8E5M2*> &&
              !from_e4m3_v<const std::uint8_t*>);
static_assert(to_e5m2_v<Fp8E5M2*> && !to_e5m2_v<Fp8E4M3*> && !to_e5m2_v<std::uint8_t*>);
static_assert(from_e5m2_v<const Fp8E5M2*> && !from_e5m2_v<const Fp8E4M3*> &&
              !from_e5m2_v<const std::uint8_t*>);
static_assert(gemm_inputs_v<const Fp16Code*> && gemm_inputs_v<Fp16Code*> && !gemm_inputs_v<const Bf16Code*> &&
              !gemm_inputs_v<const std::uint16_t*>);
static_assert(gemm_output_v<float*> && gemm_output_v<Fp16Code*> && !gemm_output_v<Bf16Code*> &&
              !gemm_output_v<std::uint16_t*>);

// --- the scale update takes double factors ---------------------------------

// The exact signature: a float growth or backoff factor here would round a
// factor such as 0.3 before mpt::update_scale sees it (tests/cpu/
// test_ch02_scaler_math.cpp shows that the scale then drifts from the CPU's).
static_assert(std::is_same_v<decltype(&mpt::cuda::update_scale),
                             void (*)(float*, std::int32_t*, const float*, double, double, std::int32_t)>,
              "mpt::cuda::update_scale must take its factors as double");

}  // namespace

TEST_CASE("codes: no code pointer converts to another format's or to the raw integer") {
  CHECK_FALSE(converts<Fp16Code*, Bf16Code*>);
  CHECK_FALSE(converts<Bf16Code*, Fp16Code*>);
  CHECK_FALSE(converts<std::uint16_t*, Fp16Code*>);
  CHECK_FALSE(converts<Fp16Code*, std::uint16_t*>);
  CHECK_FALSE(converts<std::uint16_t*, Bf16Code*>);
  CHECK_FALSE(converts<Fp8E4M3*, Fp8E5M2*>);
  CHECK_FALSE(converts<std::uint8_t*, Fp8E4M3*>);
  CHECK(sizeof(Fp16Code) == 2);
  CHECK(sizeof(Bf16Code) == 2);
  CHECK(sizeof(Fp8E4M3) == 1);
  CHECK(sizeof(Fp8E5M2) == 1);
}

TEST_CASE("the cast and GEMM kernels accept their own codes only") {
  CHECK(to_fp16_v<Fp16Code*>);
  CHECK_FALSE(to_fp16_v<Bf16Code*>);
  CHECK_FALSE(to_fp16_v<std::uint16_t*>);
  CHECK(from_bf16_v<const Bf16Code*>);
  CHECK_FALSE(from_bf16_v<const Fp16Code*>);
  CHECK(to_e4m3_v<Fp8E4M3*>);
  CHECK_FALSE(to_e4m3_v<Fp8E5M2*>);
  CHECK_FALSE(to_e4m3_v<std::uint8_t*>);
  CHECK(gemm_inputs_v<const Fp16Code*>);
  CHECK_FALSE(gemm_inputs_v<const Bf16Code*>);
  CHECK_FALSE(gemm_inputs_v<const std::uint16_t*>);
  CHECK(gemm_output_v<Fp16Code*>);
  CHECK_FALSE(gemm_output_v<Bf16Code*>);
}

TEST_CASE("the device scale update takes double factors") {
  using Fn = void (*)(float*, std::int32_t*, const float*, double, double, std::int32_t);
  CHECK(std::is_same_v<decltype(&mpt::cuda::update_scale), Fn>);
}
