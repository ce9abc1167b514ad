// Chapters 07 onwards — one training run (see run.hpp): Chapter 4's runs,
// data-parallel over ranks since Chapter 5, with FP8 Linear layers since
// Chapter 7 (which is why this file is tagged 07).
// Depends on: run.hpp, checkpoint.hpp; the nn tier (the model factory,
// TinyTransformer, BatchNorm, the data sets, the losses), the optim tier
// (SGD, AdamW), the amp tier (GradScaler, StaticScaler), the dist tier
// (DistributedDataParallel, ShardedOptimizer, the found-inf reduction), the fp8
// tier (the Linear layers' scaling state under fp8:RECIPE) and fp8_parallel.hpp
// (its amaxes reduced across the ranks), the formats tier
// (shortest_decimal), the core tier (Policy, the policy string, Rng).
#include "mpt/train/run.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <utility>

#include "mpt/amp/grad_scaler.hpp"
#include "mpt/core/context.hpp"
#include "mpt/core/dtype.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/dist/communicator.hpp"
#include "mpt/dist/ddp.hpp"
#include "mpt/dist/sharded.hpp"
#include "mpt/formats/explain.hpp"
#include "mpt/fp8/linear_scaling.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/data/text_data.hpp"
#include "mpt/nn/layers/batch_norm.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/layers/softmax.hpp"
#include "mpt/nn/models/model_factory.hpp"
#include "mpt/nn/models/transformer.hpp"
#include "mpt/optim/adamw.hpp"
#include "mpt/optim/sgd.hpp"
#include "mpt/train/fp8_parallel.hpp"

