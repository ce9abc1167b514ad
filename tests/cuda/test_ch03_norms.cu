// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the CUDA
// kernels (kernels/nn/norms.cu) against the library's layers, mpt::BatchNorm
// and mpt::LayerNorm, run on the same inputs in the same dtypes.
// Depends on: mpt (the layers, Tensor, Context, Policy, the format
// descriptors), mpt::kernels (kernels/nn/nn_kernels.hpp), gpu_test_support.hpp.
// Without a usable GPU it exits 77 (CTest: Skipped).
//
// Every case runs once per poison of kPoisonBytes (outputs and seven guard
// elements behind each are poisoned first, so a skipped write or one past
// the end fails), in each pair of dtypes (X for x, y, dy, dx; P for the
// parameters and the running estimates), on random and adversarial inputs:
// a mean of 1000 with a spread of 1, constant and near-constant channels
// (variance 0 and a few ulps), |x| >= 256, f16's ±max beside its subnormals,
// and an inf, a -inf and a NaN.
//
// What must be equal bit for bit (same operations on the same values; the
// kernels are compiled without FMA contraction, like the CPU's float code):
//  - eval-mode BatchNorm forward, and its backward dx with fixed statistics;
//  - y of a training forward, recomputed on the host from the kernel's own
//    mean and invstd with norm_math's formulas and rounded by mpt's Tensor
//    writes; dx of BatchNorm's backward recomputed from the kernel's own
//    Σdy and Σdy·x̂ (dbias, dweight);
//  - LayerNorm's dweight and dbias against a host model of the order each
//    version states (nn_kernels.hpp): the CPU layer's FP32 terms, added row
//    by row (simple), or row by row within chunks of 64 rows, the chunks'
//    partial sums then in chunk order (fast). Not against the CPU layer's
//    bits: its order is the simple version's today, but a CPU that sums
//    differently (or more accurately) is held to the bound below instead.
//
// What may differ, and by how much. The reduction order differs (the CPU
// adds the values of a channel one after the other, the GPU 256 threads
// each a strided share, then a tree of merges), so statistics and sums may
// differ in their last bits. The tolerances are first-order worst-case
// bounds from the count n and FP32's unit roundoff u = 2^-24, for each side
// against the exact value (computed in double from the same inputs) and
// doubled for the difference of the two sides:
//  - a sum of n terms t in any order of additions (BatchNorm's Σdy and
//    Σdy·x̂, LayerNorm's dweight and dbias against the CPU layer's): γ(n + 8)·Σ|t|, with
//    γ(k) = k·u/(1 − k·u) (Higham, Accuracy and Stability of Numerical
//    Algorithms, 2nd ed., §4.2; the GPU's path is ⌈n/256⌉ + 8 additions
//    deep, the CPU's n − 1);
//  - Welford's mean, merged by Chan's formula: (n + 80)·u·max|x| (each step
//    rounds the mean once, relative u, and errors of earlier steps are
//    averaged down by later ones; each of the GPU's ≤ 10 merge levels adds
//    at most 7 u·max|x|);
//  - its M2 = Σ(x − mean)²: 2·(n + 80)·u·κ·M2 with κ = √(Σx² / M2), the
//    condition number of the variance (Chan, Golub and LeVeque, "Algorithms
//    for computing the sample variance", The American Statistician 37, 1983:
//    n·κ·u for the updating algorithm, log2(n)·κ·u for pairwise merging;
//    the factor 2 covers the constants the first-order bound drops);
//  - everything computed from those (invstd, the running estimates, y, dx)
//    by propagating the bounds through its formula, plus a few u for its
//    own roundings, plus one ulp of the storage dtype for the final
//    rounding (the two sides may land on either side of a rounding
//    boundary): outputs stored in f16 agree within one f16 ulp wherever the
//    statistics agree to well under half of one.
// Each check prints the worst ratio of error to tolerance it saw.
#define DOCTEST_CONFIG_IMPLEMENT
// The CPU layers bring Eigen (mpt's Tensor). Nothing of Eigen runs on the
// device here: read it as the plain C++ the library was compiled against,
// without its CUDA annotations (which nvcc warns about).
#define EIGEN_NO_CUDA
#include "gpu_test_support.hpp"
#include "kernels/nn/nn_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/layers/layer_norm.hpp"
#include "mpt/nn/layers/norm_math.hpp"

