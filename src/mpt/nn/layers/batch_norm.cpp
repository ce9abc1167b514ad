// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the BatchNorm layer.
// Depends on: batch_norm.hpp, norm_cpu.hpp (the forward, one channel at a
// time), norm_math.hpp, welford.hpp; Chapter 1's rounding (gradients
// rounded into the parameters' dtype).
//
// The synchronised path (set_statistics_reduction) follows PyTorch's
// SyncBatchNorm, torch/nn/modules/_functions.py in pytorch/pytorch (read at
// commit 016ec49da759b42af4b11b14ce22e8cbd840e5ab): forward gathers every
// rank's statistics and normalizes with the global mean and invstd;
// backward all-reduces the per-channel sum_dy and sum_dy_xmu
// (torch.batch_norm_backward_reduce) and computes grad_input from the global
// sums and count (torch.batch_norm_backward_elemt), while grad_weight and
// grad_bias stay local ("distributed training would handle all reduce").
// Here the second sum is Σdy·x̂ = invstd·Σdy·(x − mean), the one dγ already is.
#include "mpt/nn/layers/batch_norm.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "mpt/formats/rounding.hpp"
#include "mpt/nn/cpu/norm_cpu.hpp"
#include "mpt/nn/layers/norm_math.hpp"
#include "mpt/nn/layers/welford.hpp"

