// Chapter 05 — pitfall fp16-allreduce-overflow: gradients summed in fp16 across ranks
// Depends on: common.hpp (the chapter's helpers, this entry's declaration),
// mpt/amp/grad_scaler.hpp, mpt/dist/ddp.hpp, mpt/dist/thread_world.hpp,
// mpt/optim/sgd.hpp; <cmath>, <cstddef>, <string>, <vector>.
//
// Compressing the gradients' all-reduce to fp16 (PyTorch's
// fp16_compress_hook) halves the bytes, and the sum of N ranks' gradients is
// N times as large as one rank's: loss-scaled gradients that each fit below
// fp16's 65504 — the scaler chose its scale so that they do — add up past it
// and round to inf. Every rank then finds the same inf in the averaged
// gradients and skips a step no rank's own gradients asked to skip. Dividing
// each gradient by the world size before the sum (PyTorch's reducer does it
// while copying into the bucket; DdpOptions::predivide_factor 0) keeps the
// sum below the largest term.
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "common.hpp"
#include "mpt/amp/grad_scaler.hpp"
#include "mpt/dist/ddp.hpp"
#include "mpt/dist/thread_world.hpp"
#include "mpt/optim/sgd.hpp"

namespace mpt::ch05 {
namespace {
namespace fp16_allreduce_overflow {

constexpr int kWorld = 4;
constexpr Eigen::Index kBatch = 512;  // 128 rows per rank
constexpr double kFp16Max = 65504;

/// The largest power of two S at which every rank's gradients, scaled by S,
/// stay below 65504: the scale a dynamic scaler settles near.
float largest_fitting_scale() {
  const Dataset batch = blobs_batch(0, kBatch);
  double largest = 0;
  for (int r = 0; r < kWorld; ++r) {
    auto net = blobs_mlp();
    SGD(net->parameters(), SgdOptions{0.05}).zero_grad();
    (void)shard_backward(*net, batch, r, kWorld, 1.0f);
    largest = std::max(largest, max_abs_finite(grads(*net)));
  }
  float s = 1;
  while (2.0 * s * largest < kFp16Max) s *= 2;
  return s;
}

dist::DdpOptions broken_options() {
  dist::DdpOptions o;
  //! [fp16-allreduce-overflow-broken]
  o.comm_dtype = DType::f16;  // half the bytes of f32
  o.predivide_factor = 1;     // sum the ranks' gradients in fp16, then divide by N: the sum overflows
  //! [fp16-allreduce-overflow-broken]
  return o;
}

dist::DdpOptions fixed_options() {
  dist::DdpOptions o;
  //! [fp16-allreduce-overflow-fixed]
  o.comm_dtype = DType::f16;
  o.predivide_factor = 0;  // 0 = the world size N: divide by N, then sum (PyTorch's order)
  //! [fp16-allreduce-overflow-fixed]
  return o;
}

RunResult run(dist::DdpOptions (*options)(), std::string setup, bool broken) {
  const float scale = largest_fitting_scale();
  const Dataset batch = blobs_batch(0, kBatch);
  std::vector<std::vector<float>> local(kWorld), reduced(kWorld);
  std::vector<double> stepped(kWorld), scale_after(kWorld);
  dist::ThreadWorld world(kWorld, 10.0);
  world.run([&](dist::Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    auto net = blobs_mlp();
    GradScaler::Options so;
    so.init_scale = scale;
    GradScaler scaler(so);
    SGD opt(net->parameters(), SgdOptions{0.05});
    dist::DdpOptions o = options();
    o.overlap = false;  // every bucket at finish_backward(): the local gradients are readable before it
    dist::DistributedDataParallel ddp(*net, comm, o);
    opt.zero_grad();
    ddp.before_forward();
    (void)shard_backward(*net, batch, comm.rank(), comm.size(), scaler.scale(1.0f));
    local[r] = grads(*net);
    ddp.finish_backward();
    reduced[r] = grads(*net);
    stepped[r] = scaler.step(opt) ? 1 : 0;
    scaler.update();
    scale_after[r] = scaler.get_scale();
  });
  double largest_local = 0, local_nonfinite = 0, exact_sum = 0, steps = 0;
  for (int r = 0; r < kWorld; ++r) {
    largest_local = std::max(largest_local, max_abs_finite(local[static_cast<std::size_t>(r)]));
    local_nonfinite += nonfinite(local[static_cast<std::size_t>(r)]);
    steps += stepped[static_cast<std::size_t>(r)];
  }
  for (std::size_t i = 0; i < local[0].size(); ++i) {
    double s = 0;
    for (int r = 0; r < kWorld; ++r) s += local[static_cast<std::size_t>(r)][i];
    exact_sum = std::max(exact_sum, std::fabs(s));
  }
  RunResult out;
  out.setup = std::move(setup);
  out.outcomes = {
      {"world", kWorld, "ranks"},
      {"loss_scale", scale, "the scale every rank's loss is multiplied by"},
      {"largest_rank_grad", largest_local,
       "the largest |scaled gradient| on any rank, before the all-reduce"},
      {"rank_grads_nonfinite", local_nonfinite, "scaled gradients that are inf/NaN on the ranks, before it"},
      {"largest_exact_sum", exact_sum, "the largest |sum over the ranks| of one gradient, in FP64"},
      {"fp16_max", kFp16Max, "fp16's largest finite value"},
      {"reduced_nonfinite", nonfinite(reduced[0]), "averaged gradients (rank 0) that are inf/NaN"},
      {"reduced_largest", max_abs_finite(reduced[0]), "the largest finite |averaged gradient| (rank 0)"},
      {"ranks_stepped", steps, "ranks whose scaler stepped"},
      {"scale_after", scale_after[0], "rank 0's scale after update()"},
  };
  const double per = out.get("largest_rank_grad"), sum = out.get("largest_exact_sum");
  out.explanation =
      broken ? "Every rank's scaled gradients are finite, the largest " + num(per) + " < 65504; but the " +
                   std::to_string(kWorld) + " ranks' gradients add up to " + num(sum) +
                   " in the largest element, past 65504, and the fp16 sum rounds it to inf: " +
                   num(out.get("reduced_nonfinite")) + " averaged gradients are inf/NaN, every rank skips (" +
                   num(steps) + " stepped) and halves its scale to " + num(out.get("scale_after")) + "."
             : "Each gradient is divided by " + std::to_string(kWorld) +
                   " before it enters the fp16 buffer, so the sum is at most the largest term (" + num(per) +
                   "): the largest averaged gradient is " + num(out.get("reduced_largest")) +
                   ", none is inf, and " + num(steps) + " of " + std::to_string(kWorld) +
                   " ranks step with the scale kept at " + num(out.get("scale_after")) + ".";
  return out;
}

RunResult broken_run() {
  return run(broken_options,
             "4 ranks, blobs MLP, 128 rows each; loss scale = the largest power of two at which every rank's "
             "gradients fit in fp16; DDP all-reduce in fp16 with predivide_factor 1 (sum, then divide)",
             true);
}

RunResult fixed_run() {
  return run(fixed_options,
             "the same, with predivide_factor 0 (= the world: divide by 4, then sum), PyTorch's order",
             false);
}

}  // namespace fp16_allreduce_overflow
}  // namespace

Pitfall fp16_allreduce_overflow_pitfall() {
  using namespace fp16_allreduce_overflow;
  return Pitfall{
      "fp16-allreduce-overflow",
      5,
      "fp16 gradient all-reduce summed before dividing: finite gradients on every rank, inf after the sum",
      "A sum of N ranks' fp16 gradients is up to N times the largest one: loss-scaled gradients that each "
      "fit below 65504 add up past it and round to inf, so every rank skips a step none of them needed to "
      "skip. Divide by the world size before the sum (PyTorch's reducer does; predivide_factor 0).",
      broken_run,
      fixed_run,
      {
          check("the averaged gradients hold inf/NaN",
                [](const RunResult& r) { return r.get("reduced_nonfinite") > 0; }),
          check("no rank steps", [](const RunResult& r) { return r.get("ranks_stepped") == 0; }),
          check("the scale backs off",
                [](const RunResult& r) { return r.get("scale_after") < r.get("loss_scale"); }),
      },
      {
          check("every averaged gradient is finite",
                [](const RunResult& r) { return r.get("reduced_nonfinite") == 0; }),
          check("every rank steps, the scale kept",
                [](const RunResult& r) {
                  return r.get("ranks_stepped") == r.get("world") &&
                         r.get("scale_after") == r.get("loss_scale");
                }),
      },
      {
          check("every rank's scaled gradients are finite and below 65504",
                [](const RunResult& r) {
                  return r.get("rank_grads_nonfinite") == 0 && r.get("largest_rank_grad") < r.get("fp16_max");
                }),
          check("the exact sum over the ranks passes 65504",
                [](const RunResult& r) { return r.get("largest_exact_sum") > r.get("fp16_max"); }),
      }};
}

}  // namespace mpt::ch05
