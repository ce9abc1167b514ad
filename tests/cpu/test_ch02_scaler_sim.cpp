// Chapter 02 — loss scaling and FP32 master weights: the scaler simulation
// behind `mpt scaler simulate` (src/mpt/scaler_sim.*).
// Depends on: mpt/scaler_sim.hpp, mpt/grad_scaler.hpp. The plot case runs
// gnuplot and is skipped where it is not installed.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/amp/grad_scaler.hpp"
#include "mpt/amp/scaler_sim.hpp"

using mpt::ScalerSimulation;
using mpt::ScalerSimulationSpec;

namespace {

ScalerSimulationSpec spec(std::int64_t steps, std::vector<std::int64_t> at, std::int32_t interval = 3,
                          float init = 1024.0f) {
  ScalerSimulationSpec s;
  s.options.init_scale = init;
  s.options.growth_interval = interval;
  s.steps = steps;
  s.overflow_at = std::move(at);
  return s;
}

bool gnuplot_available() { return std::system("gnuplot --version >/dev/null 2>&1") == 0; }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("simulate: the sawtooth, row by row") {
  const ScalerSimulation sim = mpt::simulate_scaler(spec(8, {4, 5}));
  REQUIRE(sim.rows.size() == 8);
  // step, overflow, scale after update(), tracker, skipped
  const struct { bool overflow; float scale; int tracker; bool skipped; } expected[] = {
      {false, 1024, 1, false}, {false, 1024, 2, false}, {false, 2048, 0, false},
      {true, 1024, 0, true},   {true, 512, 0, true},    {false, 512, 1, false},
      {false, 512, 2, false},  {false, 1024, 0, false},
  };
  for (std::size_t i = 0; i < sim.rows.size(); ++i) {
    CAPTURE(i);
    CHECK(sim.rows[i].step == static_cast<std::int64_t>(i + 1));
    CHECK(sim.rows[i].overflow == expected[i].overflow);
    CHECK(sim.rows[i].scale == expected[i].scale);
    CHECK(sim.rows[i].growth_tracker == expected[i].tracker);
    CHECK(sim.rows[i].skipped == expected[i].skipped);
  }
  CHECK(sim.skipped_steps() == 2);
}

TEST_CASE("simulate: agrees with a GradScaler driven by hand, for default options") {
  ScalerSimulationSpec s;
  s.steps = 4100;
  s.overflow_at = {2500, 1, 3, 2};  // any order
  const ScalerSimulation sim = mpt::simulate_scaler(s);
  REQUIRE(sim.rows.size() == 4100);

  mpt::GradScaler scaler;  // PyTorch's defaults, as the spec's
  mpt::Parameter p("p", mpt::Tensor(mpt::DType::f32, {1, 2}));
  struct Counting : mpt::Optimizer {
    explicit Counting(mpt::Parameter* q) : Optimizer({q}) {}
    void step() override {}
  } opt(&p);
  for (std::int64_t k = 1; k <= 4100; ++k) {
    const bool overflow = k <= 3 || k == 2500;
    p.grad.f32()(0, 0) = overflow ? INFINITY : scaler.scale(1.0f);
    scaler.scale(1.0f);
    const bool stepped = scaler.step(opt);
    scaler.update();
    const auto& r = sim.rows[static_cast<std::size_t>(k - 1)];
    if (r.overflow != overflow || r.skipped == stepped || r.scale != scaler.get_scale() ||
        r.growth_tracker != scaler.growth_tracker()) {
      FAIL_CHECK("step " << k << " differs");
      break;
    }
  }
  // Three backoffs from 2^16, growth on the 2000th clean step (step 2003),
  // a backoff at 2500, and 1600 clean steps counted at the end.
  CHECK(sim.rows[2].scale == 8192.0f);
  CHECK(sim.rows[2001].scale == 8192.0f);
  CHECK(sim.rows[2002].scale == 16384.0f);
  CHECK(sim.rows[2499].scale == 8192.0f);
  CHECK(sim.rows.back().growth_tracker == 1600);
  CHECK(sim.skipped_steps() == 4);
}

TEST_CASE("simulate: overflow steps drawn from a seed are reproducible and have the right rate") {
  ScalerSimulationSpec s;
  s.steps = 20000;
  s.overflow_probability = 0.05;
  s.seed = 42;
  const ScalerSimulation a = mpt::simulate_scaler(s);
  const ScalerSimulation b = mpt::simulate_scaler(s);
  s.seed = 43;
  const ScalerSimulation c = mpt::simulate_scaler(s);
  std::int64_t na = 0, nc = 0;
  bool same_as_other_seed = true;
  for (std::size_t i = 0; i < a.rows.size(); ++i) {
    CHECK(a.rows[i].overflow == b.rows[i].overflow);
    na += a.rows[i].overflow;
    nc += c.rows[i].overflow;
    same_as_other_seed = same_as_other_seed && a.rows[i].overflow == c.rows[i].overflow;
  }
  CHECK_FALSE(same_as_other_seed);
  // 1000 expected, standard deviation about 31.
  CHECK(na > 850);
  CHECK(na < 1150);
  CHECK(nc > 850);
  CHECK(nc < 1150);
  CHECK(mpt::draw_overflow_steps(100, 0.0, 1).empty());
  CHECK(mpt::draw_overflow_steps(100, 1.0, 1).size() == 100);
}

TEST_CASE("simulate: bad specs are rejected with the reason") {
  CHECK_THROWS_WITH_AS(mpt::simulate_scaler(spec(0, {})), doctest::Contains("from 1 to"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(mpt::simulate_scaler(spec(5, {6})),
                       doctest::Contains("overflow step 6 is not a step of the run; valid steps: 1 to 5"),
                       std::invalid_argument);
  CHECK_THROWS_AS(mpt::simulate_scaler(spec(5, {0})), std::invalid_argument);
  ScalerSimulationSpec s = spec(5, {2});
  s.overflow_probability = 0.5;
  CHECK_THROWS_WITH_AS(mpt::simulate_scaler(s), doctest::Contains("not both"), std::invalid_argument);
  s.overflow_at.clear();
  s.overflow_probability = 1.5;
  CHECK_THROWS_WITH_AS(mpt::simulate_scaler(s), doctest::Contains("[0, 1]"), std::invalid_argument);
  s.overflow_probability = std::nan("");
  CHECK_THROWS_AS(mpt::simulate_scaler(s), std::invalid_argument);
  s = spec(5, {});
  s.options.growth_factor = 1.0f;
  CHECK_THROWS_WITH_AS(mpt::simulate_scaler(s), doctest::Contains("The growth factor must be > 1.0"),
                       std::invalid_argument);
}

TEST_CASE("render_text: options, overflow steps, the aligned table, the summary") {
  const std::string t = mpt::render_text(mpt::simulate_scaler(spec(4, {2}, 2, 0.1f)));
  CHECK(t ==
        "GradScaler(init_scale=0.1, growth_factor=2, backoff_factor=0.5, growth_interval=2)\n"
        "4 steps; overflow at step 2\n"
        "\n"
        "step  overflow  scale  growth_tracker  skipped\n"
        "   1         0    0.1               1        0\n"
        "   2         1   0.05               0        1\n"
        "   3         0   0.05               1        0\n"
        "   4         0    0.1               0        0\n"
        "\n"
        "1 of 4 optimizer steps skipped; final scale 0.1\n");
}

TEST_CASE("render_json: the same rows, and numbers that read back to the same floats") {
  const ScalerSimulation sim = mpt::simulate_scaler(spec(6, {3, 4}, 2, 0.1f));
  const nlohmann::json j = nlohmann::json::parse(mpt::render_json(sim));
  CHECK(j["steps"] == 6);
  CHECK(j["overflow_at"] == nlohmann::json::array({3, 4}));
  CHECK(j["options"]["growth_interval"] == 2);
  REQUIRE(j["rows"].size() == 6);
  for (std::size_t i = 0; i < 6; ++i) {
    const auto& r = j["rows"][i];
    CHECK(r["step"] == sim.rows[i].step);
    CHECK(r["overflow"] == (sim.rows[i].overflow ? 1 : 0));
    CHECK(static_cast<float>(r["scale"].get<double>()) == sim.rows[i].scale);
    CHECK(r["growth_tracker"] == sim.rows[i].growth_tracker);
    CHECK(r["skipped"] == (sim.rows[i].skipped ? 1 : 0));
  }
  CHECK(j["skipped_steps"] == 2);
  ScalerSimulationSpec p = spec(10, {});
  p.overflow_probability = 0.25;
  p.seed = 9;
  const nlohmann::json jp = nlohmann::json::parse(mpt::render_json(mpt::simulate_scaler(p)));
  CHECK(jp["overflow_probability"] == 0.25);
  CHECK(jp["seed"] == 9);
  CHECK_FALSE(jp.contains("overflow_at"));
}

TEST_CASE("write_plot_svg: an SVG renamed into place, no temporary left, bad paths rejected") {
  const ScalerSimulation sim = mpt::simulate_scaler(spec(30, {5, 6, 20}));
  const char* dir = std::getenv("TMPDIR");
  const std::string base = std::string(dir && *dir ? dir : "/tmp") + "/mpt_test_scaler_plot";
  const std::string path = base + ".svg";
  std::remove(path.c_str());
  CHECK_THROWS_AS(mpt::write_plot_svg(sim, "/nonexistent-dir/x/plot.svg"), std::invalid_argument);
  if (!gnuplot_available()) {
    MESSAGE("gnuplot not installed: the SVG itself is not checked (apt-get install gnuplot-nox)");
    CHECK_THROWS_WITH_AS(mpt::write_plot_svg(sim, path), doctest::Contains("apt-get install gnuplot-nox"),
                         std::runtime_error);
    return;
  }
  mpt::write_plot_svg(sim, path);
  const std::string svg = read_file(path);
  CHECK(svg.find("<svg") != std::string::npos);
  CHECK(svg.find("</svg>") != std::string::npos);
  CHECK(svg.find("overflow") != std::string::npos);  // the legend of the overflow marks
  std::ifstream tmp(path + ".tmp");
  CHECK_FALSE(tmp.good());
  std::remove(path.c_str());
}
