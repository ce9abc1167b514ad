// Chapter 04 — a tiny language model: the training loop the chapter's
// numbers, its pitfall naive-loss-training and the notebook share.
// Depends on: mpt/nn/models/transformer.hpp (TinyTransformer), mpt/nn/layers/softmax.hpp
// (cross_entropy), mpt/nn/data/text_data.hpp (the corpus, sample_windows,
// split_text), mpt/amp/grad_scaler.hpp, mpt/optim/adamw.hpp,
// mpt/formats/rounding.hpp (the naive loss' fp16 rounding),
// mpt/plot/svg_chart.hpp (the loss curves' picture), the core tier
// (Policy, Tensor, Rng), seed_statistics.hpp (the seed sweep's paired
// comparison); <algorithm>, <cmath>, <cstdint>, <cstdio>, <limits>,
// <memory>, <string>, <utility>, <vector>.
//
// One step, as Chapter 2's: forward of a batch of windows, the loss of the
// [B·T, V] logits against the next tokens, scaler.scale(loss), backward from
// dloss = S, scaler.step(AdamW) (skipped when a gradient is inf or NaN),
// scaler.update(), and the refresh of every model copy. The loss is the
// library's cross_entropy — FP32 whatever dtype the logits are stored in,
// the maximum subtracted — or, for the pitfall, the naive one: softmax
// written out in fp16 (exp of every logit rounded to fp16, summed in fp16,
// divided in fp16) and the log of it. Everything is seeded: the same
// configuration gives the same run, bit for bit. Everything is inline in
// namespace mpt::ch04.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mpt/amp/grad_scaler.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/formats/rounding.hpp"
#include "mpt/nn/data/text_data.hpp"
#include "mpt/nn/layers/softmax.hpp"
#include "mpt/nn/models/transformer.hpp"
#include "mpt/optim/adamw.hpp"
#include "mpt/plot/svg_chart.hpp"
#include "seed_statistics.hpp"

