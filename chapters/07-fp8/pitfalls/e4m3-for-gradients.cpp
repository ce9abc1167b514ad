// Chapter 07 — pitfall e4m3-for-gradients: E4M3 for the backward's output gradients
// Depends on: common.hpp (check, num, pct, this entry's declaration),
// ../../02-loss-scaling/training.hpp (the blobs, their MLP's sizes and
// seeds), mpt/fp8/linear_scaling.hpp (Fp8Training, Fp8LinearScaling, the
// format option), mpt/fp8/recipes.hpp, mpt/nn/models/model_factory.hpp,
// mpt/core/policy_string.hpp, mpt/nn/layers/losses.hpp, mpt/optim/sgd.hpp,
// mpt/formats/round_element.hpp (format_max); <algorithm>, <cmath>,
// <memory>, <string>, <vector>.
//
// E4M3 has one more significand bit than E5M2 and 14 fewer binades: with a
// per-tensor scale that puts a tensor's amax near the format's max, E4M3
// keeps the values down to about 2^-17.8 of the amax (448 / 2^-9), E5M2 down
// to about 2^-31.8 (57344 / 2^-16). An output gradient dy can span more than
// the first: its rows are the loss's derivatives per sample, and a sample
// the model already gets right has a derivative orders of magnitude below
// one it gets wrong. Transformer Engine's default format, HYBRID, stores dy
// in E5M2 (range) and x, W in E4M3 (precision); its Format.E4M3 stores dy in
// E4M3 too.
//
// Both runs train Chapter 2's blobs MLP (8-32-32-4, SGD with momentum: the
// run `mpt train --model mlp --policy fp8:delayed` trains) with delayed
// scaling (TE's defaults), one with Format.E4M3 (Fp8LinearOptions::format)
// and one with HYBRID, and measure every dy the three Linear layers
// quantize: its span in binades, how many of its nonzero values flush to
// zero, how many samples' rows lose every value, how many become
// subnormals, its relative error, and the relative error of the weight
// gradient dW = dyᵀ·x the FP8 GEMM computes from it (against dyᵀ·x summed in
// double from the unquantized dy and the x the GEMM read). The relative
// errors are norms, which the large values dominate: there E4M3's extra bit
// counts, and what E4M3 loses is the small values, whole rows of them. The
// outcomes show both, and the loss, as measured.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../../02-loss-scaling/training.hpp"
#include "common.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/formats/round_element.hpp"
#include "mpt/fp8/linear_scaling.hpp"
#include "mpt/fp8/recipes.hpp"
#include "mpt/nn/layers/linear.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/models/model_factory.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ch07 {
namespace {
namespace e4m3_for_gradients {

constexpr int kSteps = 300;          // SGD steps of each run
constexpr int kLossSteps = 50;       // the last steps, whose training losses are averaged
constexpr Eigen::Index kBatch = 64;  // `mpt train`'s batch for the MLP
constexpr double kLr = 0.05;         // and its SGD (momentum 0.9)

// What the runs measure of the dy tensors, pooled over every Linear and step.
struct Tally {
  double nonzero = 0, flushed = 0, subnormal = 0, saturated = 0;
  double rows = 0, rows_lost = 0;   // rows (samples) of dy with a nonzero value; those all flushed
  double dy_err2 = 0, dy_ref2 = 0;  // ‖read back − dy‖², ‖dy‖²
  double dw_err2 = 0, dw_ref2 = 0;  // the same for dW
  std::vector<double> spans;        // per dy: log2(amax / its smallest nonzero |value|)
};

std::vector<float> values_of(const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  t.to_f32(v.data());
  return v;
}

// A Linear's FP8 state with a tap on its backward: the layer's own
// Fp8LinearScaling does the work; what it quantized is measured on the way.
class Measured final : public LinearFp8 {
 public:
  Measured(std::shared_ptr<fp8::Fp8LinearScaling> inner, Tally& tally)
      : inner_(std::move(inner)), tally_(tally) {}
  DType forward_dtype() const override { return inner_->forward_dtype(); }
  Forward forward(const Tensor& x, const Tensor& w, const Tensor& bias, DType out) override {
    Forward f = inner_->forward(x, w, bias, out);
    x8_ = values_of(*inner_->saved().front());  // x as the dW GEMM reads it
    return f;
  }
  Backward backward(const Tensor& dy, bool need_dx, DType dx_dtype) override {
    Backward g = inner_->backward(dy, need_dx, dx_dtype);
    measure(values_of(dy), dy.rows(), dy.cols(), g.dw);
    return g;
  }
  std::vector<const Tensor*> saved() const override { return inner_->saved(); }

