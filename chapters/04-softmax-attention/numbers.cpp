// Chapter 04 — numerically stable softmax, cross-entropy and attention: the
// numbers the chapter text quotes that the CLI does not print (program
// `ch04_numbers`).
// Depends on: the Chapter 4 library (softmax.hpp, softmax_cpu.hpp), the core
// tier (Context, policies, Tensor, Rng), Chapter 1's shortest decimals.
//
// The chapter's README contains no typed-in numbers: generate.sh runs this
// program once per section and splices the output into the text. Usage:
//   ch04_numbers claims|fused|lm-seeds
//   ch04_numbers lm DIR      (also writes DIR/lm-curves.svg)
//   ch04_numbers lm-seeds --check FILE --seed K   (the docs test's short form)
// lm and lm-seeds read the licence texts of /usr/share/common-licenses
// (Debian's base-files); lm trains the tiny Transformer in four precisions,
// lm-seeds does that for five seeds.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/formats/explain.hpp"
#include "mpt/nn/cpu/softmax_cpu.hpp"
#include "mpt/nn/data/text_data.hpp"
#include "mpt/nn/layers/softmax.hpp"
#include "training.hpp"

namespace {

using namespace mpt;

std::string dec(double x) { return shortest_decimal(static_cast<float>(x)); }
std::string g3(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

/// rows·k logits from N(0, spread²), seeded, as float.
std::vector<float> normal_logits(std::int64_t rows, std::int64_t k, double spread, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<float> z(static_cast<std::size_t>(rows * k));
  for (float& v : z) v = static_cast<float>(spread * rng.normal());
  return z;
}

/// The mean cross-entropy in double of float logits [rows, k].
double fp64_cross_entropy(const std::vector<float>& z, std::int64_t rows, std::int64_t k,
                          const std::vector<int>& y) {
  double total = 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* row = z.data() + i * k;
    double m = -INFINITY, s = 0;
    for (std::int64_t j = 0; j < k; ++j) m = std::max(m, static_cast<double>(row[j]));
    for (std::int64_t j = 0; j < k; ++j) s += std::exp(static_cast<double>(row[j]) - m);
    total += m + std::log(s) - row[y[static_cast<std::size_t>(i)]];
  }
  return total / static_cast<double>(rows);
}

/// The library's mean cross-entropy of `logits` (FP32 loss whatever their dtype).
double library_cross_entropy(const Tensor& logits, const std::vector<int>& y) {
  Context ctx(uniform_policy(logits.dtype()));
  const Tensor loss = cross_entropy(logits, y, CrossEntropyOptions{}, ctx);
  float v = 0;
  loss.to_f32(&v);
  return v;
}

// ---------------------------------------------------------------------------

int claims() {
  std::printf("claim 1: \"nn.CrossEntropyLoss().to(torch.float32) computes the loss in FP32\"\n");
  {
    // A language model's last layer: 64 rows of 4096 logits, spread 4.
    const std::int64_t rows = 64, k = 4096;
    const std::vector<float> z = normal_logits(rows, k, 4.0, 41);
    std::vector<int> y(static_cast<std::size_t>(rows));
    Rng rng(42);
    for (int& t : y) t = static_cast<int>(rng.below(static_cast<std::uint64_t>(k)));
    const double ref = fp64_cross_entropy(z, rows, k, y);
    const Tensor z32 = Tensor::from_f32(z.data(), {rows, k}, DType::f32);
    const Tensor z16 = Tensor::from_f32(z.data(), {rows, k}, DType::f16);
    std::vector<float> z16_values(z.size());
    z16.to_f32(z16_values.data());
    const double ref16 = fp64_cross_entropy(z16_values, rows, k, y);
    const double l32 = library_cross_entropy(z32, y), l16 = library_cross_entropy(z16, y);
    std::printf(
        "  a loss module has no parameters or buffers: .to(dtype) converts nothing, and the loss\n"
        "  reads the logits in whatever dtype they arrive. What the loss's value depends on:\n");
    std::printf("  %-44s %14s %16s\n", "logits [64, 4096], N(0, 16)", "mean loss", "vs FP64 of FP32");
    std::printf("  %-44s %14s %16s\n", "FP64 of the FP32 logits (reference)", dec(ref).c_str(), "-");
    std::printf("  %-44s %14s %16s\n", "FP32 logits, loss in FP32 (library)", dec(l32).c_str(),
                g3(std::fabs(l32 - ref) / ref).c_str());
    std::printf("  %-44s %14s %16s\n", "fp16 logits, loss in FP32 (library)", dec(l16).c_str(),
                g3(std::fabs(l16 - ref) / ref).c_str());
    std::printf("  %-44s %14s %16s\n", "FP64 of the fp16 logits", dec(ref16).c_str(),
                g3(std::fabs(ref16 - ref) / ref).c_str());
    std::printf(
        "  verdict: FALSE as a fix. The loss of fp16 logits computed in FP32 is within %s of FP64's\n"
        "  on the same fp16 logits: the difference from the FP32 logits (%s) was made when the logits\n"
        "  were rounded to fp16, before any loss ran. What changes it: logits produced in FP32 (the\n"
        "  last layer kept in FP32), and what keeps the loss itself in FP32 is autocast's FP32 list\n"
        "  (log_softmax, nll_loss, cross_entropy) — or this library, whose losses always are.\n",
        g3(std::fabs(l16 - ref16) / ref16).c_str(), g3(std::fabs(l16 - ref) / ref).c_str());
  }
  std::printf("\nclaim 2: \"CrossEntropy computes log(softmax) and underflows to -inf\"\n");
  {
    // One row: the target 120 below the largest logit.
    const std::vector<float> row = {120.0f, 0.0f, 60.0f, 100.0f};
    const int target = 1;
    Context ctx(uniform_policy(DType::f32));
    const Tensor x = Tensor::from_f32(row.data(), {1, 4}, DType::f32);
    std::vector<float> p(4), lp(4);
    softmax(x, ctx).to_f32(p.data());
    log_softmax(x, ctx).to_f32(lp.data());
    const double naive = -std::log(static_cast<double>(p[target]));  // log of the stored FP32 softmax
    const double stable = -lp[target];
    double m = 120, s = 0;
    for (float v : row) s += std::exp(static_cast<double>(v) - m);
    const double ref = m + std::log(s) - row[target];
    std::printf("  logits [120, 0, 60, 100], target 1: softmax(z)[1] = exp(-120)/... = %s in FP64,\n",
                g3(std::exp(-120.0 - std::log(s))).c_str());
    std::printf("  below FP32's smallest subnormal (%s):\n", g3(std::ldexp(1.0, -149)).c_str());
    std::printf("  %-46s %12s\n", "implementation", "loss");
    std::printf("  %-46s %12s\n", "FP64 log-sum-exp (reference)", dec(ref).c_str());
    std::printf("  %-46s %12s\n", "-log(softmax(z)[1]), softmax stored in FP32", dec(naive).c_str());
    std::printf("  %-46s %12s\n", "-log_softmax(z)[1] (library; PyTorch's)", dec(stable).c_str());
    std::printf(
        "  verdict: depends on the implementation. log of a stored softmax underflows (-log 0 = inf);\n"
        "  PyTorch's cross_entropy is log_softmax then nll_loss (aten/src/ATen/native/LossNLL.cpp),\n"
        "  log-sum-exp without a softmax in between, and so is this library's: no underflow.\n");
  }
  std::printf(
      "\nclaim 3: \"exp overflows around 10\" — in fp16 (exp(11.09) > 65504): see Chapter 1's claims;\n"
      "  in FP32 exp overflows at 88.72, and a softmax that subtracts the max never takes exp of a\n"
      "  positive number.\n");
  return 0;
}

int fused() {
  // The fused CPU kernel against the library's cross_entropy on the same fp16
  // logits: the loss and every gradient.
  const std::int64_t rows = 32, k = 32768;
  const std::vector<float> z = normal_logits(rows, k, 3.0, 7);
  std::vector<int> y(static_cast<std::size_t>(rows));
  Rng rng(8);
  for (int& t : y) t = static_cast<int>(rng.below(static_cast<std::uint64_t>(k)));
  const Tensor z16 = Tensor::from_f32(z.data(), {rows, k}, DType::f16);
  std::vector<std::uint16_t> codes(z.size()), grad(z.size());
  std::copy_n(static_cast<const std::uint16_t*>(z16.raw()), codes.size(), codes.begin());
  const float fused_loss =
      softmax_cpu::fused_cross_entropy_f16(codes.data(), rows, k, y.data(), {}, grad.data());
  Context ctx(uniform_policy(DType::f16));
  float lib_loss = 0;
  cross_entropy(z16, y, CrossEntropyOptions{}, ctx).to_f32(&lib_loss);
  const Tensor one = Tensor::from_f32(std::vector<float>{1.0f}.data(), {}, DType::f32);
  const Tensor lib_grad = cross_entropy_backward(z16, y, CrossEntropyOptions{}, one, ctx);
  std::vector<float> lg(z.size()), fg(z.size());
  lib_grad.to_f32(lg.data());
  load_from(DType::f16, grad.data(), fg.data(), grad.size());
  std::size_t differ = 0;
  double worst = 0;
  for (std::size_t j = 0; j < z.size(); ++j) {
    if (lg[j] == fg[j]) continue;
    ++differ;
    const double ulp =
        std::fabs(lg[j]) < 6.103515625e-05 ? std::ldexp(1.0, -24) : std::ldexp(1.0, std::ilogb(lg[j]) - 10);
    worst = std::max(worst, std::fabs(static_cast<double>(lg[j]) - fg[j]) / ulp);
  }
  std::printf("fused CPU kernel vs the library's cross_entropy, fp16 logits [%lld, %lld], N(0, 9):\n",
              static_cast<long long>(rows), static_cast<long long>(k));
  std::vector<float> z16_values(z.size());
  z16.to_f32(z16_values.data());
  const double ref = fp64_cross_entropy(z16_values, rows, k, y);
  std::printf("  loss: FP64 %s\n", dec(ref).c_str());
  std::printf("        fused   %s (relative error %s: 8 lanes, then a tree)\n", dec(fused_loss).c_str(),
              g3(std::fabs(fused_loss - ref) / ref).c_str());
  std::printf("        library %s (relative error %s: one sum left to right, Chapter 2's order)\n",
              dec(lib_loss).c_str(), g3(std::fabs(lib_loss - ref) / ref).c_str());
  std::printf(
      "  gradient: %zu of %zu fp16 values differ, by at most %s fp16 ulp (mpt's exp and the\n"
      "  library's expf round differently; each gradient is rounded to fp16 once)\n",
      differ, z.size(), g3(worst).c_str());
  return 0;
}

int lm(const std::string& dir) {
  const TextCorpus corpus = load_common_licenses();
  std::printf("corpus: %s\n        %zu bytes, %d distinct (the vocabulary), FNV-1a %016llx\n",
              corpus.source().c_str(), corpus.text().size(), corpus.vocab_size(),
              static_cast<unsigned long long>(corpus.checksum()));
  const ch04::LmCurves curves = ch04::lm_curves(corpus);
  std::fputs(curves.table.c_str(), stdout);
  const std::string path = dir + "/lm-curves.svg", tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f << curves.svg;
    if (!f) {
      std::fprintf(stderr, "ch04_numbers: cannot write %s\n", tmp.c_str());
      return 1;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "ch04_numbers: cannot rename %s to %s\n", tmp.c_str(), path.c_str());
    return 1;
  }
  std::printf("picture: %s\n", path.c_str());
  return 0;
}

