// Chapter 04 — the fused softmax cross-entropy and the masked softmax
// kernels (kernels/nn/softmax.cu) against FP64 references written out here.
// Depends on: mpt::kernels (kernels/nn/nn_kernels.hpp), mpt/formats
// (round_element.hpp: fp16 decoding and rounding on the host), mpt's CPU
// attention (mpt/nn/layers/attention.hpp, with Tensor, Context and Policy: what the
// masked softmax is compared with), gpu_test_support.hpp. Without a usable
// GPU it exits 77 (CTest: Skipped).
//
// Every case runs once per poison of kPoisonBytes (outputs and seven guard
// elements behind each are poisoned first, so a skipped write or one past
// the end fails), with both cross-entropy versions, on random and
// adversarial logits: ±60000, all equal, one huge, large logits near ties
// (30000), K not a multiple of a block's share (and K % 8 != 0, where
// version 2 runs version 1), logits or gradient one code off a 16-byte
// boundary with K % 8 == 0 (version 2's fallback), −inf logits, a +inf or
// a NaN in one row (that row's loss and gradient NaN, no other row
// affected), invalid and ignored targets; every option (ignore_index,
// label smoothing 0, 0.1 and 1, each reduction, loss scales up to 2^18 where
// the fp16 gradient overflows to ±inf).
//
// The references are FP64 loops over the fp16 inputs widened exactly:
// m = max z, eⱼ = exp(zⱼ − m), s = Σ eⱼ, softmax = e/s, and
// the loss and gradient formulas of nn_kernels.hpp. What must hold exactly:
// ignored rows (loss 0, gradient +0 bits), masked probabilities (+0), a fully
// masked row (zeros), the NaN rows. The rest within a tolerance derived
// from the kernels' FP32 operations, u = 2^-24 (FP32's unit roundoff), and
// fp16's unit roundoff 2^-11 for the one final rounding, first-order bounds
// doubled for the terms they drop:
//  - the row sum s: each term eⱼ passes through at most D = (elements per
//    thread) + 10 (merge levels) additions and rescalings, a rescaling by
//    exp(m_old − m_new) erring by u·|m_old − m_new| + 5u (the subtraction,
//    CUDA's expf within 2 ulp, i.e. 4u, the product) with |m_old − m_new|
//    <= m − zⱼ, and eⱼ itself by u·(m − zⱼ) + 4u: |Δs| <= (D + 1)·u·Σ
//    eⱼ·(m − zⱼ + 6), which the doubled (D + 1)·u·Σ eⱼ·(m − zⱼ + 4) covers;
//  - the loss is log s − (z_y − m) (softmax_math.hpp's cross_entropy_of):
//    log s errs by δ = |Δs|/s plus logf's 1 ulp, δ + 2u·|log s|, and each
//    further operation adds u times the magnitude it produces (z_y − m,
//    the difference); with smoothing, Σ(z − m) errs by γ(D + 1)·Σ|z − m|
//    (each difference rounded once, then D additions; Higham, Accuracy and
//    Stability of Numerical Algorithms, §4.2). No term is u·|m|: the old
//    form (m + log s) − z_y rounded lse at the max's magnitude, which the
//    "large logits, near ties" case shows these bounds reject;
//  - a gradient element g·(p − q) before rounding: p = e/s errs by
//    p·(u·(m − z) + 3u + δ), q by 3u·q, the difference and the product by u
//    each, plus 2^-126·|g| for FP32's underflow; the stored fp16 value may
//    then be off by half an fp16 ulp of the result more (2^-11 relative;
//    2^-25 absolute among the subnormals).
// Each check prints the worst ratio of error to tolerance it saw.
#define DOCTEST_CONFIG_IMPLEMENT
// The CPU attention brings Eigen (mpt's Tensor). Nothing of Eigen runs on the
// device here: read it as the plain C++ the library was compiled against,
// without its CUDA annotations (which nvcc warns about).
#define EIGEN_NO_CUDA
#include "gpu_test_support.hpp"
#include "kernels/nn/nn_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/formats/format_spec.hpp"
#include "mpt/formats/round_element.hpp"
#include "mpt/nn/layers/attention.hpp"

