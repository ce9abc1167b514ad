// Chapter 02 — loss scaling and FP32 master weights: the numbers the chapter
// text quotes that the CLI does not print (program `ch02_numbers`).
// Depends on: the Chapter 2 training stack (mlp.hpp, layers.hpp, optim.hpp,
// grad_scaler.hpp, data.hpp), Chapter 1 (format.hpp, rounding.hpp,
// explain.hpp, range_report.hpp for the paper figure), and training.hpp (the
// runs shared with the pitfalls, pitfalls/*.cpp).
//
// The chapter's README contains no typed-in numbers: generate.sh runs this
// program once per section and splices the output into the text. Usage:
//   ch02_numbers chain-rule|memory|grad-growth|static-scale|adam-eps|claims
//   ch02_numbers figure DIR     (also writes DIR/fig3-unscaled.svg, DIR/fig3-scaled.svg,
//                                DIR/fig3-digits-unscaled.svg, DIR/fig3-digits-scaled.svg)
// figure reads the real digits file (it fails with the fetch commands when
// the file is missing).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/amp/grad_scaler.hpp"
#include "mpt/amp/scaler_math.hpp"
#include "mpt/formats/explain.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/formats/range_report.hpp"
#include "mpt/formats/rounding.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/adamw.hpp"
#include "mpt/optim/sgd.hpp"
#include "training.hpp"

namespace {

using namespace mpt;
using namespace mpt::ch02;  // training.hpp

const Format& fp16() { return format_named("fp16"); }
std::string dec(double x) { return shortest_decimal(static_cast<float>(x)); }
std::string p2(double x) { return power_of_two_or_decimal(x); }
std::string pct(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * fraction);
  return buf;
}
std::string g6(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}
/// "2^k" for a power of two, else log2 with one decimal: "2^-21.3".
std::string log2_text(double x) {
  if (x <= 0 || !std::isfinite(x)) return dec(x);
  const double l = std::log2(x);
  char buf[32];
  if (l == std::floor(l)) std::snprintf(buf, sizeof buf, "2^%d", static_cast<int>(l));
  else std::snprintf(buf, sizeof buf, "2^%.1f", l);
  return buf;
}

bool same_bits(float a, float b) {
  std::uint32_t ua, ub;
  std::memcpy(&ua, &a, sizeof a);
  std::memcpy(&ub, &b, sizeof b);
  return ua == ub;
}

// --- chain-rule --------------------------------------------------------------

// One backward pass of two networks with dloss = 1 and with dloss = S:
// every stored gradient compared with S times its unscaled value, bit for
// bit. The blobs classifier's gradients sit in fp16's normal range; the
// tiny-target regression's (after half its FP32 run) mostly do not.
int chain_rule() {
  const float scale = GradScaler::Options{}.init_scale;
  constexpr int kSteps = kTinyTargetSteps / 2;
  TinyTargetRun tiny(DType::f32);
  for (int step = 0; step < kSteps; ++step) plain_step(tiny.net, tiny.opt, tiny.batches);
  Mlp& trained = tiny.net;
  const Dataset tiny_batch = tiny.batches.next();
  const Dataset blobs_batch = Batches(blobs().train, 64, kBatchSeed).next();

  std::printf(
      "one backward pass, once from the loss (dloss = 1) and once from S * loss (dloss = S\n"
      "= %s); every stored gradient g_S compared with S * g_1. blobs: the MLP 8-32-32-4\n"
      "classifier of the pitfalls at its initial weights, a batch of 64; tiny: the network of\n"
      "the pitfall no-loss-scaling after %d steps of its FP32 run, a batch of %d\n\n",
      p2(scale).c_str(), kSteps, static_cast<int>(kTinyTargetBatch));
  std::printf("%-11s %-24s %7s %13s %9s %10s %19s\n", "run", "gradients", "values", "g_S == S*g_1",
              "g_1 == 0", "g_1 subn.", "differ, g_1 normal");
  struct Run {
    const char* name;
    DType p;
    bool tiny;
  };
  for (const Run& run : {Run{"blobs fp32", DType::f32, false}, Run{"blobs fp16", DType::f16, false},
                         Run{"tiny fp32", DType::f32, true}, Run{"tiny fp16", DType::f16, true}}) {
    const DType p = run.p;
    // Two identical networks: the pitfalls' blobs classifier, or a fresh
    // tiny-target network holding the trained FP32 weights.
    const auto make = [&] {
      if (!run.tiny) return Mlp(mlp_config(kBlobsNet, p, kBlobsSeed));
      Mlp net = tiny_target_net(p);
      for (std::size_t i = 0; i < net.parameters().size(); ++i) {
        net.parameters()[i]->master = trained.parameters()[i]->master;
        refresh_model_copy(*net.parameters()[i]);
      }
      return net;
    };
    Mlp plain = make(), scaled = make();
    const auto backward = [&](Mlp& net, float dloss) {
      const Dataset& b = run.tiny ? tiny_batch : blobs_batch;
      const Tensor& out = net.forward(b.x);
      net.backward(batch_loss_backward(out, b, dloss));
    };
    backward(plain, 1.0f);
    backward(scaled, scale);
    const double min_normal = limits_of(format_of(p).spec).min_normal;
    // Activation gradients (stored in p) and weight gradients (FP32, summed
    // from gradients rounded into p).
    struct Group {
      const char* name;
      std::vector<MatrixF> g1, gS;
    };
    Group act{"activation gradients", {}, {}}, weight{"weight gradients", {}, {}};
    for (std::size_t i = 0; i < plain.activation_gradients().size(); ++i) {
      act.g1.push_back(plain.activation_gradients()[i].to_matrix());
      act.gS.push_back(scaled.activation_gradients()[i].to_matrix());
    }
    for (std::size_t i = 0; i < plain.parameters().size(); ++i) {
      weight.g1.push_back(plain.parameters()[i]->grad.f32());
      weight.gS.push_back(scaled.parameters()[i]->grad.f32());
    }
    for (const Group* g : {&act, &weight}) {
      long n = 0, exact = 0, zero = 0, subnormal = 0, differ_normal = 0;
      for (std::size_t t = 0; t < g->g1.size(); ++t)
        for (Eigen::Index i = 0; i < g->g1[t].size(); ++i) {
          const float a = g->g1[t].data()[i], s = g->gS[t].data()[i];
          const bool same = same_bits(s, a * scale), sub = a != 0.0f && std::fabs(a) < min_normal;
          ++n;
          exact += same;
          zero += a == 0.0f;
          subnormal += sub;
          differ_normal += !same && a != 0.0f && !sub;
        }
      std::printf("%-11s %-24s %7ld %13ld %9ld %10ld %19ld\n", run.name, g->name, n, exact, zero, subnormal,
                  differ_normal);
    }
  }
  std::printf(
      "\ng_1 == 0 counts exact zeros of the unscaled pass (in FP32 only those behind a\n"
      "ReLU; in fp16 also the ones that flushed); g_1 subn. counts subnormal ones; the last\n"
      "column counts differences at gradients that were normal numbers without the scale.\n");
  return 0;
}

