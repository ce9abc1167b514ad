// Chapter 06 — pitfall cpu-autocast-list: code tested under CPU autocast, meant for CUDA
// Depends on: common.hpp (check, num, this entry's declaration),
// mpt/core/autocast.hpp (the lists), mpt/core/context.hpp,
// mpt/core/policy_string.hpp, mpt/core/tensor.hpp, mpt/nn/layers/softmax.hpp;
// <algorithm>, <cmath>, <memory>, <string>, <vector>.
//
// torch.autocast has one list per device, and they differ
// (aten/src/ATen/autocast_mode.cpp): CUDA puts layer_norm on its fp32 list
// and softmax, log_softmax on fp32_set_opt_dtype; the CPU's lists name
// none of the three, so on the CPU they run in the dtype their input arrives
// in. Code developed and tested with autocast on the CPU in bf16 therefore
// runs its layer norms and softmaxes in bf16 — eight bits of mantissa — where
// the CUDA run it was written for keeps them in FP32: the CPU tests measure
// a model the GPU never runs. Keeping those ops in FP32 on the CPU as well
// (keep-f32:layer_norm,softmax,log_softmax) makes the CPU run decide as
// CUDA's does, op for op.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "mpt/core/autocast.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/nn/layers/softmax.hpp"

namespace mpt::ch06 {
namespace {
namespace cpu_autocast_list {

constexpr int kRows = 4, kClasses = 64;

// The ops of Chapter 4's Transformer and its loss.
const std::vector<const char*> kTransformerOps = {"linear",       "scaled_dot_product_attention",
                                                  "layer_norm",   "gelu",
                                                  "add",          "embedding",
                                                  "softmax",      "log_softmax",
                                                  "cross_entropy"};

// Logits as a bf16 linear layer leaves them: a spread of a few units.
std::vector<float> logits() {
  std::vector<float> v;
  for (int i = 0; i < kRows * kClasses; ++i)
    v.push_back(3.0f * std::sin(0.37f * static_cast<float>(i)) + 0.01f * i);
  return v;
}

RunResult run(const std::string& policy_text, std::string setup) {
  const std::shared_ptr<const Policy> policy = parse_policy_string(policy_text).make();
  const AutocastPolicy cuda(AutocastDevice::cuda, DType::bf16);
  // Each op of the Transformer asked with bf16 inputs: where does the stored
  // dtype differ from CUDA autocast's?
  double differ = 0;
  std::string which;
  for (const char* op : kTransformerOps) {
    const std::vector<DType> in = std::string(op) == "scaled_dot_product_attention"
                                      ? std::vector<DType>{DType::bf16, DType::bf16, DType::bf16}
                                  : std::string(op) == "add" ? std::vector<DType>{DType::bf16, DType::bf16}
                                  : std::string(op) == "embedding" ? std::vector<DType>{DType::f32}
                                                                   : std::vector<DType>{DType::bf16};
    if (policy->decide({op, "block0", in}).output != cuda.decide({op, "block0", in}).output) {
      ++differ;
      which += (which.empty() ? "" : ", ") + std::string(op);
    }
  }
  // The softmax itself, of bf16 logits, through the library's op.
  const std::vector<float> z = logits();
  Context ctx(policy);
  const Tensor x = Tensor::from_f32(z.data(), {kRows, kClasses}, DType::bf16);
  const Tensor p = softmax(x, ctx, "block0.softmax");
  std::vector<float> xs(static_cast<std::size_t>(x.numel())), ps(static_cast<std::size_t>(p.numel()));
  x.to_f32(xs.data());
  p.to_f32(ps.data());
  double worst = 0, worst_sum = 0;
  for (int r = 0; r < kRows; ++r) {
    double m = -INFINITY, s = 0, total = 0;
    for (int c = 0; c < kClasses; ++c) m = std::max(m, static_cast<double>(xs[r * kClasses + c]));
    for (int c = 0; c < kClasses; ++c) s += std::exp(xs[r * kClasses + c] - m);
    for (int c = 0; c < kClasses; ++c) {
      const double ref = std::exp(xs[r * kClasses + c] - m) / s;
      worst = std::max(worst, std::fabs(ps[r * kClasses + c] - ref) / ref);
      total += ps[r * kClasses + c];
    }
    worst_sum = std::max(worst_sum, std::fabs(total - 1));
  }
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"ops_checked", static_cast<double>(kTransformerOps.size()),
       "ops of the Transformer asked with bf16 inputs"},
      {"ops_unlike_cuda", differ, "of them, ops whose stored dtype differs from CUDA autocast's"},
      {"softmax_output_bits", 8.0 * static_cast<double>(bytes_per_element(p.dtype())),
       "bits of the probabilities softmax stored"},
      {"softmax_max_rel_error", worst,
       "the largest relative error of a probability (FP64 of the same logits)"},
      {"softmax_row_sum_error", worst_sum, "the largest |Σ p − 1| of a row"},
      {"cuda_softmax_output_bits",
       8.0 * static_cast<double>(bytes_per_element(cuda.decide({"softmax", "block0", {DType::bf16}}).output)),
       "bits CUDA autocast stores softmax in"},
  };
  r.explanation = differ == 0 ? "Every op decides as CUDA autocast does."
                              : "Unlike CUDA: " + which +
                                    "; softmax stores bf16 probabilities, off by up to " + pct(worst) + ".";
  return r;
}

RunResult broken_run() {
  //! [cpu-autocast-list-broken]
  // tested on the CPU with torch.autocast("cpu", dtype=torch.bfloat16)
  const std::string policy = "autocast:cpu:bf16";
  //! [cpu-autocast-list-broken]
  return run(policy,
             "CPU autocast in bf16: the Transformer's ops asked with bf16 inputs; a softmax of 4 rows of "
             "64 bf16 logits");
}

RunResult fixed_run() {
  //! [cpu-autocast-list-fixed]
  // the CPU run keeps in FP32 what CUDA's lists keep in FP32
  const std::string policy = "autocast:cpu:bf16+keep-f32:layer_norm,softmax,log_softmax";
  //! [cpu-autocast-list-fixed]
  return run(policy,
             "the same, with layer_norm, softmax and log_softmax kept in FP32 as CUDA's lists keep them");
}

}  // namespace cpu_autocast_list
}  // namespace

