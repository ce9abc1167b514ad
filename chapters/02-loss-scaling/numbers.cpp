// Chapter 02 — loss scaling and FP32 master weights: the numbers the chapter
// text quotes that the CLI does not print (program `ch02_numbers`).
// Depends on: the Chapter 2 training stack (mlp.hpp, layers.hpp, optim.hpp,
// grad_scaler.hpp, data.hpp), Chapter 1 (format.hpp, rounding.hpp,
// explain.hpp, range_report.hpp for the paper figure), and training.hpp (the
// runs shared with the pitfalls, pitfalls/*.cpp).
//
// The chapter's README contains no typed-in numbers: generate.sh runs this
// program once per section and splices the output into the text. Usage:
//   ch02_numbers chain-rule|memory|adam-eps|claims
//   ch02_numbers figure DIR     (also writes DIR/fig3-unscaled.svg, DIR/fig3-scaled.svg)
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
#include "mpt/nn/data.hpp"
#include "mpt/nn/losses.hpp"
#include "mpt/nn/mlp.hpp"
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

// The paper's Fig. 3 for this chapter: the activation gradients of the FP32
// run that the pitfall no-loss-scaling compares with, every tensor of
// Mlp::activation_gradients() at every step, against fp16's range, before
// and after multiplying by a loss scale.
int figure(const std::string& dir) {
  TinyTargetRun run(DType::f32);
  std::vector<float> g;
  for (int step = 0; step < kTinyTargetSteps; ++step)
    plain_step(run.net, run.opt, run.batches, [&] {
      for (const Tensor& t : run.net.activation_gradients()) {
        const MatrixF v = t.to_matrix();
        g.insert(g.end(), v.data(), v.data() + v.size());
      }
    });
  const double n = static_cast<double>(g.size());
  std::vector<float> mags;
  for (float v : g)
    if (v != 0.0f) mags.push_back(std::fabs(v));
  std::nth_element(mags.begin(), mags.begin() + static_cast<std::ptrdiff_t>(mags.size() / 2), mags.end());
  const float median = mags[mags.size() / 2];
  const float largest = *std::max_element(mags.begin(), mags.end());
  const float smallest = *std::min_element(mags.begin(), mags.end());
  const Limits l16 = limits_of(fp16().spec);

  std::printf(
      "activation gradients of the FP32 run that the pitfall no-loss-scaling compares with\n"
      "(MLP 8-32-32-4 on the tiny-target regression, AdamW, batch %d): every tensor of\n"
      "Mlp::activation_gradients() at each of the %d steps\n\n",
      static_cast<int>(kTinyTargetBatch), kTinyTargetSteps);
  std::printf("  values                               %.0f\n", n);
  std::printf("  exactly 0 in FP32 (behind a ReLU)    %s\n",
              pct(1.0 - static_cast<double>(mags.size()) / n).c_str());
  std::printf("  largest |g|                          %s (%s)\n", dec(largest).c_str(),
              log2_text(largest).c_str());
  std::printf("  median nonzero |g|                   %s (%s)\n", dec(median).c_str(),
              log2_text(median).c_str());
  std::printf("  smallest nonzero |g|                 %s (%s)\n", dec(smallest).c_str(),
              log2_text(smallest).c_str());
  std::printf("  fp16: min subnormal %s, min normal %s, max %s\n\n", p2(l16.min_subnormal).c_str(),
              p2(l16.min_normal).c_str(), dec(l16.max).c_str());

  // The largest power of two that keeps the largest gradient finite in fp16
  // (below max + ulp(max)/2 = 65520, where round-to-nearest overflows).
  int k_max = 0;
  while (static_cast<double>(largest) * std::ldexp(1.0, k_max + 1) < 65520.0) ++k_max;
  std::printf("stored in fp16 after multiplying by S (fractions of all %.0f values):\n\n", n);
  std::printf("%-8s %14s %12s %12s %10s %14s  %s\n", "S", "0 in fp16", "flushed", "subnormal", "overflow",
              "normal", "");
  struct Scale {
    int k;
    const char* note;
  };
  const std::vector<Scale> scales = {{0, "no loss scaling"},
                                     {3, "the scale that sufficed for SSD in the paper"},
                                     {8, ""},
                                     {16, "GradScaler's default init_scale; the pitfall's run"},
                                     {24, ""},
                                     {k_max, "the largest power of two without overflow"}};
  std::vector<float> scaled(g.size());
  for (const Scale& s : scales) {
    const float factor = std::ldexp(1.0f, s.k);
    for (std::size_t i = 0; i < g.size(); ++i) scaled[i] = g[i] * factor;  // exact: a power of two
    const RangeReport r = range_report(scaled.data(), scaled.size(), fp16());
    const double zero = r.fraction(RangeClass::zero) + r.fraction(RangeClass::flushed_to_zero);
    const double normal = r.fraction(RangeClass::exact) + r.fraction(RangeClass::rounded);
    std::printf("%-8s %14s %12s %12s %10s %14s  %s\n", p2(factor).c_str(), pct(zero).c_str(),
                pct(r.fraction(RangeClass::flushed_to_zero)).c_str(),
                pct(r.fraction(RangeClass::subnormal_result)).c_str(),
                pct(r.fraction(RangeClass::overflow)).c_str(), pct(normal).c_str(), s.note);
    if (s.k == 0 || s.k == 16) {
      const std::string name = s.k == 0 ? "fig3-unscaled.svg" : "fig3-scaled.svg";
      const std::string path = dir + "/" + name;
      std::ofstream f(path);
      f << render_svg(r);
      if (!f) throw std::runtime_error("cannot write " + path);
    }
  }
  std::printf(
      "\n'0 in fp16' = exact zeros + flushed; 'flushed' = nonzero values that round to 0.\n"
      "histograms: %s/fig3-unscaled.svg (S = 1), %s/fig3-scaled.svg (S = 2^16)\n",
      dir.c_str(), dir.c_str());
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

void claim_update_after_step() {
  std::printf("claim: \"it does not matter where update() goes, or whether it runs every iteration\"\n");
  Toy t;
  GradScaler scaler;
  (void)scaler.scale(1.0f);
  t.backward(scaler.get_scale());
  try {
    scaler.update();  // before step()
    std::printf("  update() before step(): accepted\n");
  } catch (const std::logic_error& e) {
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
    std::printf("  step() again without update() throws:\n    %s\n", e.what());
  }
  std::printf(
      "  verdict: wrong. update() comes after step() (it needs step()'s inf check), once\n"
      "  at the end of every iteration (step() refuses to run twice without it).\n\n");
}

void claim_scale_is_fp16() {
  std::printf("claim: \"the loss scale 2^16 is an fp16 number, like the gradients it scales\"\n");
  const GradScaler scaler;
  const float s = scaler.get_scale();
  std::printf("  GradScaler().get_scale() (a float)                %s\n", dec(s).c_str());
  std::printf("  2^16 stored in fp16                               %s\n",
              dec(round_value(s, fp16())).c_str());
  std::printf("  largest finite fp16                               %s\n",
              dec(limits_of(fp16().spec).max).c_str());
  std::printf("  a loss of 2.5, scaled in FP32                     %s\n", dec(2.5f * s).c_str());
  std::printf("  a gradient of 2^-20, times 2^16, stored in fp16   %s\n",
              dec(round_value(std::ldexp(1.0f, -20) * s, fp16())).c_str());
  std::printf(
      "  verdict: wrong. 65536 overflows fp16; the scale and the scaled loss live in FP32,\n"
      "  and only the scaled gradients are stored in fp16, where they fit.\n\n");
}

void claim_scale_floor() {
  std::printf("claim: \"the dynamic scale cannot collapse: it has a floor\"\n");
  Toy t;
  GradScaler scaler;
  int step = 0;
  std::printf("  every step overflows (an inf in the gradient), from the default 2^16:\n");
  while (scaler.get_scale() != 0.0f && step < 1000) {
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
  // One more iteration at scale 0, with finite gradients.
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
      "  at scale 0: scaled loss %s, gradient %s, inverse scale 1/0 = %s,\n"
      "  unscaled gradient 0 * inf = %s; found inf: %s (checked before the multiply),\n"
      "  so step() %s and %.0f of %.0f weights are NaN\n",
      dec(loss).c_str(), dec(grad_before).c_str(), dec(inv).c_str(),
      std::isnan(grad_after) ? "NaN" : dec(grad_after).c_str(), *scaler.found_inf(t.opt) ? "yes" : "no",
      stepped ? "stepped" : "skipped", bad, weights);
  scaler.update();
  std::printf(
      "  verdict: wrong. There is no floor, in PyTorch or here: %d overflows in a row\n"
      "  reach 0, and at 0 the NaN is not caught. load_state_dict() refuses a saved scale of 0.\n\n",
      step);
}

void claim_bf16() {
  std::printf("claim: \"bf16 needs loss scaling as much as fp16\"\n");
  std::printf("  the pitfall no-loss-scaling's run, without a scale, in three precisions:\n");
  std::printf("    %-6s %22s %16s\n", "", "activation grads = 0", "relative loss");
  for (DType p : {DType::f32, DType::f16, DType::bf16}) {
    TinyTargetRun run(p);
    double zeros = 0, total = 0;
    for (int step = 0; step < kTinyTargetSteps; ++step)
      plain_step(run.net, run.opt, run.batches, [&] {
        for (const Tensor& t : run.net.activation_gradients()) {
          const MatrixF v = t.to_matrix();
          zeros += static_cast<double>((v.array() == 0.0f).count());
          total += static_cast<double>(v.size());
        }
      });
    const double loss =
        mse_loss(run.net.forward(tiny_targets().x), tiny_targets().targets) / target_power(tiny_targets());
    std::printf("    %-6s %22s %16s\n", std::string(format_of(p).name).c_str(), pct(zeros / total).c_str(),
                g6(loss).c_str());
  }
  std::printf(
      "  verdict: wrong. bf16 has FP32's exponent range (smallest normal 2^-126), so these\n"
      "  gradients keep their values and it trains like FP32 without a scale.\n");
}

int claims() {
  claim_update_after_step();
  claim_scale_is_fp16();
  claim_scale_floor();
  claim_bf16();
  return 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: ch02_numbers chain-rule|memory|adam-eps|claims\n"
               "       ch02_numbers figure DIR   (writes DIR/fig3-unscaled.svg and DIR/fig3-scaled.svg)\n");
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
    if (what == "claims" && argc == 2) return claims();
    if (what == "figure" && argc == 3) return figure(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ch02_numbers %s: %s\n", what.c_str(), e.what());
    return 1;
  }
  return usage();
}
