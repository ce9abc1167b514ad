// Chapter 05 — loss scaling across ranks: the numbers the chapter text
// quotes that the CLI does not print (program `ch05_numbers`).
// Depends on: the dist tier (ThreadWorld, DistributedDataParallel,
// combine), the nn/optim/amp tiers (Chapter 2's blobs MLP, SGD,
// GradScaler), the core tier (DType).
//
// Every multi-rank run here is a ThreadWorld: N ranks as threads of this
// process, each with its own model, optimizer and scaler, talking only
// through the Communicator — the same code mpiexec runs as N processes.
// The chapter's README contains no typed-in numbers: generate.sh runs this
// program once per section and splices the output into the text. Usage:
//   ch05_numbers verdicts|equivalence|order|claims
//   ch05_numbers sequence DIR    (writes DIR/ddp-step.dot, one recorded step)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/amp/grad_scaler.hpp"
#include "mpt/dist/communicator.hpp"
#include "mpt/dist/ddp.hpp"
#include "mpt/dist/sharded.hpp"
#include "mpt/dist/thread_world.hpp"
#include "mpt/nn/data/data.hpp"
#include "mpt/nn/layers/losses.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/optim/sgd.hpp"

namespace {

using namespace mpt;

constexpr int kBatch = 64;
constexpr int kSteps = 12;

const Dataset& blobs() {
  static const Dataset d = make_blobs();
  return d;
}

std::unique_ptr<Mlp> blobs_mlp(DType dtype) {
  MlpConfig c;
  c.sizes = {8, 32, 32, 4};
  c.dtype = dtype;
  c.seed = 7;
  return std::make_unique<Mlp>(c);
}

std::vector<float> masters_of(Model& net) {
  std::vector<float> v;
  for (const Parameter* p : net.parameters())
    v.insert(v.end(), p->master.f32_data(), p->master.f32_data() + p->master.numel());
  return v;
}

std::size_t bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    std::uint32_t x = 0, y = 0;  // the bits, compared as integers
    std::memcpy(&x, &a[i], sizeof x);
    std::memcpy(&y, &b[i], sizeof y);
    n += x != y;
  }
  return n;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    const double m = std::max(std::fabs(static_cast<double>(b[i])), 1e-3);
    worst = std::max(worst, d / m);
  }
  return worst;
}