namespace {

using mpt::Fp16Code;
using mpt::cuda::CrossEntropyOptions;
using mpt::cuda::MaskedSoftmaxVersion;
using mpt::cuda::Reduction;
using mpt::cuda::SoftmaxCeVersion;
using mpt::test::DeviceArray;

constexpr double kU = 0x1p-24;  // FP32's unit roundoff
constexpr std::size_t kGuard = 7;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// --- fp16 on the host --------------------------------------------------------------

/// The exact value of an fp16 code.
double value_of(Fp16Code c) { return mpt::decode(c.bits, mpt::formats::fp16); }

/// v rounded once to fp16 (nearest-even, overflow to inf, subnormals kept).
Fp16Code code_of(float v) {
  const mpt::FormatSpec& f = mpt::formats::fp16;
  return Fp16Code{static_cast<std::uint16_t>(
      mpt::encode_exact(mpt::round_to_format(v, f, mpt::RoundingMode::nearest_even,
                                             mpt::OverflowMode::infinity, mpt::SubnormalMode::keep),
                        f))};
}

std::vector<Fp16Code> codes_of(const std::vector<float>& v) {
  std::vector<Fp16Code> c(v.size());
  std::transform(v.begin(), v.end(), c.begin(), code_of);
  return c;
}

/// The spacing of fp16 values at magnitude a (2^-24 among the subnormals).
double ulp16(double a) {
  const int e = (a == 0 || !std::isfinite(a)) ? -14 : std::max(std::ilogb(a), -14);
  return std::ldexp(1.0, e - 10);
}

/// The bits of a float.
std::uint32_t float_bits(float v) {
  std::uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

/// fp16's overflow threshold: finite values at or above it round to inf.
constexpr double kF16Overflow = 65520.0;

// --- comparing -----------------------------------------------------------------------

/// Mismatch counting (the first five printed, llm.c style) and the worst
/// ratio of error to tolerance.
struct Compare {
  std::string label;
  std::size_t bad = 0;
  double* worst = nullptr;

  void fail(const char* what, std::size_t i, double got, double want, double tol) {
    if (bad++ < 5)
      std::printf("%s: %s[%zu] got %.9g want %.9g (tolerance %.3g)\n", label.c_str(), what, i, got, want,
                  tol);
  }
  /// An FP32 result: |got − want| <= tol; NaN only against NaN, inf only
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
    if (worst && tol > 0) *worst = std::max(*worst, err / tol);
  }
  /// An fp16 result of an FP32 value within e32 of want, rounded once: within
  /// e32 plus half an fp16 ulp, or ±inf where want ± e32 reaches fp16's
  /// overflow threshold.
  void close16(const char* what, std::size_t i, Fp16Code got_code, double want, double e32) {
    const double got = value_of(got_code);
    if (std::isnan(got) || std::isnan(want)) {
      if (!(std::isnan(got) && std::isnan(want))) fail(what, i, got, want, e32);
      return;
    }
    const double a = std::fabs(want);
    if (std::isinf(got)) {
      if (std::signbit(got) != std::signbit(want) || a + e32 < kF16Overflow) fail(what, i, got, want, e32);
      return;
    }
    if (std::isinf(want) || a - e32 >= kF16Overflow) {
      fail(what, i, got, want, e32);
      return;
    }
    const double tol = e32 + 0.5 * ulp16(a + e32);
    const double err = std::fabs(got - want);
    if (!(err <= tol)) fail(what, i, got, want, tol);
    if (worst) *worst = std::max(*worst, err / tol);
  }
  /// The same bits.
  void bits(const char* what, std::size_t i, std::uint32_t got, std::uint32_t want) {
    if (got != want && bad++ < 5)
      std::printf("%s: %s[%zu] has bits 0x%x, want 0x%x\n", label.c_str(), what, i, got, want);
  }
};

/// n elements of T on the device followed by kGuard guard elements, all
/// poisoned; get() returns the n outputs and counts written guards as mismatches.
template <class T>
struct Out {
  Out(std::size_t n, unsigned char poison) : n(n), poison(poison), d(n + kGuard) { d.poison(poison); }
  std::vector<T> get(Compare& cmp, const char* what) const {
    std::vector<T> all = d.download();
    const T p = mpt::test::poison_value<T>(poison);
    for (std::size_t i = n; i < n + kGuard; ++i)
      if (std::memcmp(&all[i], &p, sizeof(T)) != 0 && cmp.bad++ < 5)
        std::printf("%s: %s: guard element %zu was written\n", cmp.label.c_str(), what, i - n);
    all.resize(n);
    return all;
  }
  T* ptr() const { return d.get(); }
  std::size_t n;
  unsigned char poison;
  DeviceArray<T> d;
};

// --- the cross-entropy reference (FP64) ------------------------------------------------

/// One cross-entropy problem: logits (rounded to fp16 on upload), targets, options.
struct CeCase {
  std::string name;
  std::int64_t rows = 0, classes = 0;
  std::vector<float> logits;  // rows·classes values before rounding into fp16
  std::vector<std::int32_t> targets;
  CrossEntropyOptions options;
  float dloss = 1.0f;
};

/// Elements per thread of a version (v2: whole vectors of 8), plus the merge levels.
double depth(std::int64_t classes, SoftmaxCeVersion v) {
  const bool vec = v == SoftmaxCeVersion::vectorized && classes % 8 == 0;
  const double per_thread =
      vec ? 8.0 * static_cast<double>((classes / 8 + 511) / 512) : static_cast<double>((classes + 255) / 256);
  return per_thread + 10.0;
}

/// The reference results and their tolerances.
struct CeRef {
  std::vector<double> loss, loss_tol, grad, grad_e32;  // per row; per element (before the fp16 rounding)
  std::vector<bool> ignored;                           // per row
  double total = 0, total_tol = 0;                     // the mean or the sum
};

CeRef reference(const CeCase& k, const std::vector<Fp16Code>& codes, SoftmaxCeVersion v) {
  const auto rows = static_cast<std::size_t>(k.rows), K = static_cast<std::size_t>(k.classes);
  const double eps = k.options.label_smoothing, D = depth(k.classes, v);
  CeRef r;
  r.loss.assign(rows, 0.0);
  r.loss_tol.assign(rows, 0.0);
  r.grad.assign(rows * K, 0.0);
  r.grad_e32.assign(rows * K, 0.0);
  r.ignored.assign(rows, false);
  double count = 0;
  for (std::size_t i = 0; i < rows; ++i) count += k.targets[i] != k.options.ignore_index ? 1 : 0;
  const double g = k.options.reduction == Reduction::mean ? k.dloss / count : k.dloss;
  double sum = 0, sum_tol = 0, sum_abs = 0;
  std::vector<double> z(K);
  for (std::size_t i = 0; i < rows; ++i) {
    const std::int32_t y = k.targets[i];
    if (y == k.options.ignore_index) {
      r.ignored[i] = true;
      continue;
    }
    bool nan = !(y >= 0 && static_cast<std::size_t>(y) < K);
    double m = -kInf;
    for (std::size_t j = 0; j < K; ++j) {
      z[j] = value_of(codes[i * K + j]);
      nan = nan || std::isnan(z[j]);
      m = std::max(m, z[j]);
    }
    // The shifted logits z − m, whose sum the smoothing term needs.
    double shifted = 0, shifted_abs = 0;
    for (std::size_t j = 0; j < K; ++j) {
      shifted += z[j] - m;
      shifted_abs += std::fabs(z[j] - m);
    }
    if (nan) {
      r.loss[i] = kNaN;
      std::fill(r.grad.begin() + static_cast<std::ptrdiff_t>(i * K),
                r.grad.begin() + static_cast<std::ptrdiff_t>((i + 1) * K), kNaN);
      sum = kNaN;
      continue;
    }
    double s = 0, ds = 0;
    for (std::size_t j = 0; j < K; ++j) {
      const double e = std::exp(z[j] - m);
      s += e;
      if (e > 0) ds += e * (m - z[j] + 4);
    }
    ds *= (D + 1) * kU;
    // cross_entropy_of: log(s) − (z_y − m); no term at the max's magnitude.
    const double delta = ds / s, log_s = std::log(s), zy_shifted = z[static_cast<std::size_t>(y)] - m;
    const double log_tol = delta + 2 * kU * std::fabs(log_s);
    const double nll = log_s - zy_shifted;
    double loss = nll, tol = log_tol + kU * std::fabs(zy_shifted) + kU * std::fabs(nll);
    if (eps > 0) {
      // Σ(z − m)/K: each difference rounded once, D additions deep, one division.
      const double mean = shifted / static_cast<double>(K);
      const double smooth = log_s - mean;
      const double mean_tol =
          (D + 1) * kU / (1 - (D + 1) * kU) * shifted_abs / static_cast<double>(K) + kU * std::fabs(mean);
      loss = (1 - eps) * nll + eps * smooth;
      tol = (1 - eps) * tol + eps * (log_tol + mean_tol + kU * std::fabs(smooth)) +
            2 * kU * ((1 - eps) * std::fabs(nll) + eps * std::fabs(smooth) + std::fabs(loss));
    }
    r.loss[i] = loss;
    r.loss_tol[i] = 2 * tol;
    sum += loss;
    sum_tol += 2 * tol;
    sum_abs += std::fabs(loss);
    for (std::size_t j = 0; j < K; ++j) {
      const double p = std::exp(z[j] - m) / s;
      const double q = (static_cast<std::int32_t>(j) == y ? 1 - eps : 0) + eps / static_cast<double>(K);
      const double p_err = p * (kU * (std::isfinite(z[j]) ? m - z[j] : 0) + 3 * kU + delta);
      r.grad[i * K + j] = g * (p - q);
      r.grad_e32[i * K + j] = 2 * (std::fabs(g) * (p_err + 3 * kU * q + kU * std::fabs(p - q) + 0x1p-126) +
                                   kU * std::fabs(g * (p - q)));
    }
  }
  // The one-block reduction: at most rows/1024 + 10 additions deep.
  const double reduce = 2 * (static_cast<double>(rows) / 1024 + 11) * kU * sum_abs;
  if (k.options.reduction == Reduction::mean) {
    r.total = sum / count;
    r.total_tol = (sum_tol + reduce) / count + 2 * kU * std::fabs(r.total);
  } else {
    r.total = sum;
    r.total_tol = sum_tol + reduce;
  }
  return r;
}

/// The worst ratios over a test case, printed at its end.
struct Worst {
  double loss = 0, total = 0, grad = 0, probs = 0;
  void print(const char* what) const {
    std::printf("%s: worst error/tolerance: row losses %.3g, reduced loss %.3g, gradient %.3g, probs %.3g\n",
                what, loss, total, grad, probs);
  }
};

const char* ce_version_name(SoftmaxCeVersion v) {
  return v == SoftmaxCeVersion::block_per_row ? "v1 block per row" : "v2 vectorized";
}
const char* reduction_name(Reduction r) {
  return r == Reduction::none ? "none" : r == Reduction::mean ? "mean" : "sum";
}

/// Where check_ce puts its arrays: aligned as cudaMalloc returns them, or
/// the logits or the gradient one code (2 bytes) past a 16-byte boundary,
/// where version 2 cannot load or store 16 bytes at a time and the call runs
/// version 1 (nn_kernels.hpp).
enum class Placement { aligned, logits_misaligned, grad_misaligned };

/// Run one case on the GPU with version v, every poison, and compare with
/// the reference: row losses, the reduced loss, the gradient (or, with
/// with_grad false, that nothing is written there).
void check_ce(const CeCase& k, SoftmaxCeVersion v, Worst& worst, bool with_grad = true,
              Placement place = Placement::aligned) {
  const auto rows = static_cast<std::size_t>(k.rows), n = rows * static_cast<std::size_t>(k.classes);
  const std::vector<Fp16Code> codes = codes_of(k.logits);
  // The version that runs: a misaligned array sends version 2 to version 1
  // (a gradient not asked for is no array).
  const bool fallback =
      place == Placement::logits_misaligned || (place == Placement::grad_misaligned && with_grad);
  const SoftmaxCeVersion runs = fallback ? SoftmaxCeVersion::block_per_row : v;
  const CeRef ref = reference(k, codes, runs);
  const std::size_t in_offset = place == Placement::logits_misaligned ? 1 : 0;
  const std::size_t out_offset = place == Placement::grad_misaligned ? 1 : 0;
  std::vector<Fp16Code> placed(codes);
  if (in_offset == 1) placed.insert(placed.begin(), Fp16Code{0x7E00});  // a NaN in front: never read
  DeviceArray<Fp16Code> d_logits(placed);
  DeviceArray<std::int32_t> d_targets(k.targets);
  for (unsigned char poison : mpt::test::kPoisonBytes) {
    Compare cmp;
    cmp.label = k.name + " (" + ce_version_name(v) + ", reduction " + reduction_name(k.options.reduction) +
                ", eps " + std::to_string(k.options.label_smoothing) + ", ignore_index " +
                std::to_string(k.options.ignore_index) + ", dloss " + std::to_string(k.dloss) +
                (with_grad ? "" : ", no gradient") +
                (place == Placement::logits_misaligned ? ", logits misaligned"
                 : place == Placement::grad_misaligned ? ", gradient misaligned"
                                                       : "") +
                ", poison " + std::to_string(poison) + ")";
    Out<float> losses(rows, poison), total(1, poison);
    Out<Fp16Code> grad(n + out_offset, poison);
    mpt::cuda::softmax_cross_entropy(k.rows, k.classes, d_logits.get() + in_offset, d_targets.get(), k.dloss,
                                     k.options, losses.ptr(), total.ptr(),
                                     with_grad ? grad.ptr() + out_offset : nullptr, v);
    const std::vector<float> got_losses = losses.get(cmp, "losses");
    const std::vector<float> got_total = total.get(cmp, "loss");
    std::vector<Fp16Code> got_grad = grad.get(cmp, "dlogits");
    if (out_offset == 1) {  // the code in front of the gradient must not be written
      cmp.bits("dlogits[-1] (in front of the gradient)", 0, got_grad[0].bits,
               mpt::test::poison_value<std::uint16_t>(poison));
      got_grad.erase(got_grad.begin());
    }
    const auto K = static_cast<std::size_t>(k.classes);
    cmp.worst = &worst.loss;
    for (std::size_t i = 0; i < rows; ++i) {
      if (ref.ignored[i]) {
        cmp.bits("losses (ignored row: +0)", i, float_bits(got_losses[i]), 0u);
      } else {
        cmp.close("losses", i, got_losses[i], ref.loss[i], ref.loss_tol[i]);
      }
    }
    cmp.worst = &worst.total;
    if (k.options.reduction != Reduction::none) cmp.close("loss", 0, got_total[0], ref.total, ref.total_tol);
    else
      cmp.bits("loss (not written for reduction none)", 0, float_bits(got_total[0]),
               mpt::test::poison_value<std::uint32_t>(poison));
    cmp.worst = &worst.grad;
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < K; ++j) {
        const std::size_t e = i * K + j;
        if (!with_grad)
          cmp.bits("dlogits (not asked for)", e, got_grad[e].bits,
                   mpt::test::poison_value<std::uint16_t>(poison));
        else if (ref.ignored[i]) cmp.bits("dlogits (ignored row)", e, got_grad[e].bits, 0u);
        else cmp.close16("dlogits", e, got_grad[e], ref.grad[e], ref.grad_e32[e]);
      }
    CHECK_MESSAGE(cmp.bad == 0, cmp.label << ": " << cmp.bad << " mismatches");
  }
}

