// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the numbers the
// chapter text quotes that the CLI does not print (program `ch03_numbers`).
// Depends on: the Chapter 3 layers (batch_norm.hpp, layer_norm.hpp,
// welford.hpp, cnn.hpp), the variance methods of norm_methods.hpp, Chapter 2's training code
// (../02-loss-scaling/ training.hpp: batches, the digits, the loss-scaled step) and GradScaler, Chapter 1's
// rounding and formats.
//
// The chapter's README contains no typed-in numbers: generate.sh runs this
// program once per section and splices the output into the text. Usage:
//   ch03_numbers variance|accuracy|cnn|claims
// cnn reads the real digits file (it fails with the fetch commands when the
// file is missing).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../02-loss-scaling/training.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/core/random.hpp"
#include "mpt/formats/explain.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/formats/rounding.hpp"
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/layers/layer_norm.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/layers/welford.hpp"
#include "mpt/nn/models/cnn.hpp"
#include "mpt/optim/sgd.hpp"
#include "norm_methods.hpp"

namespace {

using namespace mpt;
using namespace mpt::ch02;  // Chapter 2's training.hpp: Batches, digits(), scaled_backward

const Format& fp16() { return format_named("fp16"); }
float to_fp16(double x) { return round_value(static_cast<float>(x), fp16()); }
std::string dec(double x) { return shortest_decimal(static_cast<float>(x)); }
std::string g3(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}
std::string pct(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * fraction);
  return buf;
}

/// n values, mean `mean`, standard deviation `sd`, from `seed`, stored in fp16
/// (what an fp16 activation tensor holds).
std::vector<float> fp16_values(std::size_t n, double mean, double sd, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (float& v : x) v = to_fp16(mean + sd * rng.normal());
  return x;
}

// --- variance: four ways of computing one channel's variance ---------------------

struct VarianceRow {
  double exact = 0;                   // fp64 two-pass
  double naive32 = 0, welford32 = 0;  // FP32 E[x²] − E[x]², FP32 Welford
  double naive16 = 0;                 // E[x²] − E[x]² with every sum and square stored in fp16
  double layer = 0;                   // what mpt::BatchNorm normalized with (from its invstd)
};

VarianceRow variance_row(const std::vector<float>& x) {
  VarianceRow r;
  const auto n = static_cast<double>(x.size());
  double mean = 0;
  for (float v : x) mean += v;
  mean /= n;
  for (float v : x) r.exact += (v - mean) * (v - mean);
  r.exact /= n;
  float s = 0, s2 = 0;
  for (float v : x) s += v, s2 += v * v;
  const float m32 = s / static_cast<float>(n);
  r.naive32 = s2 / static_cast<float>(n) - m32 * m32;
  Welford<float> w;
  for (float v : x) welford_add(w, v);
  r.welford32 = welford_variance_biased(w);
  float h = 0, h2 = 0;
  for (float v : x) h = to_fp16(h + v), h2 = to_fp16(h2 + to_fp16(v * v));
  const float mh = to_fp16(h / static_cast<float>(n));
  r.naive16 = to_fp16(to_fp16(h2 / static_cast<float>(n)) - to_fp16(mh * mh));
  // The library's layer on the same fp16 values, one channel of N = n.
  BatchNorm bn(1);
  Context ctx(uniform_policy(DType::f16));
  bn.apply_policy(ctx.policy());
  (void)bn.forward(Tensor::from_f32(x.data(), {static_cast<std::int64_t>(x.size()), 1}, DType::f16), ctx);
  const double invstd = bn.invstd().value(0);
  r.layer = 1.0 / (invstd * invstd) - bn.options().eps;
  return r;
}

std::string rel(double v, double exact) {
  if (!std::isfinite(v)) return dec(v);
  return g3(std::fabs(v - exact) / exact);
}