// --- memory ------------------------------------------------------------------

// Bytes actually allocated by an MLP's parameters, gradients, AdamW state and
// kept activations, for FP32 training and for fp16 with FP32 master weights.
int memory() {
  const std::vector<int> sizes = {64, 256, 256, 10};
  const std::vector<Eigen::Index> batches = {128, 1024, 8192};
  std::printf(
      "MLP 64-256-256-10 (ReLU) with AdamW: bytes actually allocated (Eigen buffers,\n"
      "Tensor::bytes, AdamW::state_bytes, Mlp::activation_bytes)\n\n");
  struct Column {
    const char* name;
    DType p;
    double params = 0, forward_weights = 0, masters = 0, grads = 0, adam = 0;
    std::vector<double> activations;
  };
  std::vector<Column> cols = {{"FP32 training", DType::f32, 0, 0, 0, 0, 0, {}},
                              {"fp16, FP32 masters", DType::f16, 0, 0, 0, 0, 0, {}}};
  for (Column& c : cols) {
    Mlp net(mlp_config(sizes, c.p, 1));
    AdamW opt(net.parameters());
    for (Parameter* p : net.parameters()) {
      c.params += static_cast<double>(p->master.numel());
      const double master = static_cast<double>(p->master.numel()) * sizeof(float);
      const double copy = static_cast<double>(p->model_bytes());
      c.forward_weights += c.p == DType::f32 ? master : copy;
      c.masters += c.p == DType::f32 ? 0 : master;
      c.grads += static_cast<double>(p->grad.numel()) * sizeof(float);
    }
    // AdamW creates m and v with the optimizer; one step fills them.
    for (Parameter* p : net.parameters()) p->grad.fill_zero();
    opt.step();
    c.adam = static_cast<double>(opt.state_bytes());
    Rng rng(5);
    for (Eigen::Index n : batches) {
      MatrixF x(n, sizes.front());
      for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = static_cast<float>(rng.normal());
      net.forward(x);
      c.activations.push_back(static_cast<double>(net.activation_bytes()));
    }
  }
  const auto row = [&](const std::string& what, double a, double b) {
    char ratio[32] = "-";
    if (a > 0 && b > 0) std::snprintf(ratio, sizeof ratio, "%.3f", b / a);
    std::printf("%-44s %14.0f %20.0f %8s\n", what.c_str(), a, b, ratio);
  };
  std::printf("%-44s %14s %20s %8s\n", "", cols[0].name, cols[1].name, "ratio");
  row("parameters (elements)", cols[0].params, cols[1].params);
  row("weights forward/backward read (B)", cols[0].forward_weights, cols[1].forward_weights);
  row("FP32 master weights (B)", cols[0].masters, cols[1].masters);
  row("gradients, FP32 (B)", cols[0].grads, cols[1].grads);
  row("AdamW m and v, FP32 (B)", cols[0].adam, cols[1].adam);
  const double per0 =
      (cols[0].forward_weights + cols[0].masters + cols[0].grads + cols[0].adam) / cols[0].params;
  const double per1 =
      (cols[1].forward_weights + cols[1].masters + cols[1].grads + cols[1].adam) / cols[1].params;
  row("  per parameter (B)", per0, per1);
  for (std::size_t i = 0; i < batches.size(); ++i)
    row("activations kept for backward, batch " + std::to_string(batches[i]) + " (B)", cols[0].activations[i],
        cols[1].activations[i]);
  return 0;
}