namespace mpt {

namespace {

std::string number(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

Tensor f32_tensor(const std::vector<float>& v) {
  return Tensor::from_f32(v.data(), {static_cast<std::int64_t>(v.size())}, DType::f32);
}

void require_f32_batch_norm(const OpPrecision& q) {
  if (q.compute != DType::f32)
    throw std::invalid_argument("batch_norm: the policy asks for " + std::string(dtype_name(q.compute)) +
                                " compute; batch_norm computes its statistics in f32; FP16 statistics are "
                                "Chapter 3's pitfalls, not a policy choice");
}

// [N, C, ...] as the formulas read it: {N, C, L or H·W}.
norm_math::Layout layout_of(const Shape& s) {
  norm_math::Layout l;
  l.outer = s[0];
  l.channels = s[1];
  l.inner = 1;
  for (std::size_t d = 2; d < s.size(); ++d) l.inner *= s[d];
  return l;
}

}  // namespace

// The synchronised backward's pieces (file-named: the nn tier is a unity build).
namespace batch_norm_sync {

// dx from the global per-channel sums Σdy and Σdy·x̂ over `count` values:
// norm_math::input_grad_batch with g = γ·dy, Σg = γ·Σdy, Σg·x̂ = γ·Σdy·x̂.
void input_grad(const float* x, const float* dy, const norm_math::Layout& l, const float* mean,
                const float* invstd, const float* weight, const float* sum_dy, const float* sum_dy_xhat,
                std::int64_t count, float* dx) {
  const auto m = static_cast<float>(count);
  for (std::int64_t n = 0; n < l.outer; ++n)
    for (std::int64_t c = 0; c < l.channels; ++c) {
      const float w = weight ? weight[c] : 1.0f;
      const float sum_g = w * sum_dy[c], sum_g_xhat = w * sum_dy_xhat[c];
      for (std::int64_t i = 0; i < l.inner; ++i) {
        const std::int64_t e = l.offset(n, c, i);
        dx[e] = norm_math::input_grad_batch(invstd[c], m, w * dy[e], sum_g,
                                            norm_math::normalize(x[e], mean[c], invstd[c]), sum_g_xhat);
      }
    }
}

}  // namespace batch_norm_sync

BatchNorm::BatchNorm(int num_features) : BatchNorm(num_features, Options{}) {}

BatchNorm::BatchNorm(int num_features, Options options) : num_features_(num_features), options_(options) {
  if (num_features < 1)
    throw std::invalid_argument("BatchNorm: num_features must be >= 1, got " + std::to_string(num_features));
  if (!std::isfinite(options_.eps) || options_.eps < 0)
    throw std::invalid_argument("BatchNorm: eps must be finite and >= 0, got " + number(options_.eps));
  if (options_.momentum && !(*options_.momentum >= 0 && *options_.momentum <= 1))
    throw std::invalid_argument(
        "BatchNorm: momentum must be in [0, 1], or nullopt for the cumulative average; got " +
        number(*options_.momentum));
  const std::int64_t c = num_features;
  if (options_.affine) {
    const std::vector<float> ones(static_cast<std::size_t>(c), 1.0f);
    weight = Parameter("weight", Tensor::from_f32(ones.data(), {c}, DType::f32));
    bias = Parameter("bias", Tensor(DType::f32, {c}));
  }
  if (options_.track_running_stats) {
    const std::vector<float> ones(static_cast<std::size_t>(c), 1.0f);
    running_mean = Tensor(DType::f32, {c});
    running_var = Tensor::from_f32(ones.data(), {c}, DType::f32);
  }
}

void BatchNorm::set_statistics_reduction(StatisticsReduction statistics,
                                         GradientSumsReduction gradient_sums) {
  if (static_cast<bool>(statistics) != static_cast<bool>(gradient_sums))
    throw std::invalid_argument(who() +
                                ": set_statistics_reduction needs both the statistics and the gradient-sums "
                                "reduction, or neither (clear_statistics_reduction)");
  reduce_statistics_ = std::move(statistics);
  reduce_gradient_sums_ = std::move(gradient_sums);
}

void BatchNorm::clear_statistics_reduction() {
  reduce_statistics_ = nullptr;
  reduce_gradient_sums_ = nullptr;
}

std::string BatchNorm::who() const { return path().empty() ? "BatchNorm" : "BatchNorm " + path(); }

std::vector<Parameter*> BatchNorm::parameters() {
  if (!options_.affine) return {};
  return {&weight, &bias};
}

void BatchNorm::set_path(std::string p) {
  Module::set_path(std::move(p));
  weight.name = path().empty() ? "weight" : path() + ".weight";
  bias.name = path().empty() ? "bias" : path() + ".bias";
}

void BatchNorm::apply_policy(const Policy& policy) {
  const DType d = policy.parameter_dtype("batch_norm", path());
  if (options_.affine) {
    weight.set_model_dtype(d);
    bias.set_model_dtype(d);
  }
  if (options_.track_running_stats) {
    running_mean = running_mean.to(d);
    running_var = running_var.to(d);
  }
}

//! [running-update]
void BatchNorm::update_running(const std::vector<float>& mean, const std::vector<float>& unbiased_var) {
  ++num_batches_tracked;
  // torch: exponential_average_factor = momentum, or 1/num_batches_tracked.
  const float m = static_cast<float>(options_.momentum ? *options_.momentum
                                                       : 1.0 / static_cast<double>(num_batches_tracked));
  std::vector<float> rm = widened(running_mean), rv = widened(running_var);
  for (std::size_t c = 0; c < rm.size(); ++c) {
    rm[c] = norm_math::running_update(rm[c], mean[c], m);
    rv[c] = norm_math::running_update(rv[c], unbiased_var[c], m);
  }
  // One rounding into the running estimates' dtype.
  running_mean.assign(rm.data(), running_mean.numel());
  running_var.assign(rv.data(), running_var.numel());
}
//! [running-update]

Tensor BatchNorm::forward_impl(const Tensor& x, Context& ctx) {
  const std::string c = std::to_string(num_features_);
  if (x.dim() < 2 || x.dim() > 4 || x.size(1) != num_features_)
    throw std::invalid_argument(who() + ": x is " + shape_string(x.shape()) + " but the layer takes [N, " +
                                c + "], [N, " + c + ", L] or [N, " + c + ", H, W]");
  for (std::int64_t s : x.shape())
    if (s < 1)
      throw std::invalid_argument(who() + ": x is " + shape_string(x.shape()) + "; every size must be >= 1");
  const bool track = options_.track_running_stats;
  if (track && (running_mean.shape() != Shape{num_features_} || running_var.shape() != Shape{num_features_}))
    throw std::invalid_argument(who() + ": running_mean is " + shape_string(running_mean.shape()) +
                                " and running_var " + shape_string(running_var.shape()) + ", expected " + c +
                                " each");
  const norm_math::Layout l = layout_of(x.shape());
  // PyTorch's bn_training: batch statistics in training, and in eval when
  // there are no running estimates.
  const bool batch = training() || !track;
  // SyncBatchNorm: training-mode statistics through the reduction.
  const bool sync = training() && reduce_statistics_;
  if (batch && !sync && l.count() == 1)
    throw std::invalid_argument(who() +
                                ": expected more than 1 value per channel when training, got x of shape " +
                                shape_string(x.shape()));
  std::vector<DType> inputs{x.dtype()};
  if (options_.affine) inputs.push_back(weight.weights().dtype());
  op_ = ctx.decide("batch_norm", path(), inputs);
  require_f32_batch_norm(op_);
  x_ = ctx.cast(x, op_.input, path(), Phase::forward, "x");
  const std::size_t nc = static_cast<std::size_t>(num_features_);
  const auto eps = static_cast<float>(options_.eps);
  std::vector<float> mean(nc), invstd(nc), w, b;
  Tensor wt, bt;  // γ and β as the op reads them (Parameter::read_for_norm)
  if (options_.affine) {
    wt = weight.read_for_norm(op_.input, ctx, path(), Phase::forward, "weight");
    bt = bias.read_for_norm(op_.input, ctx, path(), Phase::forward, "bias");
    w = widened(wt);
    b = widened(bt);
  }
  const float* wp = options_.affine ? w.data() : nullptr;
  const float* bp = options_.affine ? b.data() : nullptr;
  skipped_ = false;
  bool updated = false;
  used_batch_stats_ = batch;
  synced_ = false;
  used_count_ = l.count();
  Tensor out;
  if (batch) {
    // The statistics (double sums, rounded once into FP32), whatever dtype
    // x is stored in, and y from them in FP32: norm_math's formulas, one
    // run at a time (norm_cpu.hpp).
    std::vector<norm_math::Statistics> stats(nc);
    if (sync) {
      // This rank's statistics (the order norm_cpu::forward takes them in),
      // replaced by the global ones; then y from those.
      std::vector<float> xf(static_cast<std::size_t>(x_.numel()));
      x_.to_f32(xf.data());
      norm_math::statistics(xf.data(), l, stats.data());
      reduce_statistics_(stats);
      if (stats.size() != nc)
        throw std::logic_error(who() + ": the statistics reduction returned " + std::to_string(stats.size()) +
                               " channels, expected " + c);
      synced_ = true;
      used_count_ = stats[0].count;
      if (used_count_ <= 1)
        throw std::invalid_argument(who() + ": expected more than 1 value per channel when training, got " +
                                    std::to_string(used_count_) + " across the ranks (x of shape " +
                                    shape_string(x.shape()) + " here)");
      norm_math::mean_invstd(stats.data(), static_cast<std::int64_t>(nc), eps, mean.data(), invstd.data());
      out = norm_cpu::forward(x_, l, norm_math::AffineAxis::channel, wp, bp, eps, op_.output, nullptr,
                              mean.data(), invstd.data());
    } else {
      out = norm_cpu::forward(x_, l, norm_math::AffineAxis::channel, wp, bp, eps, op_.output, stats.data(),
                              mean.data(), invstd.data());
    }
    batch_mean_ = f32_tensor(mean);
    batch_invstd_ = f32_tensor(invstd);
    used_mean_ = batch_mean_;
    used_invstd_ = batch_invstd_;
    if (training() && track) {
      std::vector<float> unbiased(nc);
      bool finite = true;
      for (std::size_t k = 0; k < nc; ++k) {
        unbiased[k] = norm_math::variance_unbiased<float>(stats[k]);
        finite = finite && std::isfinite(mean[k]) && std::isfinite(unbiased[k]);
      }
      if (options_.guard_running_update && !finite) {
        skipped_ = true;
      } else {
        update_running(mean, unbiased);
        updated = true;
      }
    }
  } else {
    // Eval: the running estimates, widened exactly, invstd in FP32.
    mean = widened(running_mean);
    const std::vector<float> var = widened(running_var);
    for (std::size_t k = 0; k < nc; ++k) invstd[k] = norm_math::inverse_std(var[k], eps);
    used_mean_ = f32_tensor(mean);
    used_invstd_ = f32_tensor(invstd);
    out = norm_cpu::forward(x_, l, norm_math::AffineAxis::channel, wp, bp, eps, op_.output, nullptr,
                            mean.data(), invstd.data());
  }
  if (ctx.tracing()) {
    TraceEntry e{Phase::forward, path(), "batch_norm", {traced("x", x_)}, op_.compute, {traced("y", out)}};
    if (options_.affine) {
      e.inputs.push_back(traced("weight", wt));
      e.inputs.push_back(traced("bias", bt));
    }
    if (!batch) {
      e.inputs.push_back(traced("running_mean", running_mean));
      e.inputs.push_back(traced("running_var", running_var));
    } else {
      e.outputs.push_back(traced("mean", batch_mean_));
      e.outputs.push_back(traced("invstd", batch_invstd_));
    }
    if (updated) {
      e.outputs.push_back(traced("running_mean", running_mean));
      e.outputs.push_back(traced("running_var", running_var));
    }
    ctx.record(std::move(e));
  }
  return out;
}

Tensor BatchNorm::backward_impl(const Tensor& dy, Context& ctx) {
  if (dy.shape() != x_.shape())
    throw std::invalid_argument(who() + ": dy is " + shape_string(dy.shape()) + ", expected " +
                                shape_string(x_.shape()));
  const norm_math::Layout l = layout_of(x_.shape());
  const std::vector<float> xf = widened(x_), dyf = widened(dy), mean = widened(used_mean_),
                           invstd = widened(used_invstd_);
  const bool affine = options_.affine;
  std::vector<float> w, dw, db, dx;
  Tensor wt;  // γ as the op reads it, again (Linear reads its weight again in backward too)
  if (affine) {
    wt = weight.read_for_norm(op_.input, ctx, path(), Phase::backward, "weight");
    w = widened(wt);
    dw.resize(w.size());
    db.resize(w.size());
  }
  if (input_grad()) dx.resize(xf.size());
  if (synced_ && input_grad()) {
    // SyncBatchNorm: this rank's Σdy·x̂ and Σdy (what dγ and dβ are, in
    // norm_math::backward's order), all-reduced, and dx from the global sums.
    const std::size_t nc = static_cast<std::size_t>(num_features_);
    std::vector<float> sums(2 * nc);  // [Σdy, Σdy·x̂]
    norm_math::backward(xf.data(), dyf.data(), l, mean.data(), invstd.data(), affine ? w.data() : nullptr,
                        norm_math::AffineAxis::channel, true, static_cast<float*>(nullptr), sums.data() + nc,
                        sums.data());
    if (affine) {
      std::copy(sums.begin(), sums.begin() + static_cast<std::ptrdiff_t>(nc), db.begin());
      std::copy(sums.begin() + static_cast<std::ptrdiff_t>(nc), sums.end(), dw.begin());
    }
    reduce_gradient_sums_(sums);
    if (sums.size() != 2 * nc)
      throw std::logic_error(who() + ": the gradient-sums reduction returned " + std::to_string(sums.size()) +
                             " values, expected " + std::to_string(2 * nc));
    batch_norm_sync::input_grad(xf.data(), dyf.data(), l, mean.data(), invstd.data(),
                                affine ? w.data() : nullptr, sums.data(), sums.data() + nc, used_count_,
                                dx.data());
  } else {
    // FP32 sums and formulas: x̂ from the saved input and statistics.
    norm_math::backward(xf.data(), dyf.data(), l, mean.data(), invstd.data(), affine ? w.data() : nullptr,
                        norm_math::AffineAxis::channel, used_batch_stats_, input_grad() ? dx.data() : nullptr,
                        affine ? dw.data() : nullptr, affine ? db.data() : nullptr);
  }
  const DType wd = weight.model_dtype(), bd = bias.model_dtype();
  if (affine) {
    // The gradients pass through the dtype γ and β were read in (and the
    // stored dtype, where that differs: Parameter::accumulate_grad).
    weight.accumulate_grad(dw.data(), static_cast<std::int64_t>(dw.size()), wt);
    bias.accumulate_grad(db.data(), static_cast<std::int64_t>(db.size()), bias.norm_read_dtype(op_.input));
  }
  Tensor out;
  if (input_grad()) out = Tensor::from_f32(dx.data(), x_.shape(), op_.input);
  if (ctx.tracing()) {
    TraceEntry e{Phase::backward, path(), "batch_norm", {traced("dy", dy), traced("x", x_)}, op_.compute, {}};
    if (affine) e.inputs.push_back(traced("weight", wt));
    if (input_grad()) e.outputs.push_back(traced("dx", out));
    if (affine) {
      e.outputs.push_back({"weight.grad", wd, weight.master.shape(),
                           static_cast<std::size_t>(weight.master.numel()) * bytes_per_element(wd)});
      e.outputs.push_back({"bias.grad", bd, bias.master.shape(),
                           static_cast<std::size_t>(bias.master.numel()) * bytes_per_element(bd)});
    }
    ctx.record(std::move(e));
  }
  return out;
}

}  // namespace mpt