namespace mpt::ch04 {

/// Which loss a run trains with.
enum class LossKind {
  stable,      ///< the library's cross_entropy: FP32, max subtracted (softmax.hpp)
  naive_fp16,  ///< the pitfall's: exp, sum and division in fp16, then the log
};

/// Whether a run scales its loss.
enum class ScalerMode {
  none,     ///< no scaling (FP32 and BF16 runs)
  dynamic,  ///< GradScaler with LmConfig::scaler's options (FP16 runs)
};

/// AdamW for the tiny Transformer: learning rate 3e-3, no weight decay
/// (PyTorch's other defaults).
inline AdamWOptions lm_adam() {
  AdamWOptions o;
  o.lr = 3e-3;
  o.weight_decay = 0.0;
  return o;
}

/// One language-model run: the model, the data, the optimizer, the steps.
struct LmConfig {
  TransformerConfig model;        ///< vocab_size is set from the corpus; dtype/policy from the run's policy
  int batch = 16;                 ///< windows per step
  int steps = 200;                ///< optimizer steps (skipped ones included)
  AdamWOptions adam = lm_adam();  ///< AdamW's options
  int eval_every = 50;            ///< validation loss after every this many steps (and after the last)
  int eval_batches = 4;           ///< validation batches of `batch` windows, the same each time
  std::uint64_t seed = 1;         ///< the weights' and the batches' seed
  LossKind loss = LossKind::stable;  ///< the training loss
  GradScaler::Options scaler{};      ///< the dynamic scaler's options (PyTorch's defaults)
};

/// What one step saw.
struct LmStep {
  int step = 0;          ///< 1-based
  double loss = 0;       ///< the training loss of the batch (the run's loss kind), before the step
  float scale = 1;       ///< the loss scale the step ran with (1 without a scaler)
  bool skipped = false;  ///< the scaler skipped the optimizer step (inf/NaN gradient)
  float max_logit = 0;   ///< the largest logit of the batch (inf or NaN when one is)
};

/// A validation loss: the library's FP32 cross-entropy, whatever the run trains with.
struct LmEval {
  int step = 0;     ///< after this many steps (0: before training)
  double loss = 0;  ///< mean over the validation batches
};

/// A whole run.
struct LmRun {
  std::string name;              ///< "fp32", "fp16 + GradScaler", ...
  std::vector<LmStep> steps;     ///< every step, in order
  std::vector<LmEval> valid;     ///< at 0, every eval_every steps and at the end
  int skipped = 0;               ///< steps the scaler skipped
  int first_nonfinite_loss = 0;  ///< the first step whose training loss was inf or NaN; 0: none
  int nonfinite_losses = 0;      ///< steps whose training loss was inf or NaN
  /// The last validation loss.
  double final_valid() const { return valid.empty() ? std::nan("") : valid.back().loss; }
};

/// The licence corpus, read once per process.
inline const TextCorpus& licence_corpus() {
  static const TextCorpus c = load_common_licenses();
  return c;
}

/// The naive loss of the pitfall: for each row, e_j = fp16(exp(z_j)) (an
/// fp16 exp with no max subtracted: inf once z_j > ln(65504) ≈ 11.09), s =
/// the fp16 running sum of the e_j, p_j = fp16(e_j / s), and the row's loss
/// −fp16(log p_t); the mean over rows in FP32. Its gradient is the one
/// autograd reaches for log(softmax(z)), g·(p − onehot) with these p
/// (g = dloss/rows), rounded into fp16: NaN wherever a p is (inf/inf).
struct NaiveLoss {
  double loss = 0;  ///< the mean loss
  Tensor dlogits;   ///< [rows, V] f16
};
/// See NaiveLoss; `logits` [rows, V] in any dtype (widened, then every step rounded to fp16).
inline NaiveLoss naive_fp16_cross_entropy(const Tensor& logits, const std::vector<int>& targets,
                                          float dloss) {
  const Format& h = format_of(DType::f16);
  const auto r16 = [&h](float v) { return round_value(v, h); };
  const std::int64_t n = logits.size(0), v = logits.size(1);
  std::vector<float> z(static_cast<std::size_t>(logits.numel()));
  logits.to_f32(z.data());
  std::vector<float> dz(z.size());
  double total = 0;
  const float g = r16(dloss / static_cast<float>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    float* row = z.data() + i * v;
    float s = 0;
    for (std::int64_t j = 0; j < v; ++j) {
      row[j] = r16(std::exp(row[j]));  // e_j, kept in place
      s = r16(s + row[j]);
    }
    const auto t = static_cast<std::size_t>(targets[static_cast<std::size_t>(i)]);
    for (std::int64_t j = 0; j < v; ++j) {
      const float p = r16(row[j] / s);
      if (static_cast<std::size_t>(j) == t) total += -static_cast<double>(r16(std::log(p)));
      dz[static_cast<std::size_t>(i * v + j)] =
          r16(g * (p - (static_cast<std::size_t>(j) == t ? 1.0f : 0.0f)));
    }
  }
  return {static_cast<double>(static_cast<float>(total / static_cast<double>(n))),
          Tensor::from_f32(dz.data(), logits.shape(), DType::f16)};
}

/// The dense-precision label of a policy run: "fp32", "fp16 + GradScaler", "bf16".
inline std::string run_name(const Policy& policy, ScalerMode mode) {
  return policy.describe() + (mode == ScalerMode::dynamic ? " + GradScaler" : "");
}

/// The validation loss of `net` on `batches` (library cross_entropy, FP32).
inline double validation_loss(TinyTransformer& net, const std::vector<TokenBatch>& batches) {
  double sum = 0;
  for (const TokenBatch& b : batches) {
    const Tensor& logits = net.forward_tokens(b.inputs, b.batch, b.context);
    sum += cross_entropy(logits, b.targets, {}, net.context()).value(0);
  }
  return sum / static_cast<double>(batches.size());
}

/// Train a TinyTransformer on `corpus` with `policy` (its ops' precision)
/// and `mode`. Windows of config.model.context tokens, batches drawn from
/// Rng(seed) in the training 90 %, validation batches from Rng(seed + 1) in
/// the last 10 %. Deterministic.
inline LmRun train_lm(const TextCorpus& corpus, LmConfig config, std::shared_ptr<const Policy> policy,
                      ScalerMode mode) {
  LmRun run;
  run.name = run_name(*policy, mode);
  config.model.vocab_size = corpus.vocab_size();
  config.model.policy = std::move(policy);
  config.model.seed = config.seed;
  TinyTransformer net(config.model);
  AdamW opt(net.parameters(), config.adam);
  GradScaler::Options so = config.scaler;
  so.enabled = mode == ScalerMode::dynamic;
  GradScaler scaler(so);
  const TextSplit split = split_text(corpus.tokens().size());
  const int t = config.model.context;
  Rng data(config.seed), vdata(config.seed + 1);
  std::vector<TokenBatch> vb;
  for (int i = 0; i < config.eval_batches; ++i)
    vb.push_back(sample_windows(corpus.tokens(), split.valid_begin, split.valid_end, config.batch, t, vdata));

  run.valid.push_back({0, validation_loss(net, vb)});
  for (int k = 1; k <= config.steps; ++k) {
    const TokenBatch b =
        sample_windows(corpus.tokens(), split.train_begin, split.train_end, config.batch, t, data);
    const Tensor& logits = net.forward_tokens(b.inputs, b.batch, b.context);
    LmStep s;
    s.step = k;
    s.scale = scaler.get_scale();
    std::vector<float> z(static_cast<std::size_t>(logits.numel()));
    logits.to_f32(z.data());
    float top = -std::numeric_limits<float>::infinity();
    bool nan = false;
    for (const float v : z) {
      nan = nan || std::isnan(v);
      top = std::max(top, v);
    }
    s.max_logit = nan ? std::numeric_limits<float>::quiet_NaN() : top;
    Tensor dlogits;
    if (config.loss == LossKind::stable) {
      s.loss = cross_entropy(logits, b.targets, {}, net.context()).value(0);
      (void)scaler.scale(static_cast<float>(s.loss));
      Tensor dl(DType::f32, {});
      dl.f32_data()[0] = scaler.get_scale();
      dlogits = cross_entropy_backward(logits, b.targets, {}, dl, net.context());
    } else {
      (void)scaler.scale(1.0f);  // the scale S; the loss itself is computed below
      NaiveLoss nl = naive_fp16_cross_entropy(logits, b.targets, scaler.get_scale());
      s.loss = nl.loss;
      dlogits = std::move(nl.dlogits);
    }
    opt.zero_grad();
    net.backward(dlogits);
    s.skipped = !scaler.step(opt);
    scaler.update();
    net.refresh_model_copies();
    if (!std::isfinite(s.loss)) {
      ++run.nonfinite_losses;
      if (run.first_nonfinite_loss == 0) run.first_nonfinite_loss = k;
    }
    run.skipped += s.skipped;
    run.steps.push_back(s);
    if (k % config.eval_every == 0 || k == config.steps) run.valid.push_back({k, validation_loss(net, vb)});
  }
  return run;
}

// --- the chapter's loss curves ---------------------------------------------------

/// Three runs of the same model, data and seed: FP32, FP16 with the dynamic
/// GradScaler, BF16; a table of their validation losses and one picture.
struct LmCurves {
  LmConfig config;          ///< what every run used
  std::vector<LmRun> runs;  ///< fp32, fp16 + GradScaler, bf16
  std::string table;        ///< one row per validation point: step, each run's loss; then skipped steps
  std::string svg;          ///< training loss per step (lines) and validation loss (dots)
};

/// The picture of lm_curves(): every run's training loss per step and its
/// validation losses, log V (the loss of a uniform guess) as a reference.
inline std::string render_lm_curves_svg(const std::vector<LmRun>& runs, int vocab_size) {
  static const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};
  plot::Chart c;
  c.title = "Tiny Transformer on the licence corpus: loss per step";
  c.description =
      "Training loss per step (lines) and validation loss (dots) of the same model and data in "
      "each precision.";
  c.x.label = "step";
  c.x.grid = true;
  c.y.label = "cross-entropy (nats per token)";
  c.y.grid = true;
  double hi = std::log(static_cast<double>(vocab_size)), lo = hi;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    plot::Series line, dots;
    line.name = runs[r].name + " (training)";
    line.colour = colours[r % 4];
    line.size = 1;
    for (const LmStep& s : runs[r].steps)
      if (std::isfinite(s.loss)) {
        line.points.push_back({static_cast<double>(s.step), s.loss});
        lo = std::min(lo, s.loss);
        hi = std::max(hi, s.loss);
      }
    dots.kind = plot::Kind::markers;
    dots.name = runs[r].name + " (validation)";
    dots.colour = line.colour;
    dots.size = 3;
    for (const LmEval& e : runs[r].valid)
      if (std::isfinite(e.loss)) {
        dots.points.push_back({static_cast<double>(e.step), e.loss});
        lo = std::min(lo, e.loss);
        hi = std::max(hi, e.loss);
      }
    c.series.push_back(std::move(line));
    c.series.push_back(std::move(dots));
  }
  c.y.min = std::floor(lo * 2) / 2;
  c.y.max = std::ceil(hi * 2) / 2 + 0.5;
  plot::Series ref;
  ref.name = "log V: a uniform guess";
  ref.colour = "#7f7f7f";
  ref.size = 1;
  const double last = runs.empty() || runs.front().steps.empty() ? 1.0 : runs.front().steps.back().step;
  ref.points = {{0.0, std::log(static_cast<double>(vocab_size))},
                {last, std::log(static_cast<double>(vocab_size))}};
  c.series.push_back(std::move(ref));
  return plot::to_svg(c);
}

