// Chapter 01 — the SVG chart writer (src/mpt/plot/svg_chart.*) that every
// picture of the project is drawn with.
// Depends on: mpt/plot/svg_chart.hpp, test_support.hpp (the XML check).
//
// Well-formed, byte-stable output; data mapped onto the plot area the right
// way round (linear and log2); step lines as horizontal-then-vertical
// segments; NaN and inf rejected with one line; empty series handled.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpt/plot/svg_chart.hpp"
#include "test_support.hpp"

using mpt::plot::Chart;
using mpt::plot::Frame;
using mpt::plot::Kind;
using mpt::plot::Scale;
using mpt::plot::Series;
using mpt_test::count_of;

namespace {

Series series(Kind kind, std::string name, std::vector<mpt::plot::Point> points) {
  Series s;
  s.kind = kind;
  s.name = std::move(name);
  s.points = std::move(points);
  return s;
}

// A chart with one of each kind of element.
Chart sample_chart() {
  Chart c;
  c.title = "a sample <chart> & its \"title\"\nsecond line";
  c.description = "for the tests";
  c.x.label = "x";
  c.y.label = "y";
  c.x.grid = c.y.grid = true;
  c.series.push_back(series(Kind::line, "line", {{0, 0}, {5, 3}, {10, 1}}));
  c.series.push_back(series(Kind::step, "step", {{0, 1}, {4, 2}, {10, 2}}));
  c.series.push_back(series(Kind::markers, "dots", {{4, 2}}));
  Series bars;
  bars.kind = Kind::bars;
  bars.name = "bars";
  bars.colour = "#e69f00";
  bars.bars = {{1, 2, 1.5, "one"}, {2, 3, 2.5, ""}};
  bars.css_class = "bin";
  c.series.push_back(bars);
  c.rules.push_back({7.5, "a rule", "#cc0000", true, "marker seven"});
  return c;
}

// The value of attribute `name` in the first element starting with `element`.
std::string attribute(const std::string& svg, const std::string& element, const std::string& name,
                      std::size_t from = 0) {
  const std::size_t at = svg.find(element, from);
  REQUIRE_MESSAGE(at != std::string::npos, "no " << element);
  const std::size_t end = svg.find('>', at);
  const std::size_t a = svg.find(" " + name + "=\"", at);
  REQUIRE_MESSAGE((a != std::string::npos && a < end), element << " has no " << name);
  const std::size_t v = a + name.size() + 3;
  return svg.substr(v, svg.find('"', v) - v);
}

struct XY {
  double x, y;
};

std::vector<XY> polyline_points(const std::string& points) {
  std::vector<XY> out;
  std::size_t i = 0;
  while (i < points.size()) {
    char* end = nullptr;
    const double x = std::strtod(points.c_str() + i, &end);
    REQUIRE(*end == ',');
    const double y = std::strtod(end + 1, &end);
    out.push_back({x, y});
    i = static_cast<std::size_t>(end - points.c_str());
    while (i < points.size() && points[i] == ' ') ++i;
  }
  return out;
}

// The text labels of the ticks of one axis ("x-ticks" or "y-ticks"), with
// the tick line's position along the axis.
struct TickSeen {
  std::string label;
  double position;
};
std::vector<TickSeen> ticks_in(const std::string& svg, const std::string& group, bool horizontal) {
  std::vector<TickSeen> out;
  const std::size_t begin = svg.find("<g class=\"" + group + "\"");
  REQUIRE(begin != std::string::npos);
  const std::size_t end = svg.find("</g>", begin);
  for (std::size_t p = svg.find("<line ", begin); p < end; p = svg.find("<line ", p + 1)) {
    const double pos = std::stod(attribute(svg, "<line ", horizontal ? "x1" : "y1", p));
    const std::size_t t = svg.find("\">", svg.find("<text ", p)) + 2;
    out.push_back({svg.substr(t, svg.find("</text>", t) - t), pos});
  }
  return out;
}

std::string one_line_error(const Chart& c) {
  try {
    mpt::plot::to_svg(c);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace

TEST_SUITE("ch01 svg chart") {
  TEST_CASE("a well-formed SVG document with size, viewBox, white background, escaped text") {
    const std::string svg = mpt::plot::to_svg(sample_chart());
    CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"760\" height=\"360\" "
                    "viewBox=\"0 0 760 360\"",
                    0) == 0);
    CHECK(svg.substr(svg.size() - 7) == "</svg>\n");
    std::string why;
    CHECK_MESSAGE(mpt_test::well_formed_xml(svg, why), why);
    CHECK(svg.find("<rect x=\"0\" y=\"0\" width=\"760\" height=\"360\" fill=\"white\"/>") !=
          std::string::npos);
    CHECK(svg.find("<title>a sample &lt;chart&gt; &amp; its &quot;title&quot; second line</title>") !=
          std::string::npos);
    CHECK(count_of(svg, "font-weight=\"bold\"") == 2);  // two title lines
    CHECK(svg.find("<desc>for the tests</desc>") != std::string::npos);
    // One element per datum: 1 + 1 polylines, 1 dot, 2 bars (one with a tooltip), 1 rule.
    CHECK(count_of(svg, "<polyline") == 2);
    CHECK(count_of(svg, "<circle") == 2);  // the dot and its legend swatch
    CHECK(count_of(svg, "<rect class=\"bin\"") == 2);
    CHECK(svg.find("<title>one</title></rect>") != std::string::npos);
    CHECK(count_of(svg, "<line class=\"marker seven\"") == 1);
    CHECK(count_of(svg, "class=\"rule-label marker seven\"") == 1);
    CHECK(svg.find("stroke-dasharray") != std::string::npos);
    for (const char* name : {">line</text>", ">step</text>", ">dots</text>", ">bars</text>"})
      CHECK_MESSAGE(count_of(svg, name) == 1, name);  // the legend
  }

  TEST_CASE("byte-identical output for identical input") {
    const Chart a = sample_chart();
    const Chart b = sample_chart();
    CHECK(mpt::plot::to_svg(a) == mpt::plot::to_svg(b));
    CHECK(mpt::plot::to_svg(a) == mpt::plot::to_svg(a));
    Chart c = sample_chart();
    c.series[0].points[1].y = 2.5;  // and a different input gives different bytes
    CHECK(mpt::plot::to_svg(c) != mpt::plot::to_svg(a));
  }

  TEST_CASE("linear axes: x_max lands on the right edge, y_max on the top edge") {
    Chart c;
    c.x.min = -2;
    c.x.max = 8;
    c.y.min = 0;
    c.y.max = 100;
    c.series.push_back(series(Kind::markers, "", {{8, 100}, {-2, 0}, {3, 50}}));
    const Frame f = mpt::plot::frame_of(c);
    CHECK(f.left < f.right);
    CHECK(f.top < f.bottom);
    CHECK(f.right < c.width);
    CHECK(f.bottom < c.height);
    CHECK(f.px(8) == doctest::Approx(f.right));
    CHECK(f.px(-2) == doctest::Approx(f.left));
    CHECK(f.py(100) == doctest::Approx(f.top));  // SVG y grows downwards
    CHECK(f.py(0) == doctest::Approx(f.bottom));
    CHECK(f.px(3) == doctest::Approx((f.left + f.right) / 2));
    const std::string svg = mpt::plot::to_svg(c);
    std::size_t at = svg.find("<circle");
    CHECK(attribute(svg, "<circle", "cx", at) == mpt::plot::fixed1(f.right));
    CHECK(attribute(svg, "<circle", "cy", at) == mpt::plot::fixed1(f.top));
    at = svg.find("<circle", at + 1);
    CHECK(attribute(svg, "<circle", "cx", at) == mpt::plot::fixed1(f.left));
    CHECK(attribute(svg, "<circle", "cy", at) == mpt::plot::fixed1(f.bottom));
    // Ticks every 1, 2 or 5 times a power of ten, at most max_ticks of them.
    const std::vector<TickSeen> xt = ticks_in(svg, "x-ticks", true);
    REQUIRE(xt.size() == 6);
    CHECK(xt.front().label == "-2");
    CHECK(xt.back().label == "8");
    CHECK(xt.back().position == doctest::Approx(f.right).epsilon(0.001));
    const std::vector<TickSeen> yt = ticks_in(svg, "y-ticks", false);
    REQUIRE(yt.size() == 6);
    CHECK(yt.front().label == "0");
    CHECK(yt.back().label == "100");
    CHECK(yt.back().position == doctest::Approx(f.top).epsilon(0.001));
    // Fractional ticks for a small range, unless the axis counts things.
    c.y.max = 2;
    std::vector<TickSeen> small = ticks_in(mpt::plot::to_svg(c), "y-ticks", false);
    REQUIRE(small.size() == 5);
    CHECK(small[1].label == "0.5");
    c.y.whole_ticks = true;
    small = ticks_in(mpt::plot::to_svg(c), "y-ticks", false);
    REQUIRE(small.size() == 3);
    CHECK(small[1].label == "1");
  }

  TEST_CASE("log2 axes: ticks at powers of two, labelled 2^k, evenly spaced") {
    Chart c;
    c.x.scale = Scale::log2;
    c.x.min = std::ldexp(1.0, -3);
    c.x.max = std::ldexp(1.0, 5);
    c.y.scale = Scale::log2;
    c.series.push_back(series(Kind::line, "", {{0.125, 1}, {32, 1024}}));
    const Frame f = mpt::plot::frame_of(c);
    CHECK(f.y_min == 1);  // the data's extent
    CHECK(f.y_max == 1024);
    CHECK(f.px(32) == doctest::Approx(f.right));
    CHECK(f.px(1) == doctest::Approx(f.left + 3.0 / 8.0 * (f.right - f.left)));  // log2: 3 of 8 octaves in
    CHECK(f.py(32) == doctest::Approx(f.bottom - 0.5 * (f.bottom - f.top)));     // 2^5 of 2^0..2^10
    const std::string svg = mpt::plot::to_svg(c);
    const std::vector<TickSeen> xt = ticks_in(svg, "x-ticks", true);
    REQUIRE(xt.size() == 9);
    for (int i = 0; i < 9; ++i) {
      CAPTURE(i);
      CHECK(xt[i].label == "2^" + std::to_string(i - 3));
      CHECK(xt[i].position == doctest::Approx(f.px(std::ldexp(1.0, i - 3))).epsilon(0.001));
    }
    const std::vector<TickSeen> yt = ticks_in(svg, "y-ticks", false);
    REQUIRE(yt.size() == 6);  // 11 powers are more than max_ticks (10): every other one
    CHECK(yt[0].label == "2^0");
    CHECK(yt[1].label == "2^2");
    CHECK(yt[5].label == "2^10");
    CHECK(yt.back().position == doctest::Approx(f.top).epsilon(0.001));
    // Wider ranges tick every 2, 5, 10, ... octaves, on multiples.
    c.x.min = std::ldexp(1.0, -149);
    c.x.max = std::ldexp(1.0, 128);
    const std::vector<TickSeen> wide = ticks_in(mpt::plot::to_svg(c), "x-ticks", true);
    REQUIRE(wide.size() == 5);  // 277 octaves: every 50th (every 20th would be 14 ticks)
    CHECK(wide.front().label == "2^-100");
    CHECK(wide.back().label == "2^100");
  }

  TEST_CASE("a step series draws horizontal-then-vertical segments, changing level at each point's x") {
    Chart c;
    c.x.min = 0;
    c.x.max = 10;
    c.y.min = 0;
    c.y.max = 4;
    c.series.push_back(series(Kind::step, "s", {{0, 1}, {4, 3}, {6, 2}, {10, 2}}));
    const Frame f = mpt::plot::frame_of(c);
    const std::vector<XY> p = polyline_points(attribute(mpt::plot::to_svg(c), "<polyline", "points"));
    // 4 points: the first, then (next x, previous y) and (next x, next y) for each of the other 3.
    REQUIRE(p.size() == 7);
    for (std::size_t i = 1; i < p.size(); ++i) {
      CAPTURE(i);
      if (i % 2 == 1) CHECK(p[i].y == p[i - 1].y);  // horizontal: the value holds
      else CHECK(p[i].x == p[i - 1].x);             // vertical: the jump, at the new point's x
    }
    CHECK(p[1].x == doctest::Approx(f.px(4)).epsilon(0.001));
    CHECK(p[1].y == doctest::Approx(f.py(1)).epsilon(0.001));
    CHECK(p[2].y == doctest::Approx(f.py(3)).epsilon(0.001));
    CHECK(p[4].y == doctest::Approx(f.py(2)).epsilon(0.001));
    CHECK(p[6].x == doctest::Approx(f.right).epsilon(0.001));
    // A plain line goes straight from point to point.
    c.series[0].kind = Kind::line;
    CHECK(polyline_points(attribute(mpt::plot::to_svg(c), "<polyline", "points")).size() == 4);
  }

  TEST_CASE("NaN, inf and non-positive log2 values are rejected with one line naming them") {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double inf = std::numeric_limits<double>::infinity();
    Chart c;
    c.series.push_back(series(Kind::line, "loss", {{0, 1}, {1, nan}}));
    std::string e = one_line_error(c);
    CHECK(e == "plot: series 0 'loss' point 1: y is nan (not finite)");
    c.series[0].points[1] = {inf, 2};
    CHECK(one_line_error(c) == "plot: series 0 'loss' point 1: x is inf (not finite)");
    c.series[0].points[1] = {1, 0};
    c.y.scale = Scale::log2;
    e = one_line_error(c);
    CHECK(e.find("point 1: y is 0, which has no log2") != std::string::npos);
    c.y.scale = Scale::linear;
    Series b;
    b.kind = Kind::bars;
    b.bars = {{2, 1, 1, ""}};
    c.series.push_back(b);
    CHECK(one_line_error(c) == "plot: series 1 bar 0: x1 1 is left of x0 2");
    c.series.pop_back();
    c.rules.push_back({-inf, "edge", "#000000", false, ""});
    CHECK(one_line_error(c) == "plot: rule 0 'edge': x is -inf (not finite)");
    c.rules.clear();
    c.x.min = 1;
    c.x.max = inf;
    CHECK(one_line_error(c) == "plot: the x axis range: max is inf (not finite)");
    c.x.max = 2;
    CHECK(one_line_error(c) == "(no exception)");
    c.x.min = nan;
    CHECK(one_line_error(c) == "plot: the x axis range: min is nan (not finite)");
    CHECK(e.find('\n') == std::string::npos);
  }

  TEST_CASE("an empty series draws nothing but keeps its legend entry; an empty chart is still a chart") {
    Chart c;
    c.series.push_back(series(Kind::step, "nothing yet", {}));
    c.series.push_back(series(Kind::line, "one point", {{1, 1}}));
    Series bars;
    bars.kind = Kind::bars;
    bars.name = "no bars";
    c.series.push_back(bars);
    const std::string svg = mpt::plot::to_svg(c);
    std::string why;
    CHECK_MESSAGE(mpt_test::well_formed_xml(svg, why), why);
    CHECK(count_of(svg, "<polyline") == 0);
    CHECK(svg.find(">nothing yet</text>") != std::string::npos);
    CHECK(svg.find(">no bars</text>") != std::string::npos);
    const Frame f = mpt::plot::frame_of(c);
    CHECK(f.x_min == 0);  // one value, 1: widened to [0, 2]
    CHECK(f.x_max == 2);
    const std::string empty = mpt::plot::to_svg(Chart{});
    CHECK_MESSAGE(mpt_test::well_formed_xml(empty, why), why);
    CHECK(empty.find("<title>") == std::string::npos);  // no title given
    CHECK(mpt::plot::frame_of(Chart{}).x_max == 1);     // default range [0, 1]
  }

  TEST_CASE("bars: from the baseline up, one colour per series, a legend swatch each") {
    Chart c;
    Series a;
    a.kind = Kind::bars;
    a.name = "normal";
    a.colour = "#0072b2";
    a.bars = {{0, 1, 10, ""}, {1, 2, 5, ""}};
    Series b = a;
    b.name = "subnormal";
    b.colour = "#e69f00";
    b.bars = {{2, 3, 2.5, ""}};
    c.series = {a, b};
    const Frame f = mpt::plot::frame_of(c);
    CHECK(f.y_min == 0);  // bars stand on 0
    CHECK(f.y_max == 10);
    const std::string svg = mpt::plot::to_svg(c);
    std::size_t at = svg.find("<rect x=\"" + mpt::plot::fixed1(f.px(0) + 0.5) + "\"");
    REQUIRE(at != std::string::npos);
    CHECK(attribute(svg, "<rect", "y", at) == mpt::plot::fixed1(f.top));  // the tallest reaches the top
    CHECK(std::stod(attribute(svg, "<rect", "y", at)) + std::stod(attribute(svg, "<rect", "height", at)) ==
          doctest::Approx(f.bottom).epsilon(0.001));
    CHECK(count_of(svg, "fill=\"#0072b2\"") == 3);  // two bars and the swatch
    CHECK(count_of(svg, "fill=\"#e69f00\"") == 2);
  }

}  // TEST_SUITE
