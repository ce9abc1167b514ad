// Chapter 02 — loss scaling and FP32 master weights: the scaler simulation
// behind `mpt scaler simulate` (src/mpt/scaler_sim.*).
// Depends on: mpt/scaler_sim.hpp, mpt/io/atomic_file.hpp (FileWriteError), test_support.hpp (the XML
// check). The trajectories are pinned to values worked out by hand, not to a second GradScaler; the plot is
// read back from its SVG: markers, staircase levels.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/amp/scaler_sim.hpp"
#include "mpt/io/atomic_file.hpp"
#include "test_support.hpp"

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

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The value of attribute `name` of the element starting at `at`.
std::string attribute_at(const std::string& svg, std::size_t at, const std::string& name) {
  const std::size_t end = svg.find('>', at);
  const std::size_t a = svg.find(" " + name + "=\"", at);
  REQUIRE_MESSAGE((a != std::string::npos && a < end), "no attribute " << name);
  const std::size_t v = a + name.size() + 3;
  return svg.substr(v, svg.find('"', v) - v);
}

// The first and last tick of an axis group ("x-ticks", "y-ticks"): the
// label and the pixel position along the axis, to map pixels back to data.
struct AxisMap {
  double v0, p0, v1, p1;  // value and pixel of the first and the last tick
  double value(double px) const { return v0 + (px - p0) / (p1 - p0) * (v1 - v0); }
};
AxisMap axis_map(const std::string& svg, const std::string& group, bool log2_labels) {
  const std::size_t begin = svg.find("<g class=\"" + group + "\"");
  REQUIRE(begin != std::string::npos);
  const std::size_t end = svg.find("</g>", begin);
  std::vector<std::pair<double, double>> ticks;
  for (std::size_t p = svg.find("<line ", begin); p < end; p = svg.find("<line ", p + 1)) {
    const double px = std::stod(attribute_at(svg, p, group == "x-ticks" ? "x1" : "y1"));
    const std::size_t t = svg.find("\">", svg.find("<text ", p)) + 2;
    std::string label = svg.substr(t, svg.find("</text>", t) - t);
    if (log2_labels) {
      REQUIRE(label.rfind("2^", 0) == 0);
      label = label.substr(2);
    }
    ticks.push_back({std::stod(label), px});
  }
  REQUIRE(ticks.size() >= 2);
  return {ticks.front().first, ticks.front().second, ticks.back().first, ticks.back().second};
}

struct XY {
  double x, y;
};

// The points of the first <polyline> with this class.
std::vector<XY> polyline(const std::string& svg, const std::string& cls) {
  const std::size_t at = svg.find("<polyline class=\"" + cls + "\"");
  REQUIRE(at != std::string::npos);
  std::istringstream in(attribute_at(svg, at, "points"));
  std::vector<XY> out;
  XY p{};
  char comma = 0;
  while (in >> p.x >> comma >> p.y) out.push_back(p);
  return out;
}

}  // namespace