/// One of the chapter's precisions: a policy and whether it scales its loss.
struct LmPrecision {
  std::shared_ptr<const Policy> policy;  ///< what every op stores and computes in
  ScalerMode mode;                       ///< dynamic for the fp16 runs
};

/// The chapter's four precisions, in the order of its tables: FP32, FP16 +
/// GradScaler, FP16 + GradScaler with layer_norm kept in FP32 (Chapter 3's
/// advice, by op) and BF16.
inline std::vector<LmPrecision> lm_precisions() {
  return {{uniform_policy(DType::f32), ScalerMode::none},
          {uniform_policy(DType::f16), ScalerMode::dynamic},
          {std::make_shared<KeepF32Policy>(uniform_policy(DType::f16), std::vector<std::string>{},
                                           std::vector<std::string>{"layer_norm"}),
           ScalerMode::dynamic},
          {uniform_policy(DType::bf16), ScalerMode::none}};
}

/// The chapter's loss curves: `steps` steps of batch × context windows in
/// each of lm_precisions(), from the same seed.
inline LmCurves lm_curves(const TextCorpus& corpus, int steps = 200, std::uint64_t seed = 1) {
  LmCurves out;
  out.config.steps = steps;
  out.config.seed = seed;
  for (const LmPrecision& p : lm_precisions())
    out.runs.push_back(train_lm(corpus, out.config, p.policy, p.mode));
  char line[200];
  std::snprintf(line, sizeof line, "%6s", "step");
  out.table = line;
  for (const LmRun& r : out.runs) {
    std::snprintf(line, sizeof line, "  %22s", r.name.c_str());
    out.table += line;
  }
  out.table += "\n";
  for (std::size_t i = 0; i < out.runs.front().valid.size(); ++i) {
    std::snprintf(line, sizeof line, "%6d", out.runs.front().valid[i].step);
    out.table += line;
    for (const LmRun& r : out.runs) {
      std::snprintf(line, sizeof line, "  %22.4f", r.valid[i].loss);
      out.table += line;
    }
    out.table += "\n";
  }
  std::snprintf(line, sizeof line, "%6s", "skip");
  out.table += line;
  for (const LmRun& r : out.runs) {
    std::snprintf(line, sizeof line, "  %22d", r.skipped);
    out.table += line;
  }
  out.table += "\n";
  out.svg = render_lm_curves_svg(out.runs, corpus.vocab_size());
  return out;
}

