// Chapter 01 exercises — the adapter header: the student's specification.
// Depends on: mpt/format.hpp (mpt::Format, used by exercise 1.3).
// The grader includes this file and calls exactly these functions; the
// student writes them in ex01.cpp. Changing a signature breaks the grader.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mpt/formats/format.hpp"

/// Chapter 1 exercises: fp16 by hand, the smallest update that moves an
/// fp16 weight, how much of a tensor a format flushes to zero, and a
/// broken mean of squares to diagnose and fix.
namespace mpt::ex01 {

/// Exercise 1.1 — fp32 to fp16 by bit manipulation.
///
/// Returns the IEEE 754 binary16 bit pattern (sign, 5 exponent bits, 10
/// fraction bits) of `x` rounded to fp16 with round-to-nearest, ties to
/// even:
///
///  - a value exactly representable in fp16 gives its own code, and the sign
///    of zero is kept: +0.0f -> 0x0000, -0.0f -> 0x8000;
///  - otherwise the nearer of the two fp16 neighbours; on an exact tie the
///    neighbour whose last fraction bit is 0;
///  - gradual underflow: results below 2^-14 are fp16 subnormals, and a
///    value that rounds to zero gives a zero with the sign of `x`;
///  - overflow: a value whose rounded magnitude would exceed 65504 gives
///    infinity with the sign of `x` (0x7c00 or 0xfc00), and so do ±inf;
///  - NaN gives a quiet NaN: exponent field all ones and the top fraction
///    bit set (`(result & 0x7e00) == 0x7e00`); sign and payload are yours.
///
/// The point of the exercise is the bit manipulation: read the 32 bits of
/// `x` (std::memcpy into a std::uint32_t) and build the 16-bit result with
/// integer shifts, masks and adds. Do not convert through mpt's rounding
/// functions, _Float16, Eigen::half or F16C intrinsics: the grader uses
/// those as its reference.
std::uint16_t fp32_to_fp16_bits(float x);

/// Exercise 1.2 — the smallest update that changes an fp16 weight.
///
/// Precondition: `w` is a finite fp16 value (held in a float); the grader
/// calls it with every one of them, ±0 and the subnormals included.
///
/// Returns the smallest positive float `u` such that
///
///     fp16(w + u) != w
///
/// where `w + u` is the exact, real-number sum, rounded once, directly to
/// fp16 with round-to-nearest, ties to even (overflow to infinity counts as
/// a change). The comparison is by value, so +0 and -0 are equal: for
/// w = -0 the answer is the same as for w = +0.
///
/// Think about which neighbour of `w` the sum moves towards, how far away
/// it is, and what happens on an exact tie. Worked examples (the grader
/// checks all weights, not just these):
///
///  - w = 1 + 2^-10 (code 0x3c01, last bit odd): u = 2^-11 exactly, since
///    the tie 1 + 1.5 * 2^-10 goes to the even neighbour 1 + 2^-9;
///  - w = 65504 (the largest fp16 value): u = 16; 65520 rounds to infinity.
///
/// (Why "exact"? A GPU that adds in fp32 first rounds w + u to fp32 and then
/// to fp16 — two roundings, and a slightly different answer. See the
/// README's last section.)
float smallest_effective_update(float w);

/// Exercise 1.3 — the fraction of a tensor that a format flushes to zero.
///
/// Returns, for the n floats x[0], ..., x[n-1] and the format `f`,
///
///     (number of elements that are finite, nonzero, and whose
///      round-to-nearest-even value in f is ±0)  /  n
///
/// as a double; 0.0 when n == 0 (then `x` may be nullptr). The rounding keeps
/// subnormals (gradual underflow), as IEEE 754 does. Zeros, infinities and
/// NaNs are never counted as flushed, but they do count in n. `f` is any
/// format of mpt::all_formats() (fp32, tf32, bf16, fp16, e4m3, e5m2).
///
/// Derive what you need from the format's fields (f.spec: exponent_bits,
/// mantissa_bits, bias, emin(), ...) or from mpt::limits_of(f.spec). Do not
/// round the values with mpt::round_value, mpt::round_array, mpt::classify
/// or mpt::range_report: the grader uses those as its reference.
double flushed_fraction(const float* x, std::size_t n, const mpt::Format& f);

/// Exercise 1.4 — DIAGNOSE: the mean square of fp16 activations.
///
/// Not written from scratch: ex01.cpp comes with a body for this function
/// that compiles, runs, gives sensible numbers for some layers and has one
/// real mixed-precision bug. Find it and fix it, changing as little as you
/// can (README.md lists the symptoms the grader reports).
///
/// Precondition: x[0], ..., x[n-1] are fp16 values held in floats (the
/// activations of an fp16 layer, as a normalisation layer reads them);
/// n == 0 is allowed, then x may be nullptr.
///
/// Returns the mean of their squares, (x[0]^2 + ... + x[n-1]^2) / n, the
/// statistic RMSNorm and LayerNorm compute, computed as a GPU kernel does
/// with fp16 inputs: the arithmetic is FP32, each square a float product,
/// the squares added one by one, in index order, into a float accumulator,
/// and the sum divided by float(n); 0 when n == 0. The result is that
/// float, bit for bit.
float mean_square(const float* x, std::size_t n);

}  // namespace mpt::ex01