// --- inputs ----------------------------------------------------------------------------------

std::vector<float> normal_values(std::size_t n, float mean, float sd, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(mean, sd);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

/// Targets uniform over [0, classes), with every `ignore_every`-th row (if > 0) ignored.
std::vector<std::int32_t> random_targets(std::int64_t rows, std::int64_t classes, std::int32_t ignore_index,
                                         int ignore_every, std::mt19937_64& rng) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = ignore_every > 0 && i % static_cast<std::size_t>(ignore_every) == 1
               ? ignore_index
               : static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(classes));
  return t;
}

CeCase random_case(const std::string& name, std::int64_t rows, std::int64_t classes, float sd,
                   std::mt19937_64& rng) {
  CeCase k;
  k.name = name;
  k.rows = rows;
  k.classes = classes;
  k.logits = normal_values(static_cast<std::size_t>(rows * classes), 0.0f, sd, rng);
  k.targets = random_targets(rows, classes, k.options.ignore_index, 5, rng);
  return k;
}

/// Every version, reduction and smoothing of one case.
void check_all_options(CeCase k, Worst& worst) {
  for (SoftmaxCeVersion v : {SoftmaxCeVersion::block_per_row, SoftmaxCeVersion::vectorized})
    for (Reduction red : {Reduction::none, Reduction::mean, Reduction::sum})
      for (float eps : {0.0f, 0.1f, 1.0f}) {
        k.options.reduction = red;
        k.options.label_smoothing = eps;
        check_ce(k, v, worst);
      }
}

