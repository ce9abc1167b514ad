// Chapter 07 — FP8 training: the numbers the chapter text quotes that the
// CLI does not print (program `ch07_numbers`).
// Depends on: the train tier (TrainRun: the chapters' models under any
// policy string, fp8:RECIPE included), the plot tier (the loss curves),
// Chapter 4's seed_statistics.hpp (the paired comparison by seed).
//
// The chapter's README contains no typed-in numbers: generate.sh runs this
// program and splices the output into the text. Usage:
//   ch07_numbers train MODEL DIR [--seeds N] [--steps S]
//       MODEL mlp (Chapter 2's digits MLP, 300 steps) or transformer
//       (Chapter 4's tiny Transformer, 200 steps): every policy of the
//       chapter trained from seeds 1 to N (5), the loss at a few steps of
//       seed 1, the final losses of every seed with the paired comparison
//       against bf16; writes DIR/fp8-curves-MODEL.svg (seed 1's curves)
//   ch07_numbers claims MLP_FILE TRANSFORMER_FILE
//       the claim "FP16+FP32 remains the industry's best practice; FP8 is
//       the future", checked against the two files `train` wrote
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../04-softmax-attention/seed_statistics.hpp"
#include "mpt/plot/svg_chart.hpp"
#include "mpt/train/run.hpp"

namespace {

using namespace mpt;

/// One of the chapter's precisions: a policy string and the scaler it trains with.
struct Precision {
  const char* label;   ///< the table's name
  const char* policy;  ///< the policy string
  const char* scaler;  ///< dynamic for fp16, none for every other
  const char* colour;  ///< its curve
};

/// The chapter's precisions, in the order of its tables: the references
/// (FP32, fp16 with the GradScaler, bf16), then the four FP8 recipes.
const std::vector<Precision>& precisions() {
  static const std::vector<Precision> p = {
      {"f32", "f32", "none", "#7f7f7f"},
      {"f16 + GradScaler", "f16", "dynamic", "#8c564b"},
      {"bf16", "bf16", "none", "#1f77b4"},
      {"fp8:delayed", "fp8:delayed", "none", "#d62728"},
      {"fp8:current", "fp8:current", "none", "#2ca02c"},
      {"fp8:mx-floor", "fp8:mx-floor", "none", "#9467bd"},
      {"fp8:mx-rceil", "fp8:mx-rceil", "none", "#ff7f0e"},
  };
  return p;
}
/// The row every other is compared with: bf16, what FP8 training runs
/// around its GEMMs.
constexpr std::size_t kReference = 2;
constexpr int kNameWidth = 18;
/// The MLP's final loss: the mean of its last this many training losses
/// (its batches are the same at every seed and precision; the mean evens
/// out one batch's noise).
constexpr int kMlpTail = 20;

/// A model of the chapter and how it is run.
struct ModelRun {
  std::string model, data;
  int steps = 0;
  std::string title;       ///< the first line of the output
  std::string final_what;  ///< what "final loss" means for it
};

ModelRun model_run(const std::string& model) {
  if (model == "mlp")
    return {"mlp", "digits", 300,
            "the digits MLP 64-32-32-10 of Chapter 2 (SGD, lr 0.05, momentum 0.9, batches of 64)",
            "final loss: the mean training loss of the last " + std::to_string(kMlpTail) + " steps"};
  if (model == "transformer")
    return {"transformer", "text", 200,
            "the tiny Transformer of Chapter 4 (AdamW, lr 3e-3, 16 windows of 64 characters a step)",
            "final loss: the validation loss after the last step"};
  throw std::invalid_argument("unknown model '" + model + "'; valid: mlp, transformer");
}

/// What one run gave.
struct RunResult {
  std::vector<double> losses;  ///< the training loss of every step
  double final_loss = 0;       ///< see ModelRun::final_what
  double metric = 0;           ///< test accuracy (mlp) or validation loss (transformer)
};

RunResult train_one(const ModelRun& m, const Precision& p, std::uint64_t seed, int steps) {
  train::RunConfig c;
  c.model = m.model;
  c.data = m.data;
  c.policy = p.policy;
  c.scaler = p.scaler;
  c.seed = seed;
  c.steps = steps;
  train::TrainRun run(train::resolve_config(c));
  RunResult r;
  for (int k = 0; k < steps; ++k) r.losses.push_back(run.step().loss);
  const train::RunSummary s = run.summary();
  r.metric = s.metric_value;
  if (m.model == "mlp") {
    const std::size_t n = std::min<std::size_t>(r.losses.size(), kMlpTail);
    double sum = 0;
    for (std::size_t i = r.losses.size() - n; i < r.losses.size(); ++i) sum += r.losses[i];
    r.final_loss = sum / static_cast<double>(n);
  } else {
    r.final_loss = s.metric_value;
  }
  return r;
}

/// A loss as the tables show it (4 decimals), and back: every summary is
/// computed from the losses as shown, so that `claims` can recompute it
/// from a file.
std::string loss_text(double v) {
  char t[32];
  std::snprintf(t, sizeof t, "%.4f", v);
  return t;
}
double shown(double v) { return std::strtod(loss_text(v).c_str(), nullptr); }

std::string name_cell(const std::string& name) {
  std::string s = name;
  s.resize(static_cast<std::size_t>(kNameWidth), ' ');
  return s;
}

/// The picture of seed 1: every precision's training loss per step.
std::string curves_svg(const ModelRun& m, const std::vector<RunResult>& runs) {
  plot::Chart c;
  c.title = (m.model == "mlp" ? "Digits MLP" : "Tiny Transformer") +
            std::string(": training loss per step, seed 1, every precision");
  c.description =
      "Training loss per step of the same model, weights and batches in f32, f16 with the GradScaler, bf16 "
      "and "
      "the four FP8 recipes.";
  c.x.label = "step";
  c.x.grid = true;
  c.y.label = "cross-entropy (nats)";
  c.y.grid = true;
  double lo = INFINITY, hi = -INFINITY;
  for (std::size_t p = 0; p < runs.size(); ++p) {
    plot::Series line;
    line.name = precisions()[p].label;
    line.colour = precisions()[p].colour;
    line.size = 1;
    for (std::size_t k = 0; k < runs[p].losses.size(); ++k) {
      const double v = runs[p].losses[k];
      if (!std::isfinite(v)) continue;
      line.points.push_back({static_cast<double>(k + 1), v});
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    c.series.push_back(std::move(line));
  }
  if (std::isfinite(lo)) {
    c.y.min = std::floor(lo * 2) / 2;
    c.y.max = std::ceil(hi * 2) / 2;
  }
  return plot::to_svg(c);
}

bool write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f << text;
    if (!f) {
      std::fprintf(stderr, "ch07_numbers: cannot write %s\n", tmp.c_str());
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "ch07_numbers: cannot rename %s to %s\n", tmp.c_str(), path.c_str());
    return false;
  }
  return true;
}

