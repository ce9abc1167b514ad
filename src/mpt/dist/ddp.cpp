// Chapter 05 — loss scaling across ranks: DistributedDataParallel (see ddp.hpp).
// Depends on: ddp.hpp, communicator.hpp, sync_batch_norm.hpp; the nn tier (Model, Parameter,
// BatchNorm), the formats tier (storage.hpp: packing into f16/bf16).
#include "mpt/dist/ddp.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "mpt/dist/sync_batch_norm.hpp"
#include "mpt/formats/storage.hpp"
#include "mpt/nn/layers/batch_norm.hpp"

namespace mpt::dist {

// A bucket's communication buffer and its all-reduce in flight.
struct DistributedDataParallel::BucketState {
  std::vector<unsigned char> buffer;
  std::unique_ptr<PendingAllReduce> pending;
  std::size_t ready = 0;  // parameters of the bucket whose gradient is complete
};

namespace {

[[noreturn]] void bad_option(const std::string& what) { throw std::invalid_argument(what); }

// Tensor values through a float buffer (BatchNorm's estimates may be f16).
void broadcast_tensor(Communicator& comm, Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  t.to_f32(v.data());
  comm.broadcast(v.data(), v.size() * sizeof(float), 0);
  t.assign(v.data(), t.numel());  // the values came from a tensor of this dtype: exact
}

}  // namespace

std::pair<std::int64_t, std::int64_t> shard_rows(std::int64_t batch, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world)
    throw std::invalid_argument("rank " + std::to_string(rank) + " of a world of " + std::to_string(world));
  if (batch % world != 0)
    throw std::invalid_argument("a batch of " + std::to_string(batch) + " rows does not split evenly over " +
                                std::to_string(world) + " ranks; use a world size that divides it");
  const std::int64_t per = batch / world;
  return {per * rank, per * (rank + 1)};
}

DistributedDataParallel::DistributedDataParallel(Model& model, Communicator& comm, DdpOptions options)
    : model_(&model), comm_(&comm), options_(options), params_(model.parameters()) {
  if (!std::isfinite(options_.bucket_cap_mb) || options_.bucket_cap_mb <= 0)
    bad_option("bucket_cap_mb must be a finite number of MiB > 0, not " +
               std::to_string(options_.bucket_cap_mb));
  if (!std::isfinite(options_.first_bucket_cap_mb) || options_.first_bucket_cap_mb <= 0)
    bad_option("first_bucket_cap_mb must be a finite number of MiB > 0, not " +
               std::to_string(options_.first_bucket_cap_mb));
  if (options_.comm_dtype != DType::f32 && options_.comm_dtype != DType::f16 &&
      options_.comm_dtype != DType::bf16)
    bad_option("the communication dtype must be f32, f16 or bf16, not " +
               std::string(dtype_name(options_.comm_dtype)));
  if (!std::isfinite(options_.predivide_factor) || options_.predivide_factor < 0)
    bad_option("predivide_factor must be a finite number >= 0 (0: the world size), not " +
               std::to_string(options_.predivide_factor));
  if (options_.predivide_factor == 0) options_.predivide_factor = comm.size();

  // Every replica starts from rank 0's weights and buffers.
  for (Parameter* p : params_) comm.broadcast(p->master.f32_data(), p->master.bytes(), 0);
  model.refresh_model_copies();
  broadcast_buffers();
  if (options_.sync_batch_norm) sync_batch_norms(model, comm);

  // Buckets: parameters in reverse order, cut at the capacity.
  const auto elements_in = [this](double mib) {
    return static_cast<std::int64_t>(mib * 1024 * 1024 /
                                     static_cast<double>(element_bytes(options_.comm_dtype)));
  };
  const std::int64_t cap = elements_in(options_.bucket_cap_mb);
  const std::int64_t first_cap = std::min(cap, elements_in(options_.first_bucket_cap_mb));
  bucket_of_.resize(params_.size());
  for (std::size_t k = params_.size(); k-- > 0;) {
    const std::int64_t n = params_[k]->grad.numel();
    const std::int64_t limit = buckets_.size() == 1 ? first_cap : cap;
    if (buckets_.empty() || (buckets_.back().elements > 0 && buckets_.back().elements + n > limit))
      buckets_.emplace_back();
    buckets_.back().params.push_back(k);
    buckets_.back().elements += n;
    bucket_of_[k] = buckets_.size() - 1;
  }
  for (std::size_t b = 0; b < buckets_.size(); ++b) state_.push_back(std::make_unique<BucketState>());
  //! [ddp-bucket-view]
  // gradient_as_bucket_view: each gradient moves into its place in its
  // bucket's buffer (its values with it), and backward accumulates there.
  views_ = options_.gradient_as_bucket_view && options_.comm_dtype == DType::f32;
  if (views_) {
    // The pre-division rides on backward's own pass: accumulate_grad adds
    // each contribution times 1/predivide_factor, and divides what a
    // gradient held before (its "carry") at its first contribution.
    set_grad_factors(pre_factor(), pre_factor());
    home_.assign(params_.size(), nullptr);
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      std::vector<unsigned char>& buffer = state_[b]->buffer;
      buffer.resize(static_cast<std::size_t>(buckets_[b].elements) * sizeof(float));
      std::size_t at = 0;
      for (std::size_t k : buckets_[b].params) {
        home_[k] = reinterpret_cast<float*>(buffer.data()) + at;
        at += static_cast<std::size_t>(params_[k]->grad.numel());
        bring_home(k);
      }
    }
  }
  //! [ddp-bucket-view]
  expected_.assign(params_.size(), 0);
  seen_.assign(params_.size(), 0);
  for (std::size_t k = 0; k < params_.size(); ++k)
    params_[k]->grad_hook = [this, k](Parameter&) { on_grad(k); };
}