namespace {

using mpt::Bf16Code;
using mpt::DType;
using mpt::Fp16Code;
using mpt::Shape;
using mpt::Tensor;
using mpt::cuda::NormVersion;
using mpt::test::DeviceArray;
using VecF = std::vector<float>;
using VecD = std::vector<double>;

constexpr double kU = 0x1p-24;  // FP32's unit roundoff
constexpr std::size_t kGuard = 7;
constexpr float kEps = 1e-5f;

// --- storage types -------------------------------------------------------------------

template <class T>
DType dtype_of();
template <>
DType dtype_of<float>() {
  return DType::f32;
}
template <>
DType dtype_of<Fp16Code>() {
  return DType::f16;
}
template <>
DType dtype_of<Bf16Code>() {
  return DType::bf16;
}

/// A tensor's elements as the kernels' element type (the same bytes).
template <class T>
std::vector<T> codes_of(const Tensor& t) {
  REQUIRE(t.dtype() == dtype_of<T>());
  std::vector<T> v(static_cast<std::size_t>(t.numel()));
  if (!v.empty()) std::memcpy(v.data(), t.raw(), t.bytes());
  return v;
}

/// Elements of type T widened to float (exact), by the library's loader.
template <class T>
VecF widen(const std::vector<T>& v, std::size_t n) {
  VecF out(n);
  if (n) mpt::load_from(dtype_of<T>(), v.data(), out.data(), n);
  return out;
}

/// Floats rounded into T by the library's store (what every Tensor write does).
template <class T>
VecF round_into(const VecF& v) {
  std::vector<T> codes(v.size());
  if (!v.empty()) mpt::store_as(dtype_of<T>(), v.data(), codes.data(), v.size());
  return widen(codes, v.size());
}

/// The spacing of dtype d's values at magnitude |v|.
double ulp_in(DType d, double v) {
  const mpt::FormatSpec& s = mpt::format_of(d).spec;
  const int e = (v == 0 || !std::isfinite(v)) ? s.emin() : std::max(std::ilogb(v), s.emin());
  return std::ldexp(1.0, e - s.mantissa_bits);
}

const char* version_name(NormVersion v) { return v == NormVersion::simple ? "simple" : "fast"; }
/// Every version: each case runs with both.
constexpr NormVersion kVersions[] = {NormVersion::simple, NormVersion::fast};

/// The bits of a float.
std::uint32_t bits(float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

/// γ(k) = k·u / (1 − k·u): Higham's bound on k roundings.
double gamma_n(double k) { return k * kU / (1.0 - k * kU); }

/// n elements of T on the device followed by kGuard guard elements, all poisoned.
template <class T>
struct Out {
  Out(std::size_t n, unsigned char poison) : n(n), poison(poison), d(n + kGuard) { d.poison(poison); }
  /// The n outputs (the guards are checked into `bad`).
  std::vector<T> get(std::size_t& bad, const std::string& label, const char* what) const {
    std::vector<T> all = d.download();
    const T p = mpt::test::poison_value<T>(poison);
    for (std::size_t i = n; i < n + kGuard; ++i)
      if (std::memcmp(&all[i], &p, sizeof(T)) != 0 && bad++ < 5)
        std::printf("%s: %s: guard element %zu was written\n", label.c_str(), what, i - n);
    all.resize(n);
    return all;
  }
  T* ptr() const { return d.get(); }
  std::size_t n;
  unsigned char poison;
  DeviceArray<T> d;
};

/// Values uploaded into n elements followed by kGuard poisoned guards (for
/// arrays updated in place: the running estimates).
template <class T>
struct InOut : Out<T> {
  InOut(const std::vector<T>& v, unsigned char poison) : Out<T>(v.size(), poison) {
    std::vector<T> all(v);
    all.resize(v.size() + kGuard, mpt::test::poison_value<T>(poison));
    mpt::test::cuda_ok(cudaMemcpy(this->d.get(), all.data(), all.size() * sizeof(T), cudaMemcpyHostToDevice),
                       "upload");
  }
};

// --- comparing -------------------------------------------------------------------------

/// Mismatch counting and the worst error/tolerance ratio, llm.c style: the
/// first five mismatches of a case are printed.
struct Compare {
  std::string label;
  std::size_t bad = 0;
  double* worst = nullptr;  // the test case's worst ratio, updated

  void fail(const char* what, std::size_t i, double got, double want, double tol) {
    if (bad++ < 5)
      std::printf("%s: %s[%zu] got %.9g want %.9g (tolerance %.3g)\n", label.c_str(), what, i, got, want,
                  tol);
  }
  /// |got − want| <= tol for finite values; NaN only against NaN, ±inf only
  /// against the same inf.
  void close(const char* what, std::size_t i, double got, double want, double tol) {
    if (std::isnan(got) || std::isnan(want)) {
      if (!(std::isnan(got) && std::isnan(want))) fail(what, i, got, want, tol);
      return;
    }
    if (std::isinf(got) || std::isinf(want)) {
      if (got != want) fail(what, i, got, want, tol);
      return;
    }
    const double err = std::fabs(got - want);
    if (!(err <= tol)) fail(what, i, got, want, tol);
    if (worst && tol > 0 && std::isfinite(tol)) *worst = std::max(*worst, err / tol);
  }
  /// The same value (NaN: any NaN).
  void same(const char* what, std::size_t i, float got, float want) {
    if (!mpt::test::same_float(want, got)) fail(what, i, got, want, 0);
  }
  /// Both not finite (a statistic of a channel holding inf or NaN: whether
  /// it is inf or NaN depends on where in the order the inf was met).
  void both_nonfinite(const char* what, std::size_t i, double got, double want) {
    if (std::isfinite(got) || std::isfinite(want)) fail(what, i, got, want, 0);
  }
};

// --- inputs --------------------------------------------------------------------------------

enum class Inputs { normal, mean_1000, constant, large, extremes, nonfinite };
const char* inputs_name(Inputs k) {
  switch (k) {
    case Inputs::normal: return "normal";
    case Inputs::mean_1000: return "mean 1000 std 1";
    case Inputs::constant: return "constant and near-constant";
    case Inputs::large: return "|x| >= 256";
    case Inputs::extremes: return "f16's max and subnormals";
    case Inputs::nonfinite: return "inf, -inf, NaN";
  }
  return "?";
}

/// The value of element (n, c, i) of channel (or row) c, before rounding into X.
/// `j` counts the values of the channel.
float input_value(Inputs k, std::int64_t c, std::int64_t j, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  switch (k) {
    case Inputs::normal: return 0.5f + 1.5f * normal(rng);
    case Inputs::mean_1000: return 1000.0f + normal(rng);
    case Inputs::constant:
      // Even channels: one value (variance exactly 0); odd channels: the
      // same value with every 5th one a step of 2^-6 up (variance tiny
      // next to the mean², representable in every X).
      return c % 2 == 0 ? 3.25f : 3.25f + (j % 5 == 0 ? 0x1p-6f : 0.0f);
    case Inputs::large: {
      const float sign = rng() % 2 ? 1.0f : -1.0f;
      return sign * (256.0f + 6000.0f * std::fabs(normal(rng)));
    }
    case Inputs::extremes: {
      // ±65504 (f16's largest; 65536 in bf16) next to f16 subnormals k·2^-24:
      // the variance near 2^32, dx near f16's subnormal range.
      const float sign = rng() % 2 ? 1.0f : -1.0f;
      return sign * (rng() % 2 ? 65504.0f : static_cast<float>(1 + rng() % 1023) * 0x1p-24f);
    }
    case Inputs::nonfinite: {
      const float inf = std::numeric_limits<float>::infinity();
      if (j == 1 && c == 0) return inf;
      if (j == 0 && c == 1) return std::numeric_limits<float>::quiet_NaN();
      if (j == 2 && c == 2) return -inf;
      return 0.5f + 1.5f * normal(rng);
    }
  }
  return 0.0f;
}

VecF normal_values(std::size_t n, float mean, float sd, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(mean, sd);
  VecF v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

/// A policy with X for the activations and P for the parameters, statistics in f32.
class PairPolicy final : public mpt::Policy {
 public:
  PairPolicy(DType x, DType p) : x_(x), p_(p) {}
  std::string describe() const override { return "pair"; }

 protected:
  mpt::OpPrecision decide_op(const mpt::OpInfo&, const mpt::OpQuery&) const override {
    return {x_, DType::f32, x_};
  }
  DType parameter_dtype_of(const mpt::OpInfo&, std::string_view) const override { return p_; }

 private:
  DType x_, p_;
};

// --- per-channel truth and bounds (FP64) --------------------------------------------------

/// The exact statistics of one channel's (widened) values, and the bounds of
/// the header on one side's FP32 statistics.
struct Truth {
  double n = 0, mean = 0, m2 = 0, sumsq = 0, amax = 0;
  bool finite = true;
  double mean_bound() const { return (n + 80) * kU * amax; }
  double m2_bound() const { return 2 * (n + 80) * kU * std::sqrt(m2 * sumsq); }
  double var() const { return m2 / n; }
  double invstd(float eps) const { return 1.0 / std::sqrt(var() + eps); }
  /// One side's invstd bound: the variance's interval through 1/√(v + eps),
  /// plus the rounding of the division, the eps addition, the square root
  /// and the division.
  double invstd_bound(float eps) const {
    const double v = var() + eps, dv = m2_bound() / n + kU * var();
    if (v - dv <= 0) return std::numeric_limits<double>::infinity();
    const double inv = 1.0 / std::sqrt(v);
    return std::max(1.0 / std::sqrt(v - dv) - inv, inv - 1.0 / std::sqrt(v + dv)) + 4 * kU * inv;
  }
};

/// Two-pass double statistics of every channel c over the (outer, channels, inner) layout.
std::vector<Truth> truth_of(const VecF& x, const mpt::norm_math::Layout& l) {
  std::vector<Truth> t(static_cast<std::size_t>(l.channels));
  for (std::int64_t c = 0; c < l.channels; ++c) {
    Truth& s = t[static_cast<std::size_t>(c)];
    s.n = static_cast<double>(l.count());
    double sum = 0;
    for (std::int64_t n = 0; n < l.outer; ++n)
      for (std::int64_t i = 0; i < l.inner; ++i) {
        const double v = x[static_cast<std::size_t>(l.offset(n, c, i))];
        s.finite = s.finite && std::isfinite(v);
        sum += v;
        s.sumsq += v * v;
        s.amax = std::max(s.amax, std::fabs(v));
      }
    s.mean = sum / s.n;
    for (std::int64_t n = 0; n < l.outer; ++n)
      for (std::int64_t i = 0; i < l.inner; ++i) {
        const double d = x[static_cast<std::size_t>(l.offset(n, c, i))] - s.mean;
        s.m2 += d * d;
      }
  }
  return t;
}

/// The worst ratios of error to tolerance over a test case, printed at its end.
struct Worst {
  double stats = 0, running = 0, y = 0, grads = 0, dx = 0;
  void print(const char* what) const {
    std::printf(
        "%s: worst error/tolerance: statistics %.3g, running %.3g, y %.3g, dweight/dbias %.3g, dx %.3g\n",
        what, stats, running, y, grads, dx);
  }
};

/// y of one side against the other: one ulp of X at the larger value, the
/// statistics' bounds propagated through (x − mean)·invstd·γ + β, and the
/// roundings of the three operations on each side.
double y_tolerance(DType x_dtype, double x, double got, double want, const Truth& t, float eps, double w,
                   double b) {
  const double dm = 2 * t.mean_bound(), di = 2 * t.invstd_bound(eps), inv = t.invstd(eps);
  const double dev = std::fabs(x - t.mean) + dm, xhat = dev * (inv + di);
  return ulp_in(x_dtype, std::max(std::fabs(got), std::fabs(want))) +
         std::fabs(w) * (inv * dm + dev * di + dm * di) + 8 * kU * (xhat * std::fabs(w) + std::fabs(b));
}

/// One BatchNorm training forward and backward.
struct BnCase {
  Shape shape;
  Inputs kind = Inputs::normal;
  bool affine = true, track = true;
  std::optional<double> momentum = 0.1;
  int forwards = 1;  // training forwards in a row (the cumulative average needs several)
  float eps = kEps;
};

std::string case_label(const char* what, const Shape& s, Inputs k, DType x, DType p) {
  return std::string(what) + " " + mpt::shape_string(s) + " " + inputs_name(k) + " x " +
         std::string(mpt::dtype_name(x)) + " params " + std::string(mpt::dtype_name(p));
}

mpt::norm_math::Layout bn_layout(const Shape& s) {
  mpt::norm_math::Layout l{s[0], s[1], 1};
  for (std::size_t d = 2; d < s.size(); ++d) l.inner *= s[d];
  return l;
}

/// x for a BatchNorm of this layout and kind (before rounding into X).
VecF bn_inputs(const mpt::norm_math::Layout& l, Inputs k, std::mt19937_64& rng) {
  VecF x(static_cast<std::size_t>(l.numel()));
  for (std::int64_t c = 0; c < l.channels; ++c)
    for (std::int64_t n = 0; n < l.outer; ++n)
      for (std::int64_t i = 0; i < l.inner; ++i)
        x[static_cast<std::size_t>(l.offset(n, c, i))] = input_value(k, c, n * l.inner + i, rng);
  return x;
}

template <class X, class P>
void check_batch_norm_train(const BnCase& k, std::mt19937_64& rng, Worst& worst) {
  const DType xd = dtype_of<X>(), pd = dtype_of<P>();
  const mpt::norm_math::Layout l = bn_layout(k.shape);
  const auto C = static_cast<std::size_t>(l.channels), N = static_cast<std::size_t>(l.numel());
  const std::string base = case_label("batch_norm train", k.shape, k.kind, xd, pd) +
                           (k.affine ? "" : " no affine") + (k.track ? "" : " no running stats") +
                           (k.momentum ? "" : " cumulative") + (k.eps == 0 ? " eps 0" : "");
  const VecF w = normal_values(C, 1.0f, 0.5f, rng), b = normal_values(C, 0.0f, 1.0f, rng);
  const VecF rm = normal_values(C, 0.0f, 1.0f, rng);
  VecF rv(C);
  for (float& v : rv) v = 0.5f + static_cast<float>(rng() % 1000) / 640.0f;

  // The CPU layer, in the policy's dtypes.
  const auto policy = std::make_shared<PairPolicy>(xd, pd);
  mpt::Context ctx(policy);
  mpt::BatchNorm::Options o;
  o.eps = k.eps;
  o.momentum = k.momentum;
  o.affine = k.affine;
  o.track_running_stats = k.track;
  mpt::BatchNorm bn(static_cast<int>(C), o);
  bn.set_path("bn");
  const auto c64 = static_cast<std::int64_t>(C);
  if (k.affine) {
    bn.weight = mpt::Parameter("bn.weight", Tensor::from_f32(w.data(), {c64}, DType::f32));
    bn.bias = mpt::Parameter("bn.bias", Tensor::from_f32(b.data(), {c64}, DType::f32));
  }
  if (k.track) {
    bn.running_mean = Tensor::from_f32(rm.data(), {c64}, DType::f32);
    bn.running_var = Tensor::from_f32(rv.data(), {c64}, DType::f32);
  }
  bn.apply_policy(*policy);
  const std::vector<P> w_codes = k.affine ? codes_of<P>(bn.weight.weights()) : std::vector<P>{};
  const std::vector<P> b_codes = k.affine ? codes_of<P>(bn.bias.weights()) : std::vector<P>{};
  const VecF wf = k.affine ? widen(w_codes, C) : VecF(C, 1.0f),
             bf = k.affine ? widen(b_codes, C) : VecF(C, 0.0f);

  Tensor xt, y_cpu;
  for (int f = 0; f < k.forwards; ++f) {
    xt = Tensor::from_f32(bn_inputs(l, k.kind, rng).data(), k.shape, xd);
    const std::vector<X> x_codes = codes_of<X>(xt);
    const VecF xf = widen(x_codes, N);
    const std::vector<Truth> truth = truth_of(xf, l);
    const std::vector<P> rm_before = k.track ? codes_of<P>(bn.running_mean) : std::vector<P>{};
    const std::vector<P> rv_before = k.track ? codes_of<P>(bn.running_var) : std::vector<P>{};
    y_cpu = bn.forward(xt, ctx);
    // PyTorch's factor: momentum, or 1/num_batches_tracked after the increment.
    const auto m =
        static_cast<float>(k.momentum ? *k.momentum : 1.0 / static_cast<double>(bn.num_batches_tracked));
    const VecF yc = widen(codes_of<X>(y_cpu), N);
    const VecF mean_c = widen(codes_of<float>(bn.mean()), C), inv_c = widen(codes_of<float>(bn.invstd()), C);
    const VecF rm_c = k.track ? widen(codes_of<P>(bn.running_mean), C) : VecF{};
    const VecF rv_c = k.track ? widen(codes_of<P>(bn.running_var), C) : VecF{};
    const VecF rm_old = k.track ? widen(rm_before, C) : VecF{},
               rv_old = k.track ? widen(rv_before, C) : VecF{};

    for (NormVersion v : kVersions)
      for (unsigned char poison : mpt::test::kPoisonBytes) {
        Compare cmp{base + " forward " + std::to_string(f) + ", " + version_name(v) + ", poison " +
                        std::to_string(poison),
                    0, nullptr};
        DeviceArray<X> d_x(x_codes);
        DeviceArray<P> d_w(k.affine ? w_codes : std::vector<P>(1)),
            d_b(k.affine ? b_codes : std::vector<P>(1));
        Out<X> d_y(N, poison);
        Out<float> d_mean(C, poison), d_inv(C, poison);
        InOut<P> d_rm(k.track ? rm_before : std::vector<P>{}, poison),
            d_rv(k.track ? rv_before : std::vector<P>{}, poison);
        mpt::cuda::batch_norm_forward_train(l.outer, l.channels, l.inner, d_x.get(),
                                            k.affine ? d_w.get() : nullptr, k.affine ? d_b.get() : nullptr,
                                            k.track ? d_rm.ptr() : nullptr, k.track ? d_rv.ptr() : nullptr, m,
                                            k.eps, d_y.ptr(), d_mean.ptr(), d_inv.ptr(), v);
        const VecF yg = widen(d_y.get(cmp.bad, cmp.label, "y"), N);
        const VecF mean_g = d_mean.get(cmp.bad, cmp.label, "mean"),
                   inv_g = d_inv.get(cmp.bad, cmp.label, "invstd");
        const VecF rm_g = k.track ? widen(d_rm.get(cmp.bad, cmp.label, "running_mean"), C) : VecF{};
        const VecF rv_g = k.track ? widen(d_rv.get(cmp.bad, cmp.label, "running_var"), C) : VecF{};

        // Statistics and running estimates against the CPU layer's.
        cmp.worst = &worst.stats;
        for (std::size_t c = 0; c < C; ++c) {
          const Truth& t = truth[c];
          if (!t.finite) {
            cmp.both_nonfinite("mean", c, mean_g[c], mean_c[c]);
            cmp.close("invstd", c, inv_g[c], inv_c[c], 0);  // NaN on both sides
            continue;
          }
          cmp.close("mean", c, mean_g[c], mean_c[c], 2 * t.mean_bound());
          cmp.close("invstd", c, inv_g[c], inv_c[c], 2 * t.invstd_bound(k.eps));
        }
        if (k.track) {
          cmp.worst = &worst.running;
          for (std::size_t c = 0; c < C; ++c) {
            const Truth& t = truth[c];
            if (!t.finite) {
              cmp.both_nonfinite("running_mean", c, rm_g[c], rm_c[c]);
              cmp.close("running_var", c, rv_g[c], rv_c[c], 0);  // NaN on both sides
              continue;
            }
            const double unbiased = t.m2 / (t.n - 1), dunb = t.m2_bound() / (t.n - 1) + kU * unbiased;
            const double tol_m =
                2 * (m * t.mean_bound() +
                     4 * kU * ((1 - m) * std::fabs(rm_old[c]) + m * (std::fabs(t.mean) + t.mean_bound())));
            const double tol_v =
                2 * (m * dunb + 4 * kU * ((1 - m) * std::fabs(rv_old[c]) + m * (unbiased + dunb)));
            cmp.close("running_mean", c, rm_g[c], rm_c[c],
                      tol_m + ulp_in(pd, std::max(std::fabs(rm_g[c]), std::fabs(rm_c[c]))));
            cmp.close("running_var", c, rv_g[c], rv_c[c],
                      tol_v + ulp_in(pd, std::max(std::fabs(rv_g[c]), std::fabs(rv_c[c]))));
          }
        }
        // y: the CPU layer's within the tolerance, and the host formulas on the
        // kernel's own statistics bit for bit.
        cmp.worst = &worst.y;
        VecF y_host(N);
        for (std::int64_t n = 0; n < l.outer; ++n)
          for (std::int64_t c = 0; c < l.channels; ++c)
            for (std::int64_t i = 0; i < l.inner; ++i) {
              const auto e = static_cast<std::size_t>(l.offset(n, c, i)), cc = static_cast<std::size_t>(c);
              y_host[e] = mpt::norm_math::scale_shift(mpt::norm_math::normalize(xf[e], mean_g[cc], inv_g[cc]),
                                                      wf[cc], bf[cc]);
              const Truth& t = truth[cc];
              if (t.finite)
                cmp.close("y", e, yg[e], yc[e],
                          y_tolerance(xd, xf[e], yg[e], yc[e], t, k.eps, wf[cc], bf[cc]));
              else cmp.close("y", e, yg[e], yc[e], 0);  // NaN on both sides
            }
        const VecF y_host_x = round_into<X>(y_host);
        for (std::size_t e = 0; e < N; ++e) cmp.same("y from the kernel's statistics", e, yg[e], y_host_x[e]);
        CHECK_MESSAGE(cmp.bad == 0, cmp.label, ": ", cmp.bad, " mismatches");
      }
  }

  // Backward from the last forward, on the CPU layer's statistics: the terms
  // dy·x̂ are then the same on both sides, only their order of addition differs.
  const VecF dyv = normal_values(N, 0.0f, 1.0f, rng);
  const Tensor dyt = Tensor::from_f32(dyv.data(), k.shape, xd);
  const Tensor dx_cpu = bn.backward(dyt, ctx);
  const std::vector<X> x_codes = codes_of<X>(xt), dy_codes = codes_of<X>(dyt);
  const VecF xf = widen(x_codes, N), dyf = widen(dy_codes, N), dxc = widen(codes_of<X>(dx_cpu), N);
  const VecF mean_c = widen(codes_of<float>(bn.mean()), C), inv_c = widen(codes_of<float>(bn.invstd()), C);
  const VecF dw_c = k.affine ? widen(codes_of<float>(bn.weight.grad), C) : VecF{};
  const VecF db_c = k.affine ? widen(codes_of<float>(bn.bias.grad), C) : VecF{};
  // The sums in double, with their absolute sums for the bounds.
  VecD s_dy(C), s_dyx(C), a_dy(C), a_dyx(C), a_g(C), a_gx(C), xhat(N);
  for (std::int64_t n = 0; n < l.outer; ++n)
    for (std::int64_t c = 0; c < l.channels; ++c)
      for (std::int64_t i = 0; i < l.inner; ++i) {
        const auto e = static_cast<std::size_t>(l.offset(n, c, i)), cc = static_cast<std::size_t>(c);
        xhat[e] = (static_cast<double>(xf[e]) - mean_c[cc]) * inv_c[cc];
        s_dy[cc] += dyf[e];
        s_dyx[cc] += dyf[e] * xhat[e];
        a_dy[cc] += std::fabs(dyf[e]);
        a_dyx[cc] += std::fabs(dyf[e] * xhat[e]);
        a_g[cc] += std::fabs(wf[cc] * dyf[e]);
        a_gx[cc] += std::fabs(wf[cc] * dyf[e] * xhat[e]);
      }
  const double count = static_cast<double>(l.count());
  for (NormVersion v : kVersions)
    for (unsigned char poison : mpt::test::kPoisonBytes) {
      Compare cmp{base + " backward, " + version_name(v) + ", poison " + std::to_string(poison), 0, nullptr};
      DeviceArray<X> d_x(x_codes), d_dy(dy_codes);
      DeviceArray<float> d_mean(mean_c), d_inv(inv_c);
      DeviceArray<P> d_w(k.affine ? w_codes : std::vector<P>(1));
      Out<X> d_dx(N, poison);
      Out<float> d_dw(C, poison), d_db(C, poison);
      // dweight and dbias also without affine: the host check of dx reads them.
      mpt::cuda::batch_norm_backward(l.outer, l.channels, l.inner, d_x.get(), d_dy.get(), d_mean.get(),
                                     d_inv.get(), k.affine ? d_w.get() : nullptr, true, d_dx.ptr(),
                                     d_dw.ptr(), d_db.ptr(), v);
      const VecF dxg = widen(d_dx.get(cmp.bad, cmp.label, "dx"), N);
      const VecF dwg = d_dw.get(cmp.bad, cmp.label, "dweight"), dbg = d_db.get(cmp.bad, cmp.label, "dbias");
      cmp.worst = &worst.grads;
      if (k.affine) {
        // The layer's grads are the FP32 sums rounded into P.
        const VecF dwg_p = round_into<P>(dwg), dbg_p = round_into<P>(dbg);
        for (std::size_t c = 0; c < C; ++c) {
          const double n = count;
          cmp.close(
              "dweight", c, dwg_p[c], dw_c[c],
              2 * gamma_n(n + 8) * a_dyx[c] + ulp_in(pd, std::max(std::fabs(dwg_p[c]), std::fabs(dw_c[c]))));
          cmp.close(
              "dbias", c, dbg_p[c], db_c[c],
              2 * gamma_n(n + 8) * a_dy[c] + ulp_in(pd, std::max(std::fabs(dbg_p[c]), std::fabs(db_c[c]))));
        }
      }
      cmp.worst = &worst.dx;
      VecF dx_host(N);
      for (std::int64_t n = 0; n < l.outer; ++n)
        for (std::int64_t c = 0; c < l.channels; ++c)
          for (std::int64_t i = 0; i < l.inner; ++i) {
            const auto e = static_cast<std::size_t>(l.offset(n, c, i)), cc = static_cast<std::size_t>(c);
            // Bit for bit: the formula on the kernel's own sums.
            const float g = wf[cc] * dyf[e];
            dx_host[e] = mpt::norm_math::input_grad_batch(
                inv_c[cc], static_cast<float>(count), g, wf[cc] * dbg[cc],
                mpt::norm_math::normalize(xf[e], mean_c[cc], inv_c[cc]), wf[cc] * dwg[cc]);
            // Against the CPU layer: the sums' bounds through the formula.
            const double a = inv_c[cc] / count, sg = wf[cc] * s_dy[cc], sgx = wf[cc] * s_dyx[cc];
            const double d_sg = 2 * gamma_n(count + 9) * a_g[cc], d_sgx = 2 * gamma_n(count + 10) * a_gx[cc];
            const double terms = count * std::fabs(g) + std::fabs(sg) + std::fabs(xhat[e] * sgx);
            const double tol = a * (d_sg + std::fabs(xhat[e]) * d_sgx) + 2 * (4 * kU * a * terms) +
                               4 * kU * std::fabs(dxc[e]) +
                               ulp_in(xd, std::max(std::fabs(dxg[e]), std::fabs(dxc[e])));
            cmp.close("dx", e, dxg[e], dxc[e], tol);
          }
      const VecF dx_host_x = round_into<X>(dx_host);
      for (std::size_t e = 0; e < N; ++e) cmp.same("dx from the kernel's sums", e, dxg[e], dx_host_x[e]);
      CHECK_MESSAGE(cmp.bad == 0, cmp.label, ": ", cmp.bad, " mismatches");
    }
}

/// Eval mode: the running estimates normalize, nothing is reduced in the
/// forward, and y and dx are the CPU layer's bits.
template <class X, class P>
void check_batch_norm_eval(const Shape& shape, Inputs kind, bool affine, std::mt19937_64& rng, Worst& worst) {
  const DType xd = dtype_of<X>(), pd = dtype_of<P>();
  const mpt::norm_math::Layout l = bn_layout(shape);
  const auto C = static_cast<std::size_t>(l.channels), N = static_cast<std::size_t>(l.numel());
  const std::string base = case_label("batch_norm eval", shape, kind, xd, pd) + (affine ? "" : " no affine");
  const VecF w = normal_values(C, 1.0f, 0.5f, rng), b = normal_values(C, 0.0f, 1.0f, rng);
  const VecF rm = normal_values(C, 0.0f, 1.0f, rng);
  VecF rv(C);
  for (float& v : rv) v = 0.5f + static_cast<float>(rng() % 1000) / 640.0f;
  const auto policy = std::make_shared<PairPolicy>(xd, pd);
  mpt::Context ctx(policy);
  mpt::BatchNorm::Options o;
  o.affine = affine;
  mpt::BatchNorm bn(static_cast<int>(C), o);
  bn.set_path("bn");
  const auto c64 = static_cast<std::int64_t>(C);
  if (affine) {
    bn.weight = mpt::Parameter("bn.weight", Tensor::from_f32(w.data(), {c64}, DType::f32));
    bn.bias = mpt::Parameter("bn.bias", Tensor::from_f32(b.data(), {c64}, DType::f32));
  }
  bn.running_mean = Tensor::from_f32(rm.data(), {c64}, DType::f32);
  bn.running_var = Tensor::from_f32(rv.data(), {c64}, DType::f32);
  bn.apply_policy(*policy);
  bn.eval();
  const Tensor xt = Tensor::from_f32(bn_inputs(l, kind, rng).data(), shape, xd);
  const Tensor y_cpu = bn.forward(xt, ctx);
  const VecF dyv = normal_values(N, 0.0f, 1.0f, rng);
  const Tensor dyt = Tensor::from_f32(dyv.data(), shape, xd);
  const Tensor dx_cpu = bn.backward(dyt, ctx);
  const std::vector<X> x_codes = codes_of<X>(xt), dy_codes = codes_of<X>(dyt);
  const std::vector<P> w_codes = affine ? codes_of<P>(bn.weight.weights()) : std::vector<P>(1);
  const std::vector<P> b_codes = affine ? codes_of<P>(bn.bias.weights()) : std::vector<P>(1);
  const std::vector<P> rm_codes = codes_of<P>(bn.running_mean), rv_codes = codes_of<P>(bn.running_var);
  // What the layer normalized with (saved for backward): the running
  // estimates widened, invstd from them in FP32.
  const VecF used_mean = codes_of<float>(*bn.saved()[1]), used_inv = codes_of<float>(*bn.saved()[2]);
  const VecF yc = widen(codes_of<X>(y_cpu), N), dxc = widen(codes_of<X>(dx_cpu), N);
  const VecF xf = widen(x_codes, N), dyf = widen(dy_codes, N);
  const VecF dw_c = affine ? codes_of<float>(bn.weight.grad) : VecF{};
  const VecF db_c = affine ? codes_of<float>(bn.bias.grad) : VecF{};
  VecD a_dy(C), a_dyx(C);
  for (std::int64_t n = 0; n < l.outer; ++n)
    for (std::int64_t c = 0; c < l.channels; ++c)
      for (std::int64_t i = 0; i < l.inner; ++i) {
        const auto e = static_cast<std::size_t>(l.offset(n, c, i)), cc = static_cast<std::size_t>(c);
        const double xhat = (static_cast<double>(xf[e]) - used_mean[cc]) * used_inv[cc];
        a_dy[cc] += std::fabs(dyf[e]);
        a_dyx[cc] += std::fabs(dyf[e] * xhat);
      }
  for (NormVersion v : kVersions)
    for (unsigned char poison : mpt::test::kPoisonBytes) {
      Compare cmp{base + ", " + version_name(v) + ", poison " + std::to_string(poison), 0, &worst.grads};
      DeviceArray<X> d_x(x_codes), d_dy(dy_codes);
      DeviceArray<P> d_w(w_codes), d_b(b_codes), d_rm(rm_codes), d_rv(rv_codes);
      DeviceArray<float> d_mean(used_mean), d_inv(used_inv);
      Out<X> d_y(N, poison), d_dx(N, poison);
      Out<float> d_dw(C, poison), d_db(C, poison);
      mpt::cuda::batch_norm_forward_eval(l.outer, l.channels, l.inner, d_x.get(),
                                         affine ? d_w.get() : nullptr, affine ? d_b.get() : nullptr,
                                         d_rm.get(), d_rv.get(), kEps, d_y.ptr(), v);
      mpt::cuda::batch_norm_backward(l.outer, l.channels, l.inner, d_x.get(), d_dy.get(), d_mean.get(),
                                     d_inv.get(), affine ? d_w.get() : nullptr, false, d_dx.ptr(), d_dw.ptr(),
                                     d_db.ptr(), v);
      const VecF yg = widen(d_y.get(cmp.bad, cmp.label, "y"), N),
                 dxg = widen(d_dx.get(cmp.bad, cmp.label, "dx"), N);
      const VecF dwg = d_dw.get(cmp.bad, cmp.label, "dweight"), dbg = d_db.get(cmp.bad, cmp.label, "dbias");
      for (std::size_t e = 0; e < N; ++e) {
        cmp.same("y", e, yg[e], yc[e]);
        cmp.same("dx", e, dxg[e], dxc[e]);
      }
      if (affine) {
        const VecF dwg_p = round_into<P>(dwg), dbg_p = round_into<P>(dbg);
        const double n = static_cast<double>(l.count());
        for (std::size_t c = 0; c < C; ++c) {
          cmp.close(
              "dweight", c, dwg_p[c], dw_c[c],
              2 * gamma_n(n + 8) * a_dyx[c] + ulp_in(pd, std::max(std::fabs(dwg_p[c]), std::fabs(dw_c[c]))));
          cmp.close(
              "dbias", c, dbg_p[c], db_c[c],
              2 * gamma_n(n + 8) * a_dy[c] + ulp_in(pd, std::max(std::fabs(dbg_p[c]), std::fabs(db_c[c]))));
        }
      }
      CHECK_MESSAGE(cmp.bad == 0, cmp.label, ": ", cmp.bad, " mismatches");
    }
}

/// One LayerNorm forward and backward: x of x_shape normalized over its
/// trailing normalized_shape.
struct LnCase {
  Shape x_shape, normalized;
  Inputs kind = Inputs::normal;
  bool affine = true;
};

template <class X, class P>
void check_layer_norm(const LnCase& k, std::mt19937_64& rng, Worst& worst) {
  const DType xd = dtype_of<X>(), pd = dtype_of<P>();
  const std::int64_t cols = mpt::numel(k.normalized), rows = mpt::numel(k.x_shape) / cols;
  const mpt::norm_math::Layout l{1, rows, cols};
  const auto R = static_cast<std::size_t>(rows), D = static_cast<std::size_t>(cols), N = R * D;
  const std::string base =
      case_label("layer_norm", k.x_shape, k.kind, xd, pd) + (k.affine ? "" : " no affine");
  const VecF w = normal_values(D, 1.0f, 0.5f, rng), b = normal_values(D, 0.0f, 1.0f, rng);
  const auto policy = std::make_shared<PairPolicy>(xd, pd);
  mpt::Context ctx(policy);
  mpt::LayerNorm::Options o;
  o.elementwise_affine = k.affine;
  mpt::LayerNorm ln(k.normalized, o);
  ln.set_path("ln");
  if (k.affine) {
    ln.weight = mpt::Parameter("ln.weight", Tensor::from_f32(w.data(), k.normalized, DType::f32));
    ln.bias = mpt::Parameter("ln.bias", Tensor::from_f32(b.data(), k.normalized, DType::f32));
  }
  ln.apply_policy(*policy);
  VecF xv(N);
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t i = 0; i < D; ++i)
      xv[r * D + i] = input_value(k.kind, static_cast<std::int64_t>(r), static_cast<std::int64_t>(i), rng);
  const Tensor xt = Tensor::from_f32(xv.data(), k.x_shape, xd);
  const Tensor y_cpu = ln.forward(xt, ctx);
  const VecF dyv = normal_values(N, 0.0f, 1.0f, rng);
  const Tensor dyt = Tensor::from_f32(dyv.data(), k.x_shape, xd);
  const Tensor dx_cpu = ln.backward(dyt, ctx);

  const std::vector<X> x_codes = codes_of<X>(xt), dy_codes = codes_of<X>(dyt);
  const std::vector<P> w_codes = k.affine ? codes_of<P>(ln.weight.weights()) : std::vector<P>(1);
  const std::vector<P> b_codes = k.affine ? codes_of<P>(ln.bias.weights()) : std::vector<P>(1);
  const VecF xf = widen(x_codes, N), dyf = widen(dy_codes, N);
  const VecF wf = k.affine ? widen(w_codes, D) : VecF(D, 1.0f),
             bf = k.affine ? widen(b_codes, D) : VecF(D, 0.0f);
  const VecF yc = widen(codes_of<X>(y_cpu), N), dxc = widen(codes_of<X>(dx_cpu), N);
  const VecF mean_c = codes_of<float>(ln.mean()), rstd_c = codes_of<float>(ln.rstd());
  const VecF dw_c = k.affine ? codes_of<float>(ln.weight.grad) : VecF{};
  const VecF db_c = k.affine ? codes_of<float>(ln.bias.grad) : VecF{};
  const std::vector<Truth> truth = truth_of(xf, l);
  // The row sums of backward in double (CPU statistics), with their absolute sums.
  VecD s_g(R), s_gx(R), a_g(R), a_gx(R), xhat(N);
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t i = 0; i < D; ++i) {
      const std::size_t e = r * D + i;
      xhat[e] = (static_cast<double>(xf[e]) - mean_c[r]) * rstd_c[r];
      const double g = static_cast<double>(wf[i]) * dyf[e];
      s_g[r] += g;
      s_gx[r] += g * xhat[e];
      a_g[r] += std::fabs(g);
      a_gx[r] += std::fabs(g * xhat[e]);
    }

  // dweight and dbias as the kernels add them (nn_kernels.hpp): the CPU
  // layer's FP32 terms dy·x̂ and dy, row by row within chunks of `chunk`
  // rows, the chunks' partial sums then added in order; the simple version
  // is one chunk of every row. And Σ|terms| for the bound against the CPU.
  auto chunked = [&](std::int64_t chunk, VecF& dw, VecF& db) {
    dw.assign(D, 0.0f);
    db.assign(D, 0.0f);
    for (std::size_t first = 0; first < R; first += static_cast<std::size_t>(chunk)) {
      const std::size_t end = std::min(R, first + static_cast<std::size_t>(chunk));
      for (std::size_t i = 0; i < D; ++i) {
        float pw = 0.0f, pb = 0.0f;
        for (std::size_t r = first; r < end; ++r) {
          const std::size_t e = r * D + i;
          pw += dyf[e] * mpt::norm_math::normalize(xf[e], mean_c[r], rstd_c[r]);
          pb += dyf[e];
        }
        dw[i] += pw;
        db[i] += pb;
      }
    }
  };
  VecF dw_simple, db_simple, dw_fast, db_fast;
  chunked(std::max<std::int64_t>(rows, 1), dw_simple, db_simple);
  chunked(mpt::cuda::layer_norm_dweight_chunk_rows(rows), dw_fast, db_fast);
  VecD a_dw(D), a_db(D);
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t i = 0; i < D; ++i) {
      const std::size_t e = r * D + i;
      a_dw[i] += std::fabs(static_cast<double>(dyf[e]) * xhat[e]);
      a_db[i] += std::fabs(dyf[e]);
    }