namespace mpt::train {

namespace {

[[noreturn]] void bad_config(const std::string& what) { throw std::invalid_argument(what); }

constexpr Eigen::Index kBatch = 64;         // mlp and cnn rows per step (Chapters 2 and 3)
constexpr std::uint64_t kBatchSeed = 1234;  // Chapter 2's batch order seed
constexpr int kTextBatch = 16;              // Chapter 4's windows per step
constexpr int kTextEvalBatches = 4;         // its validation batches

// --- the data sets, once per process ---------------------------------------------

const Split& blobs_split() {
  static const Split s = [] {
    BlobsOptions o;
    o.samples = 1024;
    return train_test_split(make_blobs(o), 0.25, 5);
  }();
  return s;
}
const Split& digits_split() {
  static const Split s = train_test_split(load_digits(), 0.25, 5);
  return s;
}
const TextCorpus& corpus() {
  static const TextCorpus c = load_common_licenses();
  return c;
}

// --- the scaler ------------------------------------------------------------------

std::string canonical_scaler(const std::string& s) {
  if (s == "dynamic" || s == "none") return s;
  if (s.rfind("static:", 0) == 0) {
    const std::string num = s.substr(7);
    char* end = nullptr;
    const float v = num.empty() ? 0.0f : std::strtof(num.c_str(), &end);
    if (num.empty() || end != num.c_str() + num.size() || !std::isfinite(v) || !(v > 0.0f))
      bad_config("scaler '" + s + "': the static scale must be a finite number > 0 (e.g. static:1024)");
    return "static:" + shortest_decimal(v);
  }
  bad_config("scaler '" + s + "' is not one of dynamic, static:S (S a finite number > 0), none");
}

float static_scale_of(const std::string& canonical) { return std::strtof(canonical.c_str() + 7, nullptr); }

// --- names in messages -------------------------------------------------------------

std::string lr_text(double lr) { return shortest_decimal(lr); }

}  // namespace

std::string canonical_policy(const std::string& text) { return parse_policy_string(text).text(); }

RunConfig resolve_config(RunConfig c) {
  if (c.model != "mlp" && c.model != "cnn" && c.model != "transformer")
    bad_config("model '" + c.model + "' is not one of mlp, cnn, transformer");
  const std::string first_data = c.model == "mlp" ? "synthetic" : c.model == "cnn" ? "digits" : "text";
  if (c.data.empty()) c.data = first_data;
  const bool pair_ok =
      c.model == "mlp" ? (c.data == "synthetic" || c.data == "digits") : c.data == first_data;
  if (!pair_ok) {
    if (c.data != "synthetic" && c.data != "digits" && c.data != "text")
      bad_config("data '" + c.data + "' is not one of synthetic, digits, text");
    bad_config("model " + c.model + " does not train on data " + c.data +
               "; the pairs are mlp with synthetic or digits, cnn with digits, transformer with text");
  }
  const PolicySpec spec = parse_policy_string(c.policy);
  c.policy = spec.text();
  // A preset that names its scaler (apex's loss_scale, Keras's
  // LossScaleOptimizer) gives it when none is asked for; an explicit scaler
  // overrides it, as apex's loss_scale= override does.
  if (c.scaler.empty()) c.scaler = spec.needs().scaler;
  if (c.scaler.empty())
    bad_config("no scaler: the policy " + c.policy +
               " names none; give one of dynamic, static:S (S a finite number > 0), none");
  c.scaler = canonical_scaler(c.scaler);
  if (c.optimizer.empty()) c.optimizer = c.model == "transformer" ? "adamw" : "sgd";
  if (c.optimizer != "sgd" && c.optimizer != "adamw")
    bad_config("optimizer '" + c.optimizer + "' is not one of sgd, adamw");
  if (c.lr == 0) c.lr = c.optimizer == "sgd" ? 0.05 : 3e-3;
  if (!std::isfinite(c.lr) || c.lr <= 0) bad_config("lr " + lr_text(c.lr) + " is not a finite number > 0");
  if (!c.seed) c.seed = c.model == "mlp" ? 7 : c.model == "cnn" ? 3 : 1;
  if (c.steps < 1) bad_config("steps " + std::to_string(c.steps) + " is not a whole number >= 1");
  if (c.every < 0)
    bad_config("every " + std::to_string(c.every) + " is not a whole number >= 1 (or 0: never)");
  return c;
}

void check_resumable(const RunConfig& wanted, const RunConfig& saved) {
  if (const auto d = configuration_difference(saved, wanted))
    bad_config("the checkpoint was made with " + d->field + " " + d->theirs + " but this run has " +
               d->field + " " + d->ours + "; run with the checkpoint's " + d->field +
               ", or pick another checkpoint with --resume-from PATH");
}

// --- the run ---------------------------------------------------------------------

struct TrainRun::Impl {
  RunConfig config;
  std::unique_ptr<Model> net;
  TinyTransformer* lm = nullptr;  // net, when it is the Transformer
  // The optimizer: owned_optimizer over every parameter, or (sharded) the
  // local one inside `zero`; sgd_local/adamw_local point at whichever it is.
  std::unique_ptr<Optimizer> owned_optimizer;
  SGD* sgd_local = nullptr;
  AdamW* adamw_local = nullptr;
  Optimizer* opt = nullptr;
  GradScaler dynamic{GradScaler::Options{}};
  std::optional<StaticScaler> fixed;
  const Split* split = nullptr;
  std::optional<Batches> batches;
  TextSplit text{};
  Rng windows{0};
  std::vector<StepRecord> history;
  std::vector<std::pair<std::string, BatchNorm*>> norms;
  // Data parallelism (Chapter 5): the ranks, DDP, and with a sharded
  // optimizer the ShardedOptimizer whose local optimizer sgd/adamw then are.
  DataParallel parallel;
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  std::unique_ptr<dist::ShardedOptimizer> zero;
  std::vector<std::size_t> local_index;  // per parameter: its index in the local optimizer (sharded)
  // Chapter 7: under fp8:RECIPE, every Linear's scaling state (null otherwise).
  std::unique_ptr<fp8::Fp8Training> fp8;
  std::vector<float> step_amaxes;  // this rank's pending amaxes of the last step, before any reduction

  int rank() const { return parallel.comm ? parallel.comm->rank() : 0; }
  int world() const { return parallel.comm ? parallel.comm->size() : 1; }

