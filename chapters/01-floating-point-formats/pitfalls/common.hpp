// Chapter 01 — floating-point formats and their limits: what the chapter's
// pitfalls share, and the declarations of their registry entries.
// Depends on: mpt/registry/pitfall.hpp (Check, Pitfall, RunResult),
// mpt/formats/format.hpp (Format); <cmath>, <cstdint>, <functional>,
// <random>, <string>.
//
// One file per pitfall, pitfalls/<id>.cpp: its broken run, its fixed run,
// their outcomes and its checks, ending with the function that returns its
// registry entry (declared here, called by pitfalls/register.cpp). What more
// than one pitfall uses is here and in common.cpp; the rest stays in its
// pitfall's file.
//
// Arithmetic follows what a GPU does: every operation is an fp32 operation,
// and a value is rounded to fp16/bf16 exactly where a GPU would store it in
// that format (all rounding goes through mpt::round_value and round_array). The `//! [id-broken]` / `//!
// [id-fixed]` markers in each pitfall's file delimit the code the chapter text shows (its snippet
// blocks, written by chapters/generate_common.sh).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>

#include "mpt/formats/format.hpp"
#include "mpt/registry/pitfall.hpp"

namespace mpt::ch01 {

// ---------------------------------------------------------------------------
// Small tools shared by the runs.

/// The fp16 format (format_named("fp16")).
const Format& fp16();
/// The fp32 format (format_named("fp32")).
const Format& fp32();

/// Unit roundoff u = 2^-p of a format: the largest relative error of one
/// round-to-nearest. Tolerances below are multiples of it, never typed in.
double unit_roundoff(const Format& f);

/// The spacing of f's values around |x|: 2^(max(e, emin) - mantissa_bits)
/// where 2^e <= |x| < 2^(e+1). Below the normal range the spacing stays at
/// the subnormal quantum.
double ulp_in(const Format& f, double x);

/// A number for generated text: up to 8 significant digits, so exact binary
/// values (0.03125) print exactly and long ones stay readable.
std::string num(double v);
/// An fp32 value: the shortest decimal that reads back as the same float
/// (0.01f prints as 0.01, not as its 8-digit expansion).
std::string num(float v);
/// A limit the way the mechanisms quote it: "2^-24" for a power of two, the
/// shortest decimal otherwise (power_of_two_or_decimal).
std::string p2(double x);

/// Deterministic random numbers that are the same on every platform.
/// std::mt19937_64's output sequence is fixed by the C++ standard, but the
/// std:: distributions are not (libstdc++ and libc++ differ), so the two
/// distributions used here are written out.
class Rng {
 public:
  /// An engine seeded with `seed`: the same seed, the same numbers.
  explicit Rng(std::uint64_t seed) : engine_(seed) {}
  /// Uniform in [0, 1): the top 53 bits of one draw, scaled by 2^-53.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1p-53; }
  /// Standard normal by Box–Muller (one of the pair; the other is dropped to
  /// keep each call independent of the previous one).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]: log(u1) is finite
    const double u2 = uniform();
    const double two_pi = 6.283185307179586476925286766559;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2);
  }
  /// +1 or -1 with equal probability.
  double sign() { return (engine_() >> 63) ? -1.0 : 1.0; }

 private:
  std::mt19937_64 engine_;
};

/// A check of an entry. Each check reads outcomes by name, so a renamed
/// outcome makes the check fail loudly instead of silently passing.
Check check(std::string claim, std::function<bool(const RunResult&)> holds);

// ---------------------------------------------------------------------------
// The chapter's registry entries, one per pitfalls/<id>.cpp, in the order
// pitfalls/register.cpp registers them.

/// fp16-overflow: the squares of large fp16 activations overflow, and so
/// does a norm computed from them.
Pitfall fp16_overflow_pitfall();
/// fp16-lost-update: a weight stored in fp16 ignores every update smaller
/// than half its ulp.
Pitfall fp16_lost_update_pitfall();
/// fp16-sum-stagnation: an fp16 accumulator stops growing once half its
/// spacing exceeds the addend.
Pitfall fp16_sum_stagnation_pitfall();
/// fp16-gradient-underflow: small gradients flush to zero in fp16; a loss
/// scale moves them into range.
Pitfall fp16_gradient_underflow_pitfall();
/// fp16-vs-bf16: the same tensor in both 16-bit formats, precision against
/// range.
Pitfall fp16_vs_bf16_pitfall();

}  // namespace mpt::ch01
