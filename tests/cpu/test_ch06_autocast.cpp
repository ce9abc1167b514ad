// Chapter 06 — per-task precision policies: torch.autocast as data and as a
// policy. The library's lists held to PyTorch's, copied by hand below from
// aten/src/ATen/autocast_mode.h at d70fe7f33910bbe8bc8b6027388a84bb102a453d
// (the CUDA lists: AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32,
// AT_FORALL_FP32_SET_OPT_DTYPE, AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE,
// AT_FORALL_PROMOTE) and autocast_mode.cpp at
// 008ec6b1840c94ff6d0f685bc10fbf585167c673 (cudnn_convolution*, the CUDA ban,
// and the AutocastCPU registrations), overload names dropped; then
// autocast's semantics: the casts per list, the CPU/CUDA difference, promote,
// the ban, regions that are off, the weight cast cache, the dtype the
// weight gradient passes through, and the norms' fp16 γ and β under autocast.
// Depends on: mpt/core/autocast.hpp, policy_string.hpp, ops.hpp;
// mpt/nn/models/mlp.hpp, layer_norm.hpp, losses.hpp; mpt/optim/sgd.hpp; Chapter 1's rounding.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mpt/core/autocast.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/core/ops.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/formats/rounding.hpp"
#include "mpt/nn/layers/layer_norm.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/sgd.hpp"

using namespace mpt;

