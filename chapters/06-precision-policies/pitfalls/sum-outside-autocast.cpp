// Chapter 06 — pitfall sum-outside-autocast: an fp16 sum where autocast is disabled
// Depends on: common.hpp (check, num, this entry's declaration),
// mpt/core/dtype.hpp (format_of, dtype_name), mpt/core/policy.hpp,
// mpt/core/policy_string.hpp, mpt/formats/rounding.hpp (round_value);
// <cmath>, <memory>, <string>, <vector>.
//
// Inside autocast, `sum` is on CUDA's fp32_set_opt_dtype list: it is asked
// for an FP32 result, so a sum of fp16 values comes out FP32. A region with
// autocast disabled (torch.autocast(enabled=False), PATH=autocast-off here)
// casts nothing: the fp16 tensor goes into sum as it is, and torch.sum of an
// fp16 tensor accumulates in FP32 but stores its result in fp16 (the input's
// dtype, unless `dtype=` says otherwise). A statistic of a large fp16
// tensor — 4096 activations from 16 to 32, a sum of 98048 — is then past
// 65504 and stored as inf, although every value and the FP32 accumulator
// were finite. Asking for the FP32 result (`torch.sum(x, dtype=torch.float32)`,
// here keep-f32:sum) keeps it. Chapter 4's fp16-loss-reduction is the same
// rounding at the loss; this pitfall is about where autocast stops deciding.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/formats/rounding.hpp"

namespace mpt::ch06 {
namespace {
namespace sum_outside_autocast {

constexpr int kValues = 4096;

// 4096 fp16 activations between 16 and 32 (a deterministic pattern; each
// value exact in fp16).
std::vector<float> activations() {
  std::vector<float> v;
  for (int i = 0; i < kValues; ++i)
    v.push_back(round_value(16.0f + static_cast<float>((i * 37) % 128) / 8.0f, format_of(DType::f16)));
  return v;
}

RunResult run(const std::string& policy_text, std::string setup) {
  const std::shared_ptr<const Policy> policy = parse_policy_string(policy_text).make();
  const std::vector<float> x = activations();
  // The op asks the policy, as every op of the library does: the sum of the
  // head's fp16 activations, at path "head.total".
  const OpPrecision d = policy->decide({"sum", "head.total", {DType::f16}});
  float acc = 0;  // the accumulator in d.compute (f32 for every policy here)
  double exact = 0;
  for (float v : x) {
    acc += v;
    exact += v;
  }
  const float stored = d.output == DType::f32 ? acc : round_value(acc, format_of(d.output));
  const OpPrecision inside = policy->decide({"sum", "body.total", {DType::f16}});
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"values", kValues, "fp16 activations summed"},
      {"exact_sum", exact, "their sum in FP64"},
      {"accumulator", acc, "the FP32 accumulator before the store"},
      {"output_bits", 8.0 * static_cast<double>(bytes_per_element(d.output)), "bits of the stored sum"},
      {"stored_sum", stored, "the sum as stored"},
      {"stored_is_inf", std::isinf(stored) ? 1.0 : 0.0, "1 when the stored sum is inf"},
      {"relative_error", std::fabs(static_cast<double>(stored) - exact) / exact, "|stored − exact| / exact"},
      {"inside_autocast_output_bits", 8.0 * static_cast<double>(bytes_per_element(inside.output)),
       "bits of the same sum where autocast is on (body.total)"},
  };
  r.explanation = "sum is asked for " + std::string(dtype_name(d.output)) +
                  " at head.total: the accumulator holds " + num(acc) + " and the stored sum is " +
                  num(stored) + ".";
  return r;
}

RunResult broken_run() {
  //! [sum-outside-autocast-broken]
  // autocast off around the head: its fp16 activations go into sum as they are
  const std::string policy = "autocast:cuda:f16+head=autocast-off";
  //! [sum-outside-autocast-broken]
  return run(policy,
             "autocast (CUDA, f16) with the head's region disabled; the sum of 4096 fp16 activations "
             "(16 to 32) at head.total");
}

RunResult fixed_run() {
  //! [sum-outside-autocast-fixed]
  // the same region, the sum asked for an FP32 result (torch.sum(x, dtype=torch.float32))
  const std::string policy = "autocast:cuda:f16+head=autocast-off+keep-f32:sum";
  //! [sum-outside-autocast-fixed]
  return run(policy, "the same region, with sum kept in FP32 (its output dtype FP32)");
}

}  // namespace sum_outside_autocast
}  // namespace

Pitfall sum_outside_autocast_pitfall() {
  using namespace sum_outside_autocast;
  return Pitfall{
      "sum-outside-autocast",
      6,
      "sum of an fp16 tensor where autocast is disabled: an FP32 accumulator, an fp16 result, inf",
      "Autocast asks sum for an FP32 result, but where it is disabled nothing casts: torch.sum of fp16 "
      "stores "
      "fp16, and a sum past 65504 is inf although every value was finite. Ask for the FP32 result "
      "(dtype=torch.float32; keep-f32:sum).",
      broken_run,
      fixed_run,
      {
          check("the stored sum is fp16", [](const RunResult& r) { return r.get("output_bits") == 16; }),
          check("the stored sum is inf", [](const RunResult& r) { return r.get("stored_is_inf") == 1; }),
      },
      {
          check("the stored sum is FP32", [](const RunResult& r) { return r.get("output_bits") == 32; }),
          check("within 1e-6 of the exact sum",
                [](const RunResult& r) { return r.get("relative_error") < 1e-6; }),
      },
      {
          check("where autocast is on, the same sum is FP32",
                [](const RunResult& r) { return r.get("inside_autocast_output_bits") == 32; }),
      }};
}

}  // namespace mpt::ch06