// --- the masked softmax reference (FP64) -------------------------------------------------

struct SoftmaxCase {
  std::string name;
  std::int64_t rows = 0, cols = 0;
  std::vector<float> scores;
  std::vector<unsigned char> mask;  // empty: no mask
  bool causal = false;
};

/// The FP64 reference of a masked softmax over rows × L fp16 scores: each
/// probability and its FP32 error before the fp16 rounding, for a sum that
/// is at most D additions and rescalings deep; and what each row is.
struct MaskedRef {
  enum class Row { finite, zeros, nan };
  std::vector<double> want, e32;  // per element
  std::vector<Row> row;           // per row
};

template <class Keep>
MaskedRef masked_reference(const std::vector<Fp16Code>& codes, std::size_t rows, std::size_t L,
                           const Keep& keep, double D) {
  MaskedRef ref;
  ref.want.assign(rows * L, 0.0);
  ref.e32.assign(rows * L, 0.0);
  ref.row.assign(rows, MaskedRef::Row::finite);
  for (std::size_t r = 0; r < rows; ++r) {
    double m = -kInf;
    bool nan = false;
    for (std::size_t c = 0; c < L; ++c)
      if (keep(r, c)) {
        const double z = value_of(codes[r * L + c]);
        nan = nan || std::isnan(z) || z == kInf;  // NaN, or exp(inf − inf): the row's sum is NaN
        m = std::max(m, z);
      }
    if (nan) {
      // PyTorch's answer (softmax, then _safe_softmax): NaN at every
      // position, masked ones included.
      ref.row[r] = MaskedRef::Row::nan;
      std::fill(ref.want.begin() + static_cast<std::ptrdiff_t>(r * L),
                ref.want.begin() + static_cast<std::ptrdiff_t>((r + 1) * L), kNaN);
      continue;
    }
    if (m == -kInf) {  // nothing kept, or only −inf: zeros (_safe_softmax)
      ref.row[r] = MaskedRef::Row::zeros;
      continue;
    }
    double sum = 0, ds = 0;
    for (std::size_t c = 0; c < L; ++c)
      if (keep(r, c)) {
        const double z = value_of(codes[r * L + c]), e = std::exp(z - m);
        sum += e;
        if (e > 0) ds += e * (m - z + 4);
      }
    const double delta = (D + 1) * kU * ds / sum;
    for (std::size_t c = 0; c < L; ++c) {
      if (!keep(r, c)) continue;  // exactly 0
      const double z = value_of(codes[r * L + c]), p = std::exp(z - m) / sum;
      ref.want[r * L + c] = p;
      ref.e32[r * L + c] = 2 * (p * (kU * (std::isfinite(z) ? m - z : 0) + 3 * kU + delta) + 0x1p-126);
    }
  }
  return ref;
}

/// One probability against the reference: +0 bits where the reference is an
/// exact 0 (a masked position of a finite row, a row of zeros), NaN (any
/// payload: the class, not the bits) where it is NaN, else within e32 and
/// the fp16 rounding.
void check_prob(Compare& cmp, const MaskedRef& ref, std::size_t e, Fp16Code got) {
  if (std::isnan(ref.want[e])) cmp.close16("probs (a NaN row: NaN everywhere)", e, got, kNaN, 0);
  else if (ref.want[e] == 0 && ref.e32[e] == 0)
    cmp.bits("probs (masked or fully masked row)", e, got.bits, 0u);
  else cmp.close16("probs", e, got, ref.want[e], ref.e32[e]);
}

/// The depth of a masked softmax version's (max, sum) for rows of L: a
/// lane's columns (version 2: whole vectors of 8, where L % 8 == 0) and the
/// warp's merge levels.
double masked_depth(std::size_t L, MaskedSoftmaxVersion v) {
  const bool vec = v == MaskedSoftmaxVersion::vectorized && L % 8 == 0;
  return (vec ? 8.0 * static_cast<double>((L / 8 + 31) / 32) : static_cast<double>((L + 31) / 32)) + 5;
}

/// Where check_masked_softmax puts its arrays: aligned, or the scores, the
/// probabilities or the mask one element off (2, 2 and 1 bytes), where
/// version 2 cannot run and the call falls back to version 1.
enum class MaskPlacement { aligned, scores_off, probs_off, mask_off };

/// Run one case with both versions (or, placed off, version 2's call, which
/// runs version 1), every poison, against the FP64 reference.
void check_masked_softmax(const SoftmaxCase& k, Worst& worst, MaskPlacement place = MaskPlacement::aligned) {
  const auto rows = static_cast<std::size_t>(k.rows), L = static_cast<std::size_t>(k.cols), n = rows * L;
  const std::vector<Fp16Code> codes = codes_of(k.scores);
  auto keep = [&](std::size_t r, std::size_t c) {
    return (k.mask.empty() || k.mask[r * L + c] != 0) && (!k.causal || c <= r % L);
  };
  const std::size_t s_at = place == MaskPlacement::scores_off ? 1 : 0;
  const std::size_t p_at = place == MaskPlacement::probs_off ? 1 : 0;
  const std::size_t m_at = place == MaskPlacement::mask_off ? 1 : 0;
  std::vector<Fp16Code> placed(codes);
  placed.insert(placed.begin(), s_at, Fp16Code{0x7E00});  // a NaN in front: never read
  std::vector<unsigned char> mask_bytes(k.mask);
  mask_bytes.insert(mask_bytes.begin(), m_at, 1);
  DeviceArray<Fp16Code> d_scores(placed);
  DeviceArray<unsigned char> d_mask(mask_bytes.empty() ? std::vector<unsigned char>(1, 0) : mask_bytes);
  const bool* mask = k.mask.empty() ? nullptr : reinterpret_cast<const bool*>(d_mask.get() + m_at);
  const bool off = place != MaskPlacement::aligned && !(place == MaskPlacement::mask_off && k.mask.empty());
  for (MaskedSoftmaxVersion v : {MaskedSoftmaxVersion::warp_per_row, MaskedSoftmaxVersion::vectorized}) {
    if (off && v == MaskedSoftmaxVersion::warp_per_row) continue;  // only version 2 has a fallback to check
    const MaskedSoftmaxVersion runs = off ? MaskedSoftmaxVersion::warp_per_row : v;
    const MaskedRef ref = masked_reference(codes, rows, L, keep, masked_depth(L, runs));
    for (unsigned char poison : mpt::test::kPoisonBytes) {
      Compare cmp;
      cmp.label = k.name + " (" + std::to_string(k.rows) + " x " + std::to_string(k.cols) +
                  (k.mask.empty() ? "" : ", mask") + (k.causal ? ", causal" : "") +
                  (v == MaskedSoftmaxVersion::warp_per_row ? ", v1" : ", v2") +
                  (place == MaskPlacement::scores_off  ? ", scores off 16 bytes"
                   : place == MaskPlacement::probs_off ? ", probs off 16 bytes"
                   : place == MaskPlacement::mask_off  ? ", mask off 8 bytes"
                                                       : "") +
                  ", poison " + std::to_string(poison) + ")";
      cmp.worst = &worst.probs;
      Out<Fp16Code> probs(n + p_at, poison);
      mpt::cuda::masked_softmax(k.rows, k.cols, d_scores.get() + s_at, mask, k.causal, probs.ptr() + p_at, v);
      std::vector<Fp16Code> got = probs.get(cmp, "probs");
      if (p_at == 1) {  // nothing written in front of the probabilities
        cmp.bits("probs[-1]", 0, got[0].bits, mpt::test::poison_value<std::uint16_t>(poison));
        got.erase(got.begin());
      }
      for (std::size_t e = 0; e < n; ++e) check_prob(cmp, ref, e, got[e]);
      CHECK_MESSAGE(cmp.bad == 0, cmp.label << ": " << cmp.bad << " mismatches");
    }
  }
}