namespace {

// --- PyTorch's lists, by hand -----------------------------------------------------

const std::set<std::string> kCudaLower = {"_convolution",
                                          "conv1d",
                                          "conv2d",
                                          "conv3d",
                                          "conv_tbc",
                                          "conv_transpose1d",
                                          "conv_transpose2d",
                                          "conv_transpose3d",
                                          "convolution",
                                          "prelu",
                                          "addmm",
                                          "addmv",
                                          "addr",
                                          "matmul",
                                          "einsum",
                                          "mm",
                                          "mv",
                                          "linalg_vecdot",
                                          "linear",
                                          "addbmm",
                                          "baddbmm",
                                          "bmm",
                                          "chain_matmul",
                                          "linalg_multi_dot",
                                          "_thnn_fused_lstm_cell",
                                          "_thnn_fused_gru_cell",
                                          "lstm_cell",
                                          "gru_cell",
                                          "rnn_tanh_cell",
                                          "rnn_relu_cell",
                                          "_scaled_dot_product_flash_attention",
                                          "scaled_dot_product_attention",
                                          "cudnn_convolution",
                                          "cudnn_convolution_transpose"};
const std::set<std::string> kCudaFp32 = {"acos",
                                         "asin",
                                         "cosh",
                                         "erfinv",
                                         "exp",
                                         "expm1",
                                         "log",
                                         "log10",
                                         "log2",
                                         "log1p",
                                         "reciprocal",
                                         "rsqrt",
                                         "sinh",
                                         "tan",
                                         "pow",
                                         "softplus",
                                         "layer_norm",
                                         "native_layer_norm",
                                         "group_norm",
                                         "frobenius_norm",
                                         "nuclear_norm",
                                         "cosine_similarity",
                                         "poisson_nll_loss",
                                         "cosine_embedding_loss",
                                         "nll_loss",
                                         "nll_loss2d",
                                         "hinge_embedding_loss",
                                         "kl_div",
                                         "l1_loss",
                                         "smooth_l1_loss",
                                         "huber_loss",
                                         "mse_loss",
                                         "margin_ranking_loss",
                                         "multilabel_margin_loss",
                                         "soft_margin_loss",
                                         "triplet_margin_loss",
                                         "multi_margin_loss",
                                         "binary_cross_entropy_with_logits",
                                         "dist",
                                         "pdist",
                                         "cdist",
                                         "renorm",
                                         "logsumexp",
                                         "upsample_nearest1d",
                                         "_upsample_nearest_exact1d",
                                         "upsample_nearest2d",
                                         "_upsample_nearest_exact2d",
                                         "upsample_nearest3d",
                                         "_upsample_nearest_exact3d",
                                         "upsample_linear1d",
                                         "upsample_bilinear2d",
                                         "_upsample_bilinear2d_aa",
                                         "upsample_trilinear3d",
                                         "upsample_bicubic2d",
                                         "_upsample_bicubic2d_aa"};
const std::set<std::string> kCudaSetOpt = {
    "prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm", "linalg_matrix_norm", "sum"};
const std::set<std::string> kCudaAppend = {"norm"};
const std::set<std::string> kCudaPromote = {"addcdiv",   "addcmul",   "atan2",      "bilinear",
                                            "cross",     "dot",       "vdot",       "grid_sampler",
                                            "index_put", "tensordot", "scatter_add"};
const std::set<std::string> kCudaBanned = {"binary_cross_entropy"};

const std::set<std::string> kCpuLower = {"conv1d",
                                         "conv2d",
                                         "conv3d",
                                         "bmm",
                                         "mm",
                                         "linalg_vecdot",
                                         "baddbmm",
                                         "addmm",
                                         "_addmm_activation",
                                         "addbmm",
                                         "linear",
                                         "_convolution",
                                         "matmul",
                                         "conv_tbc",
                                         "mkldnn_rnn_layer",
                                         "conv_transpose1d",
                                         "conv_transpose2d",
                                         "conv_transpose3d",
                                         "prelu",
                                         "scaled_dot_product_attention",
                                         "_native_multi_head_attention"};
const std::set<std::string> kCpuFp32 = {"avg_pool3d",
                                        "binary_cross_entropy",
                                        "grid_sampler",
                                        "polar",
                                        "prod",
                                        "quantile",
                                        "nanquantile",
                                        "stft",
                                        "cdist",
                                        "grid_sampler_2d",
                                        "_grid_sampler_2d_cpu_fallback",
                                        "grid_sampler_3d",
                                        "trace",
                                        "view_as_complex",
                                        "cholesky",
                                        "cholesky_inverse",
                                        "cholesky_solve",
                                        "inverse",
                                        "lu_solve",
                                        "orgqr",
                                        "ormqr",
                                        "pinverse",
                                        "max_pool3d",
                                        "max_unpool2d",
                                        "max_unpool3d",
                                        "adaptive_avg_pool3d",
                                        "reflection_pad1d",
                                        "reflection_pad2d",
                                        "replication_pad1d",
                                        "replication_pad2d",
                                        "replication_pad3d",
                                        "mse_loss",
                                        "cosine_embedding_loss",
                                        "nll_loss",
                                        "nll_loss2d",
                                        "hinge_embedding_loss",
                                        "poisson_nll_loss",
                                        "smooth_l1_loss",
                                        "cross_entropy_loss",
                                        "l1_loss",
                                        "huber_loss",
                                        "margin_ranking_loss",
                                        "soft_margin_loss",
                                        "triplet_margin_loss",
                                        "multi_margin_loss",
                                        "ctc_loss",
                                        "kl_div",
                                        "multilabel_margin_loss",
                                        "binary_cross_entropy_with_logits",
                                        "fft_fft",
                                        "fft_ifft",
                                        "fft_fft2",
                                        "fft_ifft2",
                                        "fft_fftn",
                                        "fft_ifftn",
                                        "fft_rfft",
                                        "fft_irfft",
                                        "fft_rfft2",
                                        "fft_irfft2",
                                        "fft_rfftn",
                                        "fft_irfftn",
                                        "fft_hfft",
                                        "fft_ihfft",
                                        "linalg_cond",
                                        "linalg_matrix_rank",
                                        "linalg_solve",
                                        "linalg_cholesky",
                                        "linalg_svdvals",
                                        "linalg_eigvals",
                                        "linalg_eigvalsh",
                                        "linalg_inv",
                                        "linalg_householder_product",
                                        "linalg_tensorinv",
                                        "linalg_tensorsolve",
                                        "fake_quantize_per_tensor_affine",
                                        "geqrf",
                                        "_lu_with_info",
                                        "qr",
                                        "svd",
                                        "triangular_solve",
                                        "fractional_max_pool2d",
                                        "fractional_max_pool3d",
                                        "adaptive_max_pool3d",
                                        "multilabel_margin_loss_forward",
                                        "linalg_qr",
                                        "linalg_cholesky_ex",
                                        "linalg_svd",
                                        "linalg_eig",
                                        "linalg_eigh",
                                        "linalg_lstsq",
                                        "linalg_inv_ex"};
const std::set<std::string> kCpuPromote = {"stack", "cat", "index_copy"};

// The aten name PyTorch registers for a library op (the same, but one).
std::string aten_name(std::string_view op) {
  return op == "cross_entropy" ? "cross_entropy_loss" : std::string(op);
}

CastList source_list(AutocastDevice d, const std::string& aten) {
  const auto in = [&aten](const std::set<std::string>& s) { return s.count(aten) > 0; };
  if (d == AutocastDevice::cuda) {
    if (in(kCudaLower)) return CastList::lower_precision_fp;
    if (in(kCudaFp32)) return CastList::fp32;
    if (in(kCudaSetOpt)) return CastList::fp32_set_opt_dtype;
    if (in(kCudaAppend)) return CastList::fp32_append_dtype;
    if (in(kCudaPromote)) return CastList::promote;
    if (in(kCudaBanned)) return CastList::banned;
    return CastList::none;
  }
  if (in(kCpuLower)) return CastList::lower_precision_fp;
  if (in(kCpuFp32)) return CastList::fp32;
  if (in(kCpuPromote)) return CastList::promote;
  return CastList::none;
}

OpPrecision decide(const std::string& policy, const char* op, const char* path, std::vector<DType> in) {
  return parse_policy_string(policy).make()->decide({op, path, std::move(in)});
}

std::string refusal_of(const std::string& policy, const char* op, const char* path, std::vector<DType> in) {
  try {
    (void)decide(policy, op, path, std::move(in));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

bool same(const OpPrecision& a, const OpPrecision& b) {
  return a.input == b.input && a.compute == b.compute && a.output == b.output;
}

constexpr DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16;

}  // namespace

TEST_CASE("every known op is on the list PyTorch puts it on, for CUDA and for the CPU") {
  REQUIRE(autocast_table().size() == known_ops().size());
  for (const OpInfo& op : known_ops()) {
    CAPTURE(op.name);
    CHECK(autocast_list(AutocastDevice::cuda, op.name) ==
          source_list(AutocastDevice::cuda, aten_name(op.name)));
    CHECK(autocast_list(AutocastDevice::cpu, op.name) ==
          source_list(AutocastDevice::cpu, aten_name(op.name)));
  }
  // The one composite: CUDA lists neither cross_entropy nor cross_entropy_loss;
  // it runs as log_softmax (fp32_set_opt_dtype), then nll_loss (fp32).
  for (const AutocastRow& r : autocast_table()) {
    CAPTURE(r.op);
    CHECK(r.cuda_via == (r.op == "cross_entropy" ? "log_softmax" : ""));
  }
  CHECK(source_list(AutocastDevice::cuda, "log_softmax") == CastList::fp32_set_opt_dtype);
  CHECK(source_list(AutocastDevice::cuda, "nll_loss") == CastList::fp32);
  CHECK_THROWS_AS(autocast_list(AutocastDevice::cpu, "sigmoid"), std::invalid_argument);
}

TEST_CASE(
    "the lists as casts: matrix products in the low dtype, the fp32 list in f32, the rest as they arrive") {
  const std::string cuda = "autocast:cuda:f16", cpu = "autocast:cpu:bf16";
  CHECK(same(decide(cuda, "linear", "fc1", {f32, f32}), {f16, f32, f16}));  // x and W cast to f16
  CHECK(same(decide(cpu, "linear", "fc1", {f32, f32}), {bf16, f32, bf16}));
  // layer_norm and softmax: f32 on CUDA; on the CPU they run in what arrives.
  CHECK(same(decide(cuda, "layer_norm", "ln1", {f16, f32}), {f32, f32, f32}));
  CHECK(same(decide(cpu, "layer_norm", "ln1", {bf16, f32}), {bf16, f32, bf16}));
  CHECK(same(decide(cuda, "softmax", "attn", {f16}), {f32, f32, f32}));
  CHECK(same(decide(cpu, "softmax", "attn", {bf16}), {bf16, f32, bf16}));
  // On no list: relu keeps f16; batch_norm on CUDA runs in its input's dtype
  // with f32 parameters (cuDNN's mixed batch norm).
  CHECK(same(decide(cuda, "relu", "act", {f16}), {f16, f32, f16}));
  CHECK(same(decide(cuda, "batch_norm", "bn1", {f16, f32}), {f16, f32, f16}));
  // Pointwise ops with mixed inputs promote (PyTorch's type promotion).
  CHECK(same(decide(cuda, "add", "residual1", {f16, f32}), {f32, f32, f32}));
  // The CUDA loss path: cross_entropy through log_softmax, so in f32.
  CHECK(same(decide(cuda, "cross_entropy", "loss", {f16}), {f32, f32, f32}));
  CHECK(same(decide(cpu, "cross_entropy", "loss", {bf16}), {f32, f32, f32}));
  // Parameters keep f32: autocast converts no tensor.
  CHECK(parse_policy_string(cuda).make()->parameter_dtype("linear", "fc1") == f32);
  // The defaults: f16 on CUDA, bf16 on the CPU.
  CHECK(parse_policy_string("autocast:cuda").text() == "autocast:cuda:f16");
  CHECK(parse_policy_string("autocast:cpu").text() == "autocast:cpu:bf16");
}

TEST_CASE("promote runs in the widest input; two different low dtypes are an error, as in autocast") {
  const std::string cpu = "autocast:cpu:bf16";
  CHECK(same(decide(cpu, "cat", "x", {bf16, bf16}), {bf16, f32, bf16}));
  CHECK(same(decide(cpu, "cat", "x", {bf16, f32}), {f32, f32, f32}));
  CHECK(refusal_of(cpu, "cat", "x", {bf16, f16}).find("Unexpected floating ScalarType") != std::string::npos);
}

TEST_CASE("binary_cross_entropy is banned under CUDA autocast (with PyTorch's advice), fp32 on the CPU") {
  const std::string why = refusal_of("autocast:cuda:f16", "binary_cross_entropy", "loss", {f32});
  CHECK(why.find("unsafe to autocast") != std::string::npos);
  CHECK(why.find("binary_cross_entropy_with_logits") != std::string::npos);
  CHECK(why.find('\n') == std::string::npos);
  CHECK(refusal_of("autocast:cuda:f16", "binary_cross_entropy_with_logits", "loss", {f16}).empty());
  CHECK(same(decide("autocast:cpu:bf16", "binary_cross_entropy", "loss", {bf16}), {f32, f32, f32}));
  // Inside a region that is off it runs, in what arrives.
  CHECK(same(decide("autocast:cuda:f16+loss=autocast-off", "binary_cross_entropy", "loss", {f32}),
             {f32, f32, f32}));
}

TEST_CASE("a region that is off casts nothing: f16 stays f16, and a product of f16 and f32 is refused") {
  const std::string p = "autocast:cuda:f16+head=autocast-off+head.inner=autocast-on";
  const auto pol = parse_policy_string(p).make();
  CHECK(pol->decide({"linear", "fc1", {f32, f32}}).output == f16);                // outside: autocast
  CHECK(same(pol->decide({"layer_norm", "head", {f16, f32}}), {f16, f32, f16}));  // not upcast
  CHECK(same(pol->decide({"relu", "head.act", {f16}}), {f16, f32, f16}));
  CHECK(same(pol->decide({"linear", "head", {f32, f32}}), {f32, f32, f32}));
  CHECK(same(pol->decide({"linear", "head.inner.fc", {f32, f32}}), {f16, f32, f16}));  // on again inside
  const std::string why = refusal_of(p, "linear", "head.fc", {f16, f32});
  CHECK(why.find("linear at head.fc") != std::string::npos);
  CHECK(why.find("same dtype") != std::string::npos);
  // Regions belong to autocast bases only.
  CHECK_THROWS_WITH_AS(parse_policy_string("f16+head=autocast-off"),
                       doctest::Contains("autocast regions need an autocast base"), std::invalid_argument);
  CHECK(parse_policy_string("O1+head=autocast-off").text() == "O1+head=autocast-off");
}

namespace {

struct Step {
  std::unique_ptr<Mlp> net;
  MatrixF x;
  std::vector<int> y;
  explicit Step(const std::string& policy) {
    MlpConfig c;
    c.sizes = {6, 5, 3};
    c.seed = 11;
    c.policy = parse_policy_string(policy).make();
    net = std::make_unique<Mlp>(c);
    x = MatrixF(4, 6);
    for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = 0.37f * static_cast<float>(i % 7) - 1.1f;
    y = {0, 2, 1, 2};
  }
  void forward_backward() {
    const Tensor& logits = net->forward(x);
    net->backward(cross_entropy_backward(logits, y, 1.0f, net->context()));
  }
};

bool all_f16(const Tensor& g) {
  const float* p = g.f32_data();
  for (std::int64_t i = 0; i < g.numel(); ++i)
    if (round_value(p[i], format_of(DType::f16)) != p[i]) return false;
  return true;
}

}  // namespace

TEST_CASE(
    "the weight cast cache: each f32 weight cast once per change, reused by backward and the next forward") {
  Step s("autocast:cuda:f16");
  Context& ctx = s.net->context();
  const std::size_t params = s.net->parameters().size();  // 2 Linears: 4 tensors
  REQUIRE(params == 4);
  Trace trace;
  ctx.set_trace(&trace);
  s.forward_backward();
  ctx.set_trace(nullptr);
  // Forward: the input once and each weight and bias once (no other casts
  // of parameters); backward reads the two weights again, from the cache.
  std::size_t param_casts = 0;
  for (const TraceEntry& e : trace.entries())
    if (e.op == "cast" && (e.inputs[0].name == "weight" || e.inputs[0].name == "bias")) ++param_casts;
  CHECK(param_casts == params);
  CHECK(trace.cached_casts() == 2);
  CHECK(ctx.casts().cached == 2);
  // A second forward without a step: nothing to cast again.
  ctx.reset_casts();
  (void)s.net->forward(s.x);
  CHECK(ctx.casts().cached == params);
  // An optimizer step changes every master: the next forward casts again.
  SGD opt(s.net->parameters(), {});
  opt.step();
  s.net->refresh_model_copies();
  ctx.reset_casts();
  (void)s.net->forward(s.x);
  CHECK(ctx.casts().cached == 0);
  CHECK(ctx.casts().casts >= params);
}

TEST_CASE("the weight gradient passes through the dtype the weight was read in") {
  // Under autocast the f32 weight is read in f16, so its gradient is an f16
  // tensor widened into the f32 grad; under f32 it is not rounded at all.
  Step low("autocast:cuda:f16"), full("f32");
  low.forward_backward();
  full.forward_backward();
  for (Parameter* p : low.net->parameters()) {
    CAPTURE(p->name);
    CHECK(all_f16(p->grad));
  }
  bool any_not_f16 = false;
  for (Parameter* p : full.net->parameters()) any_not_f16 = any_not_f16 || !all_f16(p->grad);
  CHECK(any_not_f16);  // the check above can fail
}

namespace {
// CUDA autocast's decisions on a model whose parameters are fp16 (a
// model.half() under autocast: Chapter 6's pitfall half-under-autocast).
class HalfParamsUnderAutocast final : public Policy {
 public:
  std::string describe() const override { return "autocast cuda f16, f16 parameters"; }

 protected:
  OpPrecision decide_op(const OpInfo&, const OpQuery& q) const override { return autocast_.decide(q); }
  DType parameter_dtype_of(const OpInfo&, std::string_view) const override { return DType::f16; }

 private:
  AutocastPolicy autocast_{AutocastDevice::cuda, DType::f16};
};

// A LayerNorm of 3 rows of 8 under `policy`, forward and backward, its
// casts counted: {casts of γ and β, cached casts}.
std::pair<std::size_t, std::size_t> norm_step(const std::shared_ptr<const Policy>& policy, LayerNorm& ln) {
  ln.apply_policy(*policy);
  Context ctx(policy);
  std::vector<float> v(24), g(24);
  for (int i = 0; i < 24; ++i) {
    v[static_cast<std::size_t>(i)] = std::sin(0.7f * static_cast<float>(i)) * 3.0f;
    g[static_cast<std::size_t>(i)] = std::cos(0.3f * static_cast<float>(i)) * 1e-3f;
  }
  Trace trace;
  ctx.set_trace(&trace);
  (void)ln.forward(Tensor::from_f32(v.data(), {3, 8}, DType::f16), ctx);
  (void)ln.backward(Tensor::from_f32(g.data(), {3, 8}, DType::f32), ctx);
  std::size_t params = 0;
  for (const TraceEntry& e : trace.entries())
    if (e.op == "cast" && (e.inputs[0].name == "weight" || e.inputs[0].name == "bias")) ++params;
  return {params, trace.cached_casts()};
}
}  // namespace

TEST_CASE("a norm casts f16 γ and β to FP32 at every call under autocast, and keeps FP32 ones as they are") {
  // layer_norm is on CUDA's fp32 list: its inputs are read in f32.
  LayerNorm half({8}), full({8});
  const auto [half_casts, half_cached] = norm_step(std::make_shared<HalfParamsUnderAutocast>(), half);
  CHECK(half_casts == 3);  // γ and β in forward, γ in backward: f16-to-f32 casts are never cached
  CHECK(half_cached == 0);
  // and the gradient of the f16 γ, computed in f32, passes through f16 (the
  // backward of the cast into the f16 leaf)
  CHECK(all_f16(half.weight.grad));
  const auto [full_casts, full_cached] =
      norm_step(std::make_shared<AutocastPolicy>(AutocastDevice::cuda, DType::f16), full);
  CHECK(full_casts == 0);
  CHECK(full_cached == 0);
  // apex O2's batch norm, and CPU autocast's pass-through norms: FP32 γ
  // beside an f16 input, read as they are.
  CHECK(full.weight.norm_read_dtype(DType::f16) == DType::f32);
  CHECK(half.weight.norm_read_dtype(DType::f32) == DType::f32);
  CHECK(half.weight.norm_read_dtype(DType::f16) == DType::f16);
}
