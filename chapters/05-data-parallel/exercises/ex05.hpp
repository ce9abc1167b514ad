// Chapter 05 — exercises: the adapter header, the student's specification.
// Depends on: the dist tier (mpt/dist/communicator.hpp: the Communicator
// every exercise talks through; mpt/dist/ddp.hpp and sharded.hpp for 5.3's
// given loop), the amp tier (GradScaler's found-inf seam for 5.2), the nn
// tier (5.3's model).
// The grader includes this file and calls exactly these functions; the
// student writes them in ex05.cpp. Changing a signature breaks the grader.
// The grader runs under `mpiexec -n 2` (and once with 4 ranks): every rank
// calls the same function with its own data, and every collective call a
// function makes must be made by every rank, in the same order.
#pragma once

#include <vector>

#include "mpt/amp/grad_scaler.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/dist/communicator.hpp"
#include "mpt/nn/model.hpp"

/// Chapter 5 exercises: the averaging all-reduce with pre-division, the
/// found-inf flag sync of a sharded scaler, and a broken data-parallel
/// training loop to diagnose and fix.
namespace mpt::ex05 {

/// Exercise 5.1 — the average over ranks of every rank's gradients, as
/// DistributedDataParallel computes it (src/mpt/dist/ddp.hpp, DdpOptions).
///
/// `grads` holds this rank's FP32 gradient buffers (any number, any sizes,
/// the same sizes on every rank). On return every buffer holds, on every
/// rank, the elementwise average of all ranks' buffers, computed this way:
///  1. pack: every buffer, in order, into one communication buffer in
///     `comm_dtype` (f32, f16 or bf16: mpt's to_fp16/to_bf16 round to
///     nearest-even), each value multiplied by 1/f first (in float);
///  2. one all-reduce (ReduceOp::sum) of the packed buffer in `comm_dtype`;
///  3. unpack back into the FP32 buffers, each value multiplied by f/world
///     (in float) after decoding.
/// f is `predivide_factor`; 0 (the default) means the world size, so the sum
/// of N ranks' values never exceeds the largest of them (PyTorch's reducer
/// divides by the world while copying into its buckets). f = 1 sums first
/// and divides after (apex's gradient_predivide_factor = 1): in f16 a sum of
/// two 40000s is already inf, while f = world gives 40000 back.
/// Graded against DistributedDataParallel's own reduction of the same
/// gradients (bit for bit on 2 ranks); a multiplication by 1 may be skipped.
///
/// Bad input throws std::invalid_argument with one line naming the value
/// and what is valid, before any communication: a comm_dtype other than
/// f32, f16 or bf16; a predivide_factor that is negative, inf or NaN.
void average_gradients(mpt::dist::Communicator& comm, std::vector<std::vector<float>>& grads,
                       mpt::DType comm_dtype, double predivide_factor = 0);

/// Exercise 5.2 — the found-inf flag of a sharded scaler, across ranks.
///
/// found_inf_across(): true on every rank if any element of any rank's
/// `grads_here` is +inf, −inf or NaN; false on every rank otherwise. Every
/// rank joins the same one collective, also a rank whose list is empty (a
/// rank that owns no parameters). "Any rank skips, so every rank skips":
/// ranks that disagree would step different shards and then wait for
/// each other's broadcasts.
bool found_inf_across(mpt::dist::Communicator& comm, const std::vector<std::vector<float>>& grads_here);

/// found_inf_seam(): the function GradScaler::set_found_inf_reduction takes
/// (src/mpt/amp/grad_scaler.hpp): given what this rank's unscale found, it
/// returns the verdict of all ranks — true on every rank as soon as one
/// rank found an inf or NaN. `comm` outlives the function returned. With it
/// a GradScaler skips step() on every rank or on none, and every rank's
/// scale stays the same.
mpt::GradScaler::FoundInfReduction found_inf_seam(mpt::dist::Communicator& comm);

/// Exercise 5.3 (diagnose) — a data-parallel training loop with one bug.
///
/// Trains `net` (every rank holds a replica with the same initial weights)
/// for `steps` steps on the blobs set (mpt::make_blobs(), batches of 64 rows
/// shuffled with seed 1234): DDP, a ZeRO-1 ShardedOptimizer over SGD
/// (lr 0.05, momentum 0.9), a ShardedGradScaler of PyTorch's defaults; each
/// step accumulates `micro_batches` batches (this rank's 64/N rows of each,
/// the backward from scale × 1/micro_batches; all but the last inside
/// no_sync()). Afterwards every rank's replica must equal the others' and
/// the weights one process gets from the same steps on whole batches
/// (within rounding). The given body runs, and does not: find the bug and
/// fix it; the fix is small.
void train_data_parallel(mpt::dist::Communicator& comm, mpt::Model& net, int steps, int micro_batches);

}  // namespace mpt::ex05