std::vector<unsigned char> random_mask(std::size_t n, double keep, std::mt19937_64& rng) {
  std::bernoulli_distribution b(keep);
  std::vector<unsigned char> m(n);
  for (auto& x : m) x = b(rng) ? 1 : 0;
  return m;
}

}  // namespace

// --- cross-entropy ------------------------------------------------------------------------------

TEST_CASE("softmax_cross_entropy: random logits, every version, reduction and smoothing") {
  std::mt19937_64 rng(mpt::test::test_seed() + 1);
  Worst worst;
  // K = 1; K below a warp; K % 8 != 0 (version 2 runs version 1); K a
  // multiple of 8 but not of a block's 4096-code share; 256·3 + 37.
  for (std::int64_t K : {1, 7, 40, 805, 4096 + 8 * 37}) {
    CeCase k = random_case("random K=" + std::to_string(K), K > 1000 ? 5 : 13, K, 3.0f, rng);
    check_all_options(k, worst);
  }
  worst.print("random logits");
}

TEST_CASE("softmax_cross_entropy: adversarial logits") {
  std::mt19937_64 rng(mpt::test::test_seed() + 2);
  Worst worst;
  const std::int64_t rows = 9, K = 1000;
  const auto n = static_cast<std::size_t>(rows * K);
  {
    // ±60000: without the max subtracted every exp overflows (or underflows
    // to a sum of 0); the loss of a row whose target sits at −60000 is ~120000.
    CeCase k = random_case("±60000", rows, K, 1.0f, rng);
    for (float& z : k.logits) z = (rng() % 2 ? 60000.0f : -60000.0f) + z;
    check_all_options(k, worst);
  }
  {
    // All equal: softmax = 1/K exactly, the loss log K whatever the target.
    CeCase k = random_case("all equal", rows, K, 1.0f, rng);
    std::fill(k.logits.begin(), k.logits.end(), 12.5f);
    check_all_options(k, worst);
  }
  {
    // One huge logit per row: softmax is one-hot there (every other term
    // underflows), the loss 0 when it is the target and ~60000 otherwise.
    CeCase k = random_case("one huge", rows, K, 2.0f, rng);
    for (std::int64_t r = 0; r < rows; ++r)
      k.logits[static_cast<std::size_t>(r * K + (r * 37) % K)] = 60000.0f;
    k.targets[0] = 0;  // row 0's huge logit is at 0: the target itself
    check_all_options(k, worst);
  }
  {
    // Large logits near ties: 30000 + 16·k (fp16's spacing there is 16), the
    // target at the row's maximum, so the loss is log(1 + a few e^-16k),
    // about 0.7 where two logits tie. (m + log s) − z_y would round
    // m + log s to FP32's spacing at 30000, 2^-9, an error of up to 2^-10
    // against a tolerance of about 10^-6 here; log s − (z_y − m) does not.
    CeCase k = random_case("large logits, near ties", rows, K, 1.0f, rng);
    for (float& z : k.logits) z = 30000.0f - 16.0f * static_cast<float>(1 + rng() % 6);
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto base = static_cast<std::size_t>(r * K);
      const auto y = static_cast<std::size_t>(r * 13 % K);
      k.targets[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(y);
      k.logits[base + y] = 30000.0f;
      if (r % 2 == 0) k.logits[base + (y + 1) % static_cast<std::size_t>(K)] = 30000.0f;  // a tie
    }
    check_all_options(k, worst);
  }
  {
    // −inf logits (a masked vocabulary): the loss stays finite without
    // smoothing; with smoothing it is +inf (Σz/K = −inf), as PyTorch's.
    CeCase k = random_case("some -inf", rows, K, 2.0f, rng);
    for (std::size_t i = 3; i < n; i += 7) k.logits[i] = -std::numeric_limits<float>::infinity();
    for (std::int64_t r = 0; r < rows; ++r)
      if (k.targets[static_cast<std::size_t>(r)] >= 0)
        k.logits[static_cast<std::size_t>(r * K + k.targets[static_cast<std::size_t>(r)])] = 1.0f;
    check_all_options(k, worst);
  }
  {
    // A +inf logit in row 4 (an fp16 overflow upstream): exp(inf − inf)
    // makes that row's sum, loss and every gradient element NaN, as PyTorch's
    // log_softmax and the CPU's row functions give; a −inf beside it in row
    // 6 changes nothing there. Every other row as without them.
    CeCase k = random_case("+inf in row 4", rows, K, 2.0f, rng);
    k.targets[4] = 3;
    k.targets[6] = 3;
    k.logits[static_cast<std::size_t>(4 * K + 700)] = std::numeric_limits<float>::infinity();
    k.logits[static_cast<std::size_t>(6 * K + 700)] = -std::numeric_limits<float>::infinity();
    check_all_options(k, worst);
    // The +inf is the target itself: still NaN (inf − inf).
    k.logits[static_cast<std::size_t>(4 * K + 3)] = std::numeric_limits<float>::infinity();
    check_all_options(k, worst);
  }
  {
    // A NaN in row 2: that row's loss and every gradient element NaN (and
    // the mean and sum); every other row as without it.
    CeCase k = random_case("NaN in row 2", rows, K, 2.0f, rng);
    k.targets[2] = 5;
    k.logits[static_cast<std::size_t>(2 * K + 600)] = std::numeric_limits<float>::quiet_NaN();
    check_all_options(k, worst);
  }
  worst.print("adversarial logits");
}

