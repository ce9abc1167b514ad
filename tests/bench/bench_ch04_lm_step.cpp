// Chapter 04 — what one training step of the tiny Transformer costs in
// emulated mixed precision next to FP32, measured in the same run.
// Depends on: mpt/nn/models/transformer.hpp (TinyTransformer), mpt/nn/layers/softmax.hpp
// (cross_entropy), mpt/optim/adamw.hpp, mpt/amp/grad_scaler.hpp,
// mpt/core/random.hpp (Rng), bench_support.hpp, Google Benchmark.
//
// One step is forward of a fixed batch of token windows, the library's FP32
// cross-entropy of the [B·T, V] logits, backward, AdamW step, refresh of the
// model copies and zero_grad — with a GradScaler (scale, step, update) in
// the fp16 run, none in the FP32 and bf16 runs. On one core. The fp16/bf16
// runs emulate a GPU's mixed precision: the products are the same FP32
// GEMMs, and on top of them every stored value goes through the library's
// rounding and every input is widened first, so the emulated step can only
// be slower; the target is at most 1.3x the FP32 step, and the verdict says
// honestly whether this run met it. Each time is the fastest of
// --repetitions runs (default 5). The tokens are seeded random ids: the
// cost of a step does not depend on the text.
//
//   bench_ch04_lm_step [--batch=16] [--context=64] [--d-model=64] [--heads=4]
//                      [--layers=2] [--vocab=96] [--repetitions=5] [google-benchmark flags]
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/core/random.hpp"
#include "mpt/nn/layers/softmax.hpp"
#include "mpt/nn/models/transformer.hpp"
#include "mpt/optim/adamw.hpp"

namespace {

int g_batch = 16, g_context = 64, g_d_model = 64, g_heads = 4, g_layers = 2, g_vocab = 96, g_repetitions = 5;

/// One model, its optimizer, its scaler and a fixed batch.
struct Trainer {
  mpt::TinyTransformer net;
  mpt::AdamW opt;
  mpt::GradScaler scaler;
  std::vector<int> inputs, targets;
  bool use_scaler;
  static mpt::TransformerConfig config(mpt::DType p) {
    mpt::TransformerConfig c;
    c.vocab_size = g_vocab;
    c.context = g_context;
    c.d_model = g_d_model;
    c.num_heads = g_heads;
    c.num_layers = g_layers;
    c.dtype = p;
    c.seed = 1;
    return c;
  }
  static mpt::GradScaler::Options scaler_options(bool on) {
    mpt::GradScaler::Options o;
    o.enabled = on;
    return o;
  }
  Trainer(mpt::DType p, bool scaled)
      : net(config(p)), opt(net.parameters()), scaler(scaler_options(scaled)), use_scaler(scaled) {
    mpt::Rng rng(7);
    for (int i = 0; i < g_batch * g_context; ++i) {
      inputs.push_back(static_cast<int>(rng.below(static_cast<std::uint64_t>(g_vocab))));
      targets.push_back(static_cast<int>(rng.below(static_cast<std::uint64_t>(g_vocab))));
    }
  }
  /// One training step; returns the loss.
  float step() {
    const mpt::Tensor& logits = net.forward_tokens(inputs, g_batch, g_context);
    const float loss = mpt::cross_entropy(logits, targets, {}, net.context()).value(0);
    mpt::Tensor dloss(mpt::DType::f32, {});
    dloss.f32_data()[0] = 1.0f;
    if (use_scaler) {
      (void)scaler.scale(loss);
      dloss.f32_data()[0] = scaler.get_scale();
    }
    net.backward(mpt::cross_entropy_backward(logits, targets, {}, dloss, net.context()));
    if (use_scaler) {
      scaler.step(opt);
      scaler.update();
    } else {
      opt.step();
    }
    net.refresh_model_copies();
    opt.zero_grad();
    return loss;
  }
};

void BM_step(benchmark::State& st, mpt::DType p, bool scaled) {
  Trainer r(p, scaled);
  r.step();
  float loss = 0;
  for (auto _ : st) loss += r.step();
  benchmark::DoNotOptimize(loss);
  st.counters["tokens/s"] = benchmark::Counter(static_cast<double>(st.iterations()) * g_batch * g_context,
                                               benchmark::Counter::kIsRate);
}

/// Each benchmark's fastest CPU time per step over its repetitions, in ms.
using TimeReporter = bench::MinTimeReporter;

bool int_flag(const char* arg, const char* name, int& out) {
  const std::size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0) return false;
  out = std::stoi(arg + n);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  bench::initialize(argc, argv, [](const char* arg) {
    return int_flag(arg, "--batch=", g_batch) || int_flag(arg, "--context=", g_context) ||
           int_flag(arg, "--d-model=", g_d_model) || int_flag(arg, "--heads=", g_heads) ||
           int_flag(arg, "--layers=", g_layers) || int_flag(arg, "--vocab=", g_vocab) ||
           int_flag(arg, "--repetitions=", g_repetitions);
  });

  benchmark::RegisterBenchmark("step/fp32", BM_step, mpt::DType::f32, false)
      ->Unit(benchmark::kMillisecond)
      ->Repetitions(g_repetitions);
  benchmark::RegisterBenchmark("step/fp16+scaler", BM_step, mpt::DType::f16, true)
      ->Unit(benchmark::kMillisecond)
      ->Repetitions(g_repetitions);
  benchmark::RegisterBenchmark("step/bf16", BM_step, mpt::DType::bf16, false)
      ->Unit(benchmark::kMillisecond)
      ->Repetitions(g_repetitions);
  TimeReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);

  std::printf(
      "\ntiny Transformer V=%d T=%d D=%d H=%d L=%d, batch %d, AdamW, one core; time: the fastest of the "
      "repetitions\n\n",
      g_vocab, g_context, g_d_model, g_heads, g_layers, g_batch);
  std::printf("%-12s %9s %8s %8s  %s\n", "run", "ms/step", "x fp32", "target", "verdict");
  const double t32 = rep.ms.count("step/fp32") ? rep.ms["step/fp32"] : 0.0;
  for (const char* name : {"step/fp32", "step/fp16+scaler", "step/bf16"}) {
    if (!rep.ms.count(name) || t32 <= 0) continue;
    const double tr = rep.ms[name] / t32;
    const bool baseline = std::string(name) == "step/fp32";
    std::printf(
        "%-12s %9.3f %8.2f %8s  %s\n", name + 5, rep.ms[name], tr, baseline ? "-" : "<=1.3x",
        baseline ? "" : (tr <= 1.3 ? "meets target" : "BELOW target (the emulated rounding costs more)"));
  }
  benchmark::Shutdown();
  return 0;
}
