// Chapter 01 — the SVG chart writer (see svg_chart.hpp).
// Depends on: svg_chart.hpp; the standard library only.
//
// Layout, top to bottom: the title lines, one label row per rule, the plot
// area (ticks and tick labels outside it), the x axis label, the legend rows.
// Text widths are estimated from character counts (no font metrics), so the
// layout is the same on every machine.
#include "mpt/plot/svg_chart.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <utility>

namespace mpt::plot {

namespace {

constexpr double kFontSize = 11;    // every text but the title
constexpr double kCharWidth = 6.2;  // estimated advance of one 11 px sans-serif character
constexpr double kTitleLine = 17;   // title line height (13 px bold)
constexpr double kRuleRow = 13;     // height of one rule label row
constexpr double kLegendRow = 18;   // height of one legend row
constexpr double kRightMargin = 20;

std::string num(double v) {  // dimensions and message values: "%g"
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

double text_width(const std::string& s) { return kCharWidth * static_cast<double>(s.size()); }

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  std::string line;
  std::istringstream in(s);
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

double transform(Scale s, double v) { return s == Scale::log2 ? std::log2(v) : v; }

// --- checking -------------------------------------------------------------

[[noreturn]] void reject(const std::string& what) { throw std::invalid_argument("plot: " + what); }

void check_value(double v, Scale s, const std::string& where, const char* coordinate) {
  if (!std::isfinite(v)) reject(where + ": " + coordinate + " is " + num(v) + " (not finite)");
  if (s == Scale::log2 && !(v > 0))
    reject(where + ": " + coordinate + " is " + num(v) + ", which has no log2 (the axis is log2)");
}

std::string series_name(const Series& s, std::size_t i) {
  return "series " + std::to_string(i) + (s.name.empty() ? "" : " '" + s.name + "'");
}

void check_chart(const Chart& c) {
  if (!(c.width > 0 && c.height > 0 && std::isfinite(c.width) && std::isfinite(c.height)))
    reject("the chart size " + num(c.width) + " x " + num(c.height) + " is not > 0");
  for (const Axis* a : {&c.x, &c.y}) {
    const char* name = a == &c.x ? "x" : "y";
    if (a->max_ticks < 2) reject(std::string("the ") + name + " axis needs max_ticks >= 2");
    const std::string where = std::string("the ") + name + " axis range";
    check_value(a->min, Scale::linear, where, "min");  // NaN would silently mean "from the data"
    check_value(a->max, Scale::linear, where, "max");
    if (a->min < a->max) {
      check_value(a->min, a->scale, where, "min");
      check_value(a->max, a->scale, where, "max");
    }
  }
  for (std::size_t i = 0; i < c.series.size(); ++i) {
    const Series& s = c.series[i];
    const std::string name = series_name(s, i);
    if (!(s.size > 0 && std::isfinite(s.size))) reject(name + ": size " + num(s.size) + " is not > 0");
    for (std::size_t k = 0; k < s.points.size(); ++k) {
      const std::string where = name + " point " + std::to_string(k);
      check_value(s.points[k].x, c.x.scale, where, "x");
      check_value(s.points[k].y, c.y.scale, where, "y");
    }
    for (std::size_t k = 0; k < s.bars.size(); ++k) {
      const Bar& b = s.bars[k];
      const std::string where = name + " bar " + std::to_string(k);
      check_value(b.x0, c.x.scale, where, "x0");
      check_value(b.x1, c.x.scale, where, "x1");
      check_value(b.height, c.y.scale, where, "height");
      if (b.x1 < b.x0) reject(where + ": x1 " + num(b.x1) + " is left of x0 " + num(b.x0));
    }
  }
  for (std::size_t i = 0; i < c.rules.size(); ++i)
    check_value(c.rules[i].x, c.x.scale, "rule " + std::to_string(i) + " '" + c.rules[i].label + "'", "x");
}

// --- ranges and ticks -------------------------------------------------------

// [lo, hi] of one axis: the given range, else the data's extent (widened when
// it is a single value, a default when there are no data).
std::pair<double, double> resolve_range(const Axis& a, const std::vector<double>& values) {
  if (a.min < a.max) return {a.min, a.max};
  if (values.empty()) return a.scale == Scale::log2 ? std::make_pair(1.0, 2.0) : std::make_pair(0.0, 1.0);
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  if (*lo < *hi) return {*lo, *hi};
  return a.scale == Scale::log2 ? std::make_pair(*lo / 2, *lo * 2) : std::make_pair(*lo - 1, *lo + 1);
}

struct Tick {
  double value;       // data units
  std::string label;  // as printed
};

std::string linear_label(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  std::string s = buf;
  if (s.find_first_not_of("-0.") == std::string::npos) s = decimals ? "0." + std::string(decimals, '0') : "0";
  return s;
}

std::vector<Tick> ticks_of(Scale scale, double lo, double hi, int max_ticks, bool whole) {
  std::vector<Tick> ticks;
  if (scale == Scale::log2) {
    const double a = std::log2(lo), b = std::log2(hi);
    long step = 1000;  // 1, 2, 5, 10, 20, 50, ... exponents between ticks
    for (long candidate : {1L, 2L, 5L, 10L, 20L, 50L, 100L, 200L, 500L})
      if ((b - a) / static_cast<double>(candidate) + 1 <= max_ticks) {
        step = candidate;
        break;
      }
    const long first = static_cast<long>(std::ceil(a / static_cast<double>(step) - 1e-9));
    const long last = static_cast<long>(std::floor(b / static_cast<double>(step) + 1e-9));
    for (long i = first; i <= last; ++i)
      ticks.push_back({std::ldexp(1.0, static_cast<int>(i * step)), "2^" + std::to_string(i * step)});
    return ticks;
  }
  const double raw = (hi - lo) / (max_ticks - 1);
  const double decade = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * decade;
  for (double m : {1.0, 2.0, 5.0})
    if (m * decade >= raw * (1 - 1e-9)) {
      step = m * decade;
      break;
    }
  if (whole) step = std::max(step, 1.0);
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  const long long first = static_cast<long long>(std::ceil(lo / step - 1e-9));
  const long long last = static_cast<long long>(std::floor(hi / step + 1e-9));
  for (long long i = first; i <= last; ++i) {
    const double v = static_cast<double>(i) * step;
    ticks.push_back({v, linear_label(v, decimals)});
  }
  return ticks;
}

// --- layout ---------------------------------------------------------------

struct LegendEntry {
  const Series* series;
  double x, y;  // the swatch's left edge and the text baseline
};

struct Layout {
  Frame frame;
  std::vector<std::string> title_lines;
  std::vector<double> rule_label_y;
  std::vector<Tick> x_ticks, y_ticks;
  std::vector<LegendEntry> legend;
};

double swatch_width(const Series& s) { return s.kind == Kind::bars || s.kind == Kind::markers ? 10 : 18; }

Layout layout_of(const Chart& c) {
  check_chart(c);
  Layout L;
  Frame& f = L.frame;
  f.x_scale = c.x.scale;
  f.y_scale = c.y.scale;

  std::vector<double> xs, ys;
  for (const Series& s : c.series) {
    for (const Point& p : s.points) {
      xs.push_back(p.x);
      ys.push_back(p.y);
    }
    for (const Bar& b : s.bars) {
      xs.push_back(b.x0);
      xs.push_back(b.x1);
      ys.push_back(b.height);
      if (c.y.scale == Scale::linear) ys.push_back(0);
    }
  }
  std::tie(f.x_min, f.x_max) = resolve_range(c.x, xs);
  std::tie(f.y_min, f.y_max) = resolve_range(c.y, ys);
  L.x_ticks = ticks_of(c.x.scale, f.x_min, f.x_max, c.x.max_ticks, c.x.whole_ticks);
  L.y_ticks = ticks_of(c.y.scale, f.y_min, f.y_max, c.y.max_ticks, c.y.whole_ticks);

  // Top: title lines, then one row per rule label.
  L.title_lines = lines_of(c.title);
  double y = L.title_lines.empty() ? 4 : 18 + kTitleLine * static_cast<double>(L.title_lines.size() - 1) + 6;
  for (std::size_t i = 0; i < c.rules.size(); ++i) {
    y += kRuleRow;
    L.rule_label_y.push_back(y);
  }
  f.top = y + (c.rules.empty() ? 10 : 8);

  // Left: the widest y tick label and the rotated axis label.
  double widest = 0, widest_x = 0;
  for (const Tick& t : L.y_ticks) widest = std::max(widest, text_width(t.label));
  for (const Tick& t : L.x_ticks) widest_x = std::max(widest_x, text_width(t.label));
  f.left = std::ceil(widest) + 12 + (c.y.label.empty() ? 6 : 24);
  f.right = c.width - std::max(kRightMargin, std::ceil(widest_x / 2) + 4);

  // Bottom: tick labels, axis label, then the legend rows (wrapped to the width).
  std::vector<std::pair<const Series*, double>> entries;  // series, entry width
  for (const Series& s : c.series)
    if (!s.name.empty()) entries.push_back({&s, swatch_width(s) + 6 + text_width(s.name) + 24});
  std::vector<int> row_of;
  int rows = 0;
  double row_x = 0;
  for (const auto& e : entries) {
    if (rows == 0 || (row_x > 0 && f.left + row_x + e.second - 24 > f.right)) {
      ++rows;
      row_x = 0;
    }
    row_of.push_back(rows - 1);
    row_x += e.second;
  }
  const double below = 22 + (c.x.label.empty() ? 0 : 16) + (rows ? 6 + kLegendRow * rows : 0) + 8;
  f.bottom = c.height - below;
  if (!(f.bottom - f.top >= 10 && f.right - f.left >= 10))
    reject("the chart size " + num(c.width) + " x " + num(c.height) +
           " leaves no room for the plot area after the margins");

  double legend_y = f.bottom + 22 + (c.x.label.empty() ? 0 : 16) + 6 + 13;
  row_x = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (i > 0 && row_of[i] != row_of[i - 1]) {
      row_x = 0;
      legend_y += kLegendRow;
    }
    L.legend.push_back({entries[i].first, f.left + row_x, legend_y});
    row_x += entries[i].second;
  }
  return L;
}

// --- drawing --------------------------------------------------------------

std::string xy(double x, double y) { return fixed1(x) + "," + fixed1(y); }

std::string class_attr(const std::string& css) {
  return css.empty() ? "" : " class=\"" + xml_escape(css) + "\"";
}

void draw_series(std::ostringstream& o, const Series& s, const Frame& f) {
  const std::string cls = class_attr(s.css_class);
  const std::string colour = xml_escape(s.colour);
  switch (s.kind) {
    case Kind::bars:
      for (const Bar& b : s.bars) {
        const double base = f.y_scale == Scale::log2 ? f.y_min : 0.0;
        const double x0 = f.px(b.x0) + 0.5, x1 = f.px(b.x1) - 0.5;  // 1 px between neighbours
        const double top = std::min(f.py(b.height), f.py(base)),
                     bottom = std::max(f.py(b.height), f.py(base));
        o << "<rect" << cls << " x=\"" << fixed1(x0) << "\" y=\"" << fixed1(top) << "\" width=\""
          << fixed1(std::max(x1 - x0, 0.5)) << "\" height=\"" << fixed1(bottom - top) << "\" fill=\""
          << colour << "\"";
        if (b.tip.empty()) o << "/>\n";
        else o << "><title>" << xml_escape(b.tip) << "</title></rect>\n";
      }
      break;
    case Kind::markers:
      for (const Point& p : s.points)
        o << "<circle" << cls << " cx=\"" << fixed1(f.px(p.x)) << "\" cy=\"" << fixed1(f.py(p.y)) << "\" r=\""
          << fixed1(s.size) << "\" fill=\"" << colour << "\"/>\n";
      break;
    case Kind::line:
    case Kind::step: {
      if (s.points.size() < 2) break;  // one point is no line
      o << "<polyline" << cls << " fill=\"none\" stroke=\"" << colour << "\" stroke-width=\""
        << fixed1(s.size) << "\" points=\"" << xy(f.px(s.points[0].x), f.py(s.points[0].y));
      for (std::size_t i = 1; i < s.points.size(); ++i) {
        const Point& p = s.points[i];
        if (s.kind == Kind::step)  // hold the previous value up to here, then jump
          o << " " << xy(f.px(p.x), f.py(s.points[i - 1].y));
        o << " " << xy(f.px(p.x), f.py(p.y));
      }
      o << "\"/>\n";
      break;
    }
  }
}

void draw_swatch(std::ostringstream& o, const Series& s, double x, double baseline) {
  const std::string colour = xml_escape(s.colour);
  const double mid = baseline - 4;
  switch (s.kind) {
    case Kind::bars:
      o << "<rect x=\"" << fixed1(x) << "\" y=\"" << fixed1(mid - 5)
        << "\" width=\"10\" height=\"10\" fill=\"" << colour << "\"/>";
      break;
    case Kind::markers:
      o << "<circle cx=\"" << fixed1(x + 5) << "\" cy=\"" << fixed1(mid) << "\" r=\""
        << fixed1(std::min(s.size, 5.0)) << "\" fill=\"" << colour << "\"/>";
      break;
    case Kind::line:
    case Kind::step:
      o << "<line x1=\"" << fixed1(x) << "\" y1=\"" << fixed1(mid) << "\" x2=\"" << fixed1(x + 18)
        << "\" y2=\"" << fixed1(mid) << "\" stroke=\"" << colour << "\" stroke-width=\"" << fixed1(s.size)
        << "\"/>";
      break;
  }
}

// Whether rule i's label goes left of its line (anchored at its end) rather
// than right: right unless it would cross the line of an earlier rule (whose
// line runs down through this label's row) or leave the picture, and left
// does better.
bool label_on_left(const Chart& c, const Frame& f, std::size_t i) {
  const double x = f.px(c.rules[i].x), w = text_width(c.rules[i].label);
  auto crosses = [&](double lo, double hi) {
    for (std::size_t j = 0; j < i; ++j) {
      const double xj = f.px(c.rules[j].x);
      if (xj >= lo && xj <= hi) return true;
    }
    return false;
  };
  const bool right_fits = x + 4 + w <= c.width - 2, left_fits = x - 4 - w >= 2;
  const bool right_clean = right_fits && !crosses(x + 4, x + 4 + w);
  const bool left_clean = left_fits && !crosses(x - 4 - w, x - 4);
  if (right_clean) return false;
  if (left_clean) return true;
  return !right_fits && left_fits;
}

}  // namespace

double Frame::px(double x) const {
  const double a = transform(x_scale, x_min), b = transform(x_scale, x_max);
  return left + (transform(x_scale, x) - a) / (b - a) * (right - left);
}

double Frame::py(double y) const {
  const double a = transform(y_scale, y_min), b = transform(y_scale, y_max);
  return bottom - (transform(y_scale, y) - a) / (b - a) * (bottom - top);
}

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string fixed1(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return std::string(buf) == "-0.0" ? "0.0" : buf;
}

Frame frame_of(const Chart& c) { return layout_of(c).frame; }

std::string to_svg(const Chart& c) {
  const Layout L = layout_of(c);
  const Frame& f = L.frame;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(c.width) << "\" height=\"" << num(c.height)
    << "\" viewBox=\"0 0 " << num(c.width) << " " << num(c.height)
    << "\" font-family=\"sans-serif\" font-size=\"" << num(kFontSize) << "\">\n";
  if (!c.title.empty()) {
    std::string one_line = c.title;
    std::replace(one_line.begin(), one_line.end(), '\n', ' ');
    o << "<title>" << xml_escape(one_line) << "</title>\n";
  }
  if (!c.description.empty()) o << "<desc>" << xml_escape(c.description) << "</desc>\n";
  o << "<rect x=\"0\" y=\"0\" width=\"" << num(c.width) << "\" height=\"" << num(c.height)
    << "\" fill=\"white\"/>\n";
  for (std::size_t i = 0; i < L.title_lines.size(); ++i)
    o << "<text x=\"" << fixed1(f.left) << "\" y=\"" << fixed1(18 + kTitleLine * static_cast<double>(i))
      << "\" font-size=\"13\" font-weight=\"bold\">" << xml_escape(L.title_lines[i]) << "</text>\n";

  // Grid, under everything else.
  if (c.x.grid || c.y.grid) {
    o << "<g class=\"grid\" stroke=\"#dddddd\">\n";
    if (c.x.grid)
      for (const Tick& t : L.x_ticks)
        o << "<line x1=\"" << fixed1(f.px(t.value)) << "\" y1=\"" << fixed1(f.top) << "\" x2=\""
          << fixed1(f.px(t.value)) << "\" y2=\"" << fixed1(f.bottom) << "\"/>\n";
    if (c.y.grid)
      for (const Tick& t : L.y_ticks)
        o << "<line x1=\"" << fixed1(f.left) << "\" y1=\"" << fixed1(f.py(t.value)) << "\" x2=\""
          << fixed1(f.right) << "\" y2=\"" << fixed1(f.py(t.value)) << "\"/>\n";
    o << "</g>\n";
  }

  for (const Series& s : c.series) {
    o << "<g class=\"series\">\n";
    draw_series(o, s, f);
    o << "</g>\n";
  }

  // Axes, ticks, tick labels, axis labels.
  o << "<g class=\"axes\" stroke=\"black\">\n"
    << "<line x1=\"" << fixed1(f.left) << "\" y1=\"" << fixed1(f.bottom) << "\" x2=\"" << fixed1(f.right)
    << "\" y2=\"" << fixed1(f.bottom) << "\"/>\n"
    << "<line x1=\"" << fixed1(f.left) << "\" y1=\"" << fixed1(f.top) << "\" x2=\"" << fixed1(f.left)
    << "\" y2=\"" << fixed1(f.bottom) << "\"/>\n</g>\n";
  o << "<g class=\"x-ticks\" text-anchor=\"middle\">\n";
  for (const Tick& t : L.x_ticks) {
    const std::string x = fixed1(f.px(t.value));
    o << "<line x1=\"" << x << "\" y1=\"" << fixed1(f.bottom) << "\" x2=\"" << x << "\" y2=\""
      << fixed1(f.bottom + 4) << "\" stroke=\"black\"/><text x=\"" << x << "\" y=\"" << fixed1(f.bottom + 16)
      << "\">" << xml_escape(t.label) << "</text>\n";
  }
  o << "</g>\n<g class=\"y-ticks\" text-anchor=\"end\">\n";
  for (const Tick& t : L.y_ticks) {
    const std::string y = fixed1(f.py(t.value));
    o << "<line x1=\"" << fixed1(f.left - 4) << "\" y1=\"" << y << "\" x2=\"" << fixed1(f.left) << "\" y2=\""
      << y << "\" stroke=\"black\"/><text x=\"" << fixed1(f.left - 7) << "\" y=\""
      << fixed1(f.py(t.value) + 4) << "\">" << xml_escape(t.label) << "</text>\n";
  }
  o << "</g>\n";
  if (!c.x.label.empty())
    o << "<text class=\"x-label\" x=\"" << fixed1((f.left + f.right) / 2) << "\" y=\""
      << fixed1(f.bottom + 34) << "\" text-anchor=\"middle\">" << xml_escape(c.x.label) << "</text>\n";
  if (!c.y.label.empty()) {
    const std::string mid = fixed1((f.top + f.bottom) / 2);
    o << "<text class=\"y-label\" x=\"14.0\" y=\"" << mid
      << "\" text-anchor=\"middle\" transform=\"rotate(-90 14.0 " << mid << ")\">" << xml_escape(c.y.label)
      << "</text>\n";
  }

  // Rules: a line from its label row down through the plot.
  if (!c.rules.empty()) {
    o << "<g class=\"rules\">\n";
    for (std::size_t i = 0; i < c.rules.size(); ++i) {
      const Rule& r = c.rules[i];
      const double x = f.px(r.x), label_y = L.rule_label_y[i];
      const std::string colour = xml_escape(r.colour);
      o << "<line" << class_attr(r.css_class) << " x1=\"" << fixed1(x) << "\" y1=\"" << fixed1(label_y + 3)
        << "\" x2=\"" << fixed1(x) << "\" y2=\"" << fixed1(f.bottom) << "\" stroke=\"" << colour
        << "\" stroke-width=\"1.5\"" << (r.dashed ? " stroke-dasharray=\"4 3\"" : "") << "/>\n";
      const bool right_half = label_on_left(c, f, i);
      o << "<text" << class_attr("rule-label" + (r.css_class.empty() ? "" : " " + r.css_class)) << " x=\""
        << fixed1(x + (right_half ? -4 : 4)) << "\" y=\"" << fixed1(label_y) << "\" text-anchor=\""
        << (right_half ? "end" : "start") << "\" fill=\"" << colour << "\">" << xml_escape(r.label)
        << "</text>\n";
    }
    o << "</g>\n";
  }

  if (!L.legend.empty()) {
    o << "<g class=\"legend\">\n";
    for (const LegendEntry& e : L.legend) {
      draw_swatch(o, *e.series, e.x, e.y);
      o << "<text x=\"" << fixed1(e.x + swatch_width(*e.series) + 6) << "\" y=\"" << fixed1(e.y) << "\">"
        << xml_escape(e.series->name) << "</text>\n";
    }
    o << "</g>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace mpt::plot