TEST_CASE("simulate: the sawtooth, row by row") {
  const ScalerSimulation sim = mpt::simulate_scaler(spec(8, {4, 5}));
  REQUIRE(sim.rows.size() == 8);
  // step, overflow, scale after update(), tracker, skipped
  const struct {
    bool overflow;
    float scale;
    int tracker;
    bool skipped;
  } expected[] = {
      {false, 1024, 1, false}, {false, 1024, 2, false}, {false, 2048, 0, false}, {true, 1024, 0, true},
      {true, 512, 0, true},    {false, 512, 1, false},  {false, 512, 2, false},  {false, 1024, 0, false},
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

TEST_CASE("simulate: growth interval 2 from 2^16, overflows at 3, 7 and 8, written out") {
  // Worked by hand from PyTorch's rule: a clean step counts, the second in a
  // row doubles the scale and resets the count; an overflow halves it and
  // resets the count.
  const ScalerSimulation sim = mpt::simulate_scaler(spec(12, {3, 7, 8}, 2, 65536.0f));
  const float scales[] = {65536, 131072, 65536, 65536, 131072, 131072,
                          65536, 32768,  32768, 65536, 65536,  131072};
  const int trackers[] = {1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 1, 0};
  REQUIRE(sim.rows.size() == 12);
  for (std::size_t i = 0; i < 12; ++i) {
    CAPTURE(i + 1);
    const bool overflow = i + 1 == 3 || i + 1 == 7 || i + 1 == 8;
    CHECK(sim.rows[i].overflow == overflow);
    CHECK(sim.rows[i].skipped == overflow);
    CHECK(sim.rows[i].scale == scales[i]);
    CHECK(sim.rows[i].growth_tracker == trackers[i]);
  }
  CHECK(sim.skipped_steps() == 3);
}

TEST_CASE("simulate: factors that are not FP32 values, the scales written out") {
  // growth 1.1, backoff 0.3, interval 2 from 1000, overflows at 1-3 and 8:
  // each product formed in double and rounded to float, computed by hand
  // (Python's struct.pack('f', ...)). A product in float gives 27.000002 at
  // step 3.
  ScalerSimulationSpec s = spec(12, {1, 2, 3, 8}, 2, 1000.0f);
  s.options.growth_factor = 1.1;
  s.options.backoff_factor = 0.3;
  const ScalerSimulation sim = mpt::simulate_scaler(s);
  const float scales[] = {300.0f,         90.0f,          27.0f,          27.0f,
                          0x1.db3334p+4f, 0x1.db3334p+4f, 0x1.055c2ap+5f, 0x1.39a1ccp+3f,
                          0x1.39a1ccp+3f, 0x1.58fec6p+3f, 0x1.58fec6p+3f, 0x1.7b7ea6p+3f};
  const int trackers[] = {0, 0, 0, 1, 0, 1, 0, 0, 1, 0, 1, 0};
  REQUIRE(sim.rows.size() == 12);
  for (std::size_t i = 0; i < 12; ++i) {
    CAPTURE(i + 1);
    CHECK(sim.rows[i].scale == scales[i]);
    CHECK(sim.rows[i].growth_tracker == trackers[i]);
  }
}

TEST_CASE("simulate: PyTorch's defaults over 4100 steps, every row against its closed form") {
  // Overflows at 1, 2, 3 and 2500 (listed in any order). Worked by hand:
  // three halvings from 2^16 leave 8192 at step 3; the 2000th clean step
  // after that (step 2003) doubles it to 16384; step 2500 halves it back to
  // 8192; the 1600 clean steps after it are counted, none grows.
  ScalerSimulationSpec s;
  s.steps = 4100;
  s.overflow_at = {2500, 1, 3, 2};
  const ScalerSimulation sim = mpt::simulate_scaler(s);
  REQUIRE(sim.rows.size() == 4100);
  std::int64_t differ = 0;
  for (std::int64_t k = 1; k <= 4100; ++k) {
    const bool overflow = k <= 3 || k == 2500;
    float scale;
    std::int32_t tracker;
    if (k <= 3) {
      scale = std::ldexp(65536.0f, -static_cast<int>(k));
      tracker = 0;
    } else if (k < 2003) {
      scale = 8192.0f;
      tracker = static_cast<std::int32_t>(k - 3);
    } else if (k < 2500) {
      scale = 16384.0f;
      tracker = static_cast<std::int32_t>(k - 2003);
    } else {
      scale = 8192.0f;
      tracker = static_cast<std::int32_t>(k - 2500);
    }
    const auto& r = sim.rows[static_cast<std::size_t>(k - 1)];
    if (r.step != k || r.overflow != overflow || r.skipped != overflow || r.scale != scale ||
        r.growth_tracker != tracker) {
      if (differ++ < 3)
        FAIL_CHECK("step " << k << ": scale " << r.scale << " tracker " << r.growth_tracker << ", want "
                           << scale << " tracker " << tracker);
    }
  }
  CHECK(differ == 0);
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

TEST_CASE("render_plot_svg: one red dot per overflow, levels that change exactly where the scale did") {
  // growth_interval 3 from 1024: overflows at 4, 5 and 11, growth at 3, 8 and 14.
  const ScalerSimulation sim = mpt::simulate_scaler(spec(16, {4, 5, 11}));
  const std::string svg = mpt::render_plot_svg(sim);
  std::string why;
  CHECK_MESSAGE(mpt_test::well_formed_xml(svg, why), why);
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"960\" height=\"480\"", 0) == 0);
  CHECK(svg.find("overflow: step skipped, scale backed off") != std::string::npos);  // the legend
  CHECK(svg.find("16 steps; overflow at steps 4, 5, 11") != std::string::npos);      // the title
  CHECK(svg == mpt::render_plot_svg(sim));                                           // byte-stable

  const AxisMap xmap = axis_map(svg, "x-ticks", false);
  const AxisMap ymap = axis_map(svg, "y-ticks", true);  // log2 axis: labels 2^k
  CHECK(xmap.p1 > xmap.p0);                             // later steps to the right
  CHECK(ymap.p1 < ymap.p0);                             // larger scales higher up (SVG y grows downwards)
  auto step_of = [&](double px) { return static_cast<int>(std::lround(xmap.value(px))); };
  auto log2_scale_of = [&](double py) { return ymap.value(py); };

  // The dots: as many as overflowing steps, each at its step and at the
  // scale that step ran with (the one before its backoff).
  std::vector<int> dot_steps;
  std::vector<double> dot_levels;
  for (std::size_t p = svg.find("<circle class=\"overflow\""); p != std::string::npos;
       p = svg.find("<circle class=\"overflow\"", p + 1)) {
    dot_steps.push_back(step_of(std::stod(attribute_at(svg, p, "cx"))));
    dot_levels.push_back(log2_scale_of(std::stod(attribute_at(svg, p, "cy"))));
  }
  CHECK(dot_steps == std::vector<int>{4, 5, 11});
  REQUIRE(dot_levels.size() == 3);
  CHECK(dot_levels[0] == doctest::Approx(11).epsilon(0.01));  // step 4 ran with 2048
  CHECK(dot_levels[1] == doctest::Approx(10).epsilon(0.01));  // step 5 with 1024
  CHECK(dot_levels[2] == doctest::Approx(10).epsilon(0.01));  // step 11 with 1024 (grown at 8)

  // The staircase: horizontal then vertical segments; the vertical ones sit
  // exactly at the steps whose update() changed the scale, and join the
  // levels before and after.
  const std::vector<XY> pts = polyline(svg, "scale");
  REQUIRE(pts.size() >= 3);
  std::vector<int> changes;
  for (std::size_t i = 1; i < pts.size(); ++i) {
    CAPTURE(i);
    if (i % 2 == 1) {
      CHECK(pts[i].y == pts[i - 1].y);
    } else {
      CHECK(pts[i].x == pts[i - 1].x);
      if (pts[i].y != pts[i - 1].y) changes.push_back(step_of(pts[i].x));
    }
  }
  std::vector<int> expected;
  float prev = sim.spec.options.init_scale;
  for (const auto& r : sim.rows) {
    if (r.scale != prev) expected.push_back(static_cast<int>(r.step));
    prev = r.scale;
  }
  CHECK(expected == std::vector<int>{3, 4, 5, 8, 11, 14});
  CHECK(changes == expected);
  CHECK(step_of(pts.front().x) == 0);
  CHECK(step_of(pts.back().x) == 16);
  CHECK(log2_scale_of(pts.front().y) == doctest::Approx(10).epsilon(0.01));  // init 1024
  CHECK(log2_scale_of(pts.back().y) == doctest::Approx(std::log2(sim.rows.back().scale)).epsilon(0.01));
}

TEST_CASE("render_plot_svg: no overflow, too many steps, a scale that reaches 0") {
  const std::string clean = mpt::render_plot_svg(mpt::simulate_scaler(spec(5, {})));
  CHECK(clean.find("<circle class=\"overflow\"") == std::string::npos);
  CHECK(clean.find("overflow: step skipped") == std::string::npos);  // no legend entry without overflows
  CHECK(clean.find("no overflow") != std::string::npos);
  ScalerSimulation big = mpt::simulate_scaler(spec(5, {}));
  big.rows.resize(static_cast<std::size_t>(mpt::kMaxPlottedSteps) + 1, big.rows.back());
  CHECK_THROWS_WITH_AS(mpt::render_plot_svg(big), doctest::Contains("too many steps to plot"),
                       std::invalid_argument);
  // No floor: 2^-149 backs off to 0, which a log2 axis cannot show.
  const ScalerSimulation zero = mpt::simulate_scaler(spec(3, {1}, 3, std::ldexp(1.0f, -149)));
  REQUIRE(zero.rows[0].scale == 0.0f);
  const std::string svg = mpt::render_plot_svg(zero);
  std::string why;
  CHECK_MESSAGE(mpt_test::well_formed_xml(svg, why), why);
  CHECK(svg.find("3 steps with scale 0 or inf not drawn") != std::string::npos);
  CHECK(mpt_test::count_of(svg, "<circle class=\"overflow\"") == 1);
}

TEST_CASE("write_plot_svg: the rendered SVG written atomically, no temporary left, bad paths rejected") {
  const ScalerSimulation sim = mpt::simulate_scaler(spec(30, {5, 6, 20}));
  const char* dir = std::getenv("TMPDIR");
  const std::string base = std::string(dir && *dir ? dir : "/tmp") + "/mpt_test_scaler_plot";
  const std::string path = base + ".svg";
  std::remove(path.c_str());
  const std::string bad = "/nonexistent-dir/x/plot.svg";
  CHECK_THROWS_WITH_AS(mpt::write_plot_svg(sim, bad),
                       ("cannot write '" + bad + ".tmp': No such file or directory").c_str(),
                       mpt::FileWriteError);
  CHECK_THROWS_AS(mpt::write_plot_svg(sim, ""), std::invalid_argument);
  // write_file_atomically's rules (test_ch01_atomic_file.cpp): a directory is refused.
  const std::string folder = std::string(dir && *dir ? dir : "/tmp");
  CHECK_THROWS_WITH_AS(mpt::write_plot_svg(sim, folder),
                       ("cannot write '" + folder + "': it is a directory; give a file path").c_str(),
                       mpt::FileWriteError);
  mpt::write_plot_svg(sim, path);
  CHECK(read_file(path) == mpt::render_plot_svg(sim));
  std::ifstream tmp(path + ".tmp");
  CHECK_FALSE(tmp.good());
  // Written again over the old file: the whole new one.
  const ScalerSimulation other = mpt::simulate_scaler(spec(12, {2}));
  mpt::write_plot_svg(other, path);
  CHECK(read_file(path) == mpt::render_plot_svg(other));
  std::remove(path.c_str());
}
