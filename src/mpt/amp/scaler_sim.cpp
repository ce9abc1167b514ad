// Chapter 02 — loss scaling and FP32 master weights: the scaler simulation.
// Depends on: scaler_sim.hpp, grad_scaler.hpp, the optim tier (Optimizer), explain.hpp
// (shortest_decimal), plot/svg_chart.hpp (the plot), io/atomic_file.hpp (writing
// it), nlohmann_json.
#include "mpt/amp/scaler_sim.hpp"

#include "mpt/core/random.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "mpt/formats/explain.hpp"
#include "mpt/io/atomic_file.hpp"
#include "mpt/plot/svg_chart.hpp"

namespace mpt {

std::int64_t ScalerSimulation::skipped_steps() const {
  return std::count_if(rows.begin(), rows.end(), [](const ScalerSimulationRow& r) { return r.skipped; });
}

std::vector<std::int64_t> draw_overflow_steps(std::int64_t steps, double probability, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int64_t> out;
  for (std::int64_t k = 1; k <= steps; ++k)
    if (rng.uniform() < probability) out.push_back(k);
  return out;
}

namespace {

// The optimizer of the simulation: it only counts its steps.
class CountingOptimizer : public Optimizer {
 public:
  explicit CountingOptimizer(Parameter* p) : Optimizer({p}) {}
  void step() override { ++steps; }
  std::int64_t steps = 0;
};

void check_spec(const ScalerSimulationSpec& s) {
  if (s.steps < 1 || s.steps > kMaxScalerSimulationSteps)
    throw std::invalid_argument("the number of steps must be from 1 to " +
                                std::to_string(kMaxScalerSimulationSteps) + ", got " +
                                std::to_string(s.steps));
  if (s.overflow_probability && !s.overflow_at.empty())
    throw std::invalid_argument("give the overflow steps either as a list or as a probability, not both");
  if (s.overflow_probability && !(*s.overflow_probability >= 0.0 && *s.overflow_probability <= 1.0))
    throw std::invalid_argument("the overflow probability must be in [0, 1], got " +
                                shortest_decimal(*s.overflow_probability));
  for (std::int64_t k : s.overflow_at)
    if (k < 1 || k > s.steps)
      throw std::invalid_argument("overflow step " + std::to_string(k) +
                                  " is not a step of the run; valid steps: 1 to " + std::to_string(s.steps));
}

}  // namespace

ScalerSimulation simulate_scaler(const ScalerSimulationSpec& spec) {
  check_spec(spec);
  GradScaler scaler(spec.options);  // throws with the scaler's own message

  std::vector<char> overflow(static_cast<std::size_t>(spec.steps) + 1, 0);
  const std::vector<std::int64_t> drawn =
      spec.overflow_probability ? draw_overflow_steps(spec.steps, *spec.overflow_probability, spec.seed)
                                : spec.overflow_at;
  for (std::int64_t k : drawn) overflow[static_cast<std::size_t>(k)] = 1;

  Parameter w("w", Tensor(DType::f32, {1, 4}));
  CountingOptimizer optimizer(&w);

  ScalerSimulation sim;
  sim.spec = spec;
  sim.rows.reserve(static_cast<std::size_t>(spec.steps));
  for (std::int64_t k = 1; k <= spec.steps; ++k) {
    optimizer.zero_grad();
    const float scaled_loss = scaler.scale(1.0f);
    // A stand-in for backward: gradients proportional to the scaled loss
    // (factors <= 1, so they stay finite at any finite scale); an overflow
    // step gets the inf that an FP16 overflow in backward would produce.
    w.grad.f32() << scaled_loss, 0.5f * scaled_loss, 0.25f * scaled_loss, -0.125f * scaled_loss;
    if (overflow[static_cast<std::size_t>(k)]) w.grad.f32()(0, 1) = std::numeric_limits<float>::infinity();
    const bool stepped = scaler.step(optimizer);
    scaler.update();
    sim.rows.push_back({k, overflow[static_cast<std::size_t>(k)] != 0, scaler.get_scale(),
                        scaler.growth_tracker(), !stepped});
  }
  return sim;
}

namespace {

std::string options_line(const GradScaler::Options& o) {
  return "GradScaler(init_scale=" + shortest_decimal(o.init_scale) +
         ", growth_factor=" + shortest_decimal(o.growth_factor) +
         ", backoff_factor=" + shortest_decimal(o.backoff_factor) +
         ", growth_interval=" + std::to_string(o.growth_interval) + ")";
}

std::string overflow_line(const ScalerSimulation& sim) {
  const ScalerSimulationSpec& s = sim.spec;
  std::int64_t n = 0;
  for (const auto& r : sim.rows) n += r.overflow;
  std::string line = std::to_string(s.steps) + " steps; ";
  if (s.overflow_probability) {
    line += "each overflows with probability " + shortest_decimal(*s.overflow_probability) + " (seed " +
            std::to_string(s.seed) + "): " + std::to_string(n) + " drawn";
  } else if (n == 0) {
    line += "no overflow";
  } else {
    line += "overflow at step" + std::string(n > 1 ? "s " : " ");
    bool first = true;
    for (const auto& r : sim.rows)
      if (r.overflow) {
        line += (first ? "" : ", ") + std::to_string(r.step);
        first = false;
      }
  }
  return line;
}

}  // namespace

std::string render_text(const ScalerSimulation& sim) {
  std::vector<std::vector<std::string>> cells = {{"step", "overflow", "scale", "growth_tracker", "skipped"}};
  cells.reserve(sim.rows.size() + 1);
  for (const auto& r : sim.rows)
    cells.push_back({std::to_string(r.step), r.overflow ? "1" : "0", shortest_decimal(r.scale),
                     std::to_string(r.growth_tracker), r.skipped ? "1" : "0"});
  std::vector<std::size_t> width(5, 0);
  for (const auto& row : cells)
    for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());