DistributedDataParallel::~DistributedDataParallel() {
  for (Parameter* p : params_) p->grad_hook = nullptr;
  if (options_.sync_batch_norm) unsync_batch_norms(*model_);
  for (auto& s : state_)
    if (s->pending) s->pending->wait();
  // The buffers go with this object: every gradient gets one of its own.
  if (views_)
    for (Parameter* p : params_) {
      p->grad = p->grad.clone();
      p->grad_factor = p->grad_carry = 1.0f;
    }
}

float DistributedDataParallel::pre_factor() const {
  return static_cast<float>(1.0 / options_.predivide_factor);
}

void DistributedDataParallel::set_grad_factors(float factor, float carry) {
  for (Parameter* p : params_) {
    p->grad_factor = factor;
    p->grad_carry = carry;
  }
}

void DistributedDataParallel::set_sync(bool on) {
  sync_ = on;
  if (!views_) return;
  // Inside no_sync() the local sums build up undivided (PyTorch's p.grad
  // there); the synchronised backward after it divides them at each
  // gradient's first contribution.
  if (on) set_grad_factors(pre_factor(), pre_factor());
  else set_grad_factors(1.0f, 1.0f);
}

void DistributedDataParallel::bring_home(std::size_t k) {
  Tensor& g = params_[k]->grad;
  if (g.raw() == home_[k]) return;
  const std::int64_t n = params_[k]->master.numel();
  if (g.dtype() != DType::f32 || g.numel() != n)
    throw std::logic_error(params_[k]->name + ": its gradient became " + std::string(dtype_name(g.dtype())) +
                           " with " + std::to_string(g.numel()) + " elements; DDP needs f32 with " +
                           std::to_string(n) + ", one per master weight");
  if (g.numel() > 0) std::memcpy(home_[k], g.f32_data(), static_cast<std::size_t>(n) * sizeof(float));
  g = Tensor::borrowing(home_[k], g.shape(), DType::f32);
}

void DistributedDataParallel::broadcast_buffers() {
  if (!options_.broadcast_buffers || comm_->size() == 1) return;
  for (const std::string& path : model_->paths()) {
    auto* bn = dynamic_cast<BatchNorm*>(model_->find(path));
    if (bn == nullptr) continue;
    if (bn->running_mean.numel() > 0) broadcast_tensor(*comm_, bn->running_mean);
    if (bn->running_var.numel() > 0) broadcast_tensor(*comm_, bn->running_var);
    comm_->broadcast(&bn->num_batches_tracked, sizeof bn->num_batches_tracked, 0);
  }
}

void DistributedDataParallel::before_forward() { broadcast_buffers(); }

void DistributedDataParallel::on_grad(std::size_t k) {
  if (!sync_) return;
  ++seen_[k];
  for (std::size_t b = 0; b < next_bucket_; ++b)  // let the started all-reduces move on
    if (state_[b]->pending) (void)state_[b]->pending->progress();
  if (!learned_ || !options_.overlap) return;
  if (seen_[k] > expected_[k])
    throw std::logic_error(params_[k]->name + " received " + std::to_string(seen_[k]) +
                           " gradient contributions in one backward; the first backward gave it " +
                           std::to_string(expected_[k]));
  //! [ddp-bucket-ready]
  if (seen_[k] < expected_[k]) return;
  BucketState& s = *state_[bucket_of_[k]];
  ++s.ready;
  // Start every bucket that is complete, in order: bucket i only after i-1.
  while (next_bucket_ < buckets_.size() &&
         state_[next_bucket_]->ready == buckets_[next_bucket_].params.size()) {
    start(next_bucket_, /*in_backward=*/true);
    ++current_.buckets_started_in_backward;
    ++next_bucket_;
  }
  //! [ddp-bucket-ready]
}