  for (NormVersion v : kVersions)
    for (unsigned char poison : mpt::test::kPoisonBytes) {
      Compare cmp{base + ", " + version_name(v) + ", poison " + std::to_string(poison), 0, nullptr};
      DeviceArray<X> d_x(x_codes), d_dy(dy_codes);
      DeviceArray<P> d_w(w_codes), d_b(b_codes);
      DeviceArray<float> d_mean_c(mean_c), d_rstd_c(rstd_c);
      Out<X> d_y(N, poison), d_dx(N, poison);
      Out<float> d_mean(R, poison), d_rstd(R, poison), d_dw(D, poison), d_db(D, poison);
      mpt::cuda::layer_norm_forward(rows, cols, d_x.get(), k.affine ? d_w.get() : nullptr,
                                    k.affine ? d_b.get() : nullptr, kEps, d_y.ptr(), d_mean.ptr(),
                                    d_rstd.ptr(), v);
      // Backward on the CPU layer's statistics (the same terms on both sides).
      mpt::cuda::layer_norm_backward(rows, cols, d_x.get(), d_dy.get(), d_mean_c.get(), d_rstd_c.get(),
                                     k.affine ? d_w.get() : nullptr, d_dx.ptr(), d_dw.ptr(), d_db.ptr(), v);
      const VecF yg = widen(d_y.get(cmp.bad, cmp.label, "y"), N),
                 dxg = widen(d_dx.get(cmp.bad, cmp.label, "dx"), N);
      const VecF mean_g = d_mean.get(cmp.bad, cmp.label, "mean"),
                 rstd_g = d_rstd.get(cmp.bad, cmp.label, "rstd");
      const VecF dwg = d_dw.get(cmp.bad, cmp.label, "dweight"), dbg = d_db.get(cmp.bad, cmp.label, "dbias");

      cmp.worst = &worst.stats;
      for (std::size_t r = 0; r < R; ++r) {
        const Truth& t = truth[r];
        if (!t.finite) {
          cmp.both_nonfinite("mean", r, mean_g[r], mean_c[r]);
          cmp.close("rstd", r, rstd_g[r], rstd_c[r], 0);  // NaN on both sides
          continue;
        }
        cmp.close("mean", r, mean_g[r], mean_c[r], 2 * t.mean_bound());
        cmp.close("rstd", r, rstd_g[r], rstd_c[r], 2 * t.invstd_bound(kEps));
      }
      cmp.worst = &worst.y;
      VecF y_host(N);
      for (std::size_t r = 0; r < R; ++r)
        for (std::size_t i = 0; i < D; ++i) {
          const std::size_t e = r * D + i;
          y_host[e] = mpt::norm_math::scale_shift(mpt::norm_math::normalize(xf[e], mean_g[r], rstd_g[r]),
                                                  wf[i], bf[i]);
          const Truth& t = truth[r];
          cmp.close("y", e, yg[e], yc[e],
                    t.finite ? y_tolerance(xd, xf[e], yg[e], yc[e], t, kEps, wf[i], bf[i]) : 0);
        }
      const VecF y_host_x = round_into<X>(y_host);
      for (std::size_t e = 0; e < N; ++e) cmp.same("y from the kernel's statistics", e, yg[e], y_host_x[e]);

      cmp.worst = &worst.dx;
      const double count = static_cast<double>(cols);
      for (std::size_t r = 0; r < R; ++r) {
        const double a = rstd_c[r] / count;
        const double d_sg = 2 * gamma_n(count + 8) * a_g[r], d_sgx = 2 * gamma_n(count + 8) * a_gx[r];
        for (std::size_t i = 0; i < D; ++i) {
          const std::size_t e = r * D + i;
          const double g = static_cast<double>(wf[i]) * dyf[e];
          const double terms = count * std::fabs(g) + std::fabs(s_g[r]) + std::fabs(xhat[e] * s_gx[r]);
          const double tol = a * (d_sg + std::fabs(xhat[e]) * d_sgx) + 2 * (4 * kU * a * terms) +
                             4 * kU * std::fabs(dxc[e]) +
                             ulp_in(xd, std::max(std::fabs(dxg[e]), std::fabs(dxc[e])));
          cmp.close("dx", e, dxg[e], dxc[e], tol);
        }
      }
      // dweight, dbias: bit for bit the sums in the order the version states
      // (computed even without affine: the kernel is asked for them), and,
      // rounded into P as the layer's grads are, within the order-independent
      // bound of the CPU layer's: each side is within γ(rows + 8)·Σ|terms| of
      // the exact sum of the same terms, whatever order either adds them in
      // (a CPU that adds them more accurately stays inside it).
      const VecF& dw_want = v == NormVersion::simple ? dw_simple : dw_fast;
      const VecF& db_want = v == NormVersion::simple ? db_simple : db_fast;
      for (std::size_t i = 0; i < D; ++i) {
        cmp.same("dweight (the version's order)", i, dwg[i], dw_want[i]);
        cmp.same("dbias (the version's order)", i, dbg[i], db_want[i]);
      }
      cmp.worst = &worst.grads;
      if (k.affine) {
        const VecF dwg_p = round_into<P>(dwg), dbg_p = round_into<P>(dbg);
        const double n = static_cast<double>(rows);
        for (std::size_t i = 0; i < D; ++i) {
          cmp.close(
              "dweight", i, dwg_p[i], dw_c[i],
              2 * gamma_n(n + 8) * a_dw[i] + ulp_in(pd, std::max(std::fabs(dwg_p[i]), std::fabs(dw_c[i]))));
          cmp.close(
              "dbias", i, dbg_p[i], db_c[i],
              2 * gamma_n(n + 8) * a_db[i] + ulp_in(pd, std::max(std::fabs(dbg_p[i]), std::fabs(db_c[i]))));
        }
      }
      CHECK_MESSAGE(cmp.bad == 0, cmp.label, ": ", cmp.bad, " mismatches");
    }
}

