// Chapter 02 exercises — what every grader test file shares, instructors'
// hidden tests included: the exercise list, the reference answers (mpt's
// GradScaler arithmetic is the oracle; for 2.4, one iteration on the whole
// effective batch) and the kit's helpers.
// Depends on: doctest, grader_kit.hpp, ex02.hpp, mpt (scaler_math, unscale,
// grad_scaler, losses, mlp, sgd).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ex02.hpp"
#include "grader_kit.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/amp/scaler_math.hpp"
#include "mpt/amp/unscale.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ex02::grading {

// ---- the exercises --------------------------------------------------------
// A test case belongs to an exercise through its doctest test suite,
// "exercise-" + id; each test case that passes scores its exercise's points
// per test case (the last number below): 2 for a behaviour to write, 3 for
// one of the diagnose exercise, and 1 for the few test cases whose name
// ends "[1 point]", details that are trivia next to the rest (a signalling
// NaN's bits, products in double). The kit's grader main (grader_main.cpp)
// reads this list as exercise_kit::kChapter.

using exercise_kit::Exercise;
using exercise_kit::Kind;

inline constexpr Exercise kExercises[] = {
    {"2.1", "the loss scale's update rule", Kind::write, 2},
    {"2.2", "fused unscale-and-check over a gradient buffer", Kind::write, 2},
    {"2.3", "gradient clipping under loss scaling: unscale first", Kind::write, 2},
    {"2.4", "gradient accumulation under a GradScaler", Kind::diagnose, 3},
};

using exercise_kit::bits_of;
using exercise_kit::describe;
using exercise_kit::float_of;
using exercise_kit::Mismatches;

/// Same bits, or both NaN (payloads are not part of the specification,
/// except where a test says so).
inline bool same_float(float a, float b) {
  return bits_of(a) == bits_of(b) || (std::isnan(a) && std::isnan(b));
}

// ---- the loss scale (exercise 2.1) ------------------------------------------

/// A GradScaler's constructor arguments that the update rule uses.
struct ScalerConfig {
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int32_t growth_interval = 2000;
};

/// What update() changes: the scale and the growth tracker.
struct ScaleState {
  float scale = 65536.0f;
  std::int32_t tracker = 0;
};

/// "scale 65536 (0x47800000 = 0x1p+16), tracker 3"
inline std::string describe(const ScaleState& s) {
  return "scale " + describe(s.scale) + ", tracker " + std::to_string(s.tracker);
}

/// "growth_factor 2, backoff_factor 0.5, growth_interval 2000"
inline std::string describe(const ScalerConfig& c) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "growth_factor %.17g, backoff_factor %.17g, growth_interval %d",
                c.growth_factor, c.backoff_factor, static_cast<int>(c.growth_interval));
  return buf;
}

/// Exercise 2.1's answer: the update rule the GradScaler and the CUDA
/// kernel run (src/mpt/amp/scaler_math.hpp).
inline ScaleState reference_update(ScaleState s, bool found_inf, const ScalerConfig& c) {
  mpt::update_scale(s.scale, s.tracker, found_inf, c.growth_factor, c.backoff_factor, c.growth_interval);
  return s;
}

/// The student's update_scale on a copy of `s`.
inline ScaleState student_update(ScaleState s, bool found_inf, const ScalerConfig& c) {
  update_scale(s.scale, s.tracker, found_inf, c.growth_factor, c.backoff_factor, c.growth_interval);
  return s;
}

inline bool same_state(const ScaleState& a, const ScaleState& b) {
  return bits_of(a.scale) == bits_of(b.scale) && a.tracker == b.tracker;
}

// ---- unscale and check (exercise 2.2) -----------------------------------------

/// Exercise 2.2's answer: mpt's fused unscale-and-check (unscale.hpp), in
/// place on `g`; returns the flag.
inline bool reference_unscale(std::vector<float>& g, float inv_scale) {
  return mpt::unscale_and_check(g.data(), g.size(), inv_scale);
}

// ---- clipping (exercise 2.3) ----------------------------------------------------

/// Exercise 2.3's answer, in place on `tensors`: mpt's multi-tensor unscale
/// and check, then the norm summed in double in element order, then
/// PyTorch's clip coefficient.
inline ClipResult reference_unscale_and_clip(std::vector<std::vector<float>>& tensors, float inv_scale,
                                             double max_norm) {
  mpt::TensorList list;
  for (auto& t : tensors) list.emplace_back(t.empty() ? nullptr : t.data(), t.size());
  if (mpt::unscale_and_check(list, inv_scale)) return {true, std::numeric_limits<double>::infinity(), false};
  double sum = 0.0;
  for (const auto& t : tensors)
    for (float v : t) sum += static_cast<double>(v) * static_cast<double>(v);
  const double norm = std::sqrt(sum);
  const double coef = max_norm / (norm + 1e-6);
  if (!(coef < 1.0)) return {false, norm, false};
  for (auto& t : tensors)
    for (float& v : t) v *= static_cast<float>(coef);
  return {false, norm, true};
}

/// The student's unscale_and_clip on `tensors` (in place).
inline ClipResult student_unscale_and_clip(std::vector<std::vector<float>>& tensors, float inv_scale,
                                           double max_norm) {
  std::vector<GradTensor> list;
  for (auto& t : tensors) list.push_back({t.empty() ? nullptr : t.data(), t.size()});
  return unscale_and_clip(list, inv_scale, max_norm);
}

// ---- gradient accumulation (exercise 2.4) ----------------------------------------