std::string g3(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

// --- a Communicator that records every call (for the sequence picture) --------------

// Wraps a rank's communicator; each call, and each phase the step marks,
// becomes one line of `events`.
class Recording final : public dist::Communicator {
 public:
  explicit Recording(dist::Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* backend() const override { return inner_.backend(); }
  void all_reduce(void* data, std::int64_t count, DType dtype, dist::ReduceOp op) override {
    events.push_back("all_reduce " + std::to_string(count) + " x " + std::string(dtype_name(dtype)) + " (" +
                     dist::reduce_op_name(op) + ")" +
                     (count == 1 && op == dist::ReduceOp::max ? ": the found-inf flag" : ""));
    inner_.set_tag(tag());
    inner_.all_reduce(data, count, dtype, op);
  }
  std::unique_ptr<dist::PendingAllReduce> start_all_reduce(void* data, std::int64_t count, DType dtype,
                                                           dist::ReduceOp op) override {
    events.push_back("start all_reduce of a bucket: " + std::to_string(count) + " x " +
                     std::string(dtype_name(dtype)));
    inner_.set_tag(tag());
    return inner_.start_all_reduce(data, count, dtype, op);
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    events.push_back("broadcast from rank " + std::to_string(root));
    inner_.set_tag(tag());
    inner_.broadcast(data, bytes, root);
  }
  void all_gather(const void* send, void* recv, std::size_t bytes) override {
    events.push_back("all_gather " + std::to_string(bytes) + " bytes");
    inner_.set_tag(tag());
    inner_.all_gather(send, recv, bytes);
  }
  void barrier() override {
    events.push_back("barrier");
    inner_.barrier();
  }
  void mark(const std::string& phase) { events.push_back("= " + phase); }

  std::vector<std::string> events;

 private:
  dist::Communicator& inner_;
};

// --- one data-parallel run of the blobs MLP -------------------------------------------

struct Trial {
  std::vector<float> masters;
  std::vector<float> scales;  // before each step
  std::vector<int> skipped;   // the steps the scaler skipped
};

// kSteps steps of SGD (momentum 0.9) on batches of 64, this rank's 64/N rows
// each, a GradScaler of its own starting at init_scale — or, `sharded`,
// ZeRO-1's ShardedOptimizer with a ShardedGradScaler. With a recorder, the
// log holds the calls and phases of the last step only.
Trial train(dist::Communicator& comm, DType dtype, float init_scale, const dist::DdpOptions& options,
            Recording* rec = nullptr, int steps = kSteps, bool sharded = false) {
  auto net = blobs_mlp(dtype);
  dist::DistributedDataParallel ddp(*net, comm, options);
  auto sgd = [](std::vector<Parameter*> p) {
    return std::make_unique<SGD>(std::move(p), SgdOptions{0.05, 0.9});
  };
  std::unique_ptr<Optimizer> owned;
  dist::ShardedOptimizer* zero = nullptr;
  if (sharded) {
    auto z = std::make_unique<dist::ShardedOptimizer>(net->parameters(), comm, sgd);
    zero = z.get();
    owned = std::move(z);
  } else {
    owned = sgd(net->parameters());
  }
  Optimizer& opt = *owned;
  GradScaler::Options so;
  so.init_scale = init_scale;
  GradScaler local(so);
  dist::ShardedGradScaler synced(comm, so);
  GradScaler& scaler = sharded ? synced : local;
  Batches batches(blobs(), kBatch, 1234);
  Trial t;
  auto mark = [&](const char* what) {
    if (rec) rec->mark(what);
  };
  for (int step = 0; step < steps; ++step) {
    comm.set_tag(step);
    if (rec) rec->events.clear();
    opt.zero_grad();
    mark("zero_grad");
    ddp.before_forward();
    const Dataset batch = batches.next();
    const auto [lo, hi] = dist::shard_rows(batch.size(), comm.rank(), comm.size());
    const Dataset shard = batch.slice(lo, hi - lo);
    t.scales.push_back(scaler.get_scale());
    mark("forward (this rank's rows)");
    const Tensor& out = net->forward(shard.x);
    mark("backward from loss x S");
    net->backward(cross_entropy_backward(out, shard.labels, scaler.scale(1.0f)));
    mark("finish_backward: wait, average");
    ddp.finish_backward();
    mark(sharded ? "unscale own shard, check for inf" : "unscale, check for inf");
    if (!scaler.step(opt)) t.skipped.push_back(step);
    mark("step (or skip), update the scale");
    scaler.update();
    if (zero) {
      mark("gather the owners' masters");
      zero->gather_masters();
    }
    net->refresh_model_copies();
  }
  t.masters = masters_of(*net);
  return t;
}

// The same run on `world` ranks of a ThreadWorld: rank r's trial at [r].
std::vector<Trial> train_world(int world, DType dtype, float init_scale, const dist::DdpOptions& options) {
  std::vector<Trial> out(static_cast<std::size_t>(world));
  dist::ThreadWorld(world).run([&](dist::Communicator& c) {
    out[static_cast<std::size_t>(c.rank())] = train(c, dtype, init_scale, options);
  });
  return out;
}

// --- the sections --------------------------------------------------------------------

// Plain DDP: every rank has its own scaler, and they agree by themselves.
int verdicts() {
  const float init = 16777216.0f;  // 2^24: overflows in f16 for a few steps
  std::printf("2 ranks (ThreadWorld), blobs MLP in f16, %d steps, each rank its own GradScaler from 2^24:\n",
              kSteps);
  const std::vector<Trial> t = train_world(2, DType::f16, init, dist::DdpOptions{});
  std::printf("step  scale on rank 0  scale on rank 1  skipped on 0  skipped on 1\n");
  for (int s = 0; s < kSteps; ++s) {
    auto skipped = [&](const Trial& x) {
      return std::find(x.skipped.begin(), x.skipped.end(), s) != x.skipped.end() ? "yes" : "no";
    };
    std::printf("%4d  %15.0f  %15.0f  %12s  %12s\n", s,
                static_cast<double>(t[0].scales[static_cast<std::size_t>(s)]),
                static_cast<double>(t[1].scales[static_cast<std::size_t>(s)]), skipped(t[0]), skipped(t[1]));
  }
  std::printf("masters whose bits differ between the ranks after %d steps: %zu of %zu\n", kSteps,
              bits_differ(t[0].masters, t[1].masters), t[0].masters.size());
  return 0;
}

// N ranks x 64/N rows against one process x 64 rows.
int equivalence() {
  std::printf("blobs MLP, %d SGD steps of 64 rows, N ranks x 64/N rows (ThreadWorld) against one process:\n",
              kSteps);
  std::printf("dtype  N  replicas equal  largest relative difference from one process\n");
  for (const DType d : {DType::f32, DType::f16}) {
    const std::vector<Trial> one = train_world(1, d, 65536.0f, dist::DdpOptions{});
    for (const int n : {1, 2, 4}) {
      const std::vector<Trial> t = train_world(n, d, 65536.0f, dist::DdpOptions{});
      bool equal = true;
      for (const Trial& x : t) equal = equal && bits_differ(x.masters, t[0].masters) == 0;
      std::printf("%-5s  %d  %-14s  %s\n", std::string(dtype_name(d)).c_str(), n, equal ? "yes" : "NO",
                  g3(max_rel_diff(t[0].masters, one[0].masters)).c_str());
    }
  }
  return 0;
}

// Why an engine's all-reduce is not bit-exact across world sizes: the same
// four f32 gradients summed in rank order and in pairs (as a tree or ring
// algorithm sums them).
int order() {
  const int n = 4;
  std::vector<std::vector<float>> g(n);
  dist::ThreadWorld(n).run([&](dist::Communicator& c) {
    auto net = blobs_mlp(DType::f32);
    Batches batches(blobs(), kBatch, 1234);
    const Dataset batch = batches.next();
    const auto [lo, hi] = dist::shard_rows(batch.size(), c.rank(), n);
    const Dataset shard = batch.slice(lo, hi - lo);
    const Tensor& out = net->forward(shard.x);
    net->backward(cross_entropy_backward(out, shard.labels, 1.0f / n));
    std::vector<float> v;
    for (const Parameter* p : net->parameters())
      v.insert(v.end(), p->grad.f32_data(), p->grad.f32_data() + p->grad.numel());
    g[static_cast<std::size_t>(c.rank())] = v;
  });
  std::vector<float> serial = g[0], pairs = g[0], right = g[2];
  const auto count = static_cast<std::int64_t>(serial.size());
  for (int r = 1; r < n; ++r)
    dist::combine(serial.data(), g[static_cast<std::size_t>(r)].data(), count, DType::f32,
                  dist::ReduceOp::sum);
  dist::combine(pairs.data(), g[1].data(), count, DType::f32, dist::ReduceOp::sum);
  dist::combine(right.data(), g[3].data(), count, DType::f32, dist::ReduceOp::sum);
  dist::combine(pairs.data(), right.data(), count, DType::f32, dist::ReduceOp::sum);
  std::printf(
      "one batch's gradients of the blobs MLP on 4 ranks (%lld values each), summed two ways in f32:\n",
      static_cast<long long>(count));
  std::printf("  ((g0 + g1) + g2) + g3  (rank order, the fixed-order all-reduce)\n");
  std::printf("  (g0 + g1) + (g2 + g3)  (pairs, as a tree or recursive-doubling all-reduce adds)\n");
  std::printf("values whose bits differ: %zu of %lld; largest relative difference: %s\n",
              bits_differ(serial, pairs), static_cast<long long>(count),
              g3(max_rel_diff(serial, pairs)).c_str());
  return 0;
}

int claims() {
  std::printf("Claim 1: \"scaler.update() must be called before optimizer.step() in DDP\"\n");
  // Order A, the documented one: scaler.step(opt), then scaler.update().
  const std::vector<Trial> a = train_world(2, DType::f16, 16777216.0f, dist::DdpOptions{});
  std::printf(
      "  step() then update(), 2 ranks, f16, from 2^24: %d steps, %zu skipped, final scale %.0f on both "
      "ranks\n",
      kSteps, a[0].skipped.size(), static_cast<double>(a[0].scales.back()));
  // Order B: update() first, then step().
  std::string message;
  try {
    dist::ThreadWorld(2).run([&](dist::Communicator& c) {
      auto net = blobs_mlp(DType::f16);
      dist::DistributedDataParallel ddp(*net, c);
      SGD opt(net->parameters(), SgdOptions{0.05, 0.9});
      GradScaler scaler;
      Batches batches(blobs(), kBatch, 1234);
      const Dataset batch = batches.next();
      const auto [lo, hi] = dist::shard_rows(batch.size(), c.rank(), c.size());
      const Dataset shard = batch.slice(lo, hi - lo);
      opt.zero_grad();
      const Tensor& out = net->forward(shard.x);
      net->backward(cross_entropy_backward(out, shard.labels, scaler.scale(1.0f)));
      ddp.finish_backward();
      scaler.update();  // before step(): no inf check has run yet
      (void)scaler.step(opt);
    });
  } catch (const std::exception& e) {
    message = e.what();
  }
  std::printf("  update() then step(): %s\n", message.empty() ? "ran" : ("refused: " + message).c_str());
  std::printf(
      "  -> false: the order is step() then update(), in DDP as in one process. When backward returns,\n"
      "     DDP has already averaged the gradients; the scaler never sees the ranks.\n");

  std::printf(
      "Claim 2: \"each process must instantiate its own GradScaler; one created before the DDP\n"
      "         initialisation is shared globally\"\n");
  bool equal = true;
  for (std::size_t s = 0; s < a[0].scales.size(); ++s) equal = equal && a[0].scales[s] == a[1].scales[s];
  std::printf(
      "  each rank constructs its own scaler (a process, or here a thread, has its own objects);\n"
      "  over the %d steps above the two scalers' scales were %s at every step, and %zu masters differ.\n",
      kSteps, equal ? "equal" : "NOT equal", bits_differ(a[0].masters, a[1].masters));
  std::printf(
      "  -> what keeps them equal is that every rank sees the same averaged gradients, hence the same\n"
      "     inf verdict. It breaks when that is not so: a sharded optimizer without the flag sync\n"
      "     (pitfall sharded-found-inf-unsynced), a scaler state restored on one rank only\n"
      "     (pitfall scaler-state-one-rank).\n");

  std::printf("Claim 3: \"the correct configuration made ResNet-152 1.8x faster on 8 A100s\"\n");
  std::printf(
      "  -> unsourced (no paper, benchmark or repository states it), and not measurable here: this\n"
      "     machine has no GPU and no network. What the chapter measures instead is in its benchmarks:\n"
      "     the bucketed all-reduce against one raw MPI_Allreduce, the overlap, time per step on 1, 2, 4 "
      "ranks.\n");
  return 0;
}

// The second step of 2 ranks (the first learned how many contributions each
// gradient gets, so now the buckets start during backward), ZeRO-1 with the
// synchronised scaler, as a Graphviz picture: one column per rank,
// the phases and calls in the order each rank made them, a dashed line
// joining the two ranks' parts of every collective.
int sequence(const std::string& dir) {
  const int n = 2;
  std::vector<std::vector<std::string>> events(n);
  dist::DdpOptions o;
  o.bucket_cap_mb = 4.0 / 1024;  // 4 KiB buckets: the blobs MLP's gradients in three buckets
  o.first_bucket_cap_mb = 0.5 / 1024;
  dist::ThreadWorld(n).run([&](dist::Communicator& c) {
    Recording rec(c);
    (void)train(rec, DType::f16, 65536.0f, o, &rec, 2, /*sharded=*/true);
    // Consecutive equal calls as one: "broadcast from rank 0 (x 3)".
    std::vector<std::string>& mine = events[static_cast<std::size_t>(c.rank())];
    for (std::size_t i = 0; i < rec.events.size();) {
      std::size_t j = i;
      while (j < rec.events.size() && rec.events[j] == rec.events[i]) ++j;
      mine.push_back(rec.events[i] + (j - i > 1 ? " (x " + std::to_string(j - i) + ")" : ""));
      i = j;
    }
  });
  if (events[0].size() != events[1].size())
    throw std::logic_error("sequence: the ranks made different numbers of calls");
  const std::string path = dir + "/ddp-step.dot";
  std::ofstream f(path);
  if (!f) throw std::runtime_error("sequence: cannot write " + path);
  f << "// Chapter 05 — one data-parallel step on 2 ranks, recorded by ch05_numbers sequence.\n"
    << "digraph ddp_step {\n  rankdir=TB; newrank=true; nodesep=0.4; ranksep=0.18;\n"
    << "  node [shape=box, fontname=\"Helvetica\", fontsize=10, style=rounded];\n"
    << "  edge [arrowsize=0.6];\n";
  for (int r = 0; r < n; ++r) {
    f << "  subgraph cluster_r" << r << " {\n    label=\"rank " << r << "\"; fontname=\"Helvetica\";\n";
    for (std::size_t i = 0; i < events[static_cast<std::size_t>(r)].size(); ++i) {
      const std::string& e = events[static_cast<std::size_t>(r)][i];
      const bool phase = e.rfind("= ", 0) == 0;
      f << "    r" << r << "_" << i << " [label=\"" << (phase ? e.substr(2) : e) << "\""
        << (phase ? "" : ", style=\"rounded,filled\", fillcolor=\"#dbe9f6\"") << "];\n";
      if (i > 0) f << "    r" << r << "_" << (i - 1) << " -> r" << r << "_" << i << ";\n";
    }
    f << "  }\n";
  }
  for (std::size_t i = 0; i < events[0].size(); ++i) {
    f << "  { rank=same; r0_" << i << "; r1_" << i << "; }\n";
    if (events[0][i].rfind("= ", 0) != 0)
      f << "  r0_" << i << " -> r1_" << i
        << " [dir=both, style=dashed, color=\"#2b6cb0\", constraint=false];\n";
  }
  f << "}\n";
  std::size_t calls = 0;
  for (const std::string& e : events[0]) calls += e.rfind("= ", 0) != 0;
  std::printf(
      "the second step of 2 ranks (ZeRO-1, ShardedGradScaler, 4 KiB buckets): %zu events per rank, %zu of "
      "them collective calls; Graphviz source of the picture: %s\n",
      events[0].size(), calls, path.c_str());
  for (const std::string& e : events[0]) std::printf("  %s\n", e.c_str());
  return 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: ch05_numbers verdicts|equivalence|order|claims\n"
               "       ch05_numbers sequence DIR\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string what = argv[1];
  try {
    if (what == "sequence" && argc == 3) return sequence(argv[2]);
    if (argc != 2) return usage();
    if (what == "verdicts") return verdicts();
    if (what == "equivalence") return equivalence();
    if (what == "order") return order();
    if (what == "claims") return claims();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ch05_numbers: %s\n", e.what());
    return 1;
  }
  return usage();
}