  Impl(const RunConfig& c, const DataParallel& dp) : config(resolve_config(c)), parallel(dp) {
    const std::shared_ptr<const Policy> policy = parse_policy_string(config.policy).make();
    const std::uint64_t seed = *config.seed;
    ModelSpec model;
    model.name = config.model;
    model.policy = policy;
    model.seed = seed;
    if (config.model == "mlp") {
      split = config.data == "digits" ? &digits_split() : &blobs_split();
      model.mlp_sizes =
          config.data == "digits" ? std::vector<int>{64, 32, 32, 10} : std::vector<int>{8, 32, 32, 4};
    } else if (config.model == "cnn") {
      split = &digits_split();
    } else {
      model.vocab_size = corpus().vocab_size();
      text = split_text(corpus().tokens().size());
      windows = Rng(seed);
    }
    net = make_model(model);
    lm = dynamic_cast<TinyTransformer*>(net.get());
    // Chapter 6: every pattern must select something, and a preset without
    // master weights (apex O3, jmp params below f32) trains without them.
    const PolicySpec spec = parse_policy_string(config.policy);
    std::vector<std::string> paths = net->paths();
    paths.emplace_back("loss");  // where the run's loss asks
    check_patterns_select(spec, paths);
    if (!spec.needs().master_weights) net->set_master_weights(MasterWeights::none);
    fp8 = fp8::attach_fp8(*net, config.policy);
    if (split != nullptr) batches.emplace(split->train, kBatch, kBatchSeed);
    if (parallel.comm != nullptr) {
      const std::int64_t rows = lm != nullptr ? kTextBatch : kBatch;
      (void)dist::shard_rows(rows, rank(), world());  // N must divide the batch
      dist::DdpOptions o;
      o.bucket_cap_mb = parallel.bucket_mb;
      o.comm_dtype = parallel.comm_dtype;
      o.fixed_order = parallel.fixed_order;
      o.sync_batch_norm = parallel.sync_bn;
      if (parallel.sync_bn && config.model != "cnn")
        bad_config("sync_bn: the " + config.model + " model has no BatchNorm; SyncBatchNorm is for the cnn");
      ddp = std::make_unique<dist::DistributedDataParallel>(*net, *parallel.comm, o);
    } else if (parallel.shard_optimizer) {
      bad_config("a sharded optimizer needs the ranks of a data-parallel run");
    } else if (parallel.sync_bn) {
      bad_config("sync_bn needs the ranks of a data-parallel run");
    }
    // The optimizer over `params`: all of them, or this rank's shard.
    const auto make_optimizer = [this](std::vector<Parameter*> params) -> std::unique_ptr<Optimizer> {
      if (config.optimizer == "sgd") {
        SgdOptions o;
        o.lr = config.lr;
        o.momentum = 0.9;
        auto made = std::make_unique<SGD>(std::move(params), o);
        sgd_local = made.get();
        return made;
      }
      AdamWOptions o;
      o.lr = config.lr;
      o.weight_decay = 0.0;
      auto made = std::make_unique<AdamW>(std::move(params), o);
      adamw_local = made.get();
      return made;
    };
    if (parallel.shard_optimizer) {
      zero = std::make_unique<dist::ShardedOptimizer>(net->parameters(), *parallel.comm, make_optimizer);
      opt = zero.get();
      std::size_t next = 0;
      for (int owner : zero->owners()) local_index.push_back(owner == rank() ? next++ : SIZE_MAX);
    } else {
      owned_optimizer = make_optimizer(net->parameters());
      opt = owned_optimizer.get();
    }
    GradScaler::Options so;
    so.enabled = config.scaler == "dynamic";
    dynamic = GradScaler(so);
    if (zero) dynamic.set_found_inf_reduction(dist::found_inf_across(*parallel.comm));
    if (config.scaler.rfind("static:", 0) == 0) fixed.emplace(static_scale_of(config.scaler));
    for (const std::string& p : net->paths())
      if (auto* bn = dynamic_cast<BatchNorm*>(net->find(p))) norms.emplace_back(p, bn);
  }