/// Counts the steps of the optimizer it wraps (the GradScaler calls step()
/// through it; the parameters are the wrapped optimizer's).
class CountingOptimizer : public mpt::Optimizer {
 public:
  explicit CountingOptimizer(mpt::Optimizer& inner) : Optimizer(inner.params()), inner_(&inner) {}
  void step() override {
    ++steps;
    inner_->step();
  }
  int steps = 0;  ///< step() calls so far

 private:
  mpt::Optimizer* inner_;
};

/// The regression network of the 2.4 tests: 8 -> 16 -> 16 -> 4, ReLU, in `dtype`.
inline mpt::Mlp accumulation_net(mpt::DType dtype, std::uint64_t seed) {
  mpt::MlpConfig c;
  c.sizes = {8, 16, 16, 4};
  c.dtype = dtype;
  c.seed = seed;
  return mpt::Mlp(c);
}

/// `k` micro-batches of `rows` samples: inputs in [-1, 1), targets a fixed
/// smooth function of them (times `target_scale` for micro-batch
/// `scaled_batch`, if any: huge targets give gradients that overflow fp16).
inline std::vector<mpt::Dataset> micro_batches(std::uint32_t seed, int k, Eigen::Index rows,
                                               int scaled_batch = -1, float target_scale = 1.0f) {
  std::mt19937 rng(seed);
  auto uniform = [&rng] { return static_cast<float>(rng() >> 8) * 0x1p-23f - 1.0f; };
  std::vector<mpt::Dataset> out;
  for (int b = 0; b < k; ++b) {
    mpt::Dataset d;
    d.name = "micro-batch " + std::to_string(b);
    d.x.resize(rows, 8);
    d.targets.resize(rows, 4);
    for (Eigen::Index i = 0; i < rows; ++i) {
      for (Eigen::Index j = 0; j < 8; ++j) d.x(i, j) = uniform();
      for (Eigen::Index j = 0; j < 4; ++j)
        d.targets(i, j) = 0.5f * d.x(i, 2 * j) - 0.25f * d.x(i, 2 * j + 1) * d.x(i, (j + 3) % 8);
    }
    if (b == scaled_batch) d.targets *= target_scale;
    out.push_back(d);
  }
  return out;
}

/// The micro-batches as one batch, rows in order.
inline mpt::Dataset whole_batch(const std::vector<mpt::Dataset>& parts) {
  mpt::Dataset all;
  Eigen::Index rows = 0;
  for (const mpt::Dataset& p : parts) rows += p.size();
  all.x.resize(rows, parts.front().x.cols());
  all.targets.resize(rows, parts.front().targets.cols());
  Eigen::Index at = 0;
  for (const mpt::Dataset& p : parts) {
    all.x.middleRows(at, p.size()) = p.x;
    all.targets.middleRows(at, p.size()) = p.targets;
    at += p.size();
  }
  return all;
}

/// Exercise 2.4's reference: the same iteration on the whole effective batch
/// in one forward and backward pass (its mean loss is the mean of the
/// equal-sized micro-batches' losses), then the scaler's step and update and
/// the refresh of the model copies. Accumulating must give the same result
/// up to the rounding of sums taken in another order.
inline AccumulationResult reference_iteration(mpt::Mlp& net, mpt::Optimizer& opt, mpt::GradScaler& scaler,
                                              const std::vector<mpt::Dataset>& parts) {
  const mpt::Dataset all = whole_batch(parts);
  opt.zero_grad();
  const mpt::Tensor& out = net.forward(all.x);
  AccumulationResult r;
  r.loss = mpt::mse_loss(out, all.targets);
  (void)scaler.scale(r.loss);
  net.backward(mpt::mse_backward(out, all.targets, scaler.get_scale()));
  r.stepped = scaler.step(opt);
  scaler.update();
  net.refresh_model_copies();
  return r;
}

/// Every parameter's FP32 master weights, copied.
inline std::vector<mpt::MatrixF> masters_of(mpt::Mlp& net) {
  std::vector<mpt::MatrixF> w;
  for (const mpt::Parameter* p : net.parameters()) w.push_back(p->master.f32());
  return w;
}

/// ||(b - a) - (c - a)|| / ||c - a|| over all parameters: how far the
/// change a -> b is from the change a -> c (in double).
inline double change_error(const std::vector<mpt::MatrixF>& a, const std::vector<mpt::MatrixF>& b,
                           const std::vector<mpt::MatrixF>& c) {
  double diff = 0.0, ref = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (b[i].cast<double>() - c[i].cast<double>()).squaredNorm();
    ref += (c[i].cast<double>() - a[i].cast<double>()).squaredNorm();
  }
  return std::sqrt(diff) / std::sqrt(ref);
}

/// True when every model copy is its master rounded to the copy's dtype.
inline bool copies_refreshed(mpt::Mlp& net) {
  for (const mpt::Parameter* p : net.parameters()) {
    const mpt::MatrixF rounded = mpt::Tensor::from_matrix(p->master.f32(), p->model_dtype()).to_matrix();
    if (!(p->weights().to_matrix().array() == rounded.array()).all()) return false;
  }
  return true;
}

}  // namespace mpt::ex02::grading

namespace mpt::exercise_kit {
/// What the kit's grader main grades: Chapter 2 and its exercises.
inline constexpr Chapter kChapter{2, mpt::ex02::grading::kExercises,
                                  sizeof mpt::ex02::grading::kExercises / sizeof(Exercise)};
}  // namespace mpt::exercise_kit
