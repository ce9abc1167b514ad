// Chapter 06 — the cost model: bytes, FLOPs and a roofline time per traced op.
// Depends on: cost_model.hpp, text.hpp (shown, for the message).
#include "mpt/core/cost_model.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <utility>

#include "mpt/core/text.hpp"

namespace mpt {

namespace {

// Hopper's published peaks. The H100 figures are NVIDIA's H100 SXM5 figures
// (NVIDIA H100 Tensor Core GPU datasheet and architecture whitepaper, 2022)
// as tabulated, dense, at glennklockwood.com/garden/processors/h100:
// FP32 66.9, TF32 tensor 494.7, FP16/BF16 tensor 989.4, FP8 tensor 1978.9
// TFLOP/s; 3.35 TB/s of HBM3. The H200 is the same chip with 141 GB of
// HBM3e at 4.8 TB/s (NVIDIA's H200 announcement at SC23, 13 November 2023);
// its arithmetic rates are the H100 SXM's.
constexpr double kT = 1e12;
const std::vector<GpuSpec> kGpus = {
    {"h100-sxm", "NVIDIA H100 SXM5 (80 GB HBM3)", 3.35e12, 989.4 * kT, 494.7 * kT, 1978.9 * kT, 66.9 * kT,
     "NVIDIA H100 datasheet and whitepaper (2022), dense rates as tabulated at "
     "glennklockwood.com/garden/processors/h100"},
    {"h200-sxm", "NVIDIA H200 SXM (141 GB HBM3e)", 4.8e12, 989.4 * kT, 494.7 * kT, 1978.9 * kT, 66.9 * kT,
     "NVIDIA's H200 announcement (SC23, 2023-11-13): 4.8 TB/s; the H100 SXM's arithmetic rates"},
};

bool low16(DType d) { return d == DType::f16 || d == DType::bf16; }
bool fp8(DType d) { return d == DType::e4m3 || d == DType::e5m2; }

double numel(const TracedValue& v) {
  double n = 1;
  for (const auto d : v.shape) n *= static_cast<double>(d);
  return n;
}

const TracedValue* named(const std::vector<TracedValue>& vs, std::string_view name) {
  for (const TracedValue& v : vs)
    if (v.name == name) return &v;
  return nullptr;
}

double largest_output(const TraceEntry& e) {
  double n = 0;
  for (const TracedValue& v : e.outputs) n = std::max(n, numel(v));
  return n;
}

bool is_matrix_product(const std::string& op) {
  return op == "linear" || op == "matmul" || op == "bmm" || op == "conv2d" ||
         op == "scaled_dot_product_attention";
}

MatrixProduct product(std::string what, double count, double m, double n, double k, bool ta, bool tb) {
  MatrixProduct p;
  p.what = std::move(what);
  p.count = count;
  p.m = static_cast<std::int64_t>(m);
  p.n = static_cast<std::int64_t>(n);
  p.k = static_cast<std::int64_t>(k);
  p.a_transposed = ta;
  p.b_transposed = tb;
  return p;
}

bool has_output(const TraceEntry& e, std::string_view name) { return named(e.outputs, name) != nullptr; }

// Each function below gives the products of one op, or nullopt when the
// trace lacks the shapes they need (op_flops then counts the largest output).
using Products = std::optional<std::vector<MatrixProduct>>;

// linear: weight [N, K]; M = (elements of the activation) / K forward,
// (elements of dy) / N backward. The weight is stored [N, K] (PyTorch's
// layout): y = x Wᵀ reads it transposed, dx = dy W as stored, and dW = dyᵀ x
// reads dy transposed.
Products linear_products(const TraceEntry& e) {
  const TracedValue* w = named(e.inputs, "weight");
  if (w == nullptr || w->shape.size() != 2 || e.inputs.empty()) return std::nullopt;
  const double n = static_cast<double>(w->shape[0]), k = static_cast<double>(w->shape[1]);
  if (e.phase == Phase::forward)
    return std::vector<MatrixProduct>{product("y", 1, numel(e.inputs.front()) / k, n, k, false, true)};
  const double m = numel(e.inputs.front()) / n;  // dy [M, N]
  // The input's gradient, whatever the layer calls it ("dx"; the tied
  // output layer's "dh"), then the weight's; the bias gradient is no product.
  std::vector<MatrixProduct> p;
  for (const TracedValue& o : e.outputs)
    if (o.name != "weight.grad" && o.name != "bias.grad")
      p.push_back(product(o.name, 1, m, k, n, false, false));
  if (has_output(e, "weight.grad")) p.push_back(product("dW", 1, n, k, m, true, false));
  return p;
}

// conv2d: weight [C_out, C_in, kh, kw], as im2col products with the patch
// P = C_in·kh·kw: forward y [N·H_out·W_out, C_out] = cols [.., P] · Wᵀ;
// backward dcols = dy · W (C_out summed) and dW = dyᵀ · cols (the output
// positions summed).
Products conv_products(const TraceEntry& e) {
  const TracedValue* w = named(e.inputs, "weight");
  if (w == nullptr || w->shape.size() != 4 || e.outputs.empty() || e.inputs.empty()) return std::nullopt;
  const double out = static_cast<double>(w->shape[0]);
  const double patch = static_cast<double>(w->shape[1] * w->shape[2] * w->shape[3]);
  if (e.phase == Phase::forward)
    return std::vector<MatrixProduct>{
        product("y", 1, numel(e.outputs.front()) / out, out, patch, false, true)};
  const double positions = numel(e.inputs.front()) / out;  // dy [N, C_out, H_out, W_out]
  std::vector<MatrixProduct> p;
  for (const TracedValue& o : e.outputs)
    if (o.name != "weight.grad" && o.name != "bias.grad")
      p.push_back(product(o.name, 1, positions, patch, out, false, false));
  if (has_output(e, "weight.grad")) p.push_back(product("dW", 1, out, patch, positions, true, false));
  return p;
}

// attention: q [B, H, L, D], k [B, H, S, D]; per (batch, head) QKᵀ [L, S]
// and P V [L, D] forward, and four products of the same sizes backward.
Products attention_products(const TraceEntry& e) {
  const TracedValue* q = named(e.inputs, "q");
  const TracedValue* k = named(e.inputs, "k");
  if (q == nullptr || k == nullptr || q->shape.size() != 4 || k->shape.size() != 4) return std::nullopt;
  const double bh = static_cast<double>(q->shape[0] * q->shape[1]);
  const double l = static_cast<double>(q->shape[2]), d = static_cast<double>(q->shape[3]);
  const double s = static_cast<double>(k->shape[2]);
  if (e.phase == Phase::forward)
    return std::vector<MatrixProduct>{product("scores", bh, l, s, d, false, true),
                                      product("out", bh, l, d, s, false, false)};
  return std::vector<MatrixProduct>{
      product("dv", bh, s, d, l, true, false), product("dP", bh, l, s, d, false, true),
      product("dq", bh, l, d, s, false, false), product("dk", bh, s, d, l, true, false)};
}

// matmul/bmm forward: a [..., M, K] times b [..., K, N].
Products matmul_products(const TraceEntry& e) {
  if (e.inputs.size() < 2 || e.inputs[0].shape.size() < 2 || e.inputs[1].shape.empty()) return std::nullopt;
  const TracedValue& a = e.inputs[0];
  const double k = static_cast<double>(a.shape.back());
  const double m = static_cast<double>(a.shape[a.shape.size() - 2]);
  const double n = static_cast<double>(e.inputs[1].shape.back());
  return std::vector<MatrixProduct>{product("out", numel(a) / (m * k), m, n, k, false, false)};
}

Products products_of(const TraceEntry& e) {
  if (e.op == "linear") return linear_products(e);
  if (e.op == "conv2d") return conv_products(e);
  if (e.op == "scaled_dot_product_attention") return attention_products(e);
  if ((e.op == "matmul" || e.op == "bmm") && e.phase == Phase::forward) return matmul_products(e);
  return std::nullopt;
}

// The FLOPs beside the products: a bias added (linear forward, M·N) or
// summed into its gradient (linear and conv2d backward, one per dy element).
double bias_flops(const TraceEntry& e) {
  if (e.op == "linear") {
    const TracedValue* w = named(e.inputs, "weight");
    const double n = static_cast<double>(w->shape[0]), k = static_cast<double>(w->shape[1]);
    if (e.phase == Phase::forward)
      return named(e.inputs, "bias") != nullptr ? numel(e.inputs.front()) / k * n : 0;
    return has_output(e, "bias.grad") ? numel(e.inputs.front()) : 0;
  }
  if (e.op == "conv2d" && e.phase == Phase::backward)
    return has_output(e, "bias.grad") ? numel(e.inputs.front()) : 0;
  return 0;
}

}  // namespace

const std::vector<GpuSpec>& known_gpus() { return kGpus; }

const GpuSpec& gpu_spec(std::string_view name) {
  for (const GpuSpec& g : kGpus)
    if (g.name == name) return g;
  std::string valid;
  for (const GpuSpec& g : kGpus) valid += (valid.empty() ? "" : ", ") + std::string(g.name);
  throw std::invalid_argument("unknown GPU " + shown(name) + "; valid: " + valid);
}

std::string_view unit_name(Unit u) {
  switch (u) {
    case Unit::tensor_f16: return "tensor-f16";
    case Unit::tensor_tf32: return "tensor-tf32";
    case Unit::tensor_fp8: return "tensor-fp8";
    case Unit::fp32: break;
  }
  return "fp32";
}

std::vector<MatrixProduct> op_products(const TraceEntry& e) {
  Products p = products_of(e);
  if (!p) return {};
  const Unit u = op_unit(e);
  const DType d = u == Unit::tensor_f16 || u == Unit::tensor_fp8 ? e.inputs.front().dtype : DType::f32;
  for (MatrixProduct& m : *p) m.dtype = d;
  return *p;
}

double op_flops(const TraceEntry& e) {
  if (e.op == "cast" || e.op == "cached_cast") return 0;
  const Products p = products_of(e);
  if (!p) return largest_output(e);
  double f = bias_flops(e);
  for (const MatrixProduct& m : *p)
    f += 2 * m.count * static_cast<double>(m.m) * static_cast<double>(m.n) * static_cast<double>(m.k);
  return f;
}

Unit op_unit(const TraceEntry& e) {
  if (!is_matrix_product(e.op)) return Unit::fp32;
  // The multiplicands: forward the first two inputs (x and the weight, or q
  // and k); backward the gradient and the saved input it meets.
  const DType a = !e.inputs.empty() ? e.inputs[0].dtype : DType::f32;
  const DType b = e.inputs.size() > 1 ? e.inputs[1].dtype : a;
  if (low16(a) && low16(b)) return Unit::tensor_f16;
  if (fp8(a) && fp8(b)) return Unit::tensor_fp8;
  return e.op == "conv2d" ? Unit::tensor_tf32 : Unit::fp32;
}

double op_bytes(const TraceEntry& e) {
  if (e.op == "cached_cast") return 0;
  double n = 0;
  for (const TracedValue& v : e.inputs) n += static_cast<double>(v.bytes);
  for (const TracedValue& v : e.outputs) n += static_cast<double>(v.bytes);
  return n;
}

StepCost estimate_cost(const Trace& trace, const GpuSpec& gpu) {
  StepCost s;
  s.gpu = std::string(gpu.name);
  for (const TraceEntry& e : trace.entries()) {
    OpCost c;
    c.phase = e.phase;
    c.path = e.path;
    c.op = e.op;
    c.bytes = op_bytes(e);
    c.flops = op_flops(e);
    c.unit = op_unit(e);
    const double rate = c.unit == Unit::tensor_f16    ? gpu.f16_tensor_flops
                        : c.unit == Unit::tensor_tf32 ? gpu.tf32_tensor_flops
                        : c.unit == Unit::tensor_fp8  ? gpu.fp8_tensor_flops
                                                      : gpu.fp32_flops;
    const double memory = c.bytes / gpu.bytes_per_s, arithmetic = c.flops / rate;
    c.memory_bound = memory >= arithmetic;
    c.seconds = std::max(memory, arithmetic);
    s.bytes += c.bytes;
    s.flops += c.flops;
    if (c.unit != Unit::fp32) s.tensor_flops += c.flops;
    s.seconds += c.seconds;
    if (c.phase == Phase::forward) s.forward_seconds += c.seconds;
    s.ops.push_back(std::move(c));
  }
  return s;
}

}  // namespace mpt
