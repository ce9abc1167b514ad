// Chapter 02 — loss scaling and FP32 master weights.
// Depends on: the standard library only.
//
// The project's seeded random generator (synthetic data, initial weights,
// the scaler simulation's overflow draws): the same numbers on every
// platform and standard library.
#pragma once

#include <cstdint>

namespace mpt {

/// A seeded random generator that gives the same numbers on every platform
/// (std:: distributions do not: their algorithms are left to the library).
/// SplitMix64 for the bits; uniform doubles from the top 53 bits; normals by
/// Box–Muller (`std::log`, `std::sqrt`, `std::cos`: equal on glibc builds, within an
/// ulp elsewhere).
class Rng {
 public:
  /// A generator whose whole state is `seed`.
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  /// The next 64 random bits (SplitMix64).
  std::uint64_t next_u64();
  /// Uniform in [0, 1): 53 random bits.
  double uniform();
  /// Uniform in [lo, hi).
  double uniform(double lo, double hi);
  /// Standard normal (mean 0, variance 1).
  double normal();
  /// Uniform integer in [0, n), without modulo bias; n must be > 0.
  std::uint64_t below(std::uint64_t n);

 private:
  std::uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace mpt