TEST_CASE("softmax_cross_entropy: ignore_index, invalid targets, loss scales, forward only") {
  std::mt19937_64 rng(mpt::test::test_seed() + 3);
  Worst worst;
  for (SoftmaxCeVersion v : {SoftmaxCeVersion::block_per_row, SoftmaxCeVersion::vectorized}) {
    // ignore_index inside [0, K): rows whose target is class 0 are ignored;
    // -100 is then an invalid target (NaN row), as is K + 3.
    CeCase k = random_case("ignore_index 0", 11, 64, 2.0f, rng);
    k.options.ignore_index = 0;
    k.targets = {0, 3, 0, 63, -100, 7, 64 + 3, 0, 1, 2, 0};
    for (Reduction red : {Reduction::none, Reduction::mean, Reduction::sum}) {
      k.options.reduction = red;
      k.options.label_smoothing = 0.1f;
      check_ce(k, v, worst);
    }
    // Loss scales: 1024 and 2^16 keep the gradients finite (mean over 10
    // rows), 2^18 with sum makes the confident wrong rows' gradients ±inf.
    CeCase s = random_case("loss scales", 10, 64, 4.0f, rng);
    for (std::int64_t r = 0; r < 10; ++r) s.logits[static_cast<std::size_t>(r * 64 + 9)] = 20.0f;
    for (float dloss : {1024.0f, 65536.0f}) {
      s.dloss = dloss;
      s.options.reduction = Reduction::mean;
      check_ce(s, v, worst);
    }
    s.dloss = 262144.0f;
    s.options.reduction = Reduction::sum;
    check_ce(s, v, worst);
    // Forward only: no gradient pointer, nothing written there.
    s.dloss = 1.0f;
    s.options.reduction = Reduction::mean;
    check_ce(s, v, worst, false);
    // K % 8 == 0 but the logits or the gradient one code off a 16-byte
    // boundary: version 2 cannot run, the call falls back to version 1, whose
    // results these must be (and nothing is written in front of the gradient).
    CeCase m = random_case("misaligned", 7, 8 * 45, 3.0f, rng);
    m.options.label_smoothing = 0.1f;
    for (Placement place : {Placement::logits_misaligned, Placement::grad_misaligned}) {
      check_ce(m, v, worst, true, place);
      check_ce(m, v, worst, false, place);
    }
    // Every row ignored: the mean is 0/0 = NaN, the gradient all zeros.
    CeCase all = random_case("every row ignored", 4, 24, 1.0f, rng);
    std::fill(all.targets.begin(), all.targets.end(), all.options.ignore_index);
    check_ce(all, v, worst);
  }
  worst.print("options");
}

TEST_CASE("softmax_cross_entropy: the runs are deterministic, and a long row (K = 32768) matches") {
  std::mt19937_64 rng(mpt::test::test_seed() + 4);
  Worst worst;
  CeCase k = random_case("K=32768", 3, 32768, 4.0f, rng);
  k.options.label_smoothing = 0.1f;
  for (SoftmaxCeVersion v : {SoftmaxCeVersion::block_per_row, SoftmaxCeVersion::vectorized}) {
    check_ce(k, v, worst);
    const std::vector<Fp16Code> codes = codes_of(k.logits);
    DeviceArray<Fp16Code> d_logits(codes), g1(codes.size()), g2(codes.size());
    DeviceArray<std::int32_t> d_targets(k.targets);
    DeviceArray<float> l1(3), l2(3), t1(1), t2(1);
    mpt::cuda::softmax_cross_entropy(3, 32768, d_logits.get(), d_targets.get(), 1.0f, k.options, l1.get(),
                                     t1.get(), g1.get(), v);
    mpt::cuda::softmax_cross_entropy(3, 32768, d_logits.get(), d_targets.get(), 1.0f, k.options, l2.get(),
                                     t2.get(), g2.get(), v);
    CHECK(mpt::test::code_bits(g1.download()) == mpt::test::code_bits(g2.download()));
    CHECK(std::memcmp(l1.download().data(), l2.download().data(), 3 * sizeof(float)) == 0);
    CHECK(std::memcmp(t1.download().data(), t2.download().data(), sizeof(float)) == 0);
  }
  worst.print("K = 32768");
}

// --- masked softmax --------------------------------------------------------------------------------

TEST_CASE("masked_softmax: random, masked, causal, fully masked rows, NaN, ±inf, ±60000") {
  std::mt19937_64 rng(mpt::test::test_seed() + 5);
  Worst worst;
  // L % 8 == 0 (32, 40, 96, and 3000 below) runs version 2; the others
  // send it to version 1.
  for (std::int64_t L : {1, 5, 32, 40, 77, 96, 300}) {
    const auto n = static_cast<std::size_t>(2 * L * L);
    SoftmaxCase k{"random L=" + std::to_string(L), 2 * L, L, normal_values(n, 0.0f, 3.0f, rng), {}, false};
    check_masked_softmax(k, worst);
    k.causal = true;
    check_masked_softmax(k, worst);
    k.mask = random_mask(n, 0.7, rng);
    check_masked_softmax(k, worst);
    k.causal = false;
    // Fully masked rows (1 and 3) output zeros; a NaN at a masked position
    // changes nothing.
    for (std::size_t r : {std::size_t{1}, std::size_t{3}})
      if (r < static_cast<std::size_t>(k.rows))
        std::fill(k.mask.begin() + static_cast<std::ptrdiff_t>(r * L),
                  k.mask.begin() + static_cast<std::ptrdiff_t>((r + 1) * L), 0);
    k.scores[static_cast<std::size_t>(L)] = std::numeric_limits<float>::quiet_NaN();
    check_masked_softmax(k, worst);
  }
  {
    // A NaN at a kept position: NaN at every position of that row, masked
    // ones included (PyTorch's answer), the other rows untouched.
    const std::int64_t L = 50, R = 6;
    SoftmaxCase k{"NaN kept",
                  R,
                  L,
                  normal_values(static_cast<std::size_t>(R * L), 0.0f, 2.0f, rng),
                  random_mask(static_cast<std::size_t>(R * L), 0.8, rng),
                  false};
    k.mask[static_cast<std::size_t>(2 * L + 4)] = 1;
    k.scores[static_cast<std::size_t>(2 * L + 4)] = std::numeric_limits<float>::quiet_NaN();
    // A kept +inf in row 4: NaN everywhere in it too (exp(inf − inf)); a
    // masked +inf in row 1 and a kept −inf in row 5 change nothing.
    const float inf = std::numeric_limits<float>::infinity();
    k.mask[static_cast<std::size_t>(4 * L + 9)] = 1;
    k.scores[static_cast<std::size_t>(4 * L + 9)] = inf;
    k.mask[static_cast<std::size_t>(1 * L + 3)] = 0;
    k.scores[static_cast<std::size_t>(1 * L + 3)] = inf;
    k.mask[static_cast<std::size_t>(5 * L + 7)] = 1;
    k.scores[static_cast<std::size_t>(5 * L + 7)] = -inf;
    check_masked_softmax(k, worst);
  }
  {
    // ±60000 and a long row (a row per warp walks 3000 columns).
    const std::int64_t L = 3000, R = 4;
    SoftmaxCase k{"±60000", R, L, normal_values(static_cast<std::size_t>(R * L), 0.0f, 1.0f, rng), {}, false};
    for (float& z : k.scores) z += rng() % 2 ? 60000.0f : -60000.0f;
    check_masked_softmax(k, worst);
    k.mask = random_mask(static_cast<std::size_t>(R * L), 0.5, rng);
    check_masked_softmax(k, worst);
  }
  {
    // L % 8 == 0 but the scores, the probabilities or the mask one element
    // off their boundary: version 2 falls back to version 1 (a 16-byte access
    // there would fault), and writes nothing in front of the probabilities.
    const std::int64_t L = 64, R = 2 * L;
    SoftmaxCase k{"misaligned",
                  R,
                  L,
                  normal_values(static_cast<std::size_t>(R * L), 0.0f, 3.0f, rng),
                  random_mask(static_cast<std::size_t>(R * L), 0.7, rng),
                  false};
    for (MaskPlacement place : {MaskPlacement::scores_off, MaskPlacement::probs_off, MaskPlacement::mask_off})
      check_masked_softmax(k, worst, place);
    k.mask.clear();
    k.causal = true;
    check_masked_softmax(k, worst, MaskPlacement::probs_off);
  }
  worst.print("masked softmax");
}