/// The paired table: every precision but the reference against it, from
/// the losses as shown.
void print_paired(const std::vector<std::vector<double>>& finals) {
  const std::size_t seeds = finals.front().size();
  std::printf(
      "\npaired by seed against bf16: d = run − bf16 at the same seed, %zu pairs; 95%% interval and t with "
      "%zu "
      "degrees of freedom\n",
      seeds, seeds - 1);
  std::printf("%s  %7s  %6s  %18s  %6s  %6s  %6s  %7s  %11s\n", name_cell("run").c_str(), "mean d", "sd d",
              "95% interval", "t", "p(t)", "d > 0", "p(sign)", "shown at 5%");
  for (std::size_t p = 0; p < finals.size(); ++p) {
    if (p == kReference) continue;
    const ch04::PairedDifference d = ch04::paired_difference(finals[p], finals[kReference]);
    char interval[48], sign[16];
    std::snprintf(interval, sizeof interval, "[%+.4f, %+.4f]", d.ci_low, d.ci_high);
    std::snprintf(sign, sizeof sign, "%d of %d", d.positive, d.n);
    std::printf("%s  %+7.4f  %6.4f  %18s  %6.2f  %6.4f  %6s  %7.4f  %11s\n",
                name_cell(precisions()[p].label).c_str(), d.mean, d.sd, interval, d.t, d.p_t, sign, d.p_sign,
                d.p_t < 0.05 ? "yes" : "no");
  }
  const std::size_t comparisons = finals.size() - 1;
  std::printf(
      "shown at 5%%: two-sided p(t) < 0.05, the interval excludes 0. With %zu comparisons, the chance that "
      "one or "
      "more\nshows a difference where none exists is %.3f were they independent, at most %.2f in any case; "
      "with %zu "
      "pairs\nthe sign test's p is at least %.4f.\n",
      comparisons, 1 - std::pow(0.95, static_cast<double>(comparisons)),
      0.05 * static_cast<double>(comparisons), seeds, ch04::sign_test_p(0, static_cast<int>(seeds)));
}