 private:
  void measure(const std::vector<float>& dy, std::int64_t batch, std::int64_t outs,
               const std::vector<float>& dw) {
    // dy again, quantized as the layer did: its dtype and the scale it used
    const DType d = inner_->dtype(Fp8Role::grad_output);
    const float scale = inner_->last_scale(Fp8Role::grad_output);
    const fp8::Fp8Tensor q = fp8::quantize_with_scale(dy.data(), dy.size(), d, scale);
    const std::vector<float> back = fp8::dequantize(q);
    const FormatSpec& f = fp8::fp8_spec(d);
    const float min_normal = std::ldexp(1.0f, f.emin());
    float amax = 0, smallest = INFINITY;
    for (std::size_t i = 0; i < dy.size(); ++i) {
      if (dy[i] == 0) continue;
      const float a = std::fabs(dy[i]);
      amax = std::max(amax, a);
      smallest = std::min(smallest, a);
      tally_.nonzero += 1;
      const fp8::Fp8Outcome o = fp8::quantize_element(dy[i], scale, f, true).outcome;
      if (o == fp8::Fp8Outcome::flushed) tally_.flushed += 1;
      if (o == fp8::Fp8Outcome::saturated) tally_.saturated += 1;
      if (o == fp8::Fp8Outcome::in_range && std::fabs(back[i]) * scale < min_normal) tally_.subnormal += 1;
      const double e = static_cast<double>(back[i]) - dy[i];
      tally_.dy_err2 += e * e;
      tally_.dy_ref2 += static_cast<double>(dy[i]) * dy[i];
    }
    for (std::int64_t b = 0; b < batch; ++b) {
      bool nonzero = false, kept = false;
      for (std::int64_t o = 0; o < outs; ++o) {
        const auto i = static_cast<std::size_t>(b * outs + o);
        nonzero = nonzero || dy[i] != 0;
        kept = kept || back[i] != 0;
      }
      tally_.rows += nonzero ? 1 : 0;
      tally_.rows_lost += nonzero && !kept ? 1 : 0;
    }
    if (amax > 0) tally_.spans.push_back(std::log2(static_cast<double>(amax) / smallest));
    // dW [out, in] = dyᵀ·x on the unquantized dy, in double, against the FP8 GEMM's
    const auto in = static_cast<std::int64_t>(x8_.size()) / batch;
    for (std::int64_t o = 0; o < outs; ++o)
      for (std::int64_t i = 0; i < in; ++i) {
        double s = 0;
        for (std::int64_t b = 0; b < batch; ++b)
          s += static_cast<double>(dy[static_cast<std::size_t>(b * outs + o)]) *
               x8_[static_cast<std::size_t>(b * in + i)];
        const double e = static_cast<double>(dw[static_cast<std::size_t>(o * in + i)]) - s;
        tally_.dw_err2 += e * e;
        tally_.dw_ref2 += s * s;
      }
  }