  float scale() const { return fixed ? fixed->get_scale() : dynamic.get_scale(); }

  StepRecord step() {
    StepRecord r;
    r.step = static_cast<std::int64_t>(history.size()) + 1;
    r.scale = scale();
    if (parallel.comm != nullptr) parallel.comm->set_tag(r.step);
    if (ddp) ddp->before_forward();
    Tensor dlogits;
    if (lm != nullptr) {
      TokenBatch b = sample_windows(corpus().tokens(), text.train_begin, text.train_end, kTextBatch,
                                    lm->config().context, windows);
      if (ddp) {  // this rank's windows of the global batch
        const auto [lo, hi] = dist::shard_rows(b.batch, rank(), world());
        const auto from = static_cast<std::ptrdiff_t>(lo * b.context),
                   to = static_cast<std::ptrdiff_t>(hi * b.context);
        b.inputs = std::vector<int>(b.inputs.begin() + from, b.inputs.begin() + to);
        b.targets = std::vector<int>(b.targets.begin() + from, b.targets.begin() + to);
        b.batch = static_cast<int>(hi - lo);
      }
      const Tensor& logits = lm->forward_tokens(b.inputs, b.batch, b.context);
      r.loss = cross_entropy(logits, b.targets, {}, lm->context()).value(0);
      Tensor dl(DType::f32, {});
      dl.f32_data()[0] = r.scale;
      dlogits = cross_entropy_backward(logits, b.targets, {}, dl, lm->context());
    } else {
      Dataset b = batches->next();
      if (ddp) {  // this rank's rows of the global batch
        const auto [lo, hi] = dist::shard_rows(b.size(), rank(), world());
        b = b.slice(lo, hi - lo);
      }
      // The loss is an op of the model's Context, as the Transformer's is:
      // the policy decides what it reads, and a trace sees it.
      const Tensor& out = net->forward(b.x);
      r.loss = cross_entropy_loss(out, b.labels, net->context());
      dlogits = cross_entropy_backward(out, b.labels, r.scale, net->context());
    }
    if (fixed) (void)fixed->scale(r.loss);
    else (void)dynamic.scale(r.loss);
    opt->zero_grad();
    net->backward(dlogits);
    if (ddp) {
      ddp->finish_backward();  // every grad: the average over the ranks
      // The loss reported is the global batch's: the mean of the shards' means.
      float mean = r.loss / static_cast<float>(world());
      parallel.comm->all_reduce(&mean, 1, DType::f32, dist::ReduceOp::sum);
      r.loss = mean;
    }
    // Chapter 7: every delayed scale updated from this step's amaxes, as
    // Transformer Engine does after each pass (the step's own quantizations
    // used the scales of earlier steps).
    // Under data parallelism the ranks first agree on the amaxes (the max
    // over the ranks, as Transformer Engine's reduce_amax), so that every
    // rank's update gives the same histories and scales (fp8_parallel.hpp).
    if (fp8) {
      step_amaxes = fp8->pending_amaxes();
      if (parallel.comm != nullptr) reduce_fp8_amaxes(*fp8, *parallel.comm);
      fp8->update();
    }
    bool stepped = true;
    if (fixed) {
      stepped = fixed->step(*opt);
      fixed->update();
    } else {
      stepped = dynamic.step(*opt);
      dynamic.update();
    }
    if (zero) zero->gather_masters();  // every rank, stepped or not
    net->refresh_model_copies();
    r.skipped = !stepped;
    history.push_back(r);
    return r;
  }

  // Every parameter's optimizer state `get(local index)` as flat values, in
  // parameter order: this rank's own, or (sharded) broadcast from each
  // parameter's owner. Collective when sharded.
  std::vector<std::vector<float>> full_state(const std::function<MatrixF(std::size_t)>& get) const {
    const std::vector<Parameter*> params = net->parameters();
    std::vector<std::vector<float>> out;
    for (std::size_t k = 0; k < params.size(); ++k) {
      std::vector<float> v(static_cast<std::size_t>(params[k]->master.numel()));
      if (!zero || zero->owners()[k] == rank()) {
        const MatrixF m = get(zero ? local_index[k] : k);
        std::copy(m.data(), m.data() + m.size(), v.begin());
      }
      if (zero) parallel.comm->broadcast(v.data(), v.size() * sizeof(float), zero->owners()[k]);
      out.push_back(std::move(v));
    }
    return out;
  }