// --- figure --------------------------------------------------------------------

/// The activation gradients one FP32 run produced: the dense tensors of
/// Mlp::activation_gradients() (the ones the zero fraction counts) at every
/// step, pooled.
struct GradientSample {
  std::string name;         ///< short, for the tables
  std::string description;  ///< what was trained
  std::string files;        ///< prefix of its SVG files
  std::vector<float> g;     ///< every value
  ZeroFraction zeros;       ///< its zero fraction (kZeroFractionDefinition)
  /// Collect the last backward pass of `net`.
  void add(const Mlp& net) {
    for (const Tensor* t : dense_activation_gradients(net)) {
      const MatrixF v = t->to_matrix();
      g.insert(g.end(), v.data(), v.data() + v.size());
      zeros.add(v);
    }
  }
};

/// The FP32 run that the pitfall no-loss-scaling compares with.
GradientSample tiny_target_sample() {
  GradientSample s{"tiny-target",
                   "the FP32 run that the pitfall no-loss-scaling compares with: MLP 8-32-32-4 on the\n"
                   "  synthetic tiny-target regression, AdamW, batch " +
                       std::to_string(kTinyTargetBatch) + ", " + std::to_string(kTinyTargetSteps) + " steps",
                   "fig3",
                   {},
                   {}};
  TinyTargetRun run(DType::f32);
  for (int step = 0; step < kTinyTargetSteps; ++step)
    plain_step(run.net, run.opt, run.batches, [&] { s.add(run.net); });
  return s;
}

/// A classifier trained in FP32 on the real handwritten digits: the
/// network, data and SGD settings of the pitfall clip-before-unscale, without
/// its clipping.
GradientSample digits_sample() {
  GradientSample s{"digits",
                   "an FP32 classifier on the real handwritten digits: MLP 64-32-32-10, SGD (lr " +
                       g6(kDigitsLr) + ", momentum 0.9),\n  batch " + std::to_string(kDigitsBatch) + ", " +
                       std::to_string(kDigitsSteps) +
                       " steps (the setup of the pitfall clip-before-unscale, no clipping)",
                   "fig3-digits",
                   {},
                   {}};
  DigitsRun run(DType::f32);
  for (int step = 0; step < kDigitsSteps; ++step)
    plain_step(run.net, run.opt, run.batches, [&] { s.add(run.net); });
  return s;
}