TEST_CASE("masked_softmax against the CPU attention: +inf and NaN kept scores, fully masked rows") {
  // mpt::scaled_dot_product_attention in f16 (FP32 compute) stores its
  // scores S (Q·scale Kᵀ, rounded to f16) and its probabilities P (rounded
  // to f16); the kernel is given the same S and the same mask. Where the
  // rows are finite, both sides must be within their FP32 bounds of the
  // FP64 softmax (and so within those bounds and an fp16 ulp of each
  // other); on the special rows they must agree exactly, by class: +0
  // bits for a row of zeros, NaN (any payload) at every position of a row
  // whose kept scores hold a +inf or a NaN — PyTorch's answer, which the
  // CPU attention gives and the kernel once did not (it wrote 0 at the
  // masked positions of such a row).
  std::mt19937_64 rng(mpt::test::test_seed() + 7);
  Worst worst;
  const std::int64_t L = 40, D = 8;  // 40 columns: lanes 8–31 of each warp idle on the second pass
  const auto Lz = static_cast<std::size_t>(L), n = Lz * Lz;
  for (int variant = 0; variant < 3; ++variant) {
    // 0: a boolean mask; 1: causal; 2: an additive mask of 0, −inf, NaN, +inf.
    std::vector<float> q = normal_values(static_cast<std::size_t>(L * D), 0.0f, 1.0f, rng);
    std::vector<float> k = normal_values(static_cast<std::size_t>(L * D), 0.0f, 1.0f, rng);
    const std::vector<float> v = normal_values(static_cast<std::size_t>(L * D), 0.0f, 1.0f, rng);
    // Row 3 and key 1 of 300s: S(3, 1) = (300/√8)·300·8 ≈ 2.5e5 overflows
    // f16 to +inf (a kept score in every variant); the rest of row 3 and of
    // column 1 stays finite (a few hundred).
    for (std::int64_t c = 0; c < D; ++c) {
      q[static_cast<std::size_t>(3 * D + c)] = 300.0f;
      k[static_cast<std::size_t>(1 * D + c)] = 300.0f;
    }
    // Row 5 of Q holds a NaN: every score of row 5 is NaN.
    q[static_cast<std::size_t>(5 * D + 2)] = std::numeric_limits<float>::quiet_NaN();
    std::vector<unsigned char> keep_bytes(n, 1);
    std::vector<float> add(n, 0.0f);
    mpt::AttentionMask mask;
    mpt::AttentionOptions options;
    const float inf = std::numeric_limits<float>::infinity();
    if (variant == 0) {
      keep_bytes = random_mask(n, 0.7, rng);
      keep_bytes[3 * Lz + 1] = 1;  // the +inf is kept
      std::fill(keep_bytes.begin() + 9 * L, keep_bytes.begin() + 10 * L,
                std::uint8_t{0});  // row 9: nothing kept
      mask = mpt::AttentionMask::boolean({L, L},
                                         std::vector<std::uint8_t>(keep_bytes.begin(), keep_bytes.end()));
    } else if (variant == 1) {
      options.is_causal = true;  // row 3 sees key 1; rows 0 and 1 see no NaN and no +inf
    } else {
      for (std::size_t e = 0; e < n; ++e) add[e] = rng() % 4 == 0 ? -inf : 0.0f;
      add[3 * Lz + 1] = 0.0f;
      std::fill(add.begin() + 9 * L, add.begin() + 10 * L, -inf);  // row 9: every position −inf
      add[12 * Lz + 7] = std::numeric_limits<float>::quiet_NaN();  // a NaN added at a kept position
      add[14 * Lz + 30] = inf;                                     // a +inf added
      add[16 * Lz + 2] = -inf;
      add[16 * Lz + 3] = inf;  // −inf and +inf in one row
      for (std::size_t e = 0; e < n; ++e) keep_bytes[e] = add[e] == -inf ? 0 : 1;
      mask = mpt::AttentionMask::additive(mpt::Tensor::from_f32(add.data(), {L, L}, mpt::DType::f32));
    }
    mpt::Context ctx(mpt::uniform_policy(mpt::DType::f16));
    const mpt::Shape shape{1, L, D};
    const mpt::AttentionResult cpu = mpt::scaled_dot_product_attention(
        mpt::Tensor::from_f32(q.data(), shape, mpt::DType::f16),
        mpt::Tensor::from_f32(k.data(), shape, mpt::DType::f16),
        mpt::Tensor::from_f32(v.data(), shape, mpt::DType::f16), mask, options, ctx);
    REQUIRE(cpu.scores.dtype() == mpt::DType::f16);
    REQUIRE(cpu.saved.probs.dtype() == mpt::DType::f16);
    std::vector<Fp16Code> scores(n), cpu_probs(n);
    std::memcpy(scores.data(), cpu.scores.raw(), n * sizeof(Fp16Code));
    std::memcpy(cpu_probs.data(), cpu.saved.probs.raw(), n * sizeof(Fp16Code));
    REQUIRE(value_of(scores[3 * Lz + 1]) == kInf);  // the overflow happened
    // The kernel's input: S plus the additive mask where that is exact (0,
    // NaN, +inf on a finite score), the −inf of the mask as mask bytes.
    if (variant == 2)
      for (std::size_t e = 0; e < n; ++e)
        if (std::isnan(add[e]) || add[e] == inf) scores[e] = code_of(add[e]);
    auto keep = [&](std::size_t r, std::size_t c) {
      return variant == 1 ? c <= r : keep_bytes[r * Lz + c] != 0;
    };
    const MaskedRef cpu_ref = masked_reference(scores, Lz, Lz, keep, static_cast<double>(Lz) + 5);
    DeviceArray<Fp16Code> d_scores(scores);
    DeviceArray<unsigned char> d_mask(keep_bytes);
    const bool* d_keep = variant == 1 ? nullptr : reinterpret_cast<const bool*>(d_mask.get());
    for (MaskedSoftmaxVersion v : {MaskedSoftmaxVersion::warp_per_row, MaskedSoftmaxVersion::vectorized})
      for (unsigned char poison : mpt::test::kPoisonBytes) {
        const MaskedRef gpu_ref = masked_reference(scores, Lz, Lz, keep, masked_depth(Lz, v));
        REQUIRE(gpu_ref.row[3] == MaskedRef::Row::nan);
        REQUIRE(gpu_ref.row[5] == MaskedRef::Row::nan);
        Compare cmp;
        cmp.label = std::string("against the CPU attention, ") +
                    (variant == 0   ? "boolean mask"
                     : variant == 1 ? "causal"
                                    : "additive mask") +
                    (v == MaskedSoftmaxVersion::warp_per_row ? ", v1" : ", v2") + ", poison " +
                    std::to_string(poison);
        cmp.worst = &worst.probs;
        Out<Fp16Code> probs(n, poison);
        mpt::cuda::masked_softmax(L, L, d_scores.get(), d_keep, variant == 1, probs.ptr(), v);
        const std::vector<Fp16Code> got = probs.get(cmp, "probs");
        for (std::size_t e = 0; e < n; ++e) {
          check_prob(cmp, gpu_ref, e, got[e]);        // the kernel within its bound
          check_prob(cmp, cpu_ref, e, cpu_probs[e]);  // the CPU attention within its own
          const std::size_t r = e / Lz;
          if (gpu_ref.row[r] == MaskedRef::Row::nan) {
            if (!(std::isnan(value_of(got[e])) && std::isnan(value_of(cpu_probs[e]))))
              cmp.fail("probs (NaN row: NaN on both sides)", e, value_of(got[e]), value_of(cpu_probs[e]), 0);
          } else if (gpu_ref.want[e] == 0 && gpu_ref.e32[e] == 0) {
            cmp.bits("probs (exact zero on both sides)", e, got[e].bits, cpu_probs[e].bits);
          }
        }
        CHECK_MESSAGE(cmp.bad == 0, cmp.label << ": " << cmp.bad << " mismatches");
      }
  }
  worst.print("against the CPU attention");
}

