// Chapter 06 — the measured policy search (see policy_search.hpp).
// Depends on: policy_search.hpp, run.hpp; the core tier (policy strings,
// the trace, the cost model).
#include "mpt/train/policy_search.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <utility>

#include "mpt/core/cost_model.hpp"
#include "mpt/core/path_pattern.hpp"
#include "mpt/core/policy_string.hpp"
#include "mpt/core/trace.hpp"
#include "mpt/train/run.hpp"

namespace mpt::train {

namespace {

[[noreturn]] void search_refusal(const std::string& what) {
  throw std::invalid_argument("policy search: " + what);
}

std::string budget_text(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

RunConfig search_config(const SearchOptions& o, const std::string& policy, int k) {
  RunConfig c;
  c.model = o.model;
  c.policy = policy;
  // A preset that names its scaler (O1's dynamic, O3's static:1) runs with it.
  c.scaler = parse_policy_string(policy).needs().scaler.empty() ? o.scaler : "";
  c = resolve_config(c);
  c.seed = *c.seed + static_cast<std::uint64_t>(k);
  c.steps = o.steps;
  return c;
}

double tail_loss(const std::vector<StepRecord>& h) {
  const std::size_t n = std::min<std::size_t>(h.size(), kTail);
  double sum = 0;
  for (std::size_t i = h.size() - n; i < h.size(); ++i) sum += h[i].loss;
  return sum / static_cast<double>(n);
}

double gradient_error_of(const std::vector<float>& g, const std::vector<float>& ref) {
  if (ref.empty() || g.size() != ref.size()) return 0;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double d = static_cast<double>(g[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

int path_depth(const std::string& path) {
  return static_cast<int>(std::count(path.begin(), path.end(), '.'));
}

// The rules that give each layer its dtype on top of `base`, outermost first.
std::vector<std::pair<std::string, DType>> search_rules_for(const std::vector<std::string>& layers,
                                                            const std::set<std::string>& lowered, DType low,
                                                            DType base) {
  std::vector<std::string> order = layers;
  std::stable_sort(order.begin(), order.end(),
                   [](const std::string& a, const std::string& b) { return path_depth(a) < path_depth(b); });
  std::vector<std::pair<std::string, DType>> rules;
  for (const std::string& p : order) {
    DType now = base;
    for (const auto& [rule, d] : rules)
      if (PathPattern(rule).covers(p)) now = d;  // the last covering rule wins, as in PathRulePolicy
    const DType want = lowered.count(p) != 0 ? low : DType::f32;
    if (now != want) rules.emplace_back(p, want);
  }
  return rules;
}

}  // namespace

void check_search_options(const SearchOptions& o) {
  if (o.model != "mlp" && o.model != "cnn" && o.model != "transformer")
    search_refusal("model '" + o.model + "' is not one of mlp, cnn, transformer");
  if (o.low != DType::f16 && o.low != DType::bf16)
    search_refusal(std::string("dtype ") + std::string(dtype_name(o.low)) +
                   " is not one the search lowers to; valid: f16, bf16");
  if (!std::isfinite(o.budget) || o.budget < 0 || o.budget > 10)
    search_refusal("budget " + budget_text(o.budget) +
                   " is not a number from 0 to 10 (the relative increase of the final loss)");
  if (o.steps < 1 || o.steps > 100000)
    search_refusal("steps " + std::to_string(o.steps) + " is not a whole number from 1 to 100000");
  if (o.seeds < 1 || o.seeds > 64)
    search_refusal("seeds " + std::to_string(o.seeds) + " is not a whole number from 1 to 64");
  if (o.depth < 0 || o.depth > 16)
    search_refusal("depth " + std::to_string(o.depth) +
                   " is not a whole number from 0 to 16 (0: every op path; D: paths cut to D segments)");
  (void)gpu_spec(o.gpu);
  RunConfig c;
  c.model = o.model;
  c.scaler = o.scaler;
  (void)resolve_config(c);  // the scaler's spelling
}

std::vector<float> reference_gradients(const SearchOptions& o) {
  TrainRun run(search_config(o, "f32", 0));
  (void)run.step();
  return run.gradients();
}

Evaluation evaluate_policy(const SearchOptions& o, const std::string& policy,
                           const std::vector<float>& reference_grads) {
  check_search_options(o);
  Evaluation e;
  e.policy = parse_policy_string(policy).text();
  const GpuSpec& gpu = gpu_spec(o.gpu);
  for (int k = 0; k < o.seeds; ++k) {
    TrainRun run(search_config(o, e.policy, k));
    if (k == 0) {  // the first step traced: the cost, the bytes, the gradient error
      Trace trace;
      (void)run.step(trace);
      e.grad_error = gradient_error_of(run.gradients(), reference_grads);
      const StepCost cost = estimate_cost(trace, gpu);
      e.seconds = cost.seconds;
      std::set<std::pair<std::string, std::string>> weights;
      for (const TraceEntry& t : trace.entries()) {
        if (t.phase != Phase::forward || t.op == "cached_cast") continue;
        if (t.op != "cast") e.activation_bytes += static_cast<double>(t.bytes_written());
        for (const TracedValue& v : t.inputs)
          if ((v.name == "weight" || v.name == "bias") && weights.emplace(t.path, v.name).second)
            e.weight_bytes += static_cast<double>(v.bytes);
      }
    }
    while (run.steps_done() < o.steps) (void)run.step();
    const double f = tail_loss(run.history());
    e.final_losses.push_back(f);
    e.finite = e.finite && std::isfinite(f);
    for (const StepRecord& h : run.history()) e.skipped += h.skipped;
  }
  double sum = 0, lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double f : e.final_losses) {
    sum += f;
    lo = std::min(lo, f);
    hi = std::max(hi, f);
  }
  e.mean_loss = sum / static_cast<double>(e.final_losses.size());
  e.spread = hi - lo;
  return e;
}

std::vector<std::pair<std::string, std::string>> searchable_layers(const SearchOptions& o) {
  TrainRun run(search_config(o, "f32", 0));
  Trace trace;
  (void)run.step(trace);
  std::vector<std::pair<std::string, std::string>> layers;
  for (const TraceEntry& t : trace.entries()) {
    if (t.phase != Phase::forward || t.path == "loss" || t.op == "cast" || t.op == "cached_cast") continue;
    std::string path = t.path;
    if (o.depth > 0) {  // the first D segments
      std::size_t cut = std::string::npos, from = 0;
      for (int d = 0; d < o.depth; ++d) {
        cut = path.find('.', from);
        if (cut == std::string::npos) break;
        from = cut + 1;
      }
      if (cut != std::string::npos) path.resize(cut);
    }
    auto at = std::find_if(layers.begin(), layers.end(), [&](const auto& l) { return l.first == path; });
    if (at == layers.end()) {
      layers.emplace_back(path, t.op);
    } else if (at->second.find(t.op) == std::string::npos) {
      at->second += ", " + t.op;
    }
  }
  return layers;
}

std::string policy_for(const std::vector<std::string>& layers, const std::vector<std::string>& lowered,
                       DType low) {
  const std::set<std::string> down(lowered.begin(), lowered.end());
  const auto text = [&](DType base) {
    std::string s(dtype_name(base));
    for (const auto& [path, d] : search_rules_for(layers, down, low, base))
      s += "+" + path + "=" + std::string(dtype_name(d));
    return s;
  };
  const std::string up = text(DType::f32), dn = text(low);
  return parse_policy_string(dn.size() < up.size() ? dn : up).text();
}

SearchResult search_policy(const SearchOptions& o) {
  check_search_options(o);
  SearchResult r;
  r.options = o;
  const std::vector<float> g32 = reference_gradients(o);
  r.fp32 = evaluate_policy(o, "f32", g32);
  r.loss_limit = r.fp32.mean_loss + o.budget * std::abs(r.fp32.mean_loss);
  r.evaluations = 1;
  const auto layers = searchable_layers(o);
  std::vector<std::string> paths;
  for (const auto& l : layers) paths.push_back(l.first);
  // 3. each layer alone
  for (const auto& [path, ops] : layers) {
    const Evaluation e = evaluate_policy(o, policy_for(paths, {path}, o.low), g32);
    ++r.evaluations;
    LayerResult l;
    l.path = path;
    l.ops = ops;
    l.loss_change = e.finite ? e.mean_loss - r.fp32.mean_loss : std::numeric_limits<double>::infinity();
    l.grad_error = e.grad_error;
    r.layers.push_back(l);
  }
  // 4. greedily, the least sensitive first
  std::stable_sort(r.layers.begin(), r.layers.end(), [](const LayerResult& a, const LayerResult& b) {
    return a.loss_change != b.loss_change ? a.loss_change < b.loss_change : a.grad_error < b.grad_error;
  });
  std::vector<std::string> lowered;
  r.found = r.fp32;
  //! [greedy-pass]
  for (LayerResult& l : r.layers) {
    std::vector<std::string> trial = lowered;
    trial.push_back(l.path);
    const Evaluation e = evaluate_policy(o, policy_for(paths, trial, o.low), g32);
    ++r.evaluations;
    l.loss_when_tried = e.mean_loss;
    if (e.finite && e.mean_loss <= r.loss_limit) {
      l.lowered = true;
      lowered = trial;
      r.found = e;
    }
  }
  //! [greedy-pass]
  r.policy = r.found.policy;
  return r;
}

}  // namespace mpt::train