// The paper's Fig. 3 for this chapter: the activation gradients of two FP32
// runs, the synthetic tiny-target regression of the pitfall no-loss-scaling
// and a classifier on the real digits, against fp16's range, before and
// after multiplying by a loss scale.
int figure(const std::string& dir) {
  const std::vector<GradientSample> samples = {tiny_target_sample(), digits_sample()};
  const Limits l16 = limits_of(fp16().spec);
  std::printf(
      "activation gradients of two FP32 runs, the dense tensors of Mlp::activation_gradients()\n"
      "(dlogits and each d(activation output)) at every step:\n");
  for (const GradientSample& s : samples) std::printf("  %s: %s\n", s.name.c_str(), s.description.c_str());
  std::printf("zero fraction: %s\n\n", kZeroFractionDefinition);

  struct Stats {
    float median, largest, smallest;
  };
  std::vector<Stats> stats;
  for (const GradientSample& s : samples) {
    std::vector<float> mags;
    for (float v : s.g)
      if (v != 0.0f) mags.push_back(std::fabs(v));
    std::nth_element(mags.begin(), mags.begin() + static_cast<std::ptrdiff_t>(mags.size() / 2), mags.end());
    stats.push_back({mags[mags.size() / 2], *std::max_element(mags.begin(), mags.end()),
                     *std::min_element(mags.begin(), mags.end())});
  }
  const auto both = [&](const char* what, const auto& cell) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "  %-26s", what);
    std::string line = buf;
    for (std::size_t i = 0; i < samples.size(); ++i) {
      std::snprintf(buf, sizeof buf, " %-28s", cell(i).c_str());
      line += buf;
    }
    line.erase(line.find_last_not_of(' ') + 1);
    std::printf("%s\n", line.c_str());
  };
  const auto with_log2 = [](float x) { return dec(x) + " (" + log2_text(x) + ")"; };
  both("", [&](std::size_t i) { return samples[i].name; });
  both("values", [&](std::size_t i) { return std::to_string(samples[i].g.size()); });
  both("zero fraction in FP32", [&](std::size_t i) { return pct(samples[i].zeros.fraction()); });
  both("largest |g|", [&](std::size_t i) { return with_log2(stats[i].largest); });
  both("median nonzero |g|", [&](std::size_t i) { return with_log2(stats[i].median); });
  both("smallest nonzero |g|", [&](std::size_t i) { return with_log2(stats[i].smallest); });
  std::printf("  fp16: min subnormal %s, min normal %s, max %s\n\n", p2(l16.min_subnormal).c_str(),
              p2(l16.min_normal).c_str(), dec(l16.max).c_str());

  std::printf("stored in fp16 after multiplying by S (fractions of each run's values):\n\n");
  std::printf("%-12s %-7s %10s %10s %10s %9s %9s  %s\n", "run", "S", "0 in fp16", "flushed", "subnormal",
              "overflow", "normal", "");
  std::string histograms;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const GradientSample& smp = samples[i];
    // The largest power of two that keeps the largest gradient finite in
    // fp16 (below max + ulp(max)/2 = 65520, where round-to-nearest overflows).
    int k_max = 0;
    while (static_cast<double>(stats[i].largest) * std::ldexp(1.0, k_max + 1) < 65520.0) ++k_max;
    struct Scale {
      int k;
      std::string note;
    };
    std::vector<Scale> scales = {
        {0, "no loss scaling"},
        {3, "the scale that sufficed for SSD in the paper"},
        {8, ""},
        {16, "GradScaler's default init_scale" + std::string(i == 0 ? "; the pitfall's run" : "")},
        {k_max, "the largest power of two without overflow"}};
    if (k_max > 24) scales.insert(scales.end() - 1, Scale{24, ""});
    std::vector<float> scaled(smp.g.size());
    for (const Scale& sc : scales) {
      if (sc.k > k_max) continue;  // overflows: only the scales that fit are shown
      const float factor = std::ldexp(1.0f, sc.k);
      for (std::size_t j = 0; j < smp.g.size(); ++j) scaled[j] = smp.g[j] * factor;  // exact: a power of two
      const RangeReport r = range_report(scaled.data(), scaled.size(), fp16());
      const double zero = r.fraction(RangeClass::zero) + r.fraction(RangeClass::flushed_to_zero);
      const double normal = r.fraction(RangeClass::exact) + r.fraction(RangeClass::rounded);
      std::printf("%-12s %-7s %10s %10s %10s %9s %9s  %s\n", smp.name.c_str(), p2(factor).c_str(),
                  pct(zero).c_str(), pct(r.fraction(RangeClass::flushed_to_zero)).c_str(),
                  pct(r.fraction(RangeClass::subnormal_result)).c_str(),
                  pct(r.fraction(RangeClass::overflow)).c_str(), pct(normal).c_str(), sc.note.c_str());
      if (sc.k == 0 || sc.k == 16) {
        const std::string name = smp.files + (sc.k == 0 ? "-unscaled.svg" : "-scaled.svg");
        const std::string path = dir + "/" + name;
        std::ofstream f(path);
        f << render_svg(r);
        if (!f) throw std::runtime_error("cannot write " + path);
        histograms += std::string(histograms.empty() ? "" : ",\n  ") + dir + "/" + name + " (" + smp.name +
                      ", S = " + p2(factor) + ")";
      }
    }
  }
  std::printf(
      "\n'0 in fp16' = the zero fraction of the values stored in fp16: exact zeros + flushed;\n"
      "'flushed' = nonzero values that round to 0.\n"
      "histograms: %s\n",
      histograms.c_str());
  return 0;
}

// --- grad-growth ---------------------------------------------------------------

// The run of the pitfall static-scale-too-large, with the GradScaler of its
// fixed run (the two are the same run until the first overflow, and the
// dynamic one goes on): at each step the largest |gradient| before
// unscaling, divided by the scale to give the true one (exact: a power of
// two), the gradient norm, the batch loss and the classifier's confidence
// (the mean largest softmax probability on the batch). Do the gradients grow
// as the classifier becomes confident?
/// Pearson correlation of two equally long series.
double correlation(const std::vector<double>& a, const std::vector<double>& b) {
  const auto n = static_cast<double>(a.size());
  double ma = 0, mb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) ma += a[i] / n, mb += b[i] / n;
  double sab = 0, saa = 0, sbb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return sab / std::sqrt(saa * sbb);
}