  std::shared_ptr<fp8::Fp8LinearScaling> inner_;
  Tally& tally_;
  std::vector<float> x8_;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

// E4M3's window, log2(448 / 2^-9).
double e4m3_window_binades() {
  const FormatSpec& f = fp8::fp8_spec(DType::e4m3);
  return std::log2(static_cast<double>(format_max(f))) - (f.emin() - f.mantissa_bits);
}

// The blobs MLP under fp8:delayed, as `mpt train --model mlp` builds it.
std::unique_ptr<Model> blobs_mlp() {
  ModelSpec spec;
  spec.name = "mlp";
  spec.policy = parse_policy_string("fp8:delayed").make();
  spec.seed = ch02::kBlobsSeed;
  spec.mlp_sizes = ch02::kBlobsNet;
  return make_model(spec);
}

// The loss of the first batch, with fresh FP8 states (scale 1: both runs' first forward).
double first_step_loss() {
  static const double loss = [] {
    const std::unique_ptr<Model> net = blobs_mlp();
    const fp8::Fp8Training fp8_state(*net, fp8::Fp8LinearOptions{});
    Batches batches(ch02::blobs().train, kBatch, ch02::kBatchSeed);
    const Dataset b = batches.next();
    return static_cast<double>(cross_entropy_loss(net->forward(b.x), b.labels, net->context()));
  }();
  return loss;
}

RunResult run(fp8::Fp8Format format, std::string setup) {
  const std::unique_ptr<Model> net = blobs_mlp();
  fp8::Fp8LinearOptions options;  // delayed scaling, TE's defaults (margin 0, history 1024, max)
  if (format == fp8::Fp8Format::e4m3) {
    //! [e4m3-for-gradients-broken]
    // Format.E4M3: x, W and the output gradient dy in E4M3
    options.format = fp8::Fp8Format::e4m3;
    //! [e4m3-for-gradients-broken]
  } else {
    //! [e4m3-for-gradients-fixed]
    // Format.HYBRID (TE's default): x and W in E4M3, dy in E5M2
    options.format = fp8::Fp8Format::hybrid;
    //! [e4m3-for-gradients-fixed]
  }
  fp8::Fp8Training fp8_state(*net, options);
  Tally tally;
  for (const fp8::Fp8Training::Layer& l : fp8_state.layers())
    dynamic_cast<Linear&>(*net->find(l.path)).fp8 = std::make_shared<Measured>(l.fp8, tally);
  SgdOptions so;
  so.lr = kLr;
  so.momentum = 0.9;
  SGD opt(net->parameters(), so);
  Batches batches(ch02::blobs().train, kBatch, ch02::kBatchSeed);
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    const Dataset b = batches.next();
    const Tensor& out = net->forward(b.x);
    losses.push_back(cross_entropy_loss(out, b.labels, net->context()));
    const Tensor dlogits = cross_entropy_backward(out, b.labels, 1.0f, net->context());
    opt.zero_grad();
    net->backward(dlogits);
    fp8_state.update();
    opt.step();
    net->refresh_model_copies();
  }
  double late = 0;
  for (int s = kSteps - kLossSteps; s < kSteps; ++s) late += losses[static_cast<std::size_t>(s)];
  late /= kLossSteps;
  const DType d = fp8_state.layers().front().fp8->dtype(Fp8Role::grad_output);
  const FormatSpec& f = fp8::fp8_spec(d);
  const double window =
      std::log2(static_cast<double>(format_max(f))) - (f.emin() - f.mantissa_bits);  // as e4m3_window_binades
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"dy_window_binades", window, "binades the dy format holds: log2(max / smallest subnormal)"},
      {"dy_span_binades", median(tally.spans),
       "median over the dy tensors of log2(amax / smallest nonzero |value|)"},
      {"dy_values", tally.nonzero, "nonzero dy values quantized (3 Linears, every step)"},
      {"dy_flushed_fraction", tally.flushed / tally.nonzero, "nonzero dy values flushed to zero"},
      {"dy_rows_lost_fraction", tally.rows_lost / tally.rows,
       "rows of dy (one sample's gradient at one Linear) whose every nonzero value flushed"},
      {"dy_subnormal_fraction", tally.subnormal / tally.nonzero, "dy values stored as subnormals"},
      {"dy_saturated_fraction", tally.saturated / tally.nonzero, "dy values clamped to ±max"},
      {"dy_relative_error", std::sqrt(tally.dy_err2 / tally.dy_ref2),
       "‖read back − dy‖ / ‖dy‖, pooled over every dy"},
      {"dw_relative_error", std::sqrt(tally.dw_err2 / tally.dw_ref2),
       "‖dW − dyᵀ·x‖ / ‖dyᵀ·x‖ (x as the GEMM read it, dy unquantized), pooled"},
      {"first_loss", losses.front(), "the first step's training loss"},
      {"late_loss", late, "mean training loss of the last " + std::to_string(kLossSteps) + " steps"},
  };
  r.explanation =
      "dy in " + std::string(dtype_name(d)) + " holds " + num(window) +
      " binades (its max over its smallest subnormal); the dy tensors span " + num(r.get("dy_span_binades")) +
      " (median of amax over the smallest nonzero value). " + pct(r.get("dy_flushed_fraction")) +
      " of their nonzero values flushed to zero, " + pct(r.get("dy_rows_lost_fraction")) +
      " of the samples' rows lost every value (that sample gave the " + "layer's dW nothing) and " +
      pct(r.get("dy_subnormal_fraction")) + " were stored as subnormals. The relative errors, " +
      num(r.get("dy_relative_error")) + " for dy and " + num(r.get("dw_relative_error")) +
      " for dW, are those of the large values, which hold most of the norm; " + "the mean loss of the last " +
      std::to_string(kLossSteps) + " steps is " + num(late) + ".";
  return r;
}