// --- how far one seed's curves can be trusted ---------------------------------------

/// The final validation loss of every precision for seeds 1..n: each seed
/// draws its own initial weights, training batches and validation windows;
/// at one seed all precisions share them.
struct LmSeedSweep {
  int steps = 0;                                ///< steps of every run
  std::vector<std::string> names;               ///< the precisions' run names
  std::vector<std::vector<double>> final_loss;  ///< [precision][seed − 1]
  std::string table;                            ///< one row per precision (see lm_seed_table)
};

/// One seed of the sweep: every precision of lm_precisions() trained for
/// `steps` steps from `seed`; the final validation losses, in that order
/// (and the run names into `names`, when given).
inline std::vector<double> lm_seed_finals(const TextCorpus& corpus, std::uint64_t seed, int steps,
                                          std::vector<std::string>* names = nullptr) {
  LmConfig config;
  config.steps = steps;
  config.seed = seed;
  std::vector<double> out;
  for (const LmPrecision& p : lm_precisions()) {
    const LmRun run = train_lm(corpus, config, p.policy, p.mode);
    if (names) names->push_back(run.name);
    out.push_back(run.final_valid());
  }
  return out;
}

/// A loss as the table shows it (4 decimals).
inline std::string lm_loss_text(double loss) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4f", loss);
  return text;
}
/// The number the table shows for `loss`, back as a double: the table's
/// summary columns are computed from what it shows, so that they can be
/// rechecked from the printed seed columns alone.
inline double lm_shown(double loss) { return std::strtod(lm_loss_text(loss).c_str(), nullptr); }