TEST_CASE("softmax kernels: a small case of every kernel (for compute-sanitizer)") {
  // tools/gpu_report.sh runs this case under memcheck and racecheck: both
  // cross-entropy versions with each reduction (the count and reduction
  // kernels too) on rows that leave threads idle, and the masked softmax
  // with a mask and causal, in both versions.
  std::mt19937_64 rng(mpt::test::test_seed() + 6);
  Worst worst;
  CeCase k = random_case("small", 5, 8 * 77, 2.0f, rng);
  k.options.label_smoothing = 0.1f;
  for (SoftmaxCeVersion v : {SoftmaxCeVersion::block_per_row, SoftmaxCeVersion::vectorized})
    for (Reduction red : {Reduction::none, Reduction::mean, Reduction::sum}) {
      k.options.reduction = red;
      check_ce(k, v, worst);
    }
  const std::int64_t L = 37;
  SoftmaxCase s{"small",
                2 * L,
                L,
                normal_values(static_cast<std::size_t>(2 * L * L), 0.0f, 2.0f, rng),
                random_mask(static_cast<std::size_t>(2 * L * L), 0.6, rng),
                true};
  check_masked_softmax(s, worst);
  s.rows = 40;  // rows of 8-code vectors: the vectorized version runs
  s.cols = 40;
  s.scores.resize(40 * 40);
  s.mask.resize(40 * 40);
  check_masked_softmax(s, worst);
  worst.print("small cases");
}

TEST_CASE("softmax kernels: empty sizes, bad arguments throw before any launch") {
  using mpt::cuda::masked_softmax;
  using mpt::cuda::softmax_cross_entropy;
  DeviceArray<Fp16Code> x(64), y(64);
  DeviceArray<std::int32_t> t(8);
  DeviceArray<float> losses(8), loss(1);
  Fp16Code* no_grad = nullptr;
  float* none = nullptr;
  const Fp16Code* no_logits = nullptr;
  CrossEntropyOptions mean;  // the defaults: mean, eps 0, ignore_index -100
  // No rows: the mean of nothing is NaN, the sum 0; nothing else is written.
  losses.poison();
  loss.poison(mpt::test::kPoisonFinite);
  CHECK_NOTHROW(softmax_cross_entropy(0, 5, no_logits, nullptr, 1.0f, mean, none, loss.get(), no_grad));
  CHECK(std::isnan(loss.download()[0]));
  CrossEntropyOptions sum;
  sum.reduction = Reduction::sum;
  CHECK_NOTHROW(softmax_cross_entropy(0, 5, no_logits, nullptr, 1.0f, sum, none, loss.get(), no_grad));
  CHECK(loss.download()[0] == 0.0f);
  CHECK(std::isnan(losses.download()[0]));  // still the 0xFF poison
  y.poison();
  CHECK_NOTHROW(masked_softmax(0, 5, no_logits, nullptr, true, y.get()));
  CHECK(mpt::test::code_bits(y.download()[0]) == 0xffffu);

  // std::invalid_argument, naming what was wrong.
  auto ce = [&](std::int64_t rows, std::int64_t classes, const CrossEntropyOptions& o, float* total) {
    softmax_cross_entropy(rows, classes, x.get(), t.get(), 1.0f, o, losses.get(), total, y.get());
  };
  CHECK_THROWS_AS(ce(-1, 4, mean, loss.get()), std::invalid_argument);
  CHECK_THROWS_AS(ce(2, 0, mean, loss.get()), std::invalid_argument);
  CHECK_THROWS_AS(ce(2, 4, mean, none), std::invalid_argument);  // mean without a loss output
  CrossEntropyOptions o;
  for (float eps : {-0.1f, 1.5f, std::nanf("")}) {
    o.label_smoothing = eps;
    CHECK_THROWS_AS(ce(2, 4, o, loss.get()), std::invalid_argument);
  }
  o = CrossEntropyOptions{};
  o.reduction = static_cast<Reduction>(7);
  CHECK_THROWS_AS(ce(2, 4, o, loss.get()), std::invalid_argument);
  CHECK_THROWS_AS(
      softmax_cross_entropy(2, 4, no_logits, t.get(), 1.0f, mean, losses.get(), loss.get(), y.get()),
      std::invalid_argument);
  CHECK_THROWS_AS(softmax_cross_entropy(2, 4, x.get(), t.get(), 1.0f, mean, none, loss.get(), y.get()),
                  std::invalid_argument);
  CHECK_THROWS_AS(softmax_cross_entropy(2, 4, x.get(), t.get(), 1.0f, mean, losses.get(), loss.get(), y.get(),
                                        static_cast<SoftmaxCeVersion>(3)),
                  std::invalid_argument);
  CHECK_THROWS_AS(masked_softmax(-1, 4, x.get(), nullptr, false, y.get()), std::invalid_argument);
  CHECK_THROWS_AS(masked_softmax(4, 0, x.get(), nullptr, false, y.get()), std::invalid_argument);
  CHECK_THROWS_AS(masked_softmax(6, 4, x.get(), nullptr, true, y.get()), std::invalid_argument);  // 6 % 4
  CHECK_THROWS_AS(masked_softmax(4, 4, x.get(), nullptr, false, no_grad), std::invalid_argument);
  // Too big for a grid or for 64-bit offsets: std::length_error, no launch.
  CHECK_THROWS_AS(ce(std::int64_t{1} << 31, 4, mean, loss.get()), std::length_error);
  CHECK_THROWS_AS(ce(std::int64_t{1} << 40, std::int64_t{1} << 40, mean, loss.get()), std::length_error);
  CHECK_THROWS_AS(masked_softmax(std::int64_t{1} << 40, 1, x.get(), nullptr, false, y.get()),
                  std::length_error);
  CHECK_NOTHROW(mpt::cuda::synchronize());
  CHECK(mpt::test::code_bits(y.download()[0]) == 0xffffu);
}

int main(int argc, char** argv) { return mpt::test::gpu_test_main(argc, argv); }