int grad_growth() {
  BlobsRun run(DType::f16, kStaticLr, kStaticBatch);
  GradScaler::Options o;
  o.init_scale = kStaticScale;
  GradScaler scaler(o);
  std::printf(
      "the run of the pitfall static-scale-too-large (fp16 MLP 8-32-32-4 on the blobs, SGD lr %s,\n"
      "batch %d) with its fixed run's GradScaler from S = %s; per step, unscaled (the scaled\n"
      "gradient / S): the largest |activation gradient|, the largest |weight gradient| and the\n"
      "weight gradients' norm; the batch loss; the confidence (mean largest softmax probability)\n\n",
      g6(kStaticLr).c_str(), static_cast<int>(kStaticBatch), p2(kStaticScale).c_str());
  struct Row {
    int step;
    double act, weight, norm, loss, confidence;
    bool stepped;
  };
  std::vector<Row> rows;
  int first_overflow = 0;
  for (int step = 1; step <= kStaticSteps; ++step) {
    const Dataset b = run.batches.next();
    const Tensor& out = run.net.forward(b.x);
    const MatrixF logits = out.to_matrix();
    const float loss = batch_loss(out, b);
    (void)scaler.scale(loss);
    run.opt.zero_grad();
    run.net.backward(batch_loss_backward(out, b, scaler.get_scale()));
    const double s = scaler.get_scale();
    Row r{step, 0, 0, 0, loss, 0, true};
    for (const Tensor& t : run.net.activation_gradients())
      r.act = std::max(r.act, static_cast<double>(t.to_matrix().cwiseAbs().maxCoeff()) / s);
    double sq = 0;
    for (const Parameter* p : run.net.parameters()) {
      const Eigen::MatrixXd g = p->grad.f32().cast<double>() / s;
      r.weight = std::max(r.weight, g.cwiseAbs().maxCoeff());
      sq += g.squaredNorm();
    }
    r.norm = std::sqrt(sq);
    for (Eigen::Index i = 0; i < logits.rows(); ++i) {
      // The largest softmax probability of a row: 1 / sum_j exp(z_j - max z).
      const Eigen::ArrayXd z = logits.row(i).cast<double>().transpose().array();
      r.confidence += 1.0 / (z - z.maxCoeff()).exp().sum() / static_cast<double>(logits.rows());
    }
    r.stepped = scaler.step(run.opt);
    scaler.update();
    run.net.refresh_model_copies();
    if (!r.stepped && first_overflow == 0) first_overflow = step;
    rows.push_back(r);
  }
  std::printf("%5s %12s %15s %14s %10s %11s  %s\n", "step", "max |act g|", "max |weight g|", "weight g norm",
              "loss", "confidence", "");
  for (const Row& r : rows) {
    const bool near = first_overflow != 0 && std::abs(r.step - first_overflow) <= 1;
    if (!(r.step == 1 || r.step % 10 == 0 || near)) continue;
    std::printf("%5d %12s %15s %14s %10s %11s  %s\n", r.step, g6(r.act).c_str(), g6(r.weight).c_str(),
                g6(r.norm).c_str(), g6(r.loss).c_str(), g6(r.confidence).c_str(),
                r.stepped ? "" : "overflow: step skipped, scale halved");
  }
  // The steps before the first overflow: do the largest gradients follow
  // the confidence up?
  const std::size_t before = first_overflow > 0 ? static_cast<std::size_t>(first_overflow - 1) : rows.size();
  std::vector<double> conf, act, weight;
  std::size_t top = 0;
  for (std::size_t i = 0; i < before; ++i) {
    conf.push_back(rows[i].confidence);
    act.push_back(rows[i].act);
    weight.push_back(rows[i].weight);
    if (rows[i].weight > rows[top].weight) top = i;
  }
  const Row& last = rows[before - 1];
  std::printf(
      "\nsteps 1 to %d (before the first overflow): the confidence went from %s to %s;\n"
      "  largest |act g|    from %s to %s (x %s), correlation with the confidence %s\n"
      "  largest |weight g| from %s to %s (x %s), correlation with the confidence %s;\n"
      "                     its largest, %s, at step %d\n",
      last.step, g6(rows[0].confidence).c_str(), g6(last.confidence).c_str(), g6(rows[0].act).c_str(),
      g6(last.act).c_str(), g6(last.act / rows[0].act).c_str(), g6(correlation(conf, act)).c_str(),
      g6(rows[0].weight).c_str(), g6(last.weight).c_str(), g6(last.weight / rows[0].weight).c_str(),
      g6(correlation(conf, weight)).c_str(), g6(rows[top].weight).c_str(), rows[top].step);
  if (first_overflow > 0)
    std::printf(
        "step %d overflowed: a scaled gradient reached 65520, so some |g| >= 65520 / S = %s;\n"
        "  the next step, at S/2, measured a largest |weight g| of %s\n",
        first_overflow, g6(65520.0 / kStaticScale).c_str(),
        static_cast<std::size_t>(first_overflow) < rows.size() ? g6(rows[first_overflow].weight).c_str()
                                                               : "-");
  return 0;
}

// --- static-scale --------------------------------------------------------------

// The two decisions inside "static loss scaling", separated: a constant scale
// or one that moves, and whether a step with inf/NaN gradients is skipped.
// The run of the pitfall static-scale-too-large, with each of three scalers,
// from its scale 2^18 (which fits the first steps) and from 2^20 (which
// overflows from step 1).
struct StaticScaleRow {
  double overflows = 0, skipped = 0, first_overflow = 0, final_scale = 0, bad = 0, accuracy = 0;
};

template <class Scaler>
StaticScaleRow static_scale_row(Scaler& scaler) {
  BlobsRun run(DType::f16, kStaticLr, kStaticBatch);
  StaticScaleRow r;
  for (int step = 1; step <= kStaticSteps; ++step) {
    scaled_backward(run.net, run.opt, run.batches, scaler);
    r.skipped += !scaler.step(run.opt);
    if (*scaler.found_inf(run.opt) && r.overflows++ == 0) r.first_overflow = step;
    scaler.update();
    run.net.refresh_model_copies();
  }
  r.final_scale = scaler.get_scale();
  for (const Parameter* p : run.net.parameters())
    r.bad += static_cast<double>((!p->master.f32().array().isFinite()).count());
  r.accuracy = accuracy(run.net.forward(blobs().test.x), blobs().test.labels);
  return r;
}