/// The title line of the sweep's table.
inline std::string lm_seed_title(int steps, std::size_t seeds) {
  return "final validation loss after " + std::to_string(steps) + " steps, every precision, seeds 1 to " +
         std::to_string(seeds) + "\n";
}

/// The comparisons the sweep's table makes, as (row, reference row) of
/// lm_precisions(): every low-precision run against FP32 (row 0), and the
/// run with layer_norm kept in FP32 (row 2) against plain fp16 (row 1), the
/// fix a single seed seems to show.
inline std::vector<std::pair<std::size_t, std::size_t>> lm_seed_comparisons(std::size_t precisions) {
  std::vector<std::pair<std::size_t, std::size_t>> c;
  for (std::size_t p = 1; p < precisions; ++p) c.emplace_back(p, 0);
  if (precisions > 2) c.emplace_back(2, 1);
  return c;
}

/// The table of a sweep: per precision, the loss at each seed, their mean
/// and standard deviation over the seeds; then, for each comparison of
/// lm_seed_comparisons, the differences at the same seed (seed_statistics.hpp):
/// their mean, standard deviation and 95% interval, Student's t and its
/// two-sided p, the count of positive differences and the sign test's p,
/// and whether the difference is shown at the 5% level (two-sided, by the t
/// test: the interval excludes 0). Every number is computed from the losses
/// as shown (lm_shown), so the table can be rechecked from its seed columns.
inline std::string lm_seed_table(const std::vector<std::string>& names,
                                 const std::vector<std::vector<double>>& final_loss) {
  std::string table;
  char line[512];
  const auto cell = [&](const char* fmt, auto... v) {
    std::snprintf(line, sizeof line, fmt, v...);
    table += line;
  };
  const std::size_t seeds = final_loss.front().size();
  std::vector<std::vector<double>> shown;
  for (const std::vector<double>& row : final_loss) {
    shown.emplace_back();
    for (double v : row) shown.back().push_back(lm_shown(v));
  }
  cell("%-44s", "precision");
  for (std::size_t k = 1; k <= seeds; ++k) cell("  seed %zu", k);
  table += "    mean      sd\n";
  for (std::size_t p = 0; p < shown.size(); ++p) {
    cell("%-44s", names[p].c_str());
    double sum = 0;
    for (double v : shown[p]) {
      cell("  %6.4f", v);
      sum += v;
    }
    const double mean = sum / static_cast<double>(seeds);
    double ss = 0;
    for (double v : shown[p]) ss += (v - mean) * (v - mean);
    cell("  %6.4f  %6.4f\n", mean, std::sqrt(ss / static_cast<double>(seeds - 1)));
  }
  const int df = static_cast<int>(seeds) - 1;
  cell(
      "\npaired by seed: d = run − reference at the same seed, %zu pairs; 95%% interval and t with %d "
      "degrees of freedom\n",
      seeds, df);
  cell("%-44s  %7s  %6s  %18s  %6s  %6s  %6s  %6s  %11s\n", "run", "mean d", "sd d", "95% interval", "t",
       "p(t)", "d > 0", "p(sign)", "shown at 5%");
  std::size_t last_reference = shown.size();
  for (const auto& [p, ref] : lm_seed_comparisons(shown.size())) {
    if (ref != last_reference) cell("reference: %s\n", names[ref].c_str());
    last_reference = ref;
    const PairedDifference d = paired_difference(shown[p], shown[ref]);
    char interval[48], sign[16];
    std::snprintf(interval, sizeof interval, "[%+.4f, %+.4f]", d.ci_low, d.ci_high);
    std::snprintf(sign, sizeof sign, "%d of %d", d.positive, d.n);
    cell("%-44s  %+7.4f  %6.4f  %18s  %6.2f  %6.4f  %6s  %7.4f  %11s\n", names[p].c_str(), d.mean, d.sd,
         interval, d.t, d.p_t, sign, d.p_sign, d.p_t < 0.05 ? "yes" : "no");
  }
  const std::size_t comparisons = lm_seed_comparisons(shown.size()).size();
  cell(
      "shown at 5%%: two-sided p(t) < 0.05, the interval excludes 0. With %zu comparisons, the chance that "
      "one or more shows a\ndifference where none exists is %.3f were they independent (1 − 0.95^%zu), at "
      "most %.2f "
      "(%zu × 0.05) in any case;\nwith %zu pairs the sign test's p is at least %.4f, above 0.05 whatever the "
      "losses.\n",
      comparisons, 1 - std::pow(0.95, static_cast<double>(comparisons)), comparisons,
      0.05 * static_cast<double>(comparisons), comparisons, seeds, sign_test_p(0, static_cast<int>(seeds)));
  return table;
}

/// The chapter's sweep: this many seeds ...
inline constexpr int kLmSeeds = 5;
/// ... of this many steps a run.
inline constexpr int kLmSeedSteps = 200;

/// Train every precision of lm_precisions() for `steps` steps with seeds 1
/// to `seeds`, and tabulate the final validation losses (lm_seed_table).
inline LmSeedSweep lm_seed_sweep(const TextCorpus& corpus, int seeds = kLmSeeds, int steps = kLmSeedSteps) {
  LmSeedSweep out;
  out.steps = steps;
  out.final_loss.assign(lm_precisions().size(), {});
  for (int seed = 1; seed <= seeds; ++seed) {
    const std::vector<double> f =
        lm_seed_finals(corpus, static_cast<std::uint64_t>(seed), steps, seed == 1 ? &out.names : nullptr);
    for (std::size_t p = 0; p < f.size(); ++p) out.final_loss[p].push_back(f[p]);
  }
  out.table = lm_seed_table(out.names, out.final_loss);
  return out;
}

}  // namespace mpt::ch04
