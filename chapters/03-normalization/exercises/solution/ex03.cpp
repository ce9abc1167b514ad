// Chapter 03 — exercises: REFERENCE SOLUTION (MPT-REFERENCE-SOLUTION), never shipped to students.
// Depends on: ex03.hpp, and for 3.3 mpt/formats/rounding.hpp; 3.1 and 3.2
// are written from the specification, not from mpt's Welford or norm code,
// so that grading them against mpt is a real check.
// tools/make_handout.sh refuses to produce a handout that contains these lines.
#include "ex03.hpp"

#include <cmath>
#include <cstddef>
#include <vector>

#include "mpt/formats/rounding.hpp"

namespace mpt::ex03 {

Stats merge_statistics(const Stats& a, const Stats& b) {
  // An empty side contributes nothing, and the formula below would turn a
  // huge mean into inf * 0 = NaN (or divide 0 by 0 for two empty sides).
  if (a.count == 0) return b;
  if (b.count == 0) return a;
  Stats merged;
  merged.count = a.count + b.count;
  const float n_a = static_cast<float>(a.count);
  const float share_of_b = static_cast<float>(b.count) / static_cast<float>(merged.count);
  // The difference of the two partial means, taken first: it is the only
  // place where their large common part cancels, and it cancels exactly.
  const float gap = b.mean - a.mean;
  merged.mean = a.mean + gap * share_of_b;
  merged.m2 = a.m2 + b.m2 + gap * gap * n_a * share_of_b;
  return merged;
}

namespace {

// Mean and rstd of one row by two passes in float: the mean first, then the
// squared deviations from it (no E[x^2] - E[x]^2).
void row_statistics(const float* row, std::int64_t d, float eps, float& mean, float& rstd) {
  float sum = 0.0f;
  for (std::int64_t i = 0; i < d; ++i) sum += row[i];
  mean = sum / static_cast<float>(d);
  float squares = 0.0f;
  for (std::int64_t i = 0; i < d; ++i) {
    const float deviation = row[i] - mean;
    squares += deviation * deviation;
  }
  rstd = 1.0f / std::sqrt(squares / static_cast<float>(d) + eps);
}

}  // namespace

void layer_norm_backward(const float* x, const float* dy, const float* gamma, std::int64_t rows,
                         std::int64_t d, float eps, float* dx, float* dgamma, float* dbeta) {
  for (std::int64_t i = 0; i < d; ++i) {
    dgamma[i] = 0.0f;
    dbeta[i] = 0.0f;
  }
  const float width = static_cast<float>(d);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    const float* dyr = dy + r * d;
    float mean = 0.0f, rstd = 0.0f;
    row_statistics(xr, d, eps, mean, rstd);
    // The two sums dx needs, and this row's share of the parameter gradients.
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
    for (std::int64_t i = 0; i < d; ++i) {
      const float xhat = (xr[i] - mean) * rstd;
      const float g = gamma[i] * dyr[i];
      sum_g += g;
      sum_g_xhat += g * xhat;
      dgamma[i] += dyr[i] * xhat;
      dbeta[i] += dyr[i];
    }
    float* dxr = dx + r * d;
    for (std::int64_t i = 0; i < d; ++i) {
      const float xhat = (xr[i] - mean) * rstd;
      const float g = gamma[i] * dyr[i];
      dxr[i] = rstd / width * (width * g - sum_g - xhat * sum_g_xhat);
    }
  }
}

// The fix of 3.3: the given body rounded the updated running estimates into
// the activations' format, as it rightly rounds y. The estimates are FP32
// buffers that a small momentum nudges a little every step: in fp16 a nudge
// below half an ulp of the estimate is lost (a running mean near 1000 stops
// 2.5 short, where fp16's spacing is 0.5), a variance above 65504 becomes
// inf, a small variance lands on the coarse subnormal grid, and even one
// update carries fp16's rounding error of up to 2^-11. Only y is stored in
// x's dtype; the two running updates stay as computed.
mpt::Tensor batch_norm_train_forward(const mpt::Tensor& x, const std::vector<float>& gamma,
                                     const std::vector<float>& beta, float eps, float momentum,
                                     RunningStats& running) {
  const std::int64_t batch = x.size(0), channels = x.size(1);
  const std::int64_t inner = x.numel() / (batch * channels);
  const std::int64_t per_channel = batch * inner;
  const mpt::Format& storage = mpt::format_of(x.dtype());
  // Everything y holds is stored in the activations' format.
  auto store = [&storage](float v) { return mpt::round_value(v, storage); };

  std::vector<float> values(static_cast<std::size_t>(x.numel()));
  x.to_f32(values.data());
  std::vector<float> out(values.size());
  for (std::int64_t c = 0; c < channels; ++c) {
    auto at = [&](std::int64_t n, std::int64_t i) {
      return static_cast<std::size_t>((n * channels + c) * inner + i);
    };
    // Two passes in FP32: the mean, then the squared deviations from it.
    float sum = 0.0f;
    for (std::int64_t n = 0; n < batch; ++n)
      for (std::int64_t i = 0; i < inner; ++i) sum += values[at(n, i)];
    const float mean = sum / static_cast<float>(per_channel);
    float m2 = 0.0f;
    for (std::int64_t n = 0; n < batch; ++n)
      for (std::int64_t i = 0; i < inner; ++i) {
        const float deviation = values[at(n, i)] - mean;
        m2 += deviation * deviation;
      }
    const float var = m2 / static_cast<float>(per_channel);
    const float invstd = 1.0f / std::sqrt(var + eps);
    for (std::int64_t n = 0; n < batch; ++n)
      for (std::int64_t i = 0; i < inner; ++i)
        out[at(n, i)] = store((values[at(n, i)] - mean) * invstd * gamma[c] + beta[c]);

    // The running estimates: the momentum update in FP32.
    const float unbiased = m2 / static_cast<float>(per_channel - 1);
    running.mean[c] = (1.0f - momentum) * running.mean[c] + momentum * mean;
    running.var[c] = (1.0f - momentum) * running.var[c] + momentum * unbiased;
  }
  ++running.num_batches_tracked;
  return mpt::Tensor::from_f32(out.data(), x.shape(), x.dtype());
}

}  // namespace mpt::ex03