  std::string out = options_line(sim.spec.options) + "\n" + overflow_line(sim) + "\n\n";
  for (const auto& row : cells) {
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (i) out += "  ";
      out += std::string(width[i] - row[i].size(), ' ') + row[i];
    }
    out += "\n";
  }
  const float final_scale = sim.rows.empty() ? sim.spec.options.init_scale : sim.rows.back().scale;
  out += "\n" + std::to_string(sim.skipped_steps()) + " of " + std::to_string(sim.rows.size()) +
         " optimizer steps skipped; final scale " + shortest_decimal(final_scale) + "\n";
  return out;
}

std::string render_json(const ScalerSimulation& sim) {
  using Json = nlohmann::ordered_json;
  const ScalerSimulationSpec& s = sim.spec;
  Json j;
  j["options"] = {{"init_scale", static_cast<double>(s.options.init_scale)},
                  {"growth_factor", static_cast<double>(s.options.growth_factor)},
                  {"backoff_factor", static_cast<double>(s.options.backoff_factor)},
                  {"growth_interval", s.options.growth_interval}};
  j["steps"] = s.steps;
  if (s.overflow_probability) {
    j["overflow_probability"] = *s.overflow_probability;
    j["seed"] = s.seed;
  } else {
    Json at = Json::array();
    for (const auto& r : sim.rows)
      if (r.overflow) at.push_back(r.step);
    j["overflow_at"] = at;
  }
  Json rows = Json::array();
  for (const auto& r : sim.rows)
    rows.push_back({{"step", r.step},
                    {"overflow", r.overflow ? 1 : 0},
                    {"scale", static_cast<double>(r.scale)},
                    {"growth_tracker", r.growth_tracker},
                    {"skipped", r.skipped ? 1 : 0}});
  j["rows"] = rows;
  j["skipped_steps"] = sim.skipped_steps();
  j["final_scale"] = static_cast<double>(sim.rows.empty() ? s.options.init_scale : sim.rows.back().scale);
  return j.dump(2) + "\n";
}

// ---------------------------------------------------------------------------
// The plot, drawn with the project's SVG chart writer (mpt::plot).

namespace {

bool bits_differ(float a, float b) {
  std::uint32_t ua, ub;
  std::memcpy(&ua, &a, sizeof a);
  std::memcpy(&ub, &b, sizeof b);
  return ua != ub;
}

// A scale that a log2 axis can show: no floor lets backoff reach 0.
bool drawable(float scale) { return std::isfinite(scale) && scale > 0.0f; }

// `line` cut after the last ", " that keeps it within max_chars, with a note
// of how many items the whole list had (titles must fit the picture).
std::string shortened(const std::string& line, std::size_t max_chars, std::int64_t items) {
  if (line.size() <= max_chars) return line;
  const std::size_t cut = line.rfind(", ", max_chars - 20);
  if (cut == std::string::npos) return line;
  return line.substr(0, cut) + ", ... (" + std::to_string(items) + " in all)";
}

}  // namespace

