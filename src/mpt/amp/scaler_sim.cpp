// Chapter 02 — loss scaling and FP32 master weights: the scaler simulation.
// Depends on: scaler_sim.hpp, grad_scaler.hpp, the optim tier (Optimizer), explain.hpp
// (shortest_decimal), nlohmann_json; POSIX (posix_spawnp) to run gnuplot.
#include "mpt/amp/scaler_sim.hpp"

#include "mpt/core/random.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "mpt/formats/explain.hpp"

extern char** environ;

namespace mpt {

std::int64_t ScalerSimulation::skipped_steps() const {
  return std::count_if(rows.begin(), rows.end(), [](const ScalerSimulationRow& r) { return r.skipped; });
}

std::vector<std::int64_t> draw_overflow_steps(std::int64_t steps, double probability,
                                              std::uint64_t seed) {
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
    throw std::invalid_argument(
        "give the overflow steps either as a list or as a probability, not both");
  if (s.overflow_probability && !(*s.overflow_probability >= 0.0 && *s.overflow_probability <= 1.0))
    throw std::invalid_argument("the overflow probability must be in [0, 1], got " +
                                shortest_decimal(*s.overflow_probability));
  for (std::int64_t k : s.overflow_at)
    if (k < 1 || k > s.steps)
      throw std::invalid_argument("overflow step " + std::to_string(k) +
                                  " is not a step of the run; valid steps: 1 to " +
                                  std::to_string(s.steps));
}

}  // namespace

ScalerSimulation simulate_scaler(const ScalerSimulationSpec& spec) {
  check_spec(spec);
  GradScaler scaler(spec.options);  // throws with the scaler's own message

  std::vector<char> overflow(static_cast<std::size_t>(spec.steps) + 1, 0);
  const std::vector<std::int64_t> drawn =
      spec.overflow_probability
          ? draw_overflow_steps(spec.steps, *spec.overflow_probability, spec.seed)
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
    line += "each overflows with probability " + shortest_decimal(*s.overflow_probability) +
            " (seed " + std::to_string(s.seed) + "): " + std::to_string(n) + " drawn";
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
  std::vector<std::vector<std::string>> cells = {
      {"step", "overflow", "scale", "growth_tracker", "skipped"}};
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
  j["final_scale"] =
      static_cast<double>(sim.rows.empty() ? s.options.init_scale : sim.rows.back().scale);
  return j.dump(2) + "\n";
}

// ---------------------------------------------------------------------------
// The plot.