  // The entries of a per-parameter list that this rank's optimizer holds:
  // all of them, or (sharded) the owned ones, in order.
  std::vector<MatrixF> owned(std::vector<MatrixF> all) const {
    if (!zero || all.empty()) return all;
    std::vector<MatrixF> mine;
    for (std::size_t k = 0; k < all.size(); ++k)
      if (zero->owners()[k] == rank()) mine.push_back(std::move(all[k]));
    return mine;
  }

  // Whether SGD's momentum buffers exist (they do after its first step); on
  // every rank alike when sharded (a rank may own no parameter).
  bool have_momentum() const {
    if (sgd_local == nullptr) return false;
    float have = sgd_local->momentum_buffers().empty() ? 0.0f : 1.0f;
    if (zero) parallel.comm->all_reduce(&have, 1, DType::f32, dist::ReduceOp::max);
    return have != 0.0f;
  }

  // Chapter 7: each delayed scaling state as two named tensors,
  // "fp8.amax_history/<path>.<role>" and "fp8.scale/<path>.<role>", layer
  // by layer in visit() order, roles in kFp8Roles order (none for current
  // scaling, which keeps no state between steps).
  std::vector<TensorRecord> fp8_records() const {
    std::vector<TensorRecord> out;
    if (!fp8 || fp8->options().recipe != fp8::LinearRecipe::delayed) return out;
    for (const fp8::Fp8Training::Layer& l : fp8->layers())
      for (const Fp8Role r : fp8::kFp8Roles) {
        const fp8::DelayedScaling& s = l.fp8->state(r);
        const std::string name = l.path + "." + fp8_role_name(r);
        const auto len = static_cast<std::int64_t>(s.amax_history().size());
        out.push_back({"fp8.amax_history/" + name, {len}, s.amax_history()});
        out.push_back({"fp8.scale/" + name, {1}, {s.scale()}});
      }
    return out;
  }

  // The tensors and counters of a checkpoint, in order (momentum: whether
  // SGD's buffers are included).
  Checkpoint snapshot() const {
    Checkpoint c;
    c.config = config;
    c.step = static_cast<std::int64_t>(history.size());
    const auto add = [&c](const std::string& name, const Tensor& t) {
      TensorRecord r{name, t.shape(), std::vector<float>(static_cast<std::size_t>(t.numel()))};
      t.to_f32(r.values.data());
      c.tensors.push_back(std::move(r));
    };
    const std::vector<Parameter*> params = net->parameters();
    for (const Parameter* p : params) add("master/" + p->name, p->master);
    for (const auto& [path, bn] : norms) {
      if (bn->running_mean.numel() > 0) add("running_mean/" + path, bn->running_mean);
      if (bn->running_var.numel() > 0) add("running_var/" + path, bn->running_var);
      c.counters.emplace_back("num_batches_tracked/" + path, bn->num_batches_tracked);
    }
    for (const TensorRecord& t : fp8_records()) c.tensors.push_back(t);
    if (have_momentum()) {
      const auto m = full_state([this](std::size_t i) { return sgd_local->momentum_buffers()[i]; });
      for (std::size_t i = 0; i < params.size(); ++i)
        c.tensors.push_back({"sgd.momentum/" + params[i]->name, params[i]->master.shape(), m[i]});
    }
    if (adamw_local != nullptr) {
      const auto m = full_state([this](std::size_t i) { return adamw_local->exp_avg(i); });
      for (std::size_t i = 0; i < params.size(); ++i)
        c.tensors.push_back({"adamw.m/" + params[i]->name, params[i]->master.shape(), m[i]});
      const auto v = full_state([this](std::size_t i) { return adamw_local->exp_avg_sq(i); });
      for (std::size_t i = 0; i < params.size(); ++i)
        c.tensors.push_back({"adamw.v/" + params[i]->name, params[i]->master.shape(), v[i]});
      c.counters.emplace_back("adamw.steps", adamw_local->step_count());
    }
    c.scaler_state = dynamic.state_dict();
    if (batches) {
      c.data_epoch = batches->epoch();
      c.data_position = static_cast<std::int64_t>(batches->position());
    }
    if (lm != nullptr) c.rngs.push_back(windows.state());
    c.history = history;
    return c;
  }

