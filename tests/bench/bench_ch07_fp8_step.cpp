// Chapter 07 — what one training step costs under each FP8 recipe next to
// bf16 and FP32, all measured in the same run: Chapter 2's MLP step (the
// shape bench_ch02_mlp_step times) and the tiny Transformer's step
// (bench_ch04_lm_step's, smaller by default).
// Depends on: mpt/core/policy_string.hpp (parse_policy_string),
// mpt/fp8/linear_scaling.hpp (attach_fp8, Fp8Training), mpt/nn/models/mlp.hpp,
// mpt/nn/models/transformer.hpp, mpt/nn/layers/losses.hpp,
// mpt/nn/layers/softmax.hpp, mpt/optim/sgd.hpp, mpt/optim/adamw.hpp,
// mpt/core/random.hpp (Rng), bench_support.hpp, Google Benchmark.
//
// The policies, each a policy string as `mpt train --policy` takes it: f32,
// bf16, fp8:delayed, fp8:current, fp8:mx-floor, fp8:mx-rceil. Under fp8:*
// every Linear's GEMMs run through the fp8 tier (attach_fp8: quantize its
// operands by the recipe, the FP8 GEMM emulation, delayed scaling's update
// after each step), every other op in bf16. All of it is emulation on the
// CPU: an FP8 GEMM is a FP32 GEMM on decoded codes, with the quantization
// (amax, scale, codes, counts) on top of bf16's casts; the question this
// answers is what that emulation costs per step against bf16's emulation
// (the "cost per step against bf16 emulation"), and how far the
// recipes differ (MX quantizes each operand twice, along rows and along
// columns; current scaling reads each tensor twice, once for its amax).
//
// One MLP step: forward, softmax cross-entropy, backward, SGD (momentum 0.9)
// step, the FP8 update, refresh of the model copies and zero_grad, on a
// fixed batch. One Transformer step: the same with the library's
// cross-entropy of the [B·T, V] logits and AdamW. On one core. Each time is
// the fastest of --repetitions runs (default 5), in CPU time.
//
// Output (chapters/07-fp8's text reads it; keep the format): after Google
// Benchmark's lines, per model a header line and one row per policy:
//
//   model  policy  ms/step  x bf16  x f32
//
// Printed, never asserted: not a test.
//
//   bench_ch07_fp8_step [--batch=128] [--sizes=256,512,512,10] [--lm-batch=8] [--context=32]
//                       [--d-model=64] [--heads=4] [--layers=2] [--vocab=96] [--no-lm]
//                       [--repetitions=5] [google-benchmark flags]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/core/random.hpp"
#include "mpt/fp8/linear_scaling.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/layers/softmax.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/nn/models/transformer.hpp"
#include "mpt/optim/adamw.hpp"
#include "mpt/optim/sgd.hpp"

namespace {

int g_batch = 128;
std::vector<int> g_sizes = {256, 512, 512, 10};
int g_lm_batch = 8, g_context = 32, g_d_model = 64, g_heads = 4, g_layers = 2, g_vocab = 96;
bool g_lm = true;
int g_repetitions = 5;

const char* const kPolicies[] = {"f32", "bf16", "fp8:delayed", "fp8:current", "fp8:mx-floor", "fp8:mx-rceil"};

/// The policy text's Policy and its canonical text (what attach_fp8 reads).
struct Parsed {
  std::shared_ptr<const mpt::Policy> policy;
  std::string text;
  explicit Parsed(const char* s) {
    const mpt::PolicySpec spec = mpt::parse_policy_string(s);
    policy = spec.make();
    text = spec.text();
  }
};

/// Chapter 2's MLP under a policy, its optimizer and a fixed batch.
struct MlpTrainer {
  mpt::Mlp mlp;
  mpt::SGD opt;
  std::unique_ptr<mpt::fp8::Fp8Training> fp8;
  mpt::MatrixF x;
  std::vector<int> labels;
  static mpt::MlpConfig config(const Parsed& p) {
    mpt::MlpConfig c{g_sizes, mpt::Activation::relu, mpt::DType::f32, mpt::MasterWeights::fp32, 1};
    c.policy = p.policy;
    return c;
  }
  explicit MlpTrainer(const Parsed& p)
      : mlp(config(p)),
        opt(mlp.parameters(), mpt::SGD::Options{0.01, 0.9}),
        fp8(mpt::fp8::attach_fp8(mlp, p.text)),
        x(g_batch, g_sizes.front()),
        labels(static_cast<std::size_t>(g_batch)) {
    mpt::Rng rng(7);
    for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = static_cast<float>(rng.normal());
    for (int& y : labels) y = static_cast<int>(rng.below(static_cast<std::uint64_t>(g_sizes.back())));
  }
  float step() {
    const mpt::Tensor& logits = mlp.forward(x);
    const float loss = mpt::cross_entropy_loss(logits, labels);
    mlp.backward(mpt::cross_entropy_backward(logits, labels, 1.0f));
    opt.step();
    if (fp8) fp8->update();
    mlp.refresh_model_copies();
    opt.zero_grad();
    return loss;
  }
};

/// The tiny Transformer under a policy, AdamW and a fixed batch of token windows.
struct LmTrainer {
  mpt::TinyTransformer net;
  mpt::AdamW opt;
  std::unique_ptr<mpt::fp8::Fp8Training> fp8;
  std::vector<int> inputs, targets;
  static mpt::TransformerConfig config(const Parsed& p) {
    mpt::TransformerConfig c;
    c.vocab_size = g_vocab;
    c.context = g_context;
    c.d_model = g_d_model;
    c.num_heads = g_heads;
    c.num_layers = g_layers;
    c.seed = 1;
    c.policy = p.policy;
    return c;
  }
  explicit LmTrainer(const Parsed& p)
      : net(config(p)), opt(net.parameters()), fp8(mpt::fp8::attach_fp8(net, p.text)) {
    mpt::Rng rng(7);
    for (int i = 0; i < g_lm_batch * g_context; ++i) {
      inputs.push_back(static_cast<int>(rng.below(static_cast<std::uint64_t>(g_vocab))));
      targets.push_back(static_cast<int>(rng.below(static_cast<std::uint64_t>(g_vocab))));
    }
  }
  float step() {
    const mpt::Tensor& logits = net.forward_tokens(inputs, g_lm_batch, g_context);
    const float loss = mpt::cross_entropy(logits, targets, {}, net.context()).value(0);
    mpt::Tensor dloss(mpt::DType::f32, {});
    dloss.f32_data()[0] = 1.0f;
    net.backward(mpt::cross_entropy_backward(logits, targets, {}, dloss, net.context()));
    opt.step();
    if (fp8) fp8->update();
    net.refresh_model_copies();
    opt.zero_grad();
    return loss;
  }
};

template <class Trainer>
void BM_step(benchmark::State& st, const char* policy) {
  const Parsed p(policy);
  Trainer r(p);
  r.step();  // the first step allocates the buffers
  float loss = 0;
  for (auto _ : st) loss += r.step();
  benchmark::DoNotOptimize(loss);
}

std::vector<int> parse_sizes(const char* s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoi(item));
  return v;
}

