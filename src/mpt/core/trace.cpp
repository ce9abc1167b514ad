// Chapter 02 — precision as data: the precision trace and its renderings.
// Depends on: trace.hpp; nlohmann_json (render_json, inside this file only).
#include "mpt/core/trace.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>

namespace mpt {

const char* phase_name(Phase p) { return p == Phase::forward ? "forward" : "backward"; }

TracedValue traced(std::string name, const Tensor& t) {
  return {std::move(name), t.dtype(), t.shape(), t.bytes()};
}

std::size_t TraceEntry::bytes_written() const {
  std::size_t n = 0;
  for (const TracedValue& v : outputs) n += v.bytes;
  return n;
}

std::size_t Trace::casts() const {
  return static_cast<std::size_t>(
      std::count_if(entries_.begin(), entries_.end(), [](const TraceEntry& e) { return e.op == "cast"; }));
}

std::size_t Trace::cached_casts() const {
  return static_cast<std::size_t>(std::count_if(entries_.begin(), entries_.end(),
                                                [](const TraceEntry& e) { return e.op == "cached_cast"; }));
}

std::size_t Trace::cast_bytes() const {
  std::size_t n = 0;
  for (const TraceEntry& e : entries_)
    if (e.op == "cast") n += e.bytes_written();
  return n;
}

namespace {

std::string values_text(const std::vector<TracedValue>& vs) {
  std::string s;
  for (const TracedValue& v : vs)
    s += (s.empty() ? "" : ", ") + v.name + " " + std::string(dtype_name(v.dtype)) + " " +
         shape_string(v.shape);
  return s;
}

// Aligned columns, two spaces apart, left-aligned but for the last (bytes).
std::string columns(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& r : rows)
    for (std::size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t i = 0; i < r.size(); ++i) {
      const std::string pad(width[i] - r[i].size(), ' ');
      if (i) line += "  ";
      line += i + 1 == r.size() ? pad + r[i] : r[i] + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

const char* fill_of(DType d) {
  switch (d) {
    case DType::f32: return "#cfe2f3";
    case DType::bf16: return "#d9ead3";
    case DType::f16: return "#fce5cd";
    case DType::e4m3:
    case DType::e5m2: return "#f4cccc";
  }
  return "white";
}

std::string dot_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

std::string render_text(const Trace& trace) {
  std::vector<std::vector<std::string>> rows = {
      {"#", "phase", "path", "op", "reads", "computes", "writes", "bytes"}};
  std::size_t i = 0;
  for (const TraceEntry& e : trace.entries())
    rows.push_back({std::to_string(++i), phase_name(e.phase), e.path, e.op, values_text(e.inputs),
                    std::string(dtype_name(e.compute)), values_text(e.outputs),
                    std::to_string(e.bytes_written())});
  std::ostringstream o;
  o << columns(rows);
  o << "\n"
    << trace.casts() << " cast(s) at op boundaries, " << trace.cast_bytes() << " bytes written by them";
  if (const std::size_t cached = trace.cached_casts(); cached > 0)
    o << "; " << cached << " more reused from the weight cast cache";
  o << "\n";
  return o.str();
}

std::string render_json(const Trace& trace) {
  using Json = nlohmann::ordered_json;
  const auto values = [](const std::vector<TracedValue>& vs) {
    Json a = Json::array();
    for (const TracedValue& v : vs)
      a.push_back({{"name", v.name}, {"dtype", dtype_name(v.dtype)}, {"shape", v.shape}, {"bytes", v.bytes}});
    return a;
  };
  Json entries = Json::array();
  for (const TraceEntry& e : trace.entries())
    entries.push_back({{"phase", phase_name(e.phase)},
                       {"path", e.path},
                       {"op", e.op},
                       {"inputs", values(e.inputs)},
                       {"compute", dtype_name(e.compute)},
                       {"outputs", values(e.outputs)},
                       {"bytes_written", e.bytes_written()}});
  const Json j = {{"entries", entries},
                  {"casts", trace.casts()},
                  {"cast_bytes", trace.cast_bytes()},
                  {"cached_casts", trace.cached_casts()}};
  return j.dump(2) + "\n";
}

std::string render_dot(const Trace& trace, const std::string& title) {
  std::ostringstream o;
  o << "digraph precision {\n"
    << "  graph [rankdir=LR, fontname=\"Helvetica\", fontsize=11, label=\"" << dot_escape(title)
    << "\", labelloc=t];\n"
    << "  node [fontname=\"Helvetica\", fontsize=10, style=filled];\n"
    << "  edge [fontname=\"Helvetica\", fontsize=9];\n";
  // Backward first: dot stacks the clusters of a left-to-right graph from the
  // bottom up, so the forward pass comes out on top, where it is read first.
  for (Phase phase : {Phase::backward, Phase::forward}) {
    const char* name = phase_name(phase);
    o << "  subgraph cluster_" << name << " {\n    label=\"" << name << "\"; color=\"#999999\";\n";
    std::string previous;
    std::string flowing;  // the value the previous node wrote, as an edge label
    std::size_t i = 0;
    for (const TraceEntry& e : trace.entries()) {
      ++i;
      if (e.phase != phase || e.op == "cached_cast") continue;  // a reuse: no node, nothing flows
      const std::string id = std::string(name).substr(0, 1) + std::to_string(i);
      const DType out = e.outputs.empty() ? e.compute : e.outputs.front().dtype;
      if (e.op == "cast") {
        const DType from = e.inputs.empty() ? out : e.inputs.front().dtype;
        o << "    " << id << " [shape=diamond, fillcolor=\"" << fill_of(out) << "\", label=\"cast\\n"
          << dtype_name(from) << " → " << dtype_name(out) << "\"];\n";
      } else {
        // Each line escaped on its own: "\\n" is dot's line break.
        std::string label =
            dot_escape(e.path + ": " + e.op) + "\\ncomputes " + std::string(dtype_name(e.compute));
        for (const TracedValue& v : e.inputs)
          if (v.name.find("weight") != std::string::npos || v.name.find("bias") != std::string::npos)
            label += "\\n" + dot_escape(v.name) + " " + std::string(dtype_name(v.dtype));
        o << "    " << id << " [shape=box, fillcolor=\"" << fill_of(out) << "\", label=\"" << label
          << "\"];\n";
      }
      if (!previous.empty()) o << "    " << previous << " -> " << id << " [label=\"" << flowing << "\"];\n";
      previous = id;
      flowing = e.outputs.empty() ? ""
                                  : std::string(dtype_name(e.outputs.front().dtype)) + " " +
                                        shape_string(e.outputs.front().shape);
    }
    o << "  }\n";
  }
  o << "}\n";
  return o.str();
}

}  // namespace mpt