Pitfall cpu_autocast_list_pitfall() {
  using namespace cpu_autocast_list;
  return Pitfall{
      "cpu-autocast-list",
      6,
      "the CPU autocast list is not the CUDA list: layer_norm and softmax run in bf16 on the CPU",
      "CUDA autocast keeps layer_norm, softmax and log_softmax in FP32; the CPU's lists name none of them, "
      "so "
      "a model tested under CPU autocast runs them in bf16 and the tests measure a model the GPU never runs. "
      "Keep them in FP32 on the CPU too, or test with the device's list.",
      broken_run,
      fixed_run,
      {
          check("three of the Transformer's ops store another dtype than on CUDA",
                [](const RunResult& r) { return r.get("ops_unlike_cuda") == 3; }),
          check("softmax stores bf16 probabilities",
                [](const RunResult& r) { return r.get("softmax_output_bits") == 16; }),
          check("a probability off by more than 0.1%",
                [](const RunResult& r) { return r.get("softmax_max_rel_error") > 1e-3; }),
      },
      {
          check("every op decides as on CUDA",
                [](const RunResult& r) { return r.get("ops_unlike_cuda") == 0; }),
          check("every probability within 1e-6 of FP64's (relative)",
                [](const RunResult& r) { return r.get("softmax_max_rel_error") < 1e-6; }),
      },
      {
          check("CUDA autocast stores softmax in FP32",
                [](const RunResult& r) { return r.get("cuda_softmax_output_bits") == 32; }),
      }};
}

}  // namespace mpt::ch06
