// Chapter 03 — exercises: YOUR FILE: write 3.1 and 3.2 here, and find and fix the bug in 3.3.
// Depends on: ex03.hpp (the specification), the C++ standard library, and
// for 3.3's given body mpt/formats/rounding.hpp (mpt::round_value,
// mpt::format_of) and the Tensor of ex03.hpp.
// Each function of 3.1 and 3.2 throws until you replace its body; the grader
// reports the exercise as "not implemented" until then. 3.3's body runs, and
// scores nothing until it is fixed. See README.md for how to grade.
#include "ex03.hpp"

#include <cmath>  // std::sqrt
#include <cstddef>
#include <stdexcept>
#include <vector>

// mpt::round_value and mpt::format_of, used by 3.3's given body.
#include "mpt/formats/rounding.hpp"

namespace mpt::ex03 {

Stats merge_statistics(const Stats& a, const Stats& b) {
  (void)a;
  (void)b;
  throw std::logic_error("exercise 3.1 not implemented");
}

void layer_norm_backward(const float* x, const float* dy, const float* gamma, std::int64_t rows,
                         std::int64_t d, float eps, float* dx, float* dgamma, float* dbeta) {
  (void)x;
  (void)dy;
  (void)gamma;
  (void)rows;
  (void)d;
  (void)eps;
  (void)dx;
  (void)dgamma;
  (void)dbeta;
  throw std::logic_error("exercise 3.2 not implemented");
}

// Exercise 3.3 — DIAGNOSE: this body is given. It compiles, runs and
// normalizes its batch, and it has one mixed-precision bug; find it and fix
// it (ex03.hpp says what one call must do).
mpt::Tensor batch_norm_train_forward(const mpt::Tensor& x, const std::vector<float>& gamma,
                                     const std::vector<float>& beta, float eps, float momentum,
                                     RunningStats& running) {
  const std::int64_t batch = x.size(0), channels = x.size(1);
  const std::int64_t inner = x.numel() / (batch * channels);
  const std::int64_t per_channel = batch * inner;
  const mpt::Format& storage = mpt::format_of(x.dtype());
  // What this layer stores is stored in the activations' format.
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
    running.mean[c] = store((1.0f - momentum) * running.mean[c] + momentum * mean);
    running.var[c] = store((1.0f - momentum) * running.var[c] + momentum * unbiased);
  }
  ++running.num_batches_tracked;
  return mpt::Tensor::from_f32(out.data(), x.shape(), x.dtype());
}

}  // namespace mpt::ex03