int variance() {
  constexpr std::size_t kN = 4096;
  std::printf("one channel of %zu fp16 activations, standard deviation 1, mean as given; the biased\n", kN);
  std::printf("variance four ways, each as the relative error against the fp64 two-pass value\n");
  std::printf("(fp16 naive: E[x^2] - E[x]^2 with every square and running sum stored in fp16)\n\n");
  std::printf("%-8s %-12s %-14s %-14s %-14s %-14s\n", "mean", "exact", "fp32 naive", "fp32 Welford",
              "mpt BatchNorm", "fp16 naive");
  for (const double mean : {0.0, 10.0, 100.0, 300.0, 1000.0, 3000.0}) {
    const VarianceRow r = variance_row(fp16_values(kN, mean, 1.0, 11));
    std::printf("%-8s %-12s %-14s %-14s %-14s %-14s\n", dec(mean).c_str(), g3(r.exact).c_str(),
                rel(r.naive32, r.exact).c_str(), rel(r.welford32, r.exact).c_str(),
                rel(r.layer, r.exact).c_str(), rel(r.naive16, r.exact).c_str());
  }
  // The smallest fp16 value whose square, rounded to fp16, is inf: walk up
  // the fp16 values from 255 (spacing 1/8 there).
  float x = 255.0f;
  while (!std::isinf(to_fp16(static_cast<double>(x) * x))) x = to_fp16(x + 0.125f);
  std::printf(
      "\nx^2 overflows fp16 from |x| = %s on (the first fp16 value whose square rounds past fp16's max,\n"
      "%s); a sum of squares overflows much earlier: 4096 squares of about 10 already pass it\n",
      dec(x).c_str(), dec(limits_of(fp16().spec).max).c_str());
  return 0;
}

// --- accuracy: the FP32 variance by six methods, against an exact reference -------

int accuracy() {
  // FP32 inputs (what PyTorch's float kernels and the library's f32 path
  // read), 16 channels of 4096 values each, standard deviation 1.
  constexpr std::int64_t kN = 4096;
  constexpr int kChannels = 16;
  const double ratios[] = {10.0, 100.0, 1000.0, 10000.0};
  struct Method {
    const char* name;
    ch03::MeanVar (*run)(const float*, std::int64_t);
  };
  const Method methods[] = {
      {"fp32 naive", ch03::fp32_single_pass},     {"fp32 Welford", ch03::fp32_welford},
      {"fp32 two-pass", ch03::fp32_two_pass},     {"torch BN (CPU)", ch03::torch_batch_norm},
      {"torch LN (CPU)", ch03::torch_layer_norm}, {"mpt (CPU)", ch03::mpt_statistics}};
  constexpr int kMethods = sizeof methods / sizeof methods[0];
  std::printf("%d channels of %lld FP32 values, standard deviation 1, mean = mean/std; the worst relative\n",
              kChannels, static_cast<long long>(kN));
  std::printf("error over the channels of each method's FP32 biased variance, against a two-pass sum in\n");
  std::printf("long double (norm_methods.hpp has every method with its source)\n\n");
  std::printf("%-10s", "mean/std");
  for (const Method& m : methods) std::printf(" %-15s", m.name);
  std::printf("\n");
  double worst[4][kMethods] = {};
  int row = 0;
  for (const double ratio : ratios) {
    for (int c = 0; c < kChannels; ++c) {
      Rng rng(700 + static_cast<std::uint64_t>(c));
      std::vector<float> x(kN);
      for (float& v : x) v = static_cast<float>(ratio + rng.normal());
      const ch03::MeanVar ref = ch03::exact_statistics(x.data(), kN);
      for (int k = 0; k < kMethods; ++k) {
        const double e = ch03::relative_error(methods[k].run(x.data(), kN).var_biased, ref.var_biased);
        worst[row][k] = std::isfinite(e) ? std::max(worst[row][k], e) : e;
      }
    }
    std::printf("%-10s", dec(ratio).c_str());
    for (int k = 0; k < kMethods; ++k) std::printf(" %-15s", g3(worst[row][k]).c_str());
    std::printf("\n");
    ++row;
  }
  // How each error grows: the power p of error ~ (mean/std)^p fitted through
  // the first and the last row (three decades).
  std::printf("%-10s", "power p");
  for (int k = 0; k < kMethods; ++k) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%.2f", std::log10(worst[3][k] / worst[0][k]) / 3.0);
    std::printf(" %-15s", buf);
  }
  std::printf("\n\npower p: each error grows like (mean/std)^p from the first row to the last.\n");
  std::printf("FP32's unit roundoff is 2^-24 = %s: an error near it is one rounding of the result.\n",
              g3(std::ldexp(1.0, -24)).c_str());
  return 0;
}

// --- cnn: the digits CNN in five precisions ---------------------------------------

constexpr int kCnnSteps = 300;
constexpr Eigen::Index kCnnBatch = 64;
constexpr double kCnnLr = 0.05;