RunResult broken_run() {
  return run(fp8::Fp8Format::e4m3,
             "the blobs MLP under FP8 delayed scaling (TE's defaults), Format.E4M3: dy in E4M3; " +
                 std::to_string(kSteps) + " SGD steps");
}
RunResult fixed_run() { return run(fp8::Fp8Format::hybrid, "the same run with Format.HYBRID: dy in E5M2"); }

}  // namespace e4m3_for_gradients
}  // namespace

Pitfall e4m3_for_gradients_pitfall() {
  using namespace e4m3_for_gradients;
  return Pitfall{
      "e4m3-for-gradients",
      7,
      "E4M3 for the output gradients: 14 binades less range, and dy's small values flush to zero",
      "A per-tensor scale puts dy's amax near the format's max; E4M3 then keeps 17.8 binades below it, "
      "E5M2 31.8. The rows of dy differ by orders of magnitude (samples the model gets right have tiny "
      "derivatives): under E4M3 the small values flush, whole rows of them; HYBRID stores dy in E5M2, "
      "which keeps them. E4M3's extra significand bit keeps the large values closer, and they hold most "
      "of the norm: the relative errors and the loss are shown as measured.",
      broken_run,
      fixed_run,
      {
          check("more than 5% of the nonzero dy values flush to zero",
                [](const RunResult& r) { return r.get("dy_flushed_fraction") > 0.05; }),
          check("more than 2% of the samples' dy rows lose every value",
                [](const RunResult& r) { return r.get("dy_rows_lost_fraction") > 0.02; }),
          check("more than 10% of the dy values are stored as subnormals",
                [](const RunResult& r) { return r.get("dy_subnormal_fraction") > 0.1; }),
      },
      {
          check("fewer than 1% of the nonzero dy values flush to zero",
                [](const RunResult& r) { return r.get("dy_flushed_fraction") < 0.01; }),
          check("fewer than 0.5% of the samples' dy rows lose every value",
                [](const RunResult& r) { return r.get("dy_rows_lost_fraction") < 0.005; }),
          check("fewer than 2% of the dy values are stored as subnormals",
                [](const RunResult& r) { return r.get("dy_subnormal_fraction") < 0.02; }),
      },
      {
          check("the dy tensors span more binades than E4M3 holds (median)",
                [](const RunResult& r) { return r.get("dy_span_binades") > e4m3_window_binades(); }),
          check("the same first step: the same weights, batch and E4M3 forward",
                [](const RunResult& r) { return r.get("first_loss") == first_step_loss(); }),
      }};
}

}  // namespace mpt::ch07