/// f(X{}, P{}) for every pair of storage types.
template <class F>
void for_every_pair(F&& f) {
  f(float{}, float{});
  f(float{}, Fp16Code{});
  f(float{}, Bf16Code{});
  f(Fp16Code{}, float{});
  f(Fp16Code{}, Fp16Code{});
  f(Fp16Code{}, Bf16Code{});
  f(Bf16Code{}, float{});
  f(Bf16Code{}, Fp16Code{});
  f(Bf16Code{}, Bf16Code{});
}

/// f(X{}, P{}) for the pairs training uses: one dtype throughout (model.half(),
/// FP32 kept), and half-precision activations with FP32 parameters (autocast).
template <class F>
void for_common_pairs(F&& f) {
  f(float{}, float{});
  f(Fp16Code{}, Fp16Code{});
  f(Fp16Code{}, float{});
  f(Bf16Code{}, Bf16Code{});
  f(Bf16Code{}, float{});
}

// [N, C] (inner 1: version 2 reads it 32 channels of a row at a time, in
// chunks of 256 rows: 1000 rows of 40 channels are 4 chunks and two column
// blocks, the second one mostly idle) and [N, C, ...] (version 2: chunks of
// 4096 values of a channel; [8, 3, 64, 64] has 8 of them, [2, 4, 5000] 3).
const Shape kBnShapes[] = {{2, 3},         {5, 3},        {300, 5},      {1000, 40},   {16, 4, 7},
                           {7, 3, 40},     {2, 4, 1000},  {2, 4, 5000},  {1, 2, 3, 3}, {4, 6, 5, 5},
                           {3, 2, 17, 19}, {64, 8, 8, 8}, {8, 3, 64, 64}};

}  // namespace

