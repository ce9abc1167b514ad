// Chapter 06 — the cost model: bytes, FLOPs and a roofline time per traced op.
// Depends on: cost_model.hpp, text.hpp (shown, for the message).
#include "mpt/core/cost_model.hpp"

#include <algorithm>
#include <stdexcept>

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

// linear: weight [N, K]; M = (elements of the activation) / K forward,
// (elements of dy) / N backward.
double linear_flops(const TraceEntry& e) {
  const TracedValue* w = named(e.inputs, "weight");
  if (w == nullptr || w->shape.size() != 2) return largest_output(e);
  const double n = static_cast<double>(w->shape[0]), k = static_cast<double>(w->shape[1]);
  if (e.phase == Phase::forward) {
    const double m = numel(e.inputs.front()) / k;
    return 2 * m * n * k + (named(e.inputs, "bias") != nullptr ? m * n : 0);
  }
  const double m = numel(e.inputs.front()) / n;  // dy [M, N]
  double f = 0;
  for (const TracedValue& o : e.outputs) f += o.name == "bias.grad" ? m * n : 2 * m * n * k;
  return f;
}

// conv2d: weight [C_out, C_in, kh, kw]; per output element C_in·kh·kw
// multiply-adds, for y forward and for each of dx, dW backward.
double conv_flops(const TraceEntry& e) {
  const TracedValue* w = named(e.inputs, "weight");
  if (w == nullptr || w->shape.size() != 4) return largest_output(e);
  const double per = static_cast<double>(w->shape[1] * w->shape[2] * w->shape[3]);
  if (e.phase == Phase::forward) return 2 * numel(e.outputs.front()) * per;
  const double dy = numel(e.inputs.front());
  double f = 0;
  for (const TracedValue& o : e.outputs) f += o.name == "bias.grad" ? dy : 2 * dy * per;
  return f;
}

// attention: q [B, H, L, D], k [B, H, S, D].
double attention_flops(const TraceEntry& e) {
  const TracedValue* q = named(e.inputs, "q");
  const TracedValue* k = named(e.inputs, "k");
  if (q == nullptr || k == nullptr || q->shape.size() != 4 || k->shape.size() != 4) return largest_output(e);
  const double bhld = numel(*q), s = static_cast<double>(k->shape[2]);
  return (e.phase == Phase::forward ? 4 : 8) * bhld * s;
}

// matmul/bmm: a [..., M, K] times b [..., K, N].
double product_flops(const TraceEntry& e) {
  if (e.inputs.size() < 2 || e.inputs[0].shape.size() < 2 || e.inputs[1].shape.empty())
    return largest_output(e);
  const TracedValue& a = e.inputs[0];
  const double k = static_cast<double>(a.shape.back());
  const double n = static_cast<double>(e.inputs[1].shape.back());
  return 2 * (numel(a) / k) * k * n;
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

double op_flops(const TraceEntry& e) {
  if (e.op == "cast" || e.op == "cached_cast") return 0;
  if (e.op == "linear") return linear_flops(e);
  if (e.op == "conv2d") return conv_flops(e);
  if (e.op == "scaled_dot_product_attention") return attention_flops(e);
  if ((e.op == "matmul" || e.op == "bmm") && e.phase == Phase::forward) return product_flops(e);
  return largest_output(e);
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
