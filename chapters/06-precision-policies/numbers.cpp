// Chapter 06 — per-task precision policies: the numbers the chapter text
// quotes that the CLI does not print (program `ch06_numbers`).
// Depends on: the core tier (policy strings, presets, the trace, the cost
// model), the nn tier (the tiny Transformer, trace_step), the train tier
// (the measured policy search).
//
// The chapter's README contains no typed-in numbers: generate.sh runs this
// program once per section and splices the output into the text. Usage:
//   ch06_numbers presets DIR   the precision picture of each preset on the
//                              Transformer (text, and DIR/presets.dot)
//   ch06_numbers autocast      what autocast chose for each op of the
//                              Transformer's forward, counted
//   ch06_numbers lists         the ops whose autocast list differs between
//                              CUDA and the CPU
//   ch06_numbers claims        the mission source's claims, checked
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mpt/core/autocast.hpp"
#include "mpt/core/cost_model.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/nn/model.hpp"
#include "mpt/nn/models/transformer.hpp"
#include "mpt/train/policy_search.hpp"

namespace {

using namespace mpt;

constexpr int kTokens = 8;  // as `mpt trace --model transformer`
constexpr int kBatch = 4;

// The presets of the picture, in the order of the text.
const std::vector<std::string>& presets() {
  static const std::vector<std::string> p = {
      "O0", "O1", "O2", "O3", "mixed_float16", "mixed_bfloat16", "autocast:cpu:bf16", "jmp:half"};
  return p;
}

/// One traced training step of the chapter's Transformer (V 96, D 64, 4
/// heads, 2 blocks, as `mpt trace --model transformer` builds it) under
/// `policy`, on a seeded batch of token ids.
Trace transformer_step(const std::string& policy) {
  TransformerConfig c;
  c.policy = parse_policy_string(policy).make();
  c.seed = 1;
  TinyTransformer net(c);
  Rng rng(1);
  MatrixF ids(kBatch, kTokens);
  for (Eigen::Index i = 0; i < ids.size(); ++i)
    ids.data()[i] = static_cast<float>(rng.below(static_cast<std::uint64_t>(c.vocab_size)));
  std::vector<int> labels(static_cast<std::size_t>(kBatch * kTokens));
  for (int& y : labels) y = static_cast<int>(rng.below(static_cast<std::uint64_t>(c.vocab_size)));
  return trace_step(net, ids, labels);
}

bool is_cast(const TraceEntry& e) { return e.op == "cast" || e.op == "cached_cast"; }

// The forward ops of a trace (no casts), as "path op".
std::vector<const TraceEntry*> forward_ops(const Trace& t) {
  std::vector<const TraceEntry*> ops;
  for (const TraceEntry& e : t.entries())
    if (e.phase == Phase::forward && !is_cast(e)) ops.push_back(&e);
  return ops;
}

std::string cell_of(const TraceEntry& e) {
  return e.outputs.empty() ? "-" : std::string(dtype_name(e.outputs.front().dtype));
}

// The colour of a dtype in the picture.
const char* colour_of(const std::string& d) {
  if (d == "f32") return "#c6dbef";
  if (d == "f16") return "#fdd0a2";
  if (d == "bf16") return "#c7e9c0";
  return "#ffffff";
}

int picture(const std::string& dir) {
  std::vector<Trace> traces;
  for (const std::string& p : presets()) traces.push_back(transformer_step(p));
  const std::vector<const TraceEntry*> rows = forward_ops(traces.front());
  for (const Trace& t : traces)
    if (forward_ops(t).size() != rows.size())
      throw std::logic_error("the presets' forward passes ran different ops");
  std::printf(
      "the dtype each forward op of the Transformer (V 96, D 64, 4 heads, 2 blocks, batch %d x %d tokens) "
      "writes, under each preset\n\n",
      kBatch, kTokens);
  std::printf("%-26s %-28s", "path", "op");
  for (const std::string& p : presets())
    std::printf(" %-8s", p == "autocast:cpu:bf16" ? "cpu:bf16" : p.substr(0, 8).c_str());
  std::printf("\n");
  std::vector<std::vector<std::string>> cells(rows.size());
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::printf("%-26s %-28s", rows[r]->path.c_str(), rows[r]->op.c_str());
    for (const Trace& t : traces) {
      cells[r].push_back(cell_of(*forward_ops(t)[r]));
      std::printf(" %-8s", cells[r].back().c_str());
    }
    std::printf("\n");
  }
  std::printf("\n%-55s", "casts at op boundaries (forward and backward)");
  for (const Trace& t : traces) {
    int n = 0;
    for (const TraceEntry& e : t.entries()) n += e.op == "cast";
    std::printf(" %-8d", n);
  }
  std::printf("\n%-55s", "bytes the forward ops wrote");
  for (const Trace& t : traces) {
    std::size_t bytes = 0;
    for (const TraceEntry* e : forward_ops(t)) bytes += e->bytes_written();
    std::printf(" %-8zu", bytes);
  }
  std::printf("\n%-55s", "step on an H100 SXM, cost model (us)");
  for (const Trace& t : traces) std::printf(" %-8.2f", estimate_cost(t, gpu_spec("h100-sxm")).seconds * 1e6);
  std::printf("\n");