int static_scale() {
  std::printf(
      "the run of the pitfall static-scale-too-large (fp16 MLP 8-32-32-4 on the blobs, SGD lr %s,\n"
      "batch %d, %d steps) with three scalers: a constant scale that steps anyway (NVIDIA apex with a\n"
      "fixed loss_scale), a constant scale that skips a step with inf/NaN gradients (Megatron-LM's\n"
      "ConstantGradScaler; the paper's suggestion), and PyTorch's dynamic GradScaler\n\n",
      g6(kStaticLr).c_str(), static_cast<int>(kStaticBatch), kStaticSteps);
  std::printf("%-8s %-28s %9s %14s %8s %12s %16s %9s\n", "S", "scaler", "overflows", "first overflow",
              "skipped", "final scale", "inf/NaN weights", "accuracy");
  const auto print = [](float s, const char* name, const StaticScaleRow& r) {
    std::printf("%-8s %-28s %9.0f %14.0f %8.0f %12s %16.0f %9s\n", p2(s).c_str(), name, r.overflows,
                r.first_overflow, r.skipped, p2(r.final_scale).c_str(), r.bad, g6(r.accuracy).c_str());
  };
  for (const float s : {kStaticScale, 4 * kStaticScale}) {
    StaticScaler no_skip(s);
    print(s, "constant, steps anyway", static_scale_row(no_skip));
    StaticScaler skip(s, /*skip_nonfinite_steps=*/true);
    print(s, "constant, skips overflows", static_scale_row(skip));
    GradScaler::Options o;
    o.init_scale = s;
    GradScaler dynamic(o);
    print(s, "dynamic (GradScaler)", static_scale_row(dynamic));
  }
  BlobsRun fp32(DType::f32, kStaticLr, kStaticBatch);
  for (int step = 0; step < kStaticSteps; ++step) plain_step(fp32.net, fp32.opt, fp32.batches);
  std::printf("\nthe FP32 baseline, no scaling: accuracy %s (4 classes: chance is 0.25)\n",
              g6(accuracy(fp32.net.forward(blobs().test.x), blobs().test.labels)).c_str());
  return 0;
}

// --- adam-eps ------------------------------------------------------------------

// AdamW with fp16 state and arithmetic, for several eps, next to PyTorch's
// FP32 AdamW: the pitfall adam-eps-fp16's run with eps varied.
int adam_eps() {
  std::printf(
      "fp16 MLP 8-32-32-4 on the blobs, GradScaler, AdamW (lr 1e-3, betas 0.9/0.999,\n"
      "weight decay 1e-2), 100 steps of batch 64; the largest step-1 update |dw| / lr,\n"
      "where Adam's is about 1 (m/sqrt(v) = +-1 on the first step)\n\n");
  std::printf("%-6s %-8s %-14s %16s %18s %10s\n", "state", "eps", "eps in state", "max |dw|/lr step 1",
              "inf/NaN weights", "accuracy");
  struct Case {
    DType state;
    double eps;
  };
  for (const Case& c : {Case{DType::f16, 1e-8}, Case{DType::f16, 1e-7}, Case{DType::f16, 1e-6},
                        Case{DType::f16, 1e-4}, Case{DType::f16, 1e-3}, Case{DType::f32, 1e-8}}) {
    Mlp net(mlp_config(kBlobsNet, DType::f16, kBlobsSeed));
    Batches batches(blobs().train, 64, kBatchSeed);
    GradScaler scaler;
    AdamWOptions o;
    o.eps = c.eps;
    o.state_dtype = c.state;
    AdamW opt(net.parameters(), o);
    double first = 0;
    for (int step = 1; step <= 100; ++step) {
      std::vector<MatrixF> before;
      for (Parameter* p : net.parameters()) before.push_back(p->master.f32());
      scaled_backward(net, opt, batches, scaler);
      const bool stepped = scaler.step(opt);
      scaler.update();
      net.refresh_model_copies();
      if (stepped && first == 0) {
        // The decoupled weight decay moves every weight by lr*wd*w too; it is
        // far below lr and does not change the maximum's order.
        for (std::size_t i = 0; i < before.size(); ++i) {
          const MatrixF d = (net.parameters()[i]->master.f32() - before[i]).cwiseAbs();
          const float m = d.array().isFinite().all() ? d.maxCoeff() : std::numeric_limits<float>::infinity();
          first = std::max(first, static_cast<double>(m) / o.lr);
        }
      }
    }
    double bad = 0;
    for (const Parameter* p : net.parameters())
      bad += static_cast<double>((!p->master.f32().array().isFinite()).count());
    const float stored = round_value(static_cast<float>(c.eps), format_of(c.state));
    std::printf("%-6s %-8s %-14s %16s %18.0f %10s\n", std::string(format_of(c.state).name).c_str(),
                g6(c.eps).c_str(), dec(stored).c_str(), g6(first).c_str(), bad,
                g6(accuracy(net.forward(blobs().test.x), blobs().test.labels)).c_str());
  }
  return 0;
}

// --- claims --------------------------------------------------------------------

/// A one-parameter-set model for the scaler claims: Mlp 2-2 in fp16 and SGD.
struct Toy {
  Mlp net{mlp_config({2, 2}, DType::f16, 1)};
  SGD opt{net.parameters(), SgdOptions{}};
  MatrixF x = MatrixF::Constant(1, 2, 0.5f);
  std::vector<int> labels{1};
  /// Forward and backward from dloss.
  void backward(float dloss) {
    const Tensor& out = net.forward(x);
    opt.zero_grad();
    net.backward(cross_entropy_backward(out, labels, dloss));
  }
};

