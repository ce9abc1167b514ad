// Chapter 04 — pitfall autocast-disabled-softmax: a softmax on an fp16 input with autocast off stores fp16
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/core/context.hpp, mpt/core/dtype.hpp (dtype_name), mpt/core/policy.hpp
// (uniform_policy, KeepF32Policy), mpt/core/tensor.hpp, mpt/core/trace.hpp,
// mpt/formats/format.hpp (limits_of), mpt/nn/layers/softmax.hpp (softmax);
// <algorithm>, <cmath>, <cstddef>, <cstdint>, <memory>, <stdexcept>, <string>, <utility>, <vector>.
//
// Autocast puts softmax on its FP32 list (aten/src/ATen/autocast_mode.cpp):
// inside an autocast region an fp16 input is cast up and the probabilities
// come out FP32. A region with autocast disabled (torch.autocast(...,
// enabled=False), often used to "do this part in full precision") does no
// casting at all: an fp16 tensor produced earlier goes into softmax as fp16
// and the probabilities are stored in fp16 — the docstring of
// torch/amp/autocast_mode.py says to cast such tensors to float32 yourself.
// Stored in fp16, every probability below 2^-25 is 0 and its log −inf: a
// KL divergence, an entropy or a sampling temperature downstream reads
// −inf. In this library the same thing is a policy that leaves softmax's
// input and output in f16 (uniform f16); the upcast is a policy that keeps
// softmax in FP32 (KeepF32Policy by op), and the precision trace shows
// both: the dtype softmax read and wrote, and the counted cast.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/formats/format.hpp"
#include "mpt/nn/layers/softmax.hpp"

