// Chapter 06 — the speed side of a policy, visible on a CPU: from the
// precision trace of a step, the bytes each op moves and the FLOPs it does,
// and a roofline estimate of its time on a named GPU from that GPU's
// published memory bandwidth and arithmetic rates.
// Depends on: trace.hpp (TraceEntry, Trace), dtype.hpp.
//
// The model, op by op (every figure comes from the trace's shapes and dtypes):
//
//   bytes    what the op read plus what it wrote, as the trace records them
//            (a cast reads the source and writes the copy; a cached_cast,
//            the weight cast cache's reuse, moves nothing).
//   FLOPs    matrix products count 2 per multiply-add: linear 2·M·N·K (its
//            backward 2·M·N·K for dx and again for dW), conv2d
//            2·(output elements)·C_in·kh·kw per output, attention
//            4·B·H·L·S·D forward (QKᵀ and PV) and 8·B·H·L·S·D backward,
//            matmul/bmm 2·batch·M·N·K. Every other op is counted as one FLOP
//            per element of its largest output: it is bound by memory, and
//            the convention only has to keep it so.
//   rate     a matrix product whose two multiplicands are f16 or bf16 runs
//            at the dense f16/bf16 tensor-core rate; e4m3/e5m2 at the FP8
//            rate; f32 at the FP32 rate of the CUDA cores for linear, matmul,
//            bmm and attention (PyTorch's default,
//            torch.backends.cuda.matmul.allow_tf32 = False) and at the TF32
//            tensor-core rate for conv2d (torch.backends.cudnn.allow_tf32 =
//            True by default). Everything else at the FP32 rate.
//   time     max(bytes / bandwidth, FLOPs / rate): a lower bound that
//            ignores kernel launches, caches and overlap. The tiny models of
//            the chapters at small batches are launch-bound on a real GPU;
//            what the estimate shows is how a policy moves the bytes and
//            which ops it puts on the tensor cores.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/core/trace.hpp"

namespace mpt {

/// A GPU's published peak figures (dense, no sparsity), with their source.
struct GpuSpec {
  std::string_view name;     ///< the name the commands take: "h100-sxm"
  std::string_view what;     ///< "NVIDIA H100 SXM5 (80 GB HBM3)"
  double bytes_per_s;        ///< memory bandwidth
  double f16_tensor_flops;   ///< dense f16/bf16 tensor-core rate (FP32 accumulate)
  double tf32_tensor_flops;  ///< dense TF32 tensor-core rate
  double fp8_tensor_flops;   ///< dense FP8 tensor-core rate
  double fp32_flops;         ///< FP32 rate of the CUDA cores
  std::string_view source;   ///< where the figures are published
};

/// The GPUs the cost model knows, in table order.
const std::vector<GpuSpec>& known_gpus();
/// The GPU of this name; throws std::invalid_argument with one line naming
/// every known GPU when there is none.
const GpuSpec& gpu_spec(std::string_view name);

/// What the arithmetic of an op ran on.
enum class Unit {
  tensor_f16,   ///< f16/bf16 tensor cores
  tensor_tf32,  ///< TF32 tensor cores
  tensor_fp8,   ///< FP8 tensor cores
  fp32,         ///< FP32 CUDA cores
};
std::string_view unit_name(Unit u);  ///< "tensor-f16", "tensor-tf32", "tensor-fp8", "fp32"

/// One traced op, costed.
struct OpCost {
  Phase phase = Phase::forward;  ///< forward or backward
  std::string path;              ///< the trace entry's path
  std::string op;                ///< its op ("cast" and "cached_cast" included)
  double bytes = 0;              ///< read + written
  double flops = 0;              ///< see the file comment
  Unit unit = Unit::fp32;        ///< what its arithmetic ran on
  double seconds = 0;            ///< max(bytes / bandwidth, flops / rate)
  bool memory_bound = true;      ///< bytes / bandwidth >= flops / rate
};

/// One matrix product C = op(A) · op(B), `count` times over (a batch, or
/// batch × heads): op(A) is m × k, op(B) is k × n, both row-major; A is
/// stored [m, k] (or [k, m] when a_transposed) and B [k, n] (or [n, k] when
/// b_transposed), as the CUDA GEMMs take them (kernels/nn/nn_kernels.hpp).
struct MatrixProduct {
  std::string what;    ///< "y", "dW", "scores", "dq", ...; an input gradient by the trace's name ("dx", "dh")
  double count = 1;    ///< how many products of this shape
  std::int64_t m = 0;  ///< rows of op(A) and of C
  std::int64_t n = 0;  ///< columns of op(B) and of C
  std::int64_t k = 0;  ///< the depth summed over
  bool a_transposed = false;  ///< A stored [k, m] (read transposed)
  bool b_transposed = false;  ///< B stored [n, k] (read transposed)
  DType dtype = DType::f32;   ///< the multiplicands' dtype (f32 unless op_unit puts it on tensor cores)
};

/// The matrix products an entry's arithmetic consists of (empty for every
/// op that is not a matrix product, or one traced without the shapes):
///   linear    forward y = x Wᵀ (m = rows of x, n = out, k = in);
///             backward dx = dy W and dW = dyᵀ x (for the outputs it wrote;
///             the input's gradient under its traced name)
///   conv2d    the im2col products: forward y (m = N·H_out·W_out, n = C_out,
///             k = C_in·kh·kw); backward dx's columns and dW
///   attention per (batch, head): forward scores = q kᵀ and out = P v;
///             backward dv = Pᵀ dout, dP = dout vᵀ, dq = dS k, dk = dSᵀ q
///   matmul, bmm  forward, a [..., m, k] times b [..., k, n]
/// op_flops() counts 2·count·m·n·k for each of them (plus the bias terms):
/// the replay of a step on a GPU (bench_ch06_presets_cuda) runs exactly these.
std::vector<MatrixProduct> op_products(const TraceEntry& e);

/// The FLOPs of one trace entry (file comment); 0 for casts.
double op_flops(const TraceEntry& e);
/// Where an entry's arithmetic runs (file comment).
Unit op_unit(const TraceEntry& e);
/// Bytes read plus written by an entry (0 for a cached_cast).
double op_bytes(const TraceEntry& e);

/// A whole trace, costed.
struct StepCost {
  std::string gpu;             ///< GpuSpec::name
  std::vector<OpCost> ops;     ///< one per trace entry, in order
  double bytes = 0;            ///< summed over ops
  double flops = 0;            ///< summed over ops
  double tensor_flops = 0;     ///< the part of flops on tensor cores
  double seconds = 0;          ///< summed over ops (no overlap)
  double forward_seconds = 0;  ///< the forward ops' part
};

/// Every entry of `trace` costed on `gpu`.
StepCost estimate_cost(const Trace& trace, const GpuSpec& gpu);

}  // namespace mpt