TEST_CASE("batch_norm training: every dtype pair and shape against mpt::BatchNorm, random inputs") {
  std::mt19937_64 rng(mpt::test::test_seed());
  Worst worst;
  for (const Shape& s : kBnShapes)
    for_every_pair([&](auto x, auto p) {
      BnCase k;
      k.shape = s;
      check_batch_norm_train<decltype(x), decltype(p)>(k, rng, worst);
    });
  worst.print("batch_norm training, random");
}

TEST_CASE("batch_norm training: mean 1000, constant channels, |x| >= 256, ±max and subnormals, inf and NaN") {
  std::mt19937_64 rng(mpt::test::test_seed() + 1);
  Worst worst;
  const Shape shapes[] = {{5, 3}, {300, 5}, {7, 3, 40}, {4, 6, 5, 5}, {64, 8, 8, 8}};
  for (Inputs kind :
       {Inputs::mean_1000, Inputs::constant, Inputs::large, Inputs::extremes, Inputs::nonfinite})
    for (const Shape& s : shapes)
      for_common_pairs([&](auto x, auto p) {
        BnCase k;
        k.shape = s;
        k.kind = kind;
        check_batch_norm_train<decltype(x), decltype(p)>(k, rng, worst);
      });
  worst.print("batch_norm training, adversarial");
}