/// The verdict on a claim, from a comparison the caller made: "right" when
/// the measurement agrees with the claim, "wrong" when it does not; the
/// claimed and the measured behaviour side by side, then the reason for a
/// wrong one (built from the measurements).
void verdict(bool claim_holds, const std::string& claimed, const std::string& measured,
             const std::string& why_wrong) {
  std::printf("  verdict: %s (claimed: %s; measured: %s).\n", claim_holds ? "right" : "wrong",
              claimed.c_str(), measured.c_str());
  if (!claim_holds) std::printf("  %s\n", why_wrong.c_str());
}

void claim_update_after_step() {
  std::printf("claim: \"it does not matter where update() goes, or whether it runs every iteration\"\n");
  Toy t;
  GradScaler scaler;
  (void)scaler.scale(1.0f);
  t.backward(scaler.get_scale());
  bool before_accepted = true, twice_accepted = true;
  try {
    scaler.update();  // before step()
    std::printf("  update() before step(): accepted\n");
  } catch (const std::logic_error& e) {
    before_accepted = false;
    std::printf("  update() before step() throws:\n    %s\n", e.what());
  }
  scaler.step(t.opt);
  scaler.update();
  (void)scaler.scale(1.0f);
  t.backward(scaler.get_scale());
  scaler.step(t.opt);  // the next iteration, without update() in between:
  (void)scaler.scale(1.0f);
  t.backward(scaler.get_scale());
  try {
    scaler.step(t.opt);
    std::printf("  a second step() without update(): accepted\n");
  } catch (const std::logic_error& e) {
    twice_accepted = false;
    std::printf("  step() again without update() throws:\n    %s\n", e.what());
  }
  const auto said = [](bool accepted) { return std::string(accepted ? "accepted" : "refused"); };
  verdict(before_accepted && twice_accepted, "both orders accepted",
          "update() before step() " + said(before_accepted) + ", step() twice " + said(twice_accepted),
          "update() comes after step() (it needs step()'s inf check), once\n"
          "  at the end of every iteration (step() refuses to run twice without it).");
  std::printf("\n");
}

void claim_scale_is_fp16() {
  std::printf("claim: \"the loss scale 2^16 is an fp16 number, like the gradients it scales\"\n");
  const GradScaler scaler;
  const float s = scaler.get_scale();
  const float s16 = round_value(s, fp16());
  std::printf("  GradScaler().get_scale() (a float)                %s\n", dec(s).c_str());
  std::printf("  2^16 stored in fp16                               %s\n", dec(s16).c_str());
  std::printf("  largest finite fp16                               %s\n",
              dec(limits_of(fp16().spec).max).c_str());
  std::printf("  a loss of 2.5, scaled in FP32                     %s\n", dec(2.5f * s).c_str());
  std::printf("  a gradient of 2^-20, times 2^16, stored in fp16   %s\n",
              dec(round_value(std::ldexp(1.0f, -20) * s, fp16())).c_str());
  verdict(s16 == s, "fp16(" + dec(s) + ") = " + dec(s), "fp16(" + dec(s) + ") = " + dec(s16),
          dec(s) +
              " overflows fp16; the scale and the scaled loss live in FP32,\n"
              "  and only the scaled activation gradients are stored in fp16, where they fit.");
  std::printf("\n");
}

void claim_scale_floor() {
  std::printf("claim: \"the dynamic scale cannot collapse: it has a floor\"\n");
  Toy t;
  GradScaler scaler;
  int step = 0;
  constexpr int kMaxSteps = 1000;
  std::printf("  every step overflows (an inf in the gradient), from the default 2^16:\n");
  while (scaler.get_scale() != 0.0f && step < kMaxSteps) {
    (void)scaler.scale(1.0f);
    t.backward(1.0f);
    t.net.parameters()[0]->grad.f32()(0, 0) = std::numeric_limits<float>::infinity();
    scaler.step(t.opt);
    scaler.update();
    ++step;
    const float s = scaler.get_scale();
    if (step == 1 || s == std::ldexp(1.0f, -126) || s == std::ldexp(1.0f, -149) || s == 0.0f)
      std::printf("    after step %3d the scale is %s%s\n", step, p2(s).c_str(),
                  s == std::ldexp(1.0f, -126)   ? " (FP32's smallest normal)"
                  : s == std::ldexp(1.0f, -149) ? " (FP32's smallest subnormal)"
                  : s == 0.0f                   ? " (2^-150 is a tie: to even, 0)"
                                                : "");
  }
  const bool collapsed = scaler.get_scale() == 0.0f;
  // One more iteration at the scale reached, with finite gradients.
  const float loss = scaler.scale(2.5f);
  t.backward(scaler.get_scale());
  const float grad_before = t.net.parameters()[0]->grad.f32()(0, 0);
  const bool stepped = scaler.step(t.opt);
  const float grad_after = t.net.parameters()[0]->grad.f32()(0, 0);
  double bad = 0, weights = 0;
  for (const Parameter* p : t.net.parameters()) {
    bad += static_cast<double>((!p->master.f32().array().isFinite()).count());
    weights += static_cast<double>(p->master.numel());
  }
  const float inv = mpt::inverse_scale(scaler.get_scale());  // as unscale() takes it
  std::printf(
      "  at scale %s: scaled loss %s, gradient %s, inverse scale 1/%s = %s,\n"
      "  unscaled gradient %s * %s = %s; found inf: %s (checked before the multiply),\n"
      "  so step() %s and %.0f of %.0f weights are NaN\n",
      dec(scaler.get_scale()).c_str(), dec(loss).c_str(), dec(grad_before).c_str(),
      dec(scaler.get_scale()).c_str(), dec(inv).c_str(), dec(grad_before).c_str(), dec(inv).c_str(),
      std::isnan(grad_after) ? "NaN" : dec(grad_after).c_str(), *scaler.found_inf(t.opt) ? "yes" : "no",
      stepped ? "stepped" : "skipped", bad, weights);
  scaler.update();
  verdict(!collapsed, "a floor above 0",
          collapsed ? "0 after " + std::to_string(step) + " overflows in a row"
                    : "still " + dec(scaler.get_scale()) + " after " + std::to_string(step) + " overflows",
          "There is no floor, in PyTorch or here: " + std::to_string(step) +
              " overflows in a row\n"
              "  reach 0, and at 0 the NaN is not caught. load_state_dict() refuses a saved scale of 0.");
  std::printf("\n");
}

