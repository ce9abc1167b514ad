// Chapter 06 — exercises: grader tests for exercise 6.2 (the promote rule: one dtype for inputs that arrive
// in several). Depends on: grader.hpp; mpt's type promotion (as_arrives) and its AutocastPolicy on the CPU
// (where "cat" is on the promote list) are the reference. Five test cases: one dtype, and f32 winning (the
// only one a "larger bit width" answer passes); f16 with bf16; every list of one to five inputs; cat under
// CPU autocast, inside and outside a disabled region; bad input (one point).
#include <stdexcept>
#include <string>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex06;
using namespace mpt::ex06::grading;
using mpt::DType;

constexpr DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16;

}  // namespace

TEST_SUITE("exercise-6.2") {
  TEST_CASE("6.2 inputs of one dtype stay in it; an f32 input wins over f16 and bf16, wherever it is") {
    Mismatches m;
    expect_promote(m, {f32}, f32, "one f32 input");
    expect_promote(m, {f16}, f16, "one f16 input");
    expect_promote(m, {bf16}, bf16, "one bf16 input");
    expect_promote(m, {f16, f16, f16}, f16, "three f16 inputs");
    expect_promote(m, {bf16, bf16}, bf16, "two bf16 inputs");
    expect_promote(m, {f32, f32}, f32, "two f32 inputs");
    expect_promote(m, {f16, f32}, f32, "f16, then f32");
    expect_promote(m, {f32, f16}, f32, "f32, then f16");
    expect_promote(m, {bf16, f32}, f32, "bf16, then f32");
    expect_promote(m, {f32, bf16, bf16}, f32, "f32 first, then bf16 twice");
    expect_promote(m, {f16, f16, f16, f32}, f32, "f32 last of four");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("6.2 f16 with bf16 promotes to f32, not to either 16-bit dtype") {
    // torch.promote_types(torch.float16, torch.bfloat16) is torch.float32:
    // f16 cannot hold bf16's range (65504 at most), bf16 not f16's digits
    // (8 bits against 11). Both are 16 bits wide: "the wider one" has no
    // answer here.
    Mismatches m;
    expect_promote(m, {f16, bf16}, f32, "f16, then bf16");
    expect_promote(m, {bf16, f16}, f32, "bf16, then f16");
    expect_promote(m, {f16, f16, bf16}, f32, "two f16, then bf16");
    expect_promote(m, {bf16, bf16, bf16, f16}, f32, "three bf16, then f16");
    expect_promote(m, {bf16, f16, bf16, f16, bf16}, f32, "alternating");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("6.2 every list of one to five inputs, as mpt's type promotion") {
    // 3 + 9 + 27 + 81 + 243 lists.
    Mismatches m;
    for (std::size_t n = 1; n <= 5; ++n)
      for (const std::vector<DType>& inputs : all_lists(n))
        expect_promote(m, inputs, reference_promote(inputs), std::to_string(n) + " inputs");
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE(
      "6.2 torch.cat under CPU autocast bf16: as autocast casts it, and as it promotes where autocast is "
      "off") {
    // "cat" is on the CPU's promote list (autocast_mode.cpp's CPU
    // registrations): inside autocast bf16 it runs in the widest input;
    // inside head=autocast-off it runs as its inputs arrive, promoted. A mix
    // of f16 and bf16 is refused inside autocast (prioritize), not outside.
    const mpt::AutocastPolicy policy(mpt::AutocastDevice::cpu, bf16,
                                     {mpt::AutocastRegion{mpt::PathPattern("head"), false}});
    Mismatches m;
    for (std::size_t n = 1; n <= 4; ++n) {
      for (const std::vector<DType>& inputs : all_lists(n)) {
        bool has_f16 = false;
        for (DType d : inputs) has_f16 = has_f16 || d == f16;
        if (!has_f16)
          expect_promote(m, inputs, policy.decide(mpt::OpQuery{"cat", "block0.mlp", inputs}).input,
                         "cat inside autocast");
        expect_promote(m, inputs, policy.decide(mpt::OpQuery{"cat", "head.proj", inputs}).input,
                       "cat where autocast is off");
      }
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE("6.2 no input, or an FP8 input, throws std::invalid_argument [1 point]") {
    CHECK_THROWS_AS(promote_dtypes({}), std::invalid_argument);
    CHECK_THROWS_AS(promote_dtypes({DType::e4m3}), std::invalid_argument);
    CHECK_THROWS_AS(promote_dtypes({f16, DType::e5m2}), std::invalid_argument);
    CHECK_THROWS_AS(promote_dtypes({DType::e4m3, f32}), std::invalid_argument);
    CHECK_THROWS_AS(promote_dtypes({bf16, bf16, DType::e5m2, f16}), std::invalid_argument);
  }
}  // TEST_SUITE