TEST_CASE("batch_norm training: no affine, no running stats, the cumulative average, eps 0") {
  std::mt19937_64 rng(mpt::test::test_seed() + 2);
  Worst worst;
  for_common_pairs([&](auto x, auto p) {
    using X = decltype(x);
    using P = decltype(p);
    for (const Shape& s : {Shape{6, 3}, Shape{4, 5, 3, 7}}) {
      BnCase k;
      k.shape = s;
      k.affine = false;
      check_batch_norm_train<X, P>(k, rng, worst);
      k.affine = true;
      k.track = false;
      check_batch_norm_train<X, P>(k, rng, worst);
      // momentum nullopt: factors 1, 1/2, 1/3 over three batches.
      k.track = true;
      k.momentum = std::nullopt;
      k.forwards = 3;
      check_batch_norm_train<X, P>(k, rng, worst);
      // Three batches at momentum 0.1, each updating the estimates the last left.
      k.momentum = 0.1;
      check_batch_norm_train<X, P>(k, rng, worst);
      // eps 0 on constant channels: variance 0, invstd inf, y NaN, as on the CPU.
      k.forwards = 1;
      k.kind = Inputs::constant;
      k.eps = 0.0f;
      check_batch_norm_train<X, P>(k, rng, worst);
    }
  });
  worst.print("batch_norm training, options");
}

TEST_CASE("batch_norm eval: y and dx bit for bit the CPU layer's, dweight and dbias within the sum bound") {
  std::mt19937_64 rng(mpt::test::test_seed() + 3);
  Worst worst;
  for (const Shape& s : {Shape{3, 4}, Shape{2, 3, 300}, Shape{5, 2, 9, 9}})
    for (Inputs kind : {Inputs::normal, Inputs::large, Inputs::extremes, Inputs::nonfinite})
      for_every_pair([&](auto x, auto p) {
        check_batch_norm_eval<decltype(x), decltype(p)>(s, kind, true, rng, worst);
      });
  for_common_pairs([&](auto x, auto p) {
    check_batch_norm_eval<decltype(x), decltype(p)>(Shape{4, 3, 5}, Inputs::normal, false, rng, worst);
  });
  worst.print("batch_norm eval");
}

TEST_CASE("layer_norm: every dtype pair and row length against mpt::LayerNorm, random inputs") {
  std::mt19937_64 rng(mpt::test::test_seed() + 4);
  Worst worst;
  const LnCase cases[] = {
      {{3, 1}, {1}},
      {{4, 2}, {2}},
      {{7, 5}, {5}},
      {{5, 32}, {32}},
      {{9, 33}, {33}},
      {{17, 768}, {768}},
      {{3, 1000}, {1000}},
      {{2, 4100}, {4100}},
      {{2, 3, 20}, {20}},
      {{5, 3, 4}, {3, 4}},
      {{70, 64}, {64}},
      // several chunks of 64 rows for the fast dweight (the last one short)
      {{129, 33}, {33}},
      {{4, 75, 40}, {40}},
  };
  for (const LnCase& c : cases)
    for_every_pair([&](auto x, auto p) { check_layer_norm<decltype(x), decltype(p)>(c, rng, worst); });
  for_common_pairs([&](auto x, auto p) {
    check_layer_norm<decltype(x), decltype(p)>({{6, 40}, {40}, Inputs::normal, false}, rng, worst);
  });
  worst.print("layer_norm, random");
}

TEST_CASE("layer_norm: mean 1000, constant rows, |x| >= 256, ±max and subnormals, inf and NaN") {
  std::mt19937_64 rng(mpt::test::test_seed() + 5);
  Worst worst;
  for (Inputs kind :
       {Inputs::mean_1000, Inputs::constant, Inputs::large, Inputs::extremes, Inputs::nonfinite})
    for (const Shape& s : {Shape{4, 7}, Shape{9, 300}, Shape{5, 2048}, Shape{130, 20}})
      for_common_pairs([&](auto x, auto p) {
        check_layer_norm<decltype(x), decltype(p)>({s, {s[1]}, kind, true}, rng, worst);
      });
  worst.print("layer_norm, adversarial");
}

TEST_CASE("norm kernels: a small case of every kernel (for compute-sanitizer)") {
  // tools/gpu_report.sh runs this case under memcheck and racecheck: every
  // kernel of both versions once, on shapes that leave threads and warps
  // idle and carry the channel walk across rows, in f16 with f32 parameters
  // and in bf16.
  std::mt19937_64 rng(mpt::test::test_seed() + 6);
  Worst worst;
  BnCase k;
  k.shape = {3, 2, 100};
  check_batch_norm_train<Fp16Code, float>(k, rng, worst);
  k.shape = {300, 3};
  check_batch_norm_train<Bf16Code, Bf16Code>(k, rng, worst);
  check_batch_norm_eval<Fp16Code, float>({2, 3, 5}, Inputs::normal, true, rng, worst);
  check_layer_norm<Fp16Code, float>({{9, 33}, {33}, Inputs::normal, true}, rng, worst);
  check_layer_norm<Bf16Code, Bf16Code>({{3, 300}, {300}, Inputs::normal, true}, rng, worst);
  // Rows of whole 16-byte vectors (the fast LayerNorm's), and more than one
  // chunk of rows for the fast dγ, dβ.
  check_layer_norm<Fp16Code, float>({{70, 40}, {40}, Inputs::normal, true}, rng, worst);
  worst.print("small cases");
}

