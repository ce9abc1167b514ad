// Chapter 02 — loss scaling and FP32 master weights.
// Depends on: random.hpp.
#include "mpt/core/random.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace mpt {

std::uint64_t Rng::next_u64() {
  // SplitMix64 (Steele, Lea, Flood 2014): a Weyl sequence through a mixer.
  std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double Rng::uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  // 1 - uniform() is in (0, 1], so the log is finite.
  const double r = std::sqrt(-2.0 * std::log(1.0 - uniform()));
  const double theta = 6.283185307179586 * uniform();
  spare_ = r * std::sin(theta);
  has_spare_ = true;
  return r * std::cos(theta);
}

std::uint64_t Rng::below(std::uint64_t n) {
  if (n == 0) throw std::invalid_argument("Rng::below(0): the range is empty");
  // Reject the top partial copy of [0, n) so every residue is equally likely.
  const std::uint64_t limit =
      std::numeric_limits<std::uint64_t>::max() - std::numeric_limits<std::uint64_t>::max() % n;
  std::uint64_t v;
  do v = next_u64();
  while (v >= limit);
  return v % n;
}

void Rng::set_state(const State& s) {
  if (s.has_spare && !std::isfinite(s.spare))
    throw std::invalid_argument(
        "Rng state: the pending normal is not finite; a saved state holds a finite one");
  if (!s.has_spare && s.spare != 0.0)
    throw std::invalid_argument(
        "Rng state: a spare normal without a pending one; a saved state holds 0 there");
  state_ = s.word;
  has_spare_ = s.has_spare;
  spare_ = s.spare;
}

}  // namespace mpt