struct CnnRow {
  const char* name;
  const char* how;
  double skipped = 0, train_loss = 0, train_acc = 0, test_acc = 0, stats_bytes = 0, casts = 0;
};

CnnRow cnn_run(const char* name, const char* how, DType dtype, std::shared_ptr<const Policy> policy,
               bool scale) {
  CnnRow row{name, how};
  const Split& d = digits();
  CnnConfig c;
  c.dtype = dtype;
  c.policy = std::move(policy);
  c.seed = 3;
  Cnn net(c);
  SgdOptions o;
  o.lr = kCnnLr;
  o.momentum = 0.9;
  SGD opt(net.parameters(), o);
  Batches batches(d.train, kCnnBatch, kBatchSeed);
  GradScaler::Options so;
  so.enabled = scale;
  GradScaler scaler(so);
  for (int step = 1; step <= kCnnSteps; ++step) {
    if (step == 1) net.context().reset_casts();
    scaled_backward(net, opt, batches, scaler);
    if (step == 1) row.casts = static_cast<double>(net.context().casts().casts);
    row.skipped += !scaler.step(opt);
    scaler.update();
    net.refresh_model_copies();
  }
  net.eval();
  const Tensor& train_out = net.forward(d.train.x);
  row.train_loss = cross_entropy_loss(train_out, d.train.labels);
  row.train_acc = accuracy(train_out, d.train.labels);
  row.test_acc = accuracy(net.forward(d.test.x), d.test.labels);
  for (const char* p : {"bn1", "bn2"}) {
    const auto& bn = dynamic_cast<const BatchNorm&>(*net.find(p));
    row.stats_bytes += static_cast<double>(bn.running_mean.bytes() + bn.running_var.bytes());
  }
  return row;
}

int cnn() {
  const std::shared_ptr<const Policy> f16 = uniform_policy(DType::f16);
  const std::vector<CnnRow> rows = {
      cnn_run("fp32", "everything f32", DType::f32, nullptr, false),
      cnn_run("fp16", "uniform f16 (model.half(): norms too), GradScaler", DType::f16, nullptr, true),
      cnn_run("fp16, bn by path", "f16, bn1 and bn2 kept f32 by path (keep_batchnorm_fp32), GradScaler",
              DType::f16, std::make_shared<KeepF32Policy>(f16, std::vector<std::string>{"bn1", "bn2"}), true),
      cnn_run("fp16, bn by op", "f16, the op batch_norm kept f32 (a per-op policy), GradScaler", DType::f16,
              std::make_shared<KeepF32Policy>(f16, std::vector<std::string>{},
                                              std::vector<std::string>{"batch_norm"}),
              true),
      cnn_run("bf16", "uniform bf16, no loss scaling", DType::bf16, nullptr, false),
  };
  std::printf("the digits CNN (conv-bn-relu-pool twice, fc; mpt::Cnn), SGD lr %s momentum 0.9, batch %d,\n",
              dec(kCnnLr).c_str(), static_cast<int>(kCnnBatch));
  std::printf("%d steps; accuracy and loss in eval mode (running statistics), on the %d training and the\n",
              kCnnSteps, static_cast<int>(digits().train.size()));
  std::printf("%d held-out digits\n\n", static_cast<int>(digits().test.size()));
  std::printf("%-18s %8s %11s %10s %9s %12s %13s\n", "run", "skipped", "train loss", "train acc", "test acc",
              "stats bytes", "casts/step");
  for (const CnnRow& r : rows)
    std::printf("%-18s %8.0f %11s %10s %9s %12.0f %13.0f\n", r.name, r.skipped, g3(r.train_loss).c_str(),
                pct(r.train_acc).c_str(), pct(r.test_acc).c_str(), r.stats_bytes, r.casts);
  std::printf("\n");
  for (const CnnRow& r : rows) std::printf("%-18s %s\n", r.name, r.how);
  std::printf(
      "\nstats bytes: the running means and variances of bn1 and bn2; casts/step: the casts at op\n"
      "boundaries in one forward and backward (mpt trace --model cnn lists them)\n");
  return 0;
}

// --- claims ---------------------------------------------------------------------------

void verdict(bool claim_holds, const std::string& claimed, const std::string& measured,
             const std::string& why) {
  std::printf("  verdict: %s (claimed: %s; measured: %s).\n", claim_holds ? "right" : "wrong",
              claimed.c_str(), measured.c_str());
  if (!claim_holds) std::printf("  %s\n", why.c_str());
}

