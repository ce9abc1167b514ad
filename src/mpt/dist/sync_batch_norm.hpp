// Chapter 05 — loss scaling across ranks: SyncBatchNorm.
// Depends on: communicator.hpp; the nn tier (Model, BatchNorm and its
// statistics-reduction seam, welford.hpp's Chan merge).
//
// With data parallelism each rank's BatchNorm sees only its shard: B/N rows
// of statistics instead of B, so the normalization (and the running
// estimates) depend on the world size. PyTorch's SyncBatchNorm
// (torch/nn/modules/_functions.py, see batch_norm.cpp) computes the
// statistics of the whole batch instead: each rank's (count, mean, M2) per
// channel is all-gathered and merged, and in backward the two per-channel
// sums dx needs are all-reduced. Here both go through BatchNorm's seam
// (BatchNorm::set_statistics_reduction): the nn tier calls two functions and
// this tier makes them collectives. The merge is Chan's (welford_merge, on
// the layers' double statistics) in rank order, and the sums are all_reduce_fixed_order: every rank
// computes the same operations on the same gathered bytes, so every rank
// normalizes with identical bits, whatever the engine.
#pragma once

#include <cstddef>
#include <vector>

#include "mpt/dist/communicator.hpp"
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/layers/norm_math.hpp"
#include "mpt/nn/layers/welford.hpp"
#include "mpt/nn/model.hpp"

namespace mpt::dist {

/// Rank 0's statistics merged with rank 1's, then rank 2's, ...:
/// gathered[r·channels + c] is rank r's channel c. What every rank computes
/// from the all-gather, so every rank gets the same bits. Throws
/// std::invalid_argument unless gathered.size() == world·channels.
std::vector<norm_math::Statistics> merge_in_rank_order(const std::vector<norm_math::Statistics>& gathered,
                                                       int world, std::size_t channels);

/// Make `bn` a SyncBatchNorm over `comm`: its training-mode statistics are
/// all-gathered and merged (merge_in_rank_order), its backward's Σdy and
/// Σdy·x̂ all-reduced in rank order. comm must outlive the reduction (or
/// clear it: BatchNorm::clear_statistics_reduction).
void sync_batch_norm(BatchNorm& bn, Communicator& comm);

/// sync_batch_norm() on every BatchNorm of `model`; returns how many there
/// are (0: nothing to synchronise).
int sync_batch_norms(Model& model, Communicator& comm);

/// Every BatchNorm of `model` back to its rank's own statistics.
void unsync_batch_norms(Model& model);

}  // namespace mpt::dist