int train_sweep(const std::string& model, const std::string& dir, int seeds, int steps_override) {
  const ModelRun m = model_run(model);
  const int steps = steps_override > 0 ? steps_override : m.steps;
  std::printf(
      "%s, %d steps,\nseeds 1 to %d; at one seed every precision starts from the same weights and sees the "
      "same batches\n%s\n\n",
      m.title.c_str(), steps, seeds, m.final_what.c_str());
  std::vector<std::vector<double>> finals(precisions().size());
  std::vector<RunResult> first;
  for (int seed = 1; seed <= seeds; ++seed)
    for (std::size_t p = 0; p < precisions().size(); ++p) {
      RunResult r = train_one(m, precisions()[p], static_cast<std::uint64_t>(seed), steps);
      finals[p].push_back(shown(r.final_loss));
      if (seed == 1) first.push_back(std::move(r));
    }
  // Seed 1: the mean training loss of each quarter of the run, and the metric.
  const int quarter = std::max(1, steps / 4);
  std::printf("seed 1: the mean training loss over each quarter of the run (steps), and the %s at the end\n",
              model == "mlp" ? "test accuracy" : "validation loss");
  std::printf("%s", name_cell("precision").c_str());
  for (int end = quarter; end <= steps; end += quarter) {
    char head[24];
    std::snprintf(head, sizeof head, "%d-%d", end - quarter + 1, end);
    std::printf("  %9s", head);
  }
  std::printf("  %10s\n", model == "mlp" ? "accuracy" : "validation");
  for (std::size_t p = 0; p < first.size(); ++p) {
    std::printf("%s", name_cell(precisions()[p].label).c_str());
    for (int end = quarter; end <= steps; end += quarter) {
      double sum = 0;
      for (int k = end - quarter; k < end; ++k) sum += first[p].losses[static_cast<std::size_t>(k)];
      std::printf("  %9.4f", sum / quarter);
    }
    std::printf("  %10.4f\n", first[p].metric);
  }
  const std::string picture = dir + "/fp8-curves-" + model + ".svg";
  if (!write_file(picture, curves_svg(m, first))) return 1;
  std::printf("picture: %s\n\n", picture.c_str());

  std::printf("final loss, seeds 1 to %d\n", seeds);
  std::printf("%s", name_cell("policy").c_str());
  for (int k = 1; k <= seeds; ++k) std::printf("  seed %d", k);
  std::printf("    mean      sd\n");
  for (std::size_t p = 0; p < finals.size(); ++p) {
    std::printf("%s", name_cell(precisions()[p].label).c_str());
    double sum = 0;
    for (double v : finals[p]) {
      std::printf("  %6.4f", v);
      sum += v;
    }
    const double mean = sum / seeds;
    double ss = 0;
    for (double v : finals[p]) ss += (v - mean) * (v - mean);
    std::printf("  %6.4f  %6.4f\n", mean, seeds > 1 ? std::sqrt(ss / (seeds - 1)) : 0.0);
  }
  if (seeds > 1) print_paired(finals);
  return 0;
}

// --- claims ---------------------------------------------------------------

/// The final-loss table of a file `train` wrote: [precision][seed], in
/// precisions() order (the names are checked).
std::vector<std::vector<double>> read_finals(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot read it");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::size_t i = 0;
  while (i < lines.size() && lines[i].rfind("final loss, seeds", 0) != 0) ++i;
  if (i + 2 >= lines.size())
    throw std::runtime_error(path + ": no 'final loss, seeds' table (the output of ch07_numbers train)");
  std::vector<std::vector<double>> finals;
  for (std::size_t p = 0; p < precisions().size(); ++p) {
    const std::size_t at = i + 2 + p;
    if (at >= lines.size() || lines[at].compare(0, kNameWidth, name_cell(precisions()[p].label)) != 0)
      throw std::runtime_error(path + ": row " + std::to_string(at + 1) + " is not " + precisions()[p].label +
                               " (rerun the chapter's generate.sh)");
    std::vector<double> row;
    const char* s = lines[at].c_str() + kNameWidth;
    char* end = nullptr;
    for (double v = std::strtod(s, &end); end != s; v = std::strtod(s, &end)) {
      row.push_back(v);
      s = end;
    }
    if (row.size() < 4)
      throw std::runtime_error(path + ": row " + std::to_string(at + 1) + " has too few numbers");
    row.resize(row.size() - 2);  // less the mean and sd
    finals.push_back(row);
  }
  return finals;
}

