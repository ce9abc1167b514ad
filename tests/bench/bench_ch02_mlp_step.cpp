// Chapter 02 — what one MLP training step costs in emulated mixed precision
// next to FP32, both measured in the same run: time and the activation
// memory kept for backward.
// Depends on: mpt/nn/models/mlp.hpp, losses.hpp, mpt/optim/sgd.hpp,
// mpt/amp/grad_scaler.hpp, mpt/core/random.hpp (Rng), bench_support.hpp,
// Google Benchmark.
//
// One step is forward, softmax cross-entropy, backward, optimizer step,
// refresh of the model copies and zero_grad — with a GradScaler (scale,
// step, update) in the fp16 run, none in the FP32 and bf16 runs (as in
// PyTorch: bf16 has FP32's range). On one core. The fp16/bf16 runs *emulate*
// a GPU's mixed precision on the CPU: the GEMMs are the same FP32 GEMMs, and
// on top of them every stored value goes through the library's rounding and
// every GEMM input is widened to FP32 first. Casting is O(n^2) next to the
// GEMMs' O(n^3), so with the vectorized conversions the emulated step must
// cost at most 1.25x the FP32 step (verdict "meets target"). The activation
// bytes are real allocations (Mlp::activation_bytes): mixed / fp32 must be
// about half, at most 0.55x. Each time is the fastest of --repetitions runs
// (default 5): the one least disturbed by whatever else the machine does.
//
//   bench_ch02_mlp_step [--batch=128] [--sizes=256,512,512,10] [--repetitions=5]
//                       [google-benchmark flags]
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "bench_support.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/core/random.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/sgd.hpp"

namespace {

int g_batch = 128;
int g_repetitions = 5;
std::vector<int> g_sizes = {256, 512, 512, 10};

/// One model, its optimizer, its scaler and a fixed batch.
struct Trainer {
  mpt::Mlp mlp;
  mpt::SGD opt;
  mpt::GradScaler scaler;
  mpt::MatrixF x;
  std::vector<int> labels;
  bool use_scaler;
  Trainer(mpt::DType p, bool scaled)
      : mlp(mpt::MlpConfig{g_sizes, mpt::Activation::relu, p, mpt::MasterWeights::fp32, 1}),
        opt(mlp.parameters(), mpt::SGD::Options{0.01, 0.9}),
        scaler(mpt::GradScaler::Options{65536.0f, 2.0f, 0.5f, 2000, scaled}),
        x(g_batch, g_sizes.front()),
        labels(static_cast<std::size_t>(g_batch)),
        use_scaler(scaled) {
    mpt::Rng rng(7);
    for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = static_cast<float>(rng.normal());
    for (int& y : labels) y = static_cast<int>(rng.below(static_cast<std::uint64_t>(g_sizes.back())));
  }
  /// One training step; returns the loss.
  float step() {
    const mpt::Tensor& logits = mlp.forward(x);
    const float loss = mpt::cross_entropy_loss(logits, labels);
    // Backward starts from the scaled loss: d(scale * loss) / dloss = scale.
    float dloss = 1.0f;
    if (use_scaler) {
      (void)scaler.scale(loss);
      dloss = scaler.get_scale();
    }
    mlp.backward(mpt::cross_entropy_backward(logits, labels, dloss));
    if (use_scaler) {
      scaler.step(opt);
      scaler.update();
    } else {
      opt.step();
    }
    mlp.refresh_model_copies();
    opt.zero_grad();
    return loss;
  }
};

std::map<std::string, double> g_activation_bytes;

void BM_step(benchmark::State& st, mpt::DType p, bool scaled, const char* name) {
  Trainer r(p, scaled);
  r.step();  // the first step allocates the activation buffers
  g_activation_bytes[name] = static_cast<double>(r.mlp.activation_bytes());
  float loss = 0;
  for (auto _ : st) loss += r.step();
  benchmark::DoNotOptimize(loss);
  st.counters["act_bytes"] = g_activation_bytes[name];
  st.counters["steps/s"] =
      benchmark::Counter(static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
}

/// Each benchmark's fastest CPU time per step over its repetitions, in ms.
using TimeReporter = bench::MinTimeReporter;

std::vector<int> parse_sizes(const char* s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoi(item));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  bench::initialize(argc, argv, [](const char* arg) {
    if (std::strncmp(arg, "--batch=", 8) == 0) g_batch = std::stoi(arg + 8);
    else if (std::strncmp(arg, "--sizes=", 8) == 0) g_sizes = parse_sizes(arg + 8);
    else if (std::strncmp(arg, "--repetitions=", 14) == 0) g_repetitions = std::stoi(arg + 14);
    else return false;
    return true;
  });

  benchmark::RegisterBenchmark("step/fp32", BM_step, mpt::DType::f32, false, "step/fp32")
      ->Unit(benchmark::kMillisecond)
      ->Repetitions(g_repetitions);
  benchmark::RegisterBenchmark("step/fp16+scaler", BM_step, mpt::DType::f16, true, "step/fp16+scaler")
      ->Unit(benchmark::kMillisecond)
      ->Repetitions(g_repetitions);
  benchmark::RegisterBenchmark("step/bf16", BM_step, mpt::DType::bf16, false, "step/bf16")
      ->Unit(benchmark::kMillisecond)
      ->Repetitions(g_repetitions);
  TimeReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);

  std::string sizes;
  for (int s : g_sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(s);
  std::printf(
      "\nMLP %s (ReLU), batch %d, SGD momentum 0.9, one core; time: the fastest of the repetitions\n\n",
      sizes.c_str(), g_batch);
  std::printf("%-12s %9s %8s %8s  %-13s %11s %8s %8s  %s\n", "run", "ms/step", "x fp32", "target", "verdict",
              "act. bytes", "x fp32", "target", "verdict");
  const double t32 = rep.ms.count("step/fp32") ? rep.ms["step/fp32"] : 0.0;
  const double b32 = g_activation_bytes.count("step/fp32") ? g_activation_bytes["step/fp32"] : 0.0;
  for (const char* name : {"step/fp32", "step/fp16+scaler", "step/bf16"}) {
    if (!rep.ms.count(name) || t32 <= 0 || b32 <= 0) continue;
    const double tr = rep.ms[name] / t32, br = g_activation_bytes[name] / b32;
    const bool baseline = std::string(name) == "step/fp32";
    std::printf("%-12s %9.3f %8.2f %8s  %-13s %11.0f %8.3f %8s  %s\n", name + 5, rep.ms[name], tr,
                baseline ? "-" : "<=1.25x", baseline ? "" : (tr <= 1.25 ? "meets target" : "BELOW target"),
                g_activation_bytes[name], br, baseline ? "-" : "<=0.55x",
                baseline ? "" : (br <= 0.55 ? "meets target" : "BELOW target"));
  }
  benchmark::Shutdown();
  return 0;
}