/// The output of `norm` for sample 0 of a batch whose other samples are `others`.
template <class Norm>
MatrixF first_sample_output(Norm& norm, const MatrixF& sample, const MatrixF& others) {
  MatrixF batch(1 + others.rows(), sample.cols());
  batch << sample, others;
  Context ctx(uniform_policy(DType::f32));
  return norm.forward(Tensor::from_matrix(batch, DType::f32), ctx).to_matrix().row(0);
}

void claim_bert() {
  std::printf(
      "claim: \"BERT fine-tuning has BatchNorm, so its batch statistics need the same care as a CNN's\"\n");
  // A token's 768 features, and two different sets of batch-mates.
  Rng rng(4);
  const auto normal = [&rng](Eigen::Index r, Eigen::Index c, double sd) {
    MatrixF m(r, c);
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(sd * rng.normal());
    return m;
  };
  const MatrixF token = normal(1, 768, 1.0), mates_a = normal(7, 768, 1.0), mates_b = normal(7, 768, 3.0);
  LayerNorm ln(Shape{768});
  BatchNorm bn(768);
  const double ln_change = (first_sample_output(ln, token, mates_a) - first_sample_output(ln, token, mates_b))
                               .cwiseAbs()
                               .maxCoeff();
  const double bn_change = (first_sample_output(bn, token, mates_a) - first_sample_output(bn, token, mates_b))
                               .cwiseAbs()
                               .maxCoeff();
  std::printf("  one token's output, batch-mates changed (7 others, std 1 vs 3), largest change:\n");
  std::printf("    LayerNorm over its 768 features  %s\n", dec(ln_change).c_str());
  std::printf("    BatchNorm over the batch         %s\n", dec(bn_change).c_str());
  verdict(ln_change != 0, "BatchNorm", "LayerNorm, per token, independent of the batch",
          "BERT normalizes with LayerNorm (Devlin et al. 2019; google-research/bert, modeling.py,\n"
          "  layer_norm after attention and after the feed-forward block): statistics over each token's\n"
          "  own features, so its mixed-precision care is LayerNorm's (autocast runs layer_norm in fp32).");
  std::printf("\n");
}

void claim_small_variance() {
  std::printf(
      "claim: \"when the input variance is small, as in a Transformer's LayerNorm, fp16 cannot represent "
      "it\"\n");
  std::printf("  std      variance  fp16(variance)  LayerNorm output error, fp16 input (max |y - y_fp64|)\n");
  double worst_ok = 0;
  for (const double sd : {1e-1, 1e-2, 1e-3, 1e-4}) {
    const std::vector<float> x = fp16_values(768, 0.0, sd, 21);
    // The reference: fp64 LayerNorm of exactly these fp16 values.
    double mean = 0, var = 0;
    for (float v : x) mean += v;
    mean /= static_cast<double>(x.size());
    for (float v : x) var += (v - mean) * (v - mean);
    var /= static_cast<double>(x.size());
    LayerNorm ln(Shape{768});
    Context ctx(uniform_policy(DType::f16));
    ln.apply_policy(ctx.policy());
    const Tensor y = ln.forward(Tensor::from_f32(x.data(), {1, 768}, DType::f16), ctx);
    double err = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double want = (x[i] - mean) / std::sqrt(var + 1e-5);
      err = std::max(err, std::fabs(y.value(static_cast<std::int64_t>(i)) - want));
    }
    const double v16 = to_fp16(var);
    std::printf("  %-8s %-9s %-15s %s\n", g3(sd).c_str(), g3(var).c_str(), g3(v16).c_str(), g3(err).c_str());
    if (sd >= 1e-3) worst_ok = std::max(worst_ok, err);
  }
  // An fp16 output is off by at most about half its ulp at the largest |y| (a few units): 2^-9 or so.
  const bool holds = worst_ok > 0.01;
  verdict(holds, "small variances are lost in fp16",
          "the layer computes the statistics in fp32: its fp16 output is accurate to " + g3(worst_ok) +
              " down to std 1e-3",
          "The variance is never stored in fp16: it is an fp32 statistic of fp16 inputs, and the\n"
          "  inputs keep fp16's relative precision down to its smallest normal (" +
              g3(limits_of(fp16().spec).min_normal) +
              "). Stored in fp16, the\n  variance itself would lose bits below that and flush to 0 below " +
              g3(limits_of(fp16().spec).min_subnormal / 2) +
              " -- but nothing stores it there;\n  the real trouble is E[x^2] overflowing,"
              "\n"
              "  cancellation in E[x^2] - E[x]^2, and eps in fp16 (this chapter's pitfalls), and with\n"
              "  std far below sqrt(eps) eps dominates whatever the precision.");
  std::printf("\n");
}