void claim_bf16() {
  std::printf("claim: \"bf16 needs loss scaling as much as fp16\"\n");
  std::printf(
      "  the pitfall no-loss-scaling's run, without a scale, in three precisions; zero fraction:\n"
      "  %s\n",
      kZeroFractionDefinition);
  std::printf("    %-6s %16s %16s %14s  %s\n", "", "zero fraction", "relative loss", "loss / FP32's",
              "needs a scale?");
  struct Result {
    DType p;
    double zero, loss;
  };
  std::vector<Result> results;
  for (DType p : {DType::f32, DType::f16, DType::bf16}) {
    TinyTargetRun run(p);
    ZeroFraction zeros;
    for (int step = 0; step < kTinyTargetSteps; ++step)
      plain_step(run.net, run.opt, run.batches, [&] { zeros.add(run.net); });
    const double loss =
        mse_loss(run.net.forward(tiny_targets().x), tiny_targets().targets) / target_power(tiny_targets());
    results.push_back({p, zeros.fraction(), loss});
  }
  const Result& f32 = results[0];
  // "Needs a scale": fails the cure of the pitfall no-loss-scaling without
  // one (more zeros than FP32 + 1 percentage point, or a loss more than 5%
  // off FP32's).
  const auto needs_scale = [&](const Result& r) {
    return r.zero > f32.zero + 0.01 || std::fabs(r.loss / f32.loss - 1.0) > 0.05;
  };
  for (const Result& r : results)
    std::printf("    %-6s %16s %16s %14s  %s\n", std::string(format_of(r.p).name).c_str(),
                pct(r.zero).c_str(), g6(r.loss).c_str(), g6(r.loss / f32.loss).c_str(),
                r.p == DType::f32 ? "(the baseline)"
                : needs_scale(r)  ? "yes"
                                  : "no");
  std::printf(
      "  (needs a scale: the run misses the pitfall's cure without one, more zeros than FP32\n"
      "  + 1 percentage point or a loss more than 5%% off FP32's)\n");
  const bool fp16_needs = needs_scale(results[1]), bf16_needs = needs_scale(results[2]);
  const auto yes_no = [](bool b) { return std::string(b ? "needs a scale" : "does not"); };
  verdict(fp16_needs && bf16_needs, "both need a scale",
          "fp16 " + yes_no(fp16_needs) + ", bf16 " + yes_no(bf16_needs),
          "bf16 has FP32's exponent range (smallest normal 2^-126), so these\n"
          "  gradients keep their values and it trains like FP32 without a scale.");
}

int claims() {
  claim_update_after_step();
  claim_scale_is_fp16();
  claim_scale_floor();
  claim_bf16();
  return 0;
}

int usage() {
  std::fprintf(
      stderr,
      "usage: ch02_numbers chain-rule|memory|grad-growth|static-scale|adam-eps|claims\n"
      "       ch02_numbers figure DIR   (writes DIR/fig3-unscaled.svg, DIR/fig3-scaled.svg,\n"
      "                                 DIR/fig3-digits-unscaled.svg and DIR/fig3-digits-scaled.svg)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string what = argv[1];
  try {
    if (what == "chain-rule" && argc == 2) return chain_rule();
    if (what == "memory" && argc == 2) return memory();
    if (what == "adam-eps" && argc == 2) return adam_eps();
    if (what == "grad-growth" && argc == 2) return grad_growth();
    if (what == "static-scale" && argc == 2) return static_scale();
    if (what == "claims" && argc == 2) return claims();
    if (what == "figure" && argc == 3) return figure(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ch02_numbers %s: %s\n", what.c_str(), e.what());
    return 1;
  }
  return usage();
}