bool int_flag(const char* arg, const char* name, int& out) {
  const std::size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0) return false;
  out = std::stoi(arg + n);
  return true;
}

/// One model's table: a header line, then one row per policy that ran.
void print_table(const bench::MinTimeReporter& rep, const std::string& model, const std::string& what) {
  std::printf("\n%s\n\n", what.c_str());
  std::printf("%-6s %-14s %10s %8s %8s\n", "model", "policy", "ms/step", "x bf16", "x f32");
  const double tb = rep.of(model + "/bf16"), tf = rep.of(model + "/f32");
  for (const char* policy : kPolicies) {
    const double t = rep.of(model + "/" + policy);
    if (t <= 0) continue;
    char xb[16] = "-", xf[16] = "-";
    if (tb > 0) std::snprintf(xb, sizeof xb, "%.2f", t / tb);
    if (tf > 0) std::snprintf(xf, sizeof xf, "%.2f", t / tf);
    std::printf("%-6s %-14s %10.3f %8s %8s\n", model.c_str(), policy, t, xb, xf);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bench::initialize(argc, argv, [](const char* arg) {
    if (std::strncmp(arg, "--sizes=", 8) == 0) return g_sizes = parse_sizes(arg + 8), true;
    if (std::strcmp(arg, "--no-lm") == 0) return g_lm = false, true;
    return int_flag(arg, "--batch=", g_batch) || int_flag(arg, "--lm-batch=", g_lm_batch) ||
           int_flag(arg, "--context=", g_context) || int_flag(arg, "--d-model=", g_d_model) ||
           int_flag(arg, "--heads=", g_heads) || int_flag(arg, "--layers=", g_layers) ||
           int_flag(arg, "--vocab=", g_vocab) || int_flag(arg, "--repetitions=", g_repetitions);
  });
  if (g_batch < 1 || g_sizes.size() < 2 || g_repetitions < 1) {
    std::fprintf(stderr,
                 "bench_ch07_fp8_step: --batch and --repetitions must be at least 1, --sizes at least two "
                 "numbers\n");
    return 2;
  }
#if defined(__GLIBC__)
  // Keep freed blocks, as bench_ch02_mlp_step does (its comment says why):
  // the step's time, not the page faults of fresh mmap'd buffers.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
  for (const char* policy : kPolicies)
    benchmark::RegisterBenchmark((std::string("mlp/") + policy).c_str(), BM_step<MlpTrainer>, policy)
        ->Unit(benchmark::kMillisecond)
        ->Repetitions(g_repetitions);
  if (g_lm)
    for (const char* policy : kPolicies)
      benchmark::RegisterBenchmark((std::string("lm/") + policy).c_str(), BM_step<LmTrainer>, policy)
          ->Unit(benchmark::kMillisecond)
          ->Repetitions(g_repetitions);
  bench::MinTimeReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);

  std::string sizes;
  for (int s : g_sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(s);
  // No count of repetitions here: a quick rerun with one prints the same header.
  std::printf(
      "\nFP8 training step, emulated on the CPU, one core; time: the fastest of the repetitions (CPU "
      "time)\n");
  print_table(rep, "mlp",
              "MLP " + sizes + " (ReLU), batch " + std::to_string(g_batch) + ", SGD momentum 0.9");
  if (g_lm)
    print_table(rep, "lm",
                "tiny Transformer V=" + std::to_string(g_vocab) + " T=" + std::to_string(g_context) +
                    " D=" + std::to_string(g_d_model) + " H=" + std::to_string(g_heads) +
                    " L=" + std::to_string(g_layers) + ", batch " + std::to_string(g_lm_batch) + ", AdamW");
  benchmark::Shutdown();
  return 0;
}