void claim_weight_half() {
  std::printf("claim: \"module.weight.half() loses precision\"\n");
  // Trained-looking BatchNorm weights: near 1, spread 0.1.
  Rng rng(9);
  double worst = 0;
  for (int i = 0; i < 1000; ++i) {
    const double g = 1.0 + 0.1 * rng.normal();
    const auto gf = static_cast<float>(g);
    worst = std::max(worst, static_cast<double>(std::fabs(to_fp16(gf) - gf) / std::fabs(gf)));
  }
  const float one = 1.0f, update = 1e-4f;
  const float after16 = to_fp16(one - update);
  std::printf("  1000 weights near 1 (std 0.1): largest relative rounding error in fp16 %s (2^-11 = %s)\n",
              g3(worst).c_str(), g3(std::ldexp(1.0, -11)).c_str());
  std::printf("  an SGD update of %s to a weight of 1 in fp16: 1 - %s = %s\n", dec(update).c_str(),
              dec(update).c_str(), dec(after16).c_str());
  verdict(
      worst > 0 && after16 == one, "it loses precision",
      "each value moves by at most " + g3(worst) + " relative, and updates below half an fp16 ulp are lost",
      "");
  std::printf(
      "  what it loses is small per value and large per run: the rounding is at most 2^-11 of each\n"
      "  weight, but every later update smaller than half an ulp vanishes (Chapter 1's lost update).\n"
      "  Keeping the norm's weights in fp32 (or fp32 masters) keeps them; the forward pass barely\n"
      "  notices the one-time rounding.\n\n");
}

void claim_watch_running_mean() {
  std::printf("claim: \"watch running_mean for NaN, and you will catch the problem in time\"\n");
  // One training batch with an inf (an fp16 activation that overflowed), then clean batches.
  BatchNorm bn(4);
  Context ctx(uniform_policy(DType::f16));
  bn.apply_policy(ctx.policy());
  Rng rng(2);
  int first_nan = 0, clean_after = 0;
  bool recovered = false;
  for (int step = 1; step <= 10; ++step) {
    MatrixF x(16, 4);
    for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = static_cast<float>(rng.normal());
    if (step == 3) x(5, 2) = std::numeric_limits<float>::infinity();
    (void)bn.forward(Tensor::from_matrix(x, DType::f16), ctx);
    bool finite = true;
    for (std::int64_t c = 0; c < 4; ++c)
      finite = finite && std::isfinite(bn.running_mean.value(c)) && std::isfinite(bn.running_var.value(c));
    if (!finite && first_nan == 0) first_nan = step;
    if (first_nan && step > first_nan) ++clean_after, recovered = recovered || finite;
  }
  std::printf("  an inf in batch 3 of 10: the running estimates are first non-finite after batch %d;\n",
              first_nan);
  std::printf("  after %d clean batches they are %s\n", clean_after,
              recovered ? "finite again" : "still non-finite");
  verdict(first_nan == 0 || recovered, "a NaN check catches it in time",
          "the check fires after the batch that already folded the inf in, and the estimates never recover",
          "By the time running_mean shows NaN, the damage is done: the estimate is a moving average,\n"
          "  and inf or NaN stays in it for good. The check can only stop the run; the guard\n"
          "  (BatchNorm::Options::guard_running_update) or FP32 statistics prevent it, and a\n"
          "  checkpoint taken before the step is the only way back.");
  std::printf("\n");
}

int claims() {
  claim_bert();
  claim_small_variance();
  claim_weight_half();
  claim_watch_running_mean();
  return 0;
}

int usage() {
  std::fprintf(stderr, "usage: ch03_numbers variance|accuracy|cnn|claims\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return usage();
  const std::string what = argv[1];
  try {
    if (what == "variance") return variance();
    if (what == "accuracy") return accuracy();
    if (what == "cnn") return cnn();
    if (what == "claims") return claims();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ch03_numbers %s: %s\n", what.c_str(), e.what());
    return 1;
  }
  return usage();
}