namespace mpt::ch04 {
// This pitfall's own names: file-local, and in a namespace of their own,
// since the chapters are compiled as unity files, where two pitfalls' names
// would meet.
namespace {
namespace autocast_disabled_softmax {

// ---------------------------------------------------------------------------
// The logits both runs take, and what a run measures.

constexpr std::int64_t kRows = 4;
constexpr std::int64_t kClasses = 64;

/// [4, 64] fp16 logits from N(0, 5²), seeded: an fp16 model's output, as it
/// arrives in the autocast-disabled region.
const std::vector<float>& logits() {
  static const std::vector<float> z = rounded_to_fp16(normal_values(kRows * kClasses, 0, 5, 412));
  return z;
}

/// A dtype's name ("f16") as a string.
std::string name(DType d) { return std::string(dtype_name(d)); }

/// What one run's softmax did, read back from the trace.
struct TracedSoftmax {
  std::vector<float> p;  ///< the probabilities, widened
  Trace trace;           ///< the pass's trace
  /// The softmax's entry in the trace.
  const TraceEntry& entry() const {
    for (const TraceEntry& e : trace.entries())
      if (e.op == "softmax") return e;
    throw std::logic_error("autocast-disabled-softmax: the trace has no softmax entry");
  }
};

/// softmax of logits() (fp16) under `policy`, traced.
TracedSoftmax traced_softmax(const std::shared_ptr<const Policy>& policy) {
  TracedSoftmax r;
  Context ctx(policy);
  ctx.set_trace(&r.trace);
  const Tensor x = Tensor::from_f32(logits().data(), {kRows, kClasses}, DType::f16);
  r.p = values_of(softmax(x, ctx, "softmax"));
  return r;
}

/// The outcomes of both runs (defined after the runs); `why` is the run's explanation.
RunResult autocast_outcomes(const TracedSoftmax& s, std::string setup, std::string why);

// ---------------------------------------------------------------------------
// The broken run.

RunResult autocast_broken() {
  //! [autocast-disabled-softmax-broken]
  // autocast disabled: an fp16 input stays fp16, and so does softmax's output
  const std::shared_ptr<const Policy> policy = uniform_policy(DType::f16);
  //! [autocast-disabled-softmax-broken]
  const TracedSoftmax s = traced_softmax(policy);
  const Limits f16 = limits_of(format_of(DType::f16).spec);
  const TraceEntry& e = s.entry();
  const std::string why =
      "The trace shows softmax reading " + name(e.inputs.front().dtype) + ", computing in " +
      name(e.compute) + " and writing " + name(e.outputs.front().dtype) + ": every probability below " +
      num(f16.min_subnormal / 2) + " (half of fp16's smallest subnormal) is stored as 0, and log 0 = −inf.";
  return autocast_outcomes(s,
                           "4 rows of 64 fp16 logits (N(0, 25)) into softmax with autocast disabled: the op "
                           "runs in its input's dtype (uniform f16); then log p in FP32",
                           why);
}

// ---------------------------------------------------------------------------
// The fixed run.

RunResult autocast_fixed() {
  //! [autocast-disabled-softmax-fixed]
  // the explicit upcast: softmax reads, computes and writes f32 inside the f16 policy
  const std::shared_ptr<const Policy> policy = std::make_shared<KeepF32Policy>(
      uniform_policy(DType::f16), std::vector<std::string>{}, std::vector<std::string>{"softmax"});
  //! [autocast-disabled-softmax-fixed]
  const TracedSoftmax s = traced_softmax(policy);
  const TraceEntry& e = s.entry();
  const std::string why = "The trace shows " + std::to_string(s.trace.casts()) +
                          " cast at softmax's boundary and softmax reading " + name(e.inputs.front().dtype) +
                          " and writing " + name(e.outputs.front().dtype) +
                          ": the smallest probabilities are normal FP32 numbers, and their logs are finite.";
  return autocast_outcomes(
      s,
      "the same logits with softmax kept in FP32 (KeepF32Policy for softmax over uniform "
      "f16: the input cast up at the op's boundary)",
      why);
}

// ---------------------------------------------------------------------------
// The outcomes.

RunResult autocast_outcomes(const TracedSoftmax& s, std::string setup, std::string why) {
  const std::vector<double> ref = fp64_softmax(logits(), kRows, kClasses);
  const TraceEntry& e = s.entry();
  const TracedValue& in = e.inputs.front();
  const TracedValue& outv = e.outputs.front();
  double flushed = 0, neg_inf = 0, worst = 0, smallest = 1;
  for (std::size_t i = 0; i < s.p.size(); ++i) {
    smallest = std::min(smallest, ref[i]);
    flushed += s.p[i] == 0 && ref[i] > 0;
    const double lp = std::log(static_cast<double>(s.p[i]));
    neg_inf += std::isinf(lp);
    worst = std::max(worst, std::fabs(lp - std::log(ref[i])));
  }
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"softmax_input_bits", 8.0 * static_cast<double>(in.bytes) / static_cast<double>(numel(in.shape)),
       "bits per element of the input softmax read (from the trace)"},
      {"softmax_output_bits", 8.0 * static_cast<double>(outv.bytes) / static_cast<double>(numel(outv.shape)),
       "bits per element of the probabilities softmax wrote (from the trace)"},
      {"softmax_output_is_f32", outv.dtype == DType::f32 ? 1.0 : 0.0,
       "1 when the trace says f32, 0 otherwise"},
      {"casts", static_cast<double>(s.trace.casts()), "casts the trace counted"},
      {"smallest_probability_fp64", smallest, "the smallest probability, FP64"},
      {"flushed_probabilities", flushed, "probabilities stored as 0 that are not 0"},
      {"neg_inf_log_probs", neg_inf, "log p that are −inf"},
      {"log_prob_max_error", worst, "the largest |log p − log p_fp64| (inf when one is −inf)"},
  };
  r.explanation = std::move(why);
  return r;
}

}  // namespace autocast_disabled_softmax
}  // namespace

// ---------------------------------------------------------------------------
// The entry and its checks.

Pitfall autocast_disabled_softmax_pitfall() {
  using namespace autocast_disabled_softmax;
  return Pitfall{
      "autocast-disabled-softmax",
      4,
      "softmax of an fp16 input with autocast disabled: fp16 probabilities, flushed to 0, log −inf",
      "Autocast keeps softmax in FP32, but in a region where it is disabled an fp16 input is not cast: "
      "softmax writes fp16 probabilities, those below 2^-25 are 0, and their log is −inf. Cast the input "
      "to FP32 before the softmax (here: a policy that keeps softmax in FP32); the precision trace shows "
      "which dtype the probabilities were stored in.",
      autocast_broken,
      autocast_fixed,
      {
          check("the trace shows fp16 probabilities",
                [](const RunResult& r) { return r.get("softmax_output_bits") == 16; }),
          check("probabilities flushed to 0",
                [](const RunResult& r) { return r.get("flushed_probabilities") > 0; }),
          check("log p is −inf", [](const RunResult& r) { return r.get("neg_inf_log_probs") > 0; }),
      },
      {
          check("the trace shows f32 probabilities, read after one cast",
                [](const RunResult& r) {
                  return r.get("softmax_output_is_f32") == 1 && r.get("softmax_input_bits") == 32 &&
                         r.get("casts") == 1;
                }),
          check("every log p within 1e-5 of FP64's",
                [](const RunResult& r) { return r.get("log_prob_max_error") < 1e-5; }),
      },
      {}};
}

}  // namespace mpt::ch04