namespace {

// A temporary file removed when it goes out of scope.
struct TempFile {
  std::string path;
  explicit TempFile(const char* stem) {
    const char* dir = std::getenv("TMPDIR");
    std::string pattern = std::string(dir && *dir ? dir : "/tmp") + "/" + stem + "-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    const int fd = ::mkstemp(buf.data());
    if (fd < 0)
      throw std::runtime_error("cannot create a temporary file in " + pattern.substr(0, pattern.rfind('/')) +
                               ": " + std::strerror(errno));
    ::close(fd);
    path = buf.data();
  }
  ~TempFile() { std::remove(path.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
};

bool bits_differ(float a, float b) { return std::memcmp(&a, &b, sizeof a) != 0; }

// gnuplot's single-quoted strings take '' for a quote and nothing else.
std::string gnuplot_quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("''") : std::string(1, c);
  return q + "'";
}

std::string plot_script(const ScalerSimulation& sim, const std::string& output) {
  std::int64_t overflows = 0;
  for (const auto& r : sim.rows) overflows += r.overflow;
  const bool mark_overflows = overflows > 0 && overflows <= kMaxPlottedOverflowMarks;
  std::string title = options_line(sim.spec.options) + ": " + overflow_line(sim);
  if (overflows > kMaxPlottedOverflowMarks)
    title += " (too many to mark: " + std::to_string(overflows) + " overflows)";

  std::ostringstream s;
  s << "set terminal svg size 960,480 font 'sans,12' background rgb 'white'\n"
    << "set output " << gnuplot_quoted(output) << "\n"
    << "set title " << gnuplot_quoted(title) << " noenhanced\n"
    << "set xlabel 'step'\n"
    << "set ylabel 'log2(scale after update())' noenhanced\n"
    << "set grid\n"
    << "set offsets 0, 0, 0.5, 0.5\n"
    << "set key outside bottom center horizontal noenhanced\n"
    << "set datafile missing '?'\n";
  // log2 of the scale; a scale of 0 (no floor) has none and is left out.
  auto log2_of = [](float scale) {
    if (!(scale > 0.0f)) return std::string("?");
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", std::log2(static_cast<double>(scale)));
    return std::string(buf);
  };
  // Drawn "with steps", a point is needed only where the scale changes (and
  // at both ends): the picture is the same and the file stays small.
  s << "$scale << EOD\n";
  for (std::size_t i = 0; i < sim.rows.size(); ++i) {
    const auto& r = sim.rows[i];
    const bool keep = i == 0 || i + 1 == sim.rows.size() ||
                      bits_differ(r.scale, sim.rows[i - 1].scale);
    if (keep) s << r.step << ' ' << log2_of(r.scale) << '\n';
  }
  s << "EOD\n";
  if (mark_overflows) {
    s << "$overflow << EOD\n";
    for (const auto& r : sim.rows)
      if (r.overflow) s << r.step << ' ' << log2_of(r.scale) << '\n';
    s << "EOD\n";
  }
  s << "plot $scale using 1:2 with steps linewidth 2 linecolor rgb '#1f77b4' title 'log2(scale)'";
  if (mark_overflows)
    // A short vertical red bar through each overflow's backed-off scale:
    // vectors are plain SVG paths, which every SVG viewer draws (gnuplot's
    // point symbols are <use> elements some converters drop).
    s << ", $overflow using 1:($2-0.4):(0):(0.8) with vectors nohead linewidth 3 linecolor rgb "
         "'#d62728' title 'overflow: step skipped, scale backed off'";
  s << "\n";
  return s.str();
}

// The first line of a file, for an error message.
std::string first_line_of(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto b = line.find_first_not_of(" \t");
    if (b != std::string::npos) return line.substr(b);
  }
  return "";
}

void run_gnuplot(const std::string& script) {
  TempFile script_file("mpt-gnuplot-script");
  TempFile err_file("mpt-gnuplot-stderr");
  {
    std::ofstream os(script_file.path, std::ios::binary | std::ios::trunc);
    os << script;
    if (!os.flush())
      throw std::runtime_error("cannot write the gnuplot script to " + script_file.path);
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, script_file.path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, err_file.path.c_str(), O_WRONLY | O_TRUNC, 0);
  char arg0[] = "gnuplot";
  char* argv[] = {arg0, nullptr};
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc == ENOENT)
    throw std::runtime_error(
        "gnuplot is not installed (not found on PATH); install it with: apt-get install gnuplot-nox");
  if (rc != 0) throw std::runtime_error(std::string("cannot run gnuplot: ") + std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw std::runtime_error(std::string("waiting for gnuplot: ") + std::strerror(errno));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const std::string why = first_line_of(err_file.path);
    throw std::runtime_error("gnuplot failed" + (why.empty() ? std::string() : ": " + why));
  }
}

}  // namespace

void write_plot_svg(const ScalerSimulation& sim, const std::string& path) {
  if (static_cast<std::int64_t>(sim.rows.size()) > kMaxPlottedSteps)
    throw std::invalid_argument("too many steps to plot (" + std::to_string(sim.rows.size()) +
                                "); plot at most " + std::to_string(kMaxPlottedSteps));
  if (path.empty() || path.find_first_of("\n\r") != std::string::npos)
    throw std::invalid_argument("cannot write '" + path + "': not a usable file name");
  const std::string tmp = path + ".tmp";
  // Create the temporary file ourselves: gnuplot only warns when it cannot
  // open its output, and the user deserves the reason.
  {
    std::ofstream probe(tmp, std::ios::binary | std::ios::trunc);
    if (!probe)
      throw std::invalid_argument("cannot write '" + tmp + "': " + std::strerror(errno));
  }
  try {
    run_gnuplot(plot_script(sim, tmp));
    std::ifstream in(tmp, std::ios::binary);
    std::string head(512, '\0');
    in.read(&head[0], static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<std::size_t>(in.gcount()));
    if (head.find("<svg") == std::string::npos)
      throw std::runtime_error("gnuplot did not write an SVG to '" + tmp + "'");
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw std::invalid_argument("cannot rename '" + tmp + "' to '" + path + "': " + why);
  }
}

}  // namespace mpt