  // The same as a Graphviz table, one coloured cell per op and preset.
  std::string dot =
      "digraph presets {\n  node [shape=plaintext, fontname=\"Helvetica\", fontsize=10];\n  t [label=<\n"
      "<table border=\"0\" cellborder=\"1\" cellspacing=\"0\" cellpadding=\"3\">\n<tr><td><b>path</b></td>"
      "<td><b>op</b></td>";
  for (const std::string& p : presets()) dot += "<td><b>" + p + "</b></td>";
  dot += "</tr>\n";
  for (std::size_t r = 0; r < rows.size(); ++r) {
    dot += "<tr><td align=\"left\">" + rows[r]->path + "</td><td align=\"left\">" + rows[r]->op + "</td>";
    for (const std::string& c : cells[r])
      dot += "<td bgcolor=\"" + std::string(colour_of(c)) + "\">" + c + "</td>";
    dot += "</tr>\n";
  }
  dot += "</table>>];\n}\n";
  const std::string file = dir + "/presets.dot";
  std::ofstream out(file);
  out << dot;
  if (!out) throw std::runtime_error("cannot write " + file);
  return 0;
}

// "autocast converts the inputs to FP16": what it chose for each forward op.
int autocast() {
  const Trace t = transformer_step("autocast:cuda:f16");
  std::map<std::string, std::vector<std::string>> by_dtype;
  int casts = 0, cached = 0;
  for (const TraceEntry& e : t.entries()) {
    casts += e.op == "cast";
    cached += e.op == "cached_cast";
  }
  const std::vector<const TraceEntry*> ops = forward_ops(t);
  for (const TraceEntry* e : ops) {
    std::vector<std::string>& v = by_dtype[cell_of(*e)];
    const std::string name = e->op;
    bool seen = false;
    for (const std::string& s : v) seen = seen || s == name;
    if (!seen) v.push_back(name);
  }
  std::map<std::string, int> count;
  for (const TraceEntry* e : ops) ++count[cell_of(*e)];
  std::printf("autocast:cuda:f16 on the Transformer's forward (%zu ops):\n", ops.size());
  for (const auto& [dtype, names] : by_dtype) {
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
    std::printf("  %3d ops wrote %-4s  %s\n", count[dtype], dtype.c_str(), list.c_str());
  }
  std::printf("  %d casts at op boundaries in the step, %d weight casts reused from the cache\n", casts,
              cached);
  return 0;
}

// The CPU's lists against CUDA's (autocast_mode.cpp registers them per
// device): every op of the table whose list differs.
int lists() {
  int same = 0;
  std::printf("%-30s %-20s %-20s\n", "op", "CUDA", "CPU");
  for (const AutocastRow& r : autocast_table()) {
    if (r.cuda == r.cpu) {
      ++same;
      continue;
    }
    std::printf("%-30s %-20s %-20s\n", std::string(r.op).c_str(), std::string(cast_list_name(r.cuda)).c_str(),
                std::string(cast_list_name(r.cpu)).c_str());
  }
  std::printf("(%d of the table's %zu ops are on the same list on both devices)\n", same,
              autocast_table().size());
  return 0;
}

int claims() {
  // "95% of a CNN's layers can safely run in FP16": the search on the CNN,
  // as the text runs it with mpt policy search.
  train::SearchOptions o;
  o.model = "cnn";
  o.budget = 0.02;
  o.steps = 20;
  o.seeds = 2;
  const train::SearchResult r = train::search_policy(o);
  int lowered = 0;
  for (const train::LayerResult& l : r.layers) lowered += l.lowered;
  std::printf("claim: \"95%% of a CNN's layers can safely run in FP16\"\n");
  std::printf(
      "  the search (budget %.2f, %lld steps, %d seeds) lowered %d of the CNN's %zu layers to f16 (%.0f%%): "
      "%s\n",
      o.budget, static_cast<long long>(o.steps), o.seeds, lowered, r.layers.size(),
      100.0 * lowered / static_cast<double>(r.layers.size()), r.policy.c_str());
  std::printf("  final loss %.6g against FP32's %.6g (limit %.6g)\n", r.found.mean_loss, r.fp32.mean_loss,
              r.loss_limit);
  // "autocast converts the inputs to FP16".
  const Trace t = transformer_step("autocast:cuda:f16");
  int f16 = 0, f32 = 0;
  for (const TraceEntry* e : forward_ops(t)) (cell_of(*e) == "f16" ? f16 : f32) += 1;
  std::printf("claim: \"autocast converts the inputs to FP16\"\n");
  std::printf(
      "  on the Transformer's forward it wrote f16 from %d ops and f32 from %d (ch06_numbers autocast)\n",
      f16, f32);
  return 0;
}

int usage() {
  std::fprintf(stderr, "usage: ch06_numbers presets DIR | autocast | lists | claims\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string what = argv[1];
  try {
    if (what == "presets" && argc == 3) return picture(argv[2]);
    if (argc != 2) return usage();
    if (what == "autocast") return autocast();
    if (what == "lists") return lists();
    if (what == "claims") return claims();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ch06_numbers: %s\n", e.what());
    return 1;
  }
  return usage();
}