int lm_seeds() {
  const ch04::LmSeedSweep sweep = ch04::lm_seed_sweep(load_common_licenses());
  std::fputs(ch04::lm_seed_title(sweep.steps, sweep.final_loss.front().size()).c_str(), stdout);
  std::fputs(sweep.table.c_str(), stdout);
  return 0;
}

// lm-seeds --check FILE --seed K: the short form of the sweep that the docs
// test runs (20 runs take minutes; this is 4). FILE is the committed output
// of `ch04_numbers lm-seeds`. It reruns seed K alone and requires its losses
// to be FILE's seed-K column, digit for digit, and it requires FILE's
// title, names and summary columns to be what the code writes for FILE's own
// seed columns (the summaries are computed from the shown losses). A change
// of the training code changes every seed's losses, so it fails here; what
// this cannot see is a change that moves only the other seeds' runs.
int lm_seeds_check(const std::string& path, int seed) {
  const auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "ch04_numbers lm-seeds --check: %s: %s\n", path.c_str(), why.c_str());
    return 1;
  };
  std::ifstream in(path);
  if (!in) return fail("cannot read it");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  if (lines.size() < 3 || lines[0] != "$ ch04_numbers lm-seeds")
    return fail("not the output of ch04_numbers lm-seeds (its first line is the command)");
  // The rows: a name in 44 columns, then the seed columns; the paired
  // comparison follows a blank line.
  std::vector<std::string> names;
  std::vector<std::vector<double>> final_loss;
  std::vector<std::vector<std::string>> shown;
  std::size_t seeds = 0;
  for (std::size_t i = 3; i < lines.size() && !lines[i].empty(); ++i) {
    const std::string& row = lines[i];
    if (row.size() < 44) return fail("row " + std::to_string(i + 1) + " is too short: " + row);
    std::string name = row.substr(0, 44);
    name.erase(name.find_last_not_of(' ') + 1);
    names.push_back(name);
    std::vector<std::string> tokens;
    std::size_t p = 44;
    while (true) {
      p = row.find_first_not_of(' ', p);
      if (p == std::string::npos) break;
      const std::size_t e = row.find(' ', p);
      tokens.push_back(row.substr(p, e == std::string::npos ? std::string::npos : e - p));
      p = e;
    }
    if (seeds == 0) seeds = tokens.size() - 2;  // the FP32 row: the seeds, the mean, the sd
    if (tokens.size() < seeds) return fail("row " + std::to_string(i + 1) + " has too few columns: " + row);
    tokens.resize(seeds);
    shown.push_back(tokens);
    std::vector<double> values;
    for (const std::string& t : tokens) values.push_back(std::strtod(t.c_str(), nullptr));
    final_loss.push_back(values);
  }
  if (seeds != static_cast<std::size_t>(ch04::kLmSeeds))
    return fail("it has " + std::to_string(seeds) + " seed columns; the code sweeps " +
                std::to_string(ch04::kLmSeeds) +
                " seeds (rerun chapters/04-softmax-attention/generate.sh BUILD_DIR)");
  if (seed < 1 || static_cast<std::size_t>(seed) > seeds)
    return fail("--seed " + std::to_string(seed) + " is not one of its seeds 1 to " + std::to_string(seeds));
  // Seed K again, from the code.
  std::vector<std::string> fresh_names;
  const std::vector<double> fresh = ch04::lm_seed_finals(
      load_common_licenses(), static_cast<std::uint64_t>(seed), ch04::kLmSeedSteps, &fresh_names);
  if (fresh_names != names) return fail("its precisions are not the ones lm_precisions() lists now");
  for (std::size_t p = 0; p < fresh.size(); ++p) {
    const std::string now = ch04::lm_loss_text(fresh[p]), then = shown[p][static_cast<std::size_t>(seed) - 1];
    if (now != then)
      return fail("seed " + std::to_string(seed) + ", " + names[p] + ": the code gives " + now +
                  ", the file says " + then +
                  " (rerun chapters/04-softmax-attention/generate.sh BUILD_DIR and commit)");
  }
  // The rest of the file, written again from its own seed columns.
  std::string want = lines[0] + "\n" + ch04::lm_seed_title(ch04::kLmSeedSteps, seeds) +
                     ch04::lm_seed_table(names, final_loss);
  std::string have;
  for (const std::string& line : lines) have += line + "\n";
  if (want != have)
    return fail(
        "its title, header or summary columns are not what the code writes for its seed columns "
        "(rerun chapters/04-softmax-attention/generate.sh BUILD_DIR and commit)");
  std::fprintf(
      stderr,
      "ch04_numbers lm-seeds --check: seed %d rerun (%zu runs) matches %s; its summary columns follow "
      "from its seed columns\n",
      seed, fresh.size(), path.c_str());
  return 0;
}

int usage() {
  std::fprintf(
      stderr,
      "usage: ch04_numbers claims|fused|lm-seeds, ch04_numbers lm DIR (writes DIR/lm-curves.svg), or "
      "ch04_numbers lm-seeds --check FILE --seed K\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string what = argv[1];
  if (what == "lm" && argc == 3) return lm(argv[2]);
  if (what == "lm-seeds" && argc == 6 && std::string(argv[2]) == "--check" &&
      std::string(argv[4]) == "--seed") {
    char* end = nullptr;
    const long seed = std::strtol(argv[5], &end, 10);
    if (*argv[5] == '\0' || *end != '\0' || seed < 1 || seed > 1000) return usage();
    return lm_seeds_check(argv[3], static_cast<int>(seed));
  }
  if (argc != 2) return usage();
  if (what == "claims") return claims();
  if (what == "fused") return fused();
  if (what == "lm-seeds") return lm_seeds();
  return usage();
}