//! [ddp-predivide]
// The gradients into bucket b, each multiplied by pre = 1/predivide_factor:
// f16/bf16 communication (or gradient_as_bucket_view off).
void DistributedDataParallel::copy_in(std::size_t b, float pre) {
  const Bucket& bucket = buckets_[b];
  BucketState& s = *state_[b];
  const DType d = options_.comm_dtype;
  const std::size_t eb = element_bytes(d);
  s.buffer.resize(static_cast<std::size_t>(bucket.elements) * eb);
  std::vector<float> scratch;
  std::size_t at = 0;
  for (std::size_t k : bucket.params) {
    const Tensor& g = params_[k]->grad;
    const auto n = static_cast<std::size_t>(g.numel());
    unsigned char* out = s.buffer.data() + at * eb;
    const float* in = g.f32_data();
    if (d == DType::f32) {  // one pass: scaled while copied, as PyTorch's reducer
      auto* o = reinterpret_cast<float*>(out);
      if (pre != 1.0f)
        for (std::size_t i = 0; i < n; ++i) o[i] = in[i] * pre;
      else std::memcpy(o, in, n * sizeof(float));
    } else {
      if (pre != 1.0f) {
        scratch.resize(n);
        for (std::size_t i = 0; i < n; ++i) scratch[i] = in[i] * pre;
        in = scratch.data();
      }
      if (d == DType::f16) to_fp16(in, reinterpret_cast<Eigen::half*>(out), n);
      else to_bf16(in, reinterpret_cast<Eigen::bfloat16*>(out), n);
    }
    at += n;
  }
}
//! [ddp-predivide]

void DistributedDataParallel::start(std::size_t b, bool in_backward) {
  const Bucket& bucket = buckets_[b];
  BucketState& s = *state_[b];
  const DType d = options_.comm_dtype;
  if (views_) {  // the gradients are the bucket, already divided by accumulate_grad
    for (std::size_t k : bucket.params) {
      bring_home(k);
      Parameter& p = *params_[k];
      if (p.grad_carry != 1.0f) {  // no contribution in this backward: divided here
        float* v = home_[k];
        for (std::int64_t i = 0; i < p.grad.numel(); ++i) v[i] *= p.grad_carry;
        p.grad_carry = 1.0f;
      }
    }
  } else {
    copy_in(b, static_cast<float>(1.0 / options_.predivide_factor));
  }
  current_.bytes += static_cast<std::int64_t>(s.buffer.size());
  if (options_.fixed_order) {
    all_reduce_fixed_order(*comm_, s.buffer.data(), bucket.elements, d, ReduceOp::sum);
  } else if (in_backward) {
    s.pending = comm_->start_all_reduce(s.buffer.data(), bucket.elements, d, ReduceOp::sum);
  } else {  // nothing left to overlap with: the blocking call, an engine's fastest
    comm_->all_reduce(s.buffer.data(), bucket.elements, d, ReduceOp::sum);
  }
}

void DistributedDataParallel::finish_backward() {
  if (!sync_) return;
  if (!learned_) {
    expected_ = seen_;
    learned_ = true;
  }
  for (std::size_t k = 0; k < params_.size(); ++k)
    if (seen_[k] != expected_[k])
      throw std::logic_error(params_[k]->name + " received " + std::to_string(seen_[k]) +
                             " gradient contributions in this backward, " + std::to_string(expected_[k]) +
                             " in the first; every backward must reach the same parameters");
  for (; next_bucket_ < buckets_.size(); ++next_bucket_) {
    start(next_bucket_, /*in_backward=*/false);
    ++current_.buckets_started_at_finish;
  }
  const DType d = options_.comm_dtype;
  const std::size_t eb = element_bytes(d);
  const auto post = static_cast<float>(options_.predivide_factor / comm_->size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    BucketState& s = *state_[b];
    if (s.pending) s.pending->wait();
    s.pending.reset();
    if (views_) {  // the averages are already where the gradients are
      if (post != 1.0f) {
        auto* v = reinterpret_cast<float*>(s.buffer.data());
        for (std::int64_t i = 0; i < buckets_[b].elements; ++i) v[i] *= post;
      }
      for (std::size_t k : buckets_[b].params) {  // one replaced since start(): the average, as a copy would
        Parameter& p = *params_[k];
        if (p.grad.raw() != home_[k]) p.grad = Tensor::borrowing(home_[k], p.master.shape(), DType::f32);
      }
      s.ready = 0;
      continue;
    }
    std::size_t at = 0;
    for (std::size_t k : buckets_[b].params) {
      Tensor& g = params_[k]->grad;
      const auto n = static_cast<std::size_t>(g.numel());
      float* out = g.f32_data();
      const unsigned char* in = s.buffer.data() + at * eb;
      if (d == DType::f32 && post != 1.0f) {  // one pass
        const auto* f = reinterpret_cast<const float*>(in);
        for (std::size_t i = 0; i < n; ++i) out[i] = f[i] * post;
      } else {
        if (d == DType::f32) std::memcpy(out, in, n * sizeof(float));
        else if (d == DType::f16) from_fp16(reinterpret_cast<const Eigen::half*>(in), out, n);
        else from_bf16(reinterpret_cast<const Eigen::bfloat16*>(in), out, n);
        if (post != 1.0f)
          for (std::size_t i = 0; i < n; ++i) out[i] *= post;
      }
      at += n;
    }
    s.ready = 0;
  }
  std::fill(seen_.begin(), seen_.end(), 0);
  next_bucket_ = 0;
  // The averages are what the next backward adds to (unless zero_grad()
  // clears them): its first contribution divides them, as a copy would.
  if (views_) set_grad_factors(pre_factor(), pre_factor());
  stats_ = current_;
  current_ = {};
}

}  // namespace mpt::dist
