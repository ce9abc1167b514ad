// Chapter 02 — loss scaling and FP32 master weights: what the GEMM tests
// share — the contract written as the naive loop (one std::fma chain per
// output, k = 0..K-1, from +0), the shapes that cross every block boundary
// of the packed GEMM, and operands with inf, NaN, subnormals and -0.
// Depends on: mpt/nn/cpu/gemm.hpp (Op, the blocking), mpt/core/random.hpp (Rng).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "mpt/core/random.hpp"
#include "mpt/nn/cpu/gemm.hpp"

namespace gemm_cases {

using mpt::Op;

/// op(A) m × k and op(B) k × n, stored row-major as the Ops say, with
/// leading dimensions a few elements longer than a row (gemm_fma must use
/// them, not the row length).
template <typename T>
struct Operands {
  std::int64_t m = 0, n = 0, k = 0;
  Op op_a = Op::N, op_b = Op::N;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  std::vector<T> a, b;
  T at_a(std::int64_t i, std::int64_t p) const {
    return op_a == Op::N ? a[static_cast<std::size_t>(i * lda + p)]
                         : a[static_cast<std::size_t>(p * lda + i)];
  }
  T at_b(std::int64_t p, std::int64_t j) const {
    return op_b == Op::N ? b[static_cast<std::size_t>(p * ldb + j)]
                         : b[static_cast<std::size_t>(j * ldb + p)];
  }
  std::string name() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " " +
           (op_a == Op::N ? "N" : "T") + (op_b == Op::N ? "N" : "T");
  }
};

/// What the values are drawn from.
enum class Values {
  spread,   ///< normals times 2^e, e in [-12, 12]: every order of the sum rounds differently
  special,  ///< spread, with about one value in six inf, -inf, NaN, a subnormal, ±0 or ±max
};

template <typename T>
T draw(mpt::Rng& rng, Values v) {
  const T x = static_cast<T>(rng.normal() * std::ldexp(1.0, static_cast<int>(rng.below(25)) - 12));
  if (v == Values::spread || rng.below(6) != 0) return x;
  switch (rng.below(9)) {
    case 0: return std::numeric_limits<T>::infinity();
    case 1: return -std::numeric_limits<T>::infinity();
    case 2: return std::numeric_limits<T>::quiet_NaN();
    case 3: return std::numeric_limits<T>::denorm_min() * static_cast<T>(1 + rng.below(1000));
    case 4: return -std::numeric_limits<T>::min() / static_cast<T>(1 + rng.below(1000));
    case 5: return T(-0.0);
    case 6: return T(0.0);
    case 7: return std::numeric_limits<T>::max();
    default: return -std::numeric_limits<T>::max();
  }
}

template <typename T>
Operands<T> make(std::int64_t m, std::int64_t n, std::int64_t k, Op op_a, Op op_b, std::uint64_t seed,
                 Values v = Values::spread) {
  Operands<T> o;
  o.m = m, o.n = n, o.k = k, o.op_a = op_a, o.op_b = op_b;
  const std::int64_t ra = op_a == Op::N ? m : k, ca = op_a == Op::N ? k : m;
  const std::int64_t rb = op_b == Op::N ? k : n, cb = op_b == Op::N ? n : k;
  o.lda = ca + 3, o.ldb = cb + 5, o.ldc = n + 2;
  mpt::Rng rng(seed);
  o.a.resize(static_cast<std::size_t>(ra * o.lda));
  o.b.resize(static_cast<std::size_t>(rb * o.ldb));
  for (T& x : o.a) x = draw<T>(rng, v);
  for (T& x : o.b) x = draw<T>(rng, v);
  return o;
}

/// The contract, written as plainly as it can be: c[i][j] is the chain
/// acc = fma(op(A)[i][p], op(B)[p][j], acc) over p = 0..K-1 from +0.
/// `order` may reverse the chain (for the tests' check that their data can
/// tell orders apart).
template <typename T>
std::vector<T> naive(const Operands<T>& o, bool reversed = false) {
  std::vector<T> c(static_cast<std::size_t>(o.m * o.ldc), T(0));
  for (std::int64_t i = 0; i < o.m; ++i)
    for (std::int64_t j = 0; j < o.n; ++j) {
      T acc = T(0);
      for (std::int64_t q = 0; q < o.k; ++q) {
        const std::int64_t p = reversed ? o.k - 1 - q : q;
        acc = std::fma(o.at_a(i, p), o.at_b(p, j), acc);
      }
      c[static_cast<std::size_t>(i * o.ldc + j)] = acc;
    }
  return c;
}

/// gemm_fma on the operands, into a C whose padding and elements start as
/// NaN (an element the GEMM forgets shows).
template <typename T>
std::vector<T> run(const Operands<T>& o, mpt::Implementation impl) {
  std::vector<T> c(static_cast<std::size_t>(o.m * o.ldc), std::numeric_limits<T>::quiet_NaN());
  mpt::gemm_fma(o.m, o.n, o.k, o.a.data(), o.lda, o.op_a, o.b.data(), o.ldb, o.op_b, c.data(), o.ldc, impl);
  return c;
}

/// The bits of a float or double.
template <typename T>
auto bits(T v) {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  U u = 0;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

/// The number of the m × n elements whose bits differ (any NaN equals any
/// NaN: x86's FMA and a library fma may pass on different NaN payloads).
template <typename T>
std::int64_t differing(const Operands<T>& o, const std::vector<T>& x, const std::vector<T>& y) {
  std::int64_t d = 0;
  for (std::int64_t i = 0; i < o.m; ++i)
    for (std::int64_t j = 0; j < o.n; ++j) {
      const T u = x[static_cast<std::size_t>(i * o.ldc + j)], v = y[static_cast<std::size_t>(i * o.ldc + j)];
      if (std::isnan(u) && std::isnan(v)) continue;
      if (bits(u) != bits(v)) ++d;
    }
  return d;
}

/// Shapes {m, n, k}: odd sizes, K = 0, empty outputs, and shapes on both
/// sides of every block boundary of the packed GEMM: the register tile
/// (kGemmMR rows, kGemmNR columns), the k block kGemmKC (where the chains
/// continue from C), the row block kGemmMC and the column block kGemmNC.
inline std::vector<std::vector<std::int64_t>> shapes() {
  using mpt::kGemmKC, mpt::kGemmMC, mpt::kGemmMR, mpt::kGemmNC, mpt::kGemmNR;
  return {{1, 1, 1},
          {1, 7, 17},
          {7, 17, 33},
          {17, 33, 7},
          {33, 129, 1},
          {129, 7, 17},
          {kGemmMR, kGemmNR, 3},
          {kGemmMR - 1, kGemmNR - 1, 5},
          {kGemmMR + 1, kGemmNR + 1, kGemmKC - 1},
          {2 * kGemmMR, 2 * kGemmNR, kGemmKC},
          {13, 35, kGemmKC + 1},
          {7, 17, 2 * kGemmKC + 3},
          {kGemmMC + 1, 33, 2 * kGemmKC + 1},
          {kGemmMC, 18, 5},
          {7, kGemmNC + kGemmNR + 3, kGemmKC + 1},
          {3, 5, 0},
          {0, 5, 3},
          {5, 0, 3}};
}

}  // namespace gemm_cases