TEST_CASE("norm backward kernels: asked for fewer outputs, they write those, with the same bits") {
  std::mt19937_64 rng(mpt::test::test_seed() + 7);
  // BatchNorm [44, 3, 40]; LayerNorm [132, 40]: three chunks of rows for the
  // fast dweight, whose partial sums of dbias alone sit where dweight's would.
  const std::int64_t rows = 132, cols = 40;
  const auto n = static_cast<std::size_t>(rows * cols);
  const VecF xv = normal_values(n, 0.5f, 1.5f, rng), dyv = normal_values(n, 0.0f, 1.0f, rng);
  std::vector<Fp16Code> xc(n), dyc(n);
  mpt::store_as(DType::f16, xv.data(), xc.data(), n);
  mpt::store_as(DType::f16, dyv.data(), dyc.data(), n);
  DeviceArray<Fp16Code> d_x(xc), d_dy(dyc);
  DeviceArray<float> d_mean(normal_values(static_cast<std::size_t>(rows), 0.5f, 0.1f, rng));
  DeviceArray<float> d_inv(normal_values(static_cast<std::size_t>(rows), 0.7f, 0.1f, rng));
  DeviceArray<float> d_w(normal_values(static_cast<std::size_t>(cols), 1.0f, 0.5f, rng));
  float* none = nullptr;
  Fp16Code* no_dx = nullptr;
  struct Outputs {
    std::vector<Fp16Code> dx;
    VecF dw, db;
  };
  auto run = [&](bool layer, bool dx, bool dw, bool db) {
    const auto na = static_cast<std::size_t>(layer ? cols : 3);
    DeviceArray<Fp16Code> o_dx(n);
    DeviceArray<float> o_dw(na), o_db(na);
    o_dx.poison();
    o_dw.poison();
    o_db.poison();
    if (layer)
      mpt::cuda::layer_norm_backward(rows, cols, d_x.get(), d_dy.get(), d_mean.get(), d_inv.get(), d_w.get(),
                                     dx ? o_dx.get() : no_dx, dw ? o_dw.get() : none, db ? o_db.get() : none);
    else
      mpt::cuda::batch_norm_backward(44, 3, cols, d_x.get(), d_dy.get(), d_mean.get(), d_inv.get(), d_w.get(),
                                     true, dx ? o_dx.get() : no_dx, dw ? o_dw.get() : none,
                                     db ? o_db.get() : none);
    return Outputs{o_dx.download(), o_dw.download(), o_db.download()};
  };
  for (bool layer : {false, true}) {
    CAPTURE(layer);
    const Outputs all = run(layer, true, true, true), dx_only = run(layer, true, false, false),
                  sums_only = run(layer, false, true, true), dw_only = run(layer, false, true, false),
                  db_only = run(layer, false, false, true);
    CHECK(mpt::test::code_bits(dx_only.dx) == mpt::test::code_bits(all.dx));
    for (std::size_t i = 0; i < all.dw.size(); ++i) {
      CHECK(bits(sums_only.dw[i]) == bits(all.dw[i]));
      CHECK(bits(sums_only.db[i]) == bits(all.db[i]));
      CHECK(bits(dw_only.dw[i]) == bits(all.dw[i]));
      CHECK(bits(db_only.db[i]) == bits(all.db[i]));
      CHECK(bits(dx_only.dw[i]) == 0xffffffffu);  // not asked for: still the poison
      CHECK(bits(dw_only.db[i]) == 0xffffffffu);
      CHECK(bits(db_only.dw[i]) == 0xffffffffu);
    }
    CHECK(mpt::test::code_bits(sums_only.dx[0]) == 0xffffu);
  }
}