std::string render_plot_svg(const ScalerSimulation& sim) {
  if (static_cast<std::int64_t>(sim.rows.size()) > kMaxPlottedSteps)
    throw std::invalid_argument("too many steps to plot (" + std::to_string(sim.rows.size()) +
                                "); plot at most " + std::to_string(kMaxPlottedSteps));
  const float init = sim.spec.options.init_scale;
  std::int64_t overflows = 0, undrawn = 0;
  for (const auto& r : sim.rows) {
    overflows += r.overflow;
    undrawn += !drawable(r.scale);
  }
  const bool mark_overflows = overflows > 0 && overflows <= kMaxPlottedOverflowMarks;

  plot::Chart c;
  c.width = 960;
  c.height = 480;
  std::string second = shortened(overflow_line(sim), 110, overflows);
  if (overflows > kMaxPlottedOverflowMarks)
    second += " (too many to mark: " + std::to_string(overflows) + " overflows)";
  if (undrawn > 0) second += "; " + std::to_string(undrawn) + " steps with scale 0 or inf not drawn";
  c.title = options_line(sim.spec.options) + "\n" + second;
  c.description =
      "The loss scale after each update() of a GradScaler simulation, log2 axis; red dots: "
      "overflowing steps, at the scale they ran with.";
  c.x.label = "step";
  c.x.min = 0;
  c.x.max = static_cast<double>(sim.rows.size());
  c.x.grid = true;
  c.x.max_ticks = 11;  // 0, 2, ..., 20 for the chapter's 20 steps
  c.y.label = "loss scale after update()";
  c.y.scale = plot::Scale::log2;
  c.y.grid = true;

  // The staircase: step k runs with the scale the previous update() left
  // (the initial one for step 1), and its own update() changes it at x = k.
  // Only the changes are points, so the file stays small; a run of scales
  // the log2 axis cannot show (0, inf) breaks the line.
  std::vector<std::vector<plot::Point>> runs;
  std::vector<plot::Point> marks;
  double lo = std::log2(init), hi = lo;
  float prev = init;
  bool open = drawable(init);
  if (open) runs.push_back({{0.0, init}});
  for (const auto& r : sim.rows) {
    const double k = static_cast<double>(r.step);
    if (r.overflow && mark_overflows && drawable(prev)) marks.push_back({k, prev});
    if (!bits_differ(r.scale, prev)) continue;
    if (drawable(r.scale)) {
      lo = std::min(lo, std::log2(static_cast<double>(r.scale)));
      hi = std::max(hi, std::log2(static_cast<double>(r.scale)));
      if (open) runs.back().push_back({k, r.scale});
      else runs.push_back({{k, r.scale}});
      open = true;
    } else if (open) {
      runs.back().push_back({k, prev});  // hold up to here, then no line
      open = false;
    }
    prev = r.scale;
  }
  if (open) runs.back().push_back({c.x.max, prev});
  c.y.min = std::exp2(std::floor(lo) - 0.5);
  c.y.max = std::exp2(std::ceil(hi) + 0.5);

  for (std::size_t i = 0; i < runs.size(); ++i) {
    plot::Series s;
    s.kind = plot::Kind::step;
    s.name = i == 0 ? "loss scale" : "";
    s.colour = "#1f77b4";
    s.size = 2;
    s.css_class = "scale";
    s.points = std::move(runs[i]);
    c.series.push_back(std::move(s));
  }
  if (overflows > 0) {
    plot::Series s;
    s.kind = plot::Kind::markers;
    s.name = "overflow: step skipped, scale backed off";
    s.colour = "#d62728";
    s.size = 3.5;
    s.css_class = "overflow";
    s.points = std::move(marks);
    c.series.push_back(std::move(s));
  }
  return plot::to_svg(c);
}

void write_plot_svg(const ScalerSimulation& sim, const std::string& path) {
  if (path.empty() || path.find_first_of("\n\r") != std::string::npos)
    throw std::invalid_argument("cannot write '" + path + "': not a usable file name");
  write_file_atomically(path, render_plot_svg(sim));
}

}  // namespace mpt