int claims(const std::string& mlp_file, const std::string& lm_file) {
  std::printf("claim: \"FP16+FP32 remains the industry's best practice; FP8 is the future (H100)\"\n");
  std::printf(
      "  the final loss of each precision against bf16 (d = run − bf16 at the same seed; negative: a lower "
      "loss than bf16's):\n");
  std::printf("  %-12s %-18s %8s  %18s  %s\n", "model", "run", "mean d", "95% interval", "");
  const std::pair<const char*, std::string> files[] = {{"mlp", mlp_file}, {"transformer", lm_file}};
  std::vector<std::string> best_names;
  std::string verdicts;
  bool any_cost = false, f16_shown = false;
  constexpr std::size_t kF16 = 1;  // fp16 + GradScaler, "FP16+FP32"
  for (const auto& [model, file] : files) {
    const std::vector<std::vector<double>> f = read_finals(file);
    std::size_t best = 3;
    double best_mean = INFINITY;
    for (std::size_t p = 0; p < f.size(); ++p) {
      if (p == kReference) continue;
      const ch04::PairedDifference d = ch04::paired_difference(f[p], f[kReference]);
      const bool fp8 = p > kReference;
      if (p == kF16 && d.p_t < 0.05) f16_shown = true;
      if (fp8 && d.mean < best_mean) {
        best_mean = d.mean;
        best = p;
      }
      char interval[48];
      std::snprintf(interval, sizeof interval, "[%+.4f, %+.4f]", d.ci_low, d.ci_high);
      std::printf("  %-12s %-18s %+8.4f  %18s  %s\n", model, precisions()[p].label, d.mean, interval,
                  d.p_t < 0.05 ? "shown at 5%" : "not shown");
    }
    const ch04::PairedDifference d = ch04::paired_difference(f[best], f[kReference]);
    best_names.push_back(precisions()[best].label);
    char line[400];
    if (d.p_t < 0.05)
      std::snprintf(
          line, sizeof line,
          "  %s: the best FP8 recipe here, %s, differs from bf16 by %+.4f (95%% interval [%+.4f, %+.4f]), "
          "shown at 5%%\n",
          model, precisions()[best].label, d.mean, d.ci_low, d.ci_high);
    else
      std::snprintf(
          line, sizeof line,
          "  %s: the best FP8 recipe here, %s, is not told apart from bf16 by %zu seeds: the cost lies "
          "in [%+.4f, %+.4f]\n",
          model, precisions()[best].label, f[best].size(), d.ci_low, d.ci_high);
    verdicts += line;
    any_cost = any_cost || d.ci_low > 0;
  }
  std::printf("%s", verdicts.c_str());
  std::printf(
      "  verdict: %s\n  %s\n",
      any_cost ? "on at least one model even the best FP8 recipe costs loss against bf16 (its interval "
                 "lies above 0)."
               : "on these two small models the best FP8 recipe costs no loss against bf16 that these "
                 "seeds can show;\n  the intervals bound what it may cost.",
      f16_shown ? "fp16 with the GradScaler (FP16+FP32) differs from bf16 on at least one model (shown "
                  "at 5%, above).\n  The speed an H100 gives FP8 a CPU run cannot measure."
                : "Nor is fp16 with the GradScaler (FP16+FP32) told apart from bf16: its being the best "
                  "practice is not\n  a matter of loss on these models. The speed an H100 gives FP8 a "
                  "CPU run cannot measure.");
  return 0;
}

int usage() {
  std::fprintf(
      stderr,
      "usage: ch07_numbers train mlp|transformer DIR [--seeds N] [--steps S], or ch07_numbers claims "
      "MLP_FILE TRANSFORMER_FILE\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2) return usage();
    const std::string what = argv[1];
    if (what == "claims" && argc == 4) return claims(argv[2], argv[3]);
    if (what == "train" && argc >= 4) {
      int seeds = 5, steps = 0;
      for (int i = 4; i < argc; i += 2) {
        if (i + 1 >= argc) return usage();
        const std::string opt = argv[i];
        char* end = nullptr;
        const long v = std::strtol(argv[i + 1], &end, 10);
        if (*argv[i + 1] == '\0' || *end != '\0' || v < 1 || v > 100000) return usage();
        if (opt == "--seeds" && v >= 2 && v <= 100) seeds = static_cast<int>(v);
        else if (opt == "--steps") steps = static_cast<int>(v);
        else return usage();
      }
      return train_sweep(argv[2], argv[3], seeds, steps);
    }
    return usage();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ch07_numbers: %s\n", e.what());
    return 1;
  }
}
