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
  /// The whole state of a generator, for checkpoints: the SplitMix64 word
  /// and the second normal of the last Box–Muller pair, when one is pending.
  struct State {
    std::uint64_t word = 0;  ///< the SplitMix64 state
    bool has_spare = false;  ///< whether the next normal() returns `spare`
    double spare = 0.0;      ///< the pending normal (0 when none)
  };
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
  /// The exact state: a generator given it by set_state() continues with
  /// the same numbers, normals included.
  State state() const { return {state_, has_spare_, has_spare_ ? spare_ : 0.0}; }
  /// Continue from `s` (from state()). Throws std::invalid_argument for a
  /// pending spare that is not finite, or a spare given without a pending one.
  void set_state(const State& s);

 private:
  std::uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace mpt