namespace {

/// n elements at `offset` elements into a fresh device array (the front
/// elements poisoned): offset 1 puts a 2- or 4-byte array off the 16-byte
/// boundary cudaMalloc gives.
template <class T>
struct Placed {
  Placed(const std::vector<T>& v, std::size_t offset) : d(v.size() + offset), at(offset), n(v.size()) {
    d.poison();
    if (!v.empty())
      mpt::test::cuda_ok(cudaMemcpy(d.get() + offset, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
                         "upload");
  }
  T* ptr() const { return d.get() + at; }
  std::vector<T> get() const {
    std::vector<T> out(n);
    mpt::test::cuda_ok(cudaMemcpy(out.data(), ptr(), n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return out;
  }
  DeviceArray<T> d;
  std::size_t at, n;
};

template <class T>
std::vector<std::uint32_t> all_bits(const std::vector<T>& v) {
  std::vector<std::uint32_t> out;
  for (const T& x : v) {
    std::uint32_t b = 0;
    std::memcpy(&b, &x, sizeof x);
    out.push_back(b);
  }
  return out;
}

/// LayerNorm forward and backward with every array at its own offset (in
/// elements: 0 aligned, 1 off the 16-byte boundary), the backward on given
/// statistics (empty: zeros) so that it does not depend on which forward
/// ran: y, mean, rstd, dx, dweight, dbias as bits.
template <class X, class P>
std::vector<std::vector<std::uint32_t>> layer_norm_run(std::int64_t rows, std::int64_t cols, const VecF& xv,
                                                       const VecF& dyv, const VecF& wv, const VecF& bv,
                                                       const VecF& mean_in, const VecF& rstd_in,
                                                       NormVersion v, std::size_t x_at, std::size_t y_at,
                                                       std::size_t w_at, std::size_t dx_at) {
  const auto n = static_cast<std::size_t>(rows * cols), r = static_cast<std::size_t>(rows),
             c = static_cast<std::size_t>(cols);
  std::vector<X> xc(n), dyc(n);
  std::vector<P> wc(c), bc(c);
  mpt::store_as(dtype_of<X>(), xv.data(), xc.data(), n);
  mpt::store_as(dtype_of<X>(), dyv.data(), dyc.data(), n);
  mpt::store_as(dtype_of<P>(), wv.data(), wc.data(), c);
  mpt::store_as(dtype_of<P>(), bv.data(), bc.data(), c);
  const Placed<X> x(xc, x_at), dy(dyc, x_at), y(std::vector<X>(n), y_at), dx(std::vector<X>(n), dx_at);
  const Placed<P> w(wc, w_at), b(bc, w_at);
  const Placed<float> mean(VecF(r), 0), rstd(VecF(r), 0), dw(VecF(c), 0), db(VecF(c), 0);
  const Placed<float> mean_b(mean_in.empty() ? VecF(r) : mean_in, 0),
      rstd_b(rstd_in.empty() ? VecF(r) : rstd_in, 0);
  mpt::cuda::layer_norm_forward(rows, cols, x.ptr(), w.ptr(), b.ptr(), kEps, y.ptr(), mean.ptr(), rstd.ptr(),
                                v);
  mpt::cuda::layer_norm_backward(rows, cols, x.ptr(), dy.ptr(), mean_b.ptr(), rstd_b.ptr(), w.ptr(), dx.ptr(),
                                 dw.ptr(), db.ptr(), v);
  return {all_bits(y.get()),  all_bits(mean.get()), all_bits(rstd.get()),
          all_bits(dx.get()), all_bits(dw.get()),   all_bits(db.get())};
}

/// BatchNorm training forward and backward with x and dy, and y and dx, at
/// their offsets: y, mean, invstd, running mean and var, dx, dweight, dbias
/// as bits.
template <class X, class P>
std::vector<std::vector<std::uint32_t>> batch_norm_run(const mpt::norm_math::Layout& l, const VecF& xv,
                                                       const VecF& dyv, NormVersion v, std::size_t in_at,
                                                       std::size_t out_at) {
  const auto n = static_cast<std::size_t>(l.numel()), c = static_cast<std::size_t>(l.channels);
  std::vector<X> xc(n), dyc(n);
  mpt::store_as(dtype_of<X>(), xv.data(), xc.data(), n);
  mpt::store_as(dtype_of<X>(), dyv.data(), dyc.data(), n);
  std::vector<P> ones(c), zeros(c);
  const VecF one(c, 1.0f), zero(c, 0.0f);
  mpt::store_as(dtype_of<P>(), one.data(), ones.data(), c);
  mpt::store_as(dtype_of<P>(), zero.data(), zeros.data(), c);
  const Placed<X> x(xc, in_at), dy(dyc, in_at), y(std::vector<X>(n), out_at), dx(std::vector<X>(n), out_at);
  const Placed<P> w(ones, 0), b(zeros, 0), rm(zeros, 0), rv(ones, 0);
  const Placed<float> mean(VecF(c), 0), invstd(VecF(c), 0), dw(VecF(c), 0), db(VecF(c), 0);
  mpt::cuda::batch_norm_forward_train(l.outer, l.channels, l.inner, x.ptr(), w.ptr(), b.ptr(), rm.ptr(),
                                      rv.ptr(), 0.1f, kEps, y.ptr(), mean.ptr(), invstd.ptr(), v);
  mpt::cuda::batch_norm_backward(l.outer, l.channels, l.inner, x.ptr(), dy.ptr(), mean.ptr(), invstd.ptr(),
                                 w.ptr(), true, dx.ptr(), dw.ptr(), db.ptr(), v);
  return {all_bits(y.get()),  all_bits(mean.get()), all_bits(invstd.get()), all_bits(rm.get()),
          all_bits(rv.get()), all_bits(dx.get()),   all_bits(dw.get()),     all_bits(db.get())};
}

}  // namespace

TEST_CASE("norm kernels, fast: arrays off a 16-byte boundary take the fallback, with its bits") {
  // LayerNorm's fast forward and dx need 16-byte aligned activations and γ,
  // β aligned to what a vector of them spans; one element off, they run the
  // simple kernels, whose bits they must then give (dweight and dbias: the
  // chunked kernel, which does not depend on alignment: the aligned call's
  // bits). BatchNorm's fast version needs x and y (dy and dx) aligned for
  // its element-wise kernels; one element off, the call runs the simple
  // version, whose bits it must then give.
  // (Without the fallback, a 16-byte access off its boundary faults.)
  std::mt19937_64 rng(mpt::test::test_seed() + 8);
  const std::int64_t rows = 70, cols = 64;  // cols % 8 == 0: only alignment decides
  const auto n = static_cast<std::size_t>(rows * cols);
  const VecF xv = normal_values(n, 0.5f, 1.5f, rng), dyv = normal_values(n, 0.0f, 1.0f, rng);
  const VecF wv = normal_values(static_cast<std::size_t>(cols), 1.0f, 0.5f, rng),
             bv = normal_values(static_cast<std::size_t>(cols), 0.0f, 1.0f, rng);
  auto layer = [&](auto x_tag, auto p_tag) {
    using X = decltype(x_tag);
    using P = decltype(p_tag);
    // Every run's backward on the statistics of one forward.
    const auto first =
        layer_norm_run<X, P>(rows, cols, xv, dyv, wv, bv, {}, {}, NormVersion::simple, 0, 0, 0, 0);
    VecF mean_in(static_cast<std::size_t>(rows)), rstd_in(static_cast<std::size_t>(rows));
    std::memcpy(mean_in.data(), first[1].data(), mean_in.size() * sizeof(float));
    std::memcpy(rstd_in.data(), first[2].data(), rstd_in.size() * sizeof(float));
    auto run = [&](NormVersion v, std::size_t x_at, std::size_t y_at, std::size_t w_at, std::size_t dx_at) {
      return layer_norm_run<X, P>(rows, cols, xv, dyv, wv, bv, mean_in, rstd_in, v, x_at, y_at, w_at, dx_at);
    };
    const auto simple = run(NormVersion::simple, 0, 0, 0, 0), fast = run(NormVersion::fast, 0, 0, 0, 0);
    // x (and dy), y, γ and β, dx: each one element off in turn.
    const std::size_t offsets[4][4] = {{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}};
    for (const auto& o : offsets) {
      CAPTURE(o[0]);
      CAPTURE(o[1]);
      CAPTURE(o[2]);
      CAPTURE(o[3]);
      const auto got = run(NormVersion::fast, o[0], o[1], o[2], o[3]);
      // The forward falls back when x, y, γ or β is off; dx when x, dy, γ or dx is.
      const bool forward_falls = o[0] + o[1] + o[2] > 0, dx_falls = o[0] + o[2] + o[3] > 0;
      for (std::size_t k = 0; k < 3; ++k) CHECK(got[k] == (forward_falls ? simple[k] : fast[k]));
      CHECK(got[3] == (dx_falls ? simple[3] : fast[3]));
      CHECK(got[4] == fast[4]);
      CHECK(got[5] == fast[5]);
    }
  };
  layer(Fp16Code{}, float{});  // γ, β: 8 floats per vector, 16-byte aligned
  layer(float{}, Fp16Code{});  // γ, β: 4 codes per vector, 8-byte aligned
  layer(Bf16Code{}, Bf16Code{});
  for (const Shape& shape : {Shape{1000, 40}, Shape{8, 3, 64, 64}}) {
    const mpt::norm_math::Layout l = bn_layout(shape);
    const auto m = static_cast<std::size_t>(l.numel());
    const VecF bx = normal_values(m, 0.5f, 1.5f, rng), bdy = normal_values(m, 0.0f, 1.0f, rng);
    const auto simple = batch_norm_run<Fp16Code, float>(l, bx, bdy, NormVersion::simple, 0, 0);
    CHECK(batch_norm_run<Fp16Code, float>(l, bx, bdy, NormVersion::fast, 1, 0) == simple);
    CHECK(batch_norm_run<Fp16Code, float>(l, bx, bdy, NormVersion::fast, 0, 1) == simple);
  }
}

TEST_CASE("norm kernels: empty sizes write nothing, bad arguments throw before any launch") {
  using mpt::cuda::batch_norm_backward;
  using mpt::cuda::batch_norm_forward_eval;
  using mpt::cuda::batch_norm_forward_train;
  using mpt::cuda::layer_norm_backward;
  using mpt::cuda::layer_norm_forward;
  DeviceArray<Fp16Code> x(64), y(64);
  DeviceArray<float> p(64), q(64), r(64), s(64);
  const float* none = nullptr;
  float* out_none = nullptr;
  p.poison();
  y.poison();
  r.poison(mpt::test::kPoisonFinite);
  s.poison(mpt::test::kPoisonFinite);
  // No channels, no rows: nothing to do, nothing written.
  CHECK_NOTHROW(batch_norm_forward_train(4, 0, 3, x.get(), none, none, out_none, out_none, 0.1f, kEps,
                                         y.get(), p.get(), q.get()));
  CHECK_NOTHROW(batch_norm_forward_eval(4, 0, 3, x.get(), none, none, none, none, kEps, y.get()));
  CHECK_NOTHROW(layer_norm_forward(0, 5, x.get(), none, none, kEps, y.get(), p.get(), q.get()));
  CHECK_NOTHROW(
      layer_norm_backward(0, 5, x.get(), x.get(), p.get(), q.get(), none, y.get(), out_none, out_none));
  CHECK(bits(p.download()[0]) == 0xffffffffu);
  CHECK(mpt::test::code_bits(y.download()[0]) == 0xffffu);
  // Channels without values: Σdy and Σdy·x̂ over nothing are 0.
  CHECK_NOTHROW(batch_norm_backward(0, 3, 5, x.get(), x.get(), p.get(), p.get(), none, true, y.get(), r.get(),
                                    s.get()));
  for (const DeviceArray<float>* a : {&r, &s}) {
    const std::vector<float> v = a->download();
    CHECK((v[0] == 0.0f && v[1] == 0.0f && v[2] == 0.0f &&
           bits(v[3]) == bits(mpt::test::poison_value<float>(0x5A))));
  }

  // Sizes and values: std::invalid_argument, naming what was wrong.
  auto train = [&](std::int64_t outer, std::int64_t channels, std::int64_t inner, float momentum, float eps) {
    batch_norm_forward_train(outer, channels, inner, x.get(), p.get(), q.get(), r.get(), s.get(), momentum,
                             eps, y.get(), p.get(), q.get());
  };
  CHECK_THROWS_AS(train(-1, 2, 2, 0.1f, kEps), std::invalid_argument);
  CHECK_THROWS_AS(train(1, 2, 1, 0.1f, kEps), std::invalid_argument);  // one value per channel
  CHECK_THROWS_AS(train(2, 2, 2, 1.5f, kEps), std::invalid_argument);
  CHECK_THROWS_AS(train(2, 2, 2, std::nanf(""), kEps), std::invalid_argument);
  CHECK_THROWS_AS(train(2, 2, 2, 0.1f, -1.0f), std::invalid_argument);
  CHECK_THROWS_AS(train(2, 2, 2, 0.1f, std::numeric_limits<float>::infinity()), std::invalid_argument);
  CHECK_THROWS_AS(batch_norm_forward_train(2, 2, 2, x.get(), p.get(), q.get(), r.get(), out_none, 0.1f, kEps,
                                           y.get(), p.get(), q.get()),
                  std::invalid_argument);  // one running estimate without the other
  CHECK_THROWS_AS(batch_norm_forward_train(2, 2, 2, x.get(), none, none, out_none, out_none, 0.1f, kEps,
                                           y.get(), out_none, q.get()),
                  std::invalid_argument);  // no mean output
  CHECK_THROWS_AS(batch_norm_forward_eval(2, 2, 2, x.get(), none, none, none, none, kEps, y.get()),
                  std::invalid_argument);  // eval without running estimates
  CHECK_THROWS_AS(batch_norm_backward(2, 2, 2, x.get(), static_cast<const Fp16Code*>(nullptr), p.get(),
                                      q.get(), none, true, y.get(), out_none, out_none),
                  std::invalid_argument);
  CHECK_THROWS_AS(layer_norm_forward(2, 0, x.get(), none, none, kEps, y.get(), p.get(), q.get()),
                  std::invalid_argument);
  CHECK_THROWS_AS(layer_norm_forward(2, 3, x.get(), none, none, -kEps, y.get(), p.get(), q.get()),
                  std::invalid_argument);
  CHECK_THROWS_AS(
      layer_norm_backward(-2, 3, x.get(), x.get(), p.get(), q.get(), none, y.get(), out_none, out_none),
      std::invalid_argument);
  // Too big for a grid or for 64-bit offsets: std::length_error, no launch.
  const std::int64_t big = std::int64_t{1} << 31;
  CHECK_THROWS_AS(train(1, big, 2, 0.1f, kEps), std::length_error);
  CHECK_THROWS_AS(train(std::int64_t{1} << 40, std::int64_t{1} << 40, 2, 0.1f, kEps), std::length_error);
  CHECK_THROWS_AS(
      layer_norm_forward(std::int64_t{1} << 40, 1, x.get(), none, none, kEps, y.get(), p.get(), q.get()),
      std::length_error);
  CHECK_NOTHROW(mpt::cuda::synchronize());
  CHECK(bits(p.download()[0]) == 0xffffffffu);
}

int main(int argc, char** argv) { return mpt::test::gpu_test_main(argc, argv); }