  void restore(const Checkpoint& c) {
    check_resumable(config, c.config);
    // The layout this run would write, with SGD's buffers when the checkpoint has them.
    const Checkpoint mine = snapshot();
    std::vector<const TensorRecord*> want;
    for (const TensorRecord& t : mine.tensors) want.push_back(&t);
    const std::vector<Parameter*> params = net->parameters();
    std::vector<TensorRecord> momentum_layout;
    const bool has_momentum = std::any_of(c.tensors.begin(), c.tensors.end(), [](const TensorRecord& t) {
      return t.name.rfind("sgd.momentum/", 0) == 0;
    });
    const bool mine_momentum =
        std::any_of(mine.tensors.begin(), mine.tensors.end(),
                    [](const TensorRecord& t) { return t.name.rfind("sgd.momentum/", 0) == 0; });
    if (sgd_local && has_momentum && !mine_momentum)
      for (const Parameter* p : params)
        momentum_layout.push_back({"sgd.momentum/" + p->name, p->master.shape(), {}});
    for (const TensorRecord& t : momentum_layout) want.push_back(&t);
    if (sgd_local && !has_momentum && mine_momentum) want.resize(want.size() - params.size());
    if (c.tensors.size() != want.size())
      bad_config("the checkpoint holds " + std::to_string(c.tensors.size()) + " tensors, this " +
                 config.model + " run has " + std::to_string(want.size()));
    for (std::size_t i = 0; i < want.size(); ++i) {
      if (c.tensors[i].name != want[i]->name)
        bad_config("checkpoint tensor " + std::to_string(i) + " is " + c.tensors[i].name +
                   ", this run expects " + want[i]->name);
      if (c.tensors[i].shape != want[i]->shape)
        bad_config("checkpoint tensor " + c.tensors[i].name + " has shape " +
                   shape_string(c.tensors[i].shape) + ", this model's is " + shape_string(want[i]->shape));
    }
    if (c.counters.size() != mine.counters.size())
      bad_config("the checkpoint holds " + std::to_string(c.counters.size()) + " counters, this run has " +
                 std::to_string(mine.counters.size()));
    for (std::size_t i = 0; i < mine.counters.size(); ++i)
      if (c.counters[i].first != mine.counters[i].first)
        bad_config("checkpoint counter " + std::to_string(i) + " is " + c.counters[i].first +
                   ", this run expects " + mine.counters[i].first);
    if (c.rngs.size() != mine.rngs.size())
      bad_config("the checkpoint holds " + std::to_string(c.rngs.size()) +
                 " generator states, this run has " + std::to_string(mine.rngs.size()));
    if (static_cast<std::int64_t>(c.history.size()) != c.step)
      bad_config("the checkpoint's history has " + std::to_string(c.history.size()) + " records for step " +
                 std::to_string(c.step));

    // Trial runs of every setter on copies, so nothing is assigned unless all pass.
    std::size_t k = 0;
    const auto tensor = [&c, &k]() -> const TensorRecord& { return c.tensors[k++]; };
    std::vector<const TensorRecord*> masters;
    for (std::size_t i = 0; i < params.size(); ++i) masters.push_back(&tensor());
    std::vector<std::pair<const TensorRecord*, const TensorRecord*>> stats;
    for (const auto& nb : norms) {
      const TensorRecord* m = nb.second->running_mean.numel() > 0 ? &tensor() : nullptr;
      const TensorRecord* v = nb.second->running_var.numel() > 0 ? &tensor() : nullptr;
      stats.emplace_back(m, v);
    }
    // Chapter 7: the FP8 states, tried on copies.
    std::vector<fp8::DelayedScaling> fp8_states;
    if (fp8 && fp8->options().recipe == fp8::LinearRecipe::delayed)
      for (const fp8::Fp8Training::Layer& l : fp8->layers())
        for (const Fp8Role r : fp8::kFp8Roles) {
          const TensorRecord& history = tensor();
          const TensorRecord& scale = tensor();
          fp8::DelayedScaling trial = l.fp8->state(r);
          try {
            trial.restore(scale.values.at(0), history.values);
          } catch (const std::invalid_argument& e) {
            bad_config("checkpoint tensor " + history.name + ": " + e.what());
          }
          fp8_states.push_back(std::move(trial));
        }
    const auto to_matrix = [](const TensorRecord& t) {
      MatrixF m(1, static_cast<Eigen::Index>(t.values.size()));
      std::copy(t.values.begin(), t.values.end(), m.data());
      return m;
    };
    std::vector<MatrixF> moments, m1, m2;
    if (sgd_local && has_momentum)
      for (std::size_t i = 0; i < params.size(); ++i) moments.push_back(to_matrix(tensor()));
    std::int64_t adam_steps = 0;
    if (adamw_local) {
      for (std::size_t i = 0; i < params.size(); ++i) m1.push_back(to_matrix(tensor()));
      for (std::size_t i = 0; i < params.size(); ++i) m2.push_back(to_matrix(tensor()));
      adam_steps = c.counters.back().second;
      AdamW trial(params, adamw_local->options());
      trial.set_state(adam_steps, m1, m2);
    }
    if (sgd_local) {
      SGD trial(params, sgd_local->options());
      trial.set_momentum_buffers(moments);
    }
    GradScaler scaler_trial(GradScaler::Options{});
    if (dynamic.is_enabled()) {
      scaler_trial.load_state_dict(c.scaler_state);
      if (scaler_trial.get_growth_interval() != GradScaler::Options{}.growth_interval ||
          scaler_trial.get_growth_factor() != GradScaler::Options{}.growth_factor ||
          scaler_trial.get_backoff_factor() != GradScaler::Options{}.backoff_factor)
        bad_config(
            "the checkpoint's GradScaler has other factors or interval than this run's (PyTorch's defaults)");
    } else if (c.scaler_state != "{}") {
      bad_config("the checkpoint has a dynamic scaler's state but this run's scaler is " + config.scaler);
    }
    if (batches) {
      Batches trial(split->train, kBatch, kBatchSeed);
      trial.restore(c.data_epoch, static_cast<Eigen::Index>(c.data_position));
    } else if (c.data_epoch != 0 || c.data_position != 0) {
      bad_config("the checkpoint has a batch position, but text runs draw windows from a generator");
    }
    Rng rng_trial(0);
    for (const Rng::State& s : c.rngs) rng_trial.set_state(s);

    // Everything checked: assign.
    for (std::size_t i = 0; i < params.size(); ++i)
      params[i]->master.assign(masters[i]->values.data(),
                               static_cast<std::int64_t>(masters[i]->values.size()));
    for (std::size_t i = 0; i < norms.size(); ++i) {
      BatchNorm& bn = *norms[i].second;
      if (stats[i].first) bn.running_mean.assign(stats[i].first->values.data(), bn.running_mean.numel());
      if (stats[i].second) bn.running_var.assign(stats[i].second->values.data(), bn.running_var.numel());
      bn.num_batches_tracked = c.counters[i].second;
    }
    if (!fp8_states.empty()) {
      std::size_t j = 0;
      for (const fp8::Fp8Training::Layer& l : fp8->layers())
        for (const Fp8Role r : fp8::kFp8Roles) l.fp8->state(r) = fp8_states[j++];
    }
    if (sgd_local) sgd_local->set_momentum_buffers(owned(std::move(moments)));
    if (adamw_local) adamw_local->set_state(adam_steps, owned(std::move(m1)), owned(std::move(m2)));
    if (dynamic.is_enabled()) dynamic.load_state_dict(c.scaler_state);
    if (batches) batches->restore(c.data_epoch, static_cast<Eigen::Index>(c.data_position));
    if (lm != nullptr) windows.set_state(c.rngs.front());
    history = c.history;
    net->refresh_model_copies();
  }
};

TrainRun::TrainRun(const RunConfig& config, const DataParallel& parallel)
    : impl_(std::make_unique<Impl>(config, parallel)) {}
TrainRun::~TrainRun() = default;
TrainRun::TrainRun(TrainRun&&) noexcept = default;
TrainRun& TrainRun::operator=(TrainRun&&) noexcept = default;

const RunConfig& TrainRun::config() const { return impl_->config; }
std::int64_t TrainRun::steps_done() const { return static_cast<std::int64_t>(impl_->history.size()); }
StepRecord TrainRun::step() { return impl_->step(); }

StepRecord TrainRun::step(Trace& trace) {
  Context& ctx = impl_->net->context();
  Trace* before = ctx.trace();
  ctx.set_trace(&trace);
  try {
    StepRecord r = impl_->step();
    ctx.set_trace(before);
    return r;
  } catch (...) {
    ctx.set_trace(before);
    throw;
  }
}

std::vector<float> TrainRun::gradients() const {
  std::vector<float> g;
  for (const Parameter* p : impl_->net->parameters()) {
    const float* v = p->grad.f32_data();
    g.insert(g.end(), v, v + p->grad.numel());
  }
  return g;
}
const std::vector<StepRecord>& TrainRun::history() const { return impl_->history; }
Checkpoint TrainRun::checkpoint() const { return impl_->snapshot(); }
void TrainRun::restore(const Checkpoint& c) { impl_->restore(c); }

RunSummary TrainRun::summary() {
  Impl& r = *impl_;
  RunSummary s;
  for (const StepRecord& h : r.history) s.skipped += h.skipped;
  s.final_loss = r.history.empty() ? std::numeric_limits<float>::quiet_NaN() : r.history.back().loss;
  s.final_scale = r.scale();
  if (r.lm != nullptr) {
    s.metric = "validation loss";
    Rng v(*r.config.seed + 1);
    double sum = 0;
    for (int i = 0; i < kTextEvalBatches; ++i) {
      const TokenBatch b = sample_windows(corpus().tokens(), r.text.valid_begin, r.text.valid_end, kTextBatch,
                                          r.lm->config().context, v);
      const Tensor& logits = r.lm->forward_tokens(b.inputs, b.batch, b.context);
      sum += cross_entropy(logits, b.targets, {}, r.lm->context()).value(0);
    }
    s.metric_value = sum / kTextEvalBatches;
  } else {
    s.metric = "test accuracy";
    r.net->eval();
    s.metric_value = accuracy(r.net->forward(r.split->test.x), r.split->test.labels);
    r.net->train();
  }
  return s;
}

std::vector<std::int64_t> TrainRun::skipped_per_rank() {
  std::int64_t mine = 0;
  for (const StepRecord& h : impl_->history) mine += h.skipped;
  if (impl_->parallel.comm == nullptr) return {mine};
  std::vector<std::int64_t> all(static_cast<std::size_t>(impl_->world()));
  impl_->parallel.comm->all_gather(&mine, all.data(), sizeof mine);
  return all;
}

const std::vector<float>& TrainRun::fp8_step_amaxes() const { return impl_->step_amaxes; }

std::uint64_t TrainRun::masters_checksum() const {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const Parameter* p : impl_->net->parameters()) {
    const float* v = p->master.f32_data();
    for (std::int64_t i = 0; i < p->master.numel(); ++i) {
      std::uint32_t b = 0;
      std::memcpy(&b, &v[i], sizeof b);
      for (int k = 0; k < 4; ++k) {
        h ^= (b >> (8 * k)) & 0xffu;
        h *= 0x100000001b3ull;
      }
    }
  }
  return h;
}

}  // namespace mpt::train
