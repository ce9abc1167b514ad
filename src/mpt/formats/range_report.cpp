// Chapter 01 — floating-point formats and their limits.
// Depends on: range_report.hpp, range_classify.hpp (classify, log2_bin: the
// per-element math the CUDA reduction runs too), explain.hpp (printing).
#include "mpt/formats/range_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "mpt/formats/explain.hpp"

namespace mpt {

namespace {

constexpr int kMaxSpanBins = 72;

// The format's three landmarks and the bins that hold them.
struct Landmarks {
  double min_subnormal, min_normal, max;
  int subnormal_bin, normal_bin, max_bin;
};

Landmarks landmarks_of(const FormatSpec& s) {
  const Limits l = limits_of(s);
  return {l.min_subnormal, l.min_normal, l.max, s.emin() - s.mantissa_bits, s.emin(), s.emax()};
}

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * fraction);
  return buf;
}

std::string pad_left(const std::string& s, std::size_t width) {
  return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}

std::string pad_right(const std::string& s, std::size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

std::string xml_escape(std::string_view s) {
  std::string out;
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

std::string fixed(double v, int decimals = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// Table order: what survives first, then what is lost, then what was never
// a number to begin with.
constexpr RangeClass kTableOrder[] = {RangeClass::exact,          RangeClass::rounded,
                                      RangeClass::subnormal_result, RangeClass::flushed_to_zero,
                                      RangeClass::overflow,       RangeClass::zero,
                                      RangeClass::nonfinite};

const char* class_label(RangeClass c) {
  switch (c) {
    case RangeClass::exact: return "exact";
    case RangeClass::rounded: return "rounded (normal)";
    case RangeClass::subnormal_result: return "subnormal result";
    case RangeClass::flushed_to_zero: return "flushed to zero";
    case RangeClass::overflow: return "overflow";
    case RangeClass::zero: return "zero input";
    case RangeClass::nonfinite: return "inf/NaN input";
  }
  return "?";
}

const char* region_colour(BinRegion r) {
  switch (r) {
    case BinRegion::below_min_subnormal: return "#9e9e9e";
    case BinRegion::subnormal: return "#e69f00";
    case BinRegion::normal: return "#0072b2";
    case BinRegion::above_max: return "#d55e00";
  }
  return "#000000";
}

}  // namespace

std::string_view bin_region_name(BinRegion r) {
  switch (r) {
    case BinRegion::below_min_subnormal: return "below min subnormal";
    case BinRegion::subnormal: return "subnormal";
    case BinRegion::normal: return "normal";
    case BinRegion::above_max: return "above max";
  }
  return "?";
}

BinRegion bin_region(int k, const FormatSpec& f) {
  if (k < f.emin() - f.mantissa_bits) return BinRegion::below_min_subnormal;
  if (k < f.emin()) return BinRegion::subnormal;
  if (k <= f.emax()) return BinRegion::normal;  // 2^emax <= max < 2^(emax+1)
  return BinRegion::above_max;
}

double RangeReport::fraction(RangeClass c) const {
  const std::uint64_t t = total();
  return t == 0 ? 0.0 : static_cast<double>(count(c)) / static_cast<double>(t);
}

std::uint64_t RangeReport::bin_count(int k) const {
  if (k < kLog2BinMin || k > kLog2BinMax) return 0;
  return counts.log2_hist[k - kLog2BinMin];
}

BinSpan RangeReport::display_span() const {
  int data_lo = kLog2BinMax + 1, data_hi = kLog2BinMin - 1;
  for (int k = kLog2BinMin; k <= kLog2BinMax; ++k) {
    if (bin_count(k) == 0) continue;
    data_lo = std::min(data_lo, k);
    data_hi = std::max(data_hi, k);
  }
  BinSpan span;
  const Landmarks m = landmarks_of(format->spec);
  if (data_lo > data_hi) {
    // No data: centre on min normal, where a reader's eye goes first.
    span = {m.normal_bin - 1, m.normal_bin};
  } else {
    span = {std::max(kLog2BinMin, data_lo - 1), std::min(kLog2BinMax, data_hi + 1)};
  }
  // Each landmark comes with the bin on its far side, so the boundary shows.
  struct Want { int lo, hi; };
  std::vector<Want> wants = {{m.subnormal_bin - 1, m.subnormal_bin},
                             {m.normal_bin - 1, m.normal_bin},
                             {m.max_bin, m.max_bin + 1}};
  auto distance = [&](const Want& w) {
    return std::max({0, span.lo - w.lo, w.hi - span.hi});
  };
  std::sort(wants.begin(), wants.end(),
            [&](const Want& a, const Want& b) { return distance(a) < distance(b); });
  for (const Want& w : wants) {
    const BinSpan wider{std::max(kLog2BinMin, std::min(span.lo, w.lo)),
                        std::min(kLog2BinMax, std::max(span.hi, w.hi))};
    if (wider.hi - wider.lo + 1 <= kMaxSpanBins) span = wider;
  }
  return span;
}

std::vector<HistogramBin> RangeReport::histogram() const {
  const BinSpan span = display_span();
  std::vector<HistogramBin> bins;
  for (int k = span.lo; k <= span.hi; ++k) bins.push_back({k, bin_count(k), bin_region(k, format->spec)});
  return bins;
}

RangeReport range_report(const float* x, std::size_t n, const Format& f) {
  RangeReport r;
  r.format = &f;
  float amax = -1.0f;
  float min_nonzero = std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < n; ++i) {
    r.counts.add(x[i], f.spec);
    const float a = std::fabs(x[i]);
    if (!std::isfinite(a)) continue;
    amax = std::max(amax, a);
    if (a != 0) min_nonzero = std::min(min_nonzero, a);
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  r.amax = amax < 0 ? nan : amax;
  r.min_nonzero = std::isinf(min_nonzero) ? nan : min_nonzero;
  return r;
}

RangeReport range_report_from_counts(const RangeCounts& counts, const Format& f) {
  RangeReport r;
  r.format = &f;
  r.counts = counts;
  r.amax = r.min_nonzero = std::numeric_limits<float>::quiet_NaN();
  return r;
}

std::string render_text(const RangeReport& r, int bar_width) {
  const Format& f = *r.format;
  const Landmarks m = landmarks_of(f.spec);
  std::ostringstream o;
  o << "range report: " << r.total() << " values stored as " << f.name << " (round to nearest even)\n";
  o << "  " << f.name << " range: min subnormal " << power_of_two_or_decimal(m.min_subnormal)
    << ", min normal " << power_of_two_or_decimal(m.min_normal) << ", max "
    << shortest_decimal(static_cast<float>(m.max)) << "\n";
  if (!std::isnan(r.amax))
    o << "  data: largest |x| " << shortest_decimal(r.amax) << ", smallest nonzero |x| "
      << (std::isnan(r.min_nonzero) ? std::string("none") : shortest_decimal(r.min_nonzero))
      << "\n";
  o << "\n";

  // The class table.
  std::size_t count_width = 5;
  for (RangeClass c : kTableOrder)
    count_width = std::max(count_width, std::to_string(r.count(c)).size());
  count_width = std::max(count_width, std::to_string(r.total()).size());
  o << "  " << pad_right("class", 18) << pad_left("count", count_width) << "  "
    << pad_left("fraction", 8) << "\n";
  for (RangeClass c : kTableOrder)
    o << "  " << pad_right(class_label(c), 18) << pad_left(std::to_string(r.count(c)), count_width)
      << "  " << pad_left(percent(r.fraction(c)), 8) << "\n";
  o << "  " << pad_right("total", 18) << pad_left(std::to_string(r.total()), count_width) << "  "
    << pad_left(percent(r.total() ? 1.0 : 0.0), 8) << "\n\n";

  // The histogram, lowest bin first, with the landmarks as rules between bins.
  const std::vector<HistogramBin> bins = r.histogram();
  const BinSpan span = r.display_span();
  std::uint64_t peak = 0;
  for (const HistogramBin& b : bins) peak = std::max(peak, b.count);
  o << "  log2|x| histogram: bin k holds 2^k <= |x| < 2^(k+1)\n";
  if (peak == 0) o << "  (no finite nonzero values)\n";
  auto rule = [&](const std::string& text) {
    o << "  ---- " << text << " " << std::string(text.size() < 50 ? 50 - text.size() : 2, '-')
      << "\n";
  };
  std::vector<std::string> off_scale;
  if (m.subnormal_bin < span.lo || m.subnormal_bin > span.hi)
    off_scale.push_back("min subnormal " + power_of_two_or_decimal(m.min_subnormal));
  if (m.normal_bin < span.lo || m.normal_bin > span.hi)
    off_scale.push_back("min normal " + power_of_two_or_decimal(m.min_normal));
  if (m.max_bin < span.lo || m.max_bin > span.hi)
    off_scale.push_back("max " + shortest_decimal(static_cast<float>(m.max)));
  std::size_t count_w = 5;
  for (const HistogramBin& b : bins) count_w = std::max(count_w, std::to_string(b.count).size());
  o << "  " << pad_left("k", 5) << "  " << pad_right("region", 19) << "  "
    << pad_left("count", count_w) << "\n";
  for (const HistogramBin& b : bins) {
    if (b.log2_lo == m.subnormal_bin)
      rule("min subnormal " + power_of_two_or_decimal(m.min_subnormal) + " = " +
           shortest_decimal(static_cast<float>(m.min_subnormal)));
    if (b.log2_lo == m.normal_bin)
      rule("min normal " + power_of_two_or_decimal(m.min_normal) + " = " +
           shortest_decimal(static_cast<float>(m.min_normal)));
    std::size_t len = 0;
    if (b.count > 0 && peak > 0)
      len = std::max<std::size_t>(
          1, static_cast<std::size_t>(std::llround(static_cast<double>(bar_width) *
                                                   static_cast<double>(b.count) /
                                                   static_cast<double>(peak))));
    o << "  " << pad_left(std::to_string(b.log2_lo), 5) << "  "
      << pad_right(std::string(bin_region_name(b.region)), 19) << "  "
      << pad_left(std::to_string(b.count), count_w) << (len ? "  " + std::string(len, '#') : "")
      << "\n";
    if (b.log2_lo == m.max_bin)
      rule("max " + shortest_decimal(static_cast<float>(m.max)) + " (in bin " + std::to_string(m.max_bin) +
           "; larger values overflow)");
  }
  if (!off_scale.empty()) {
    o << "  off scale:";
    for (std::size_t i = 0; i < off_scale.size(); ++i) o << (i ? ", " : " ") << off_scale[i];
    o << "\n";
  }
  return o.str();
}

std::string render_svg(const RangeReport& r) {
  const Format& f = *r.format;
  const Landmarks m = landmarks_of(f.spec);
  const BinSpan span = r.display_span();
  const std::vector<HistogramBin> bins = r.histogram();
  std::uint64_t peak = 0;
  for (const HistogramBin& b : bins) peak = std::max(peak, b.count);

  const double width = 760, height = 360;
  const double left = 70, right = 20, top = 70, bottom = 70;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  const int nbins = span.hi - span.lo + 1;
  const double bin_w = plot_w / nbins;
  auto x_of = [&](double log2_value) { return left + (log2_value - span.lo) * bin_w; };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << " " << height << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o << "<title>log2|x| histogram against the " << xml_escape(f.name) << " range</title>\n";
  o << "<desc>" << r.total() << " values:";
  for (RangeClass c : kTableOrder) o << " " << class_label(c) << " " << r.count(c) << ";";
  o << "</desc>\n";
  o << "<rect x=\"0\" y=\"0\" width=\"" << width << "\" height=\"" << height
    << "\" fill=\"white\"/>\n";
  o << "<text x=\"" << left << "\" y=\"14\" font-size=\"13\" font-weight=\"bold\">"
    << r.total() << " values against " << xml_escape(f.name) << ": overflow "
    << percent(r.fraction(RangeClass::overflow)) << ", flushed to zero "
    << percent(r.fraction(RangeClass::flushed_to_zero)) << ", subnormal "
    << percent(r.fraction(RangeClass::subnormal_result)) << "</text>\n";

  // Bars.
  o << "<g class=\"bars\">\n";
  for (const HistogramBin& b : bins) {
    const double h = peak ? plot_h * static_cast<double>(b.count) / static_cast<double>(peak) : 0;
    o << "<rect class=\"bin\" x=\"" << fixed(x_of(b.log2_lo) + 0.5) << "\" y=\""
      << fixed(top + plot_h - h) << "\" width=\"" << fixed(std::max(bin_w - 1.0, 0.5))
      << "\" height=\"" << fixed(h) << "\" fill=\"" << region_colour(b.region) << "\"><title>2^"
      << b.log2_lo << " &lt;= |x| &lt; 2^" << b.log2_lo + 1 << ": " << b.count << " ("
      << bin_region_name(b.region) << ")</title></rect>\n";
  }
  o << "</g>\n";

  // Axes: a tick every `step` bins, step from 1, 2, 5, 10, 20, ...
  int step = 1;
  for (int s : {1, 2, 5, 10, 20, 50, 100}) {
    step = s;
    if (nbins / s <= 16) break;
  }
  o << "<g class=\"axes\" stroke=\"black\">\n";
  o << "<line x1=\"" << left << "\" y1=\"" << top + plot_h << "\" x2=\"" << left + plot_w
    << "\" y2=\"" << top + plot_h << "\"/>\n";
  o << "<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\""
    << top + plot_h << "\"/>\n";
  o << "</g>\n<g class=\"ticks\" text-anchor=\"middle\">\n";
  for (int k = span.lo; k <= span.hi + 1; ++k) {
    if (((k % step) + step) % step != 0) continue;
    o << "<line x1=\"" << fixed(x_of(k)) << "\" y1=\"" << top + plot_h << "\" x2=\""
      << fixed(x_of(k)) << "\" y2=\"" << top + plot_h + 4 << "\" stroke=\"black\"/>"
      << "<text x=\"" << fixed(x_of(k)) << "\" y=\"" << top + plot_h + 16 << "\">2^" << k
      << "</text>\n";
  }
  o << "</g>\n";
  o << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << top + plot_h + 34
    << "\" text-anchor=\"middle\">|x| (log2 scale, one bar per power of two)</text>\n";
  o << "<text x=\"" << left - 8 << "\" y=\"" << top + 4 << "\" text-anchor=\"end\">" << peak
    << "</text>\n<text x=\"" << left - 8 << "\" y=\"" << top + plot_h
    << "\" text-anchor=\"end\">0</text>\n";
  o << "<text x=\"14\" y=\"" << top + plot_h / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 14 "
    << top + plot_h / 2 << ")\">count</text>\n";

  // The three landmarks, as vertical lines at their exact log2 positions
  // (max sits inside its bin). A landmark beyond the span is pinned to the
  // edge, dashed, and labelled "off scale".
  struct Marker { const char* cls; std::string label; double log2_value; };
  const Marker markers[] = {
      {"min-subnormal", "min subnormal " + power_of_two_or_decimal(m.min_subnormal),
       static_cast<double>(m.subnormal_bin)},
      {"min-normal", "min normal " + power_of_two_or_decimal(m.min_normal),
       static_cast<double>(m.normal_bin)},
      {"max", "max " + shortest_decimal(static_cast<float>(m.max)), std::log2(m.max)},
  };
  o << "<g class=\"markers\">\n";
  for (int i = 0; i < 3; ++i) {
    const Marker& mk = markers[i];
    const double lo = span.lo, hi = span.hi + 1;
    const bool off = mk.log2_value < lo || mk.log2_value > hi;
    const double x = x_of(std::clamp(mk.log2_value, lo, hi));
    const double label_y = 30 + 13 * i;
    o << "<line class=\"marker " << mk.cls << "\" x1=\"" << fixed(x) << "\" y1=\"" << label_y + 3
      << "\" x2=\"" << fixed(x) << "\" y2=\"" << top + plot_h << "\" stroke=\"#cc0000\" stroke-width=\"1.5\""
      << (off ? " stroke-dasharray=\"4 3\"" : "") << "/>\n";
    const bool right_half = x > left + plot_w / 2;
    o << "<text class=\"marker-label " << mk.cls << "\" x=\"" << fixed(x + (right_half ? -4 : 4))
      << "\" y=\"" << label_y << "\" text-anchor=\"" << (right_half ? "end" : "start")
      << "\" fill=\"#cc0000\">" << xml_escape(mk.label) << (off ? " (off scale)" : "")
      << "</text>\n";
  }
  o << "</g>\n";

  // Legend.
  o << "<g class=\"legend\">\n";
  double lx = left;
  for (BinRegion reg : {BinRegion::below_min_subnormal, BinRegion::subnormal, BinRegion::normal,
                        BinRegion::above_max}) {
    o << "<rect x=\"" << lx << "\" y=\"" << height - 18 << "\" width=\"10\" height=\"10\" fill=\""
      << region_colour(reg) << "\"/><text x=\"" << lx + 14 << "\" y=\"" << height - 9 << "\">"
      << bin_region_name(reg) << "</text>\n";
    lx += 150;
  }
  o << "</g>\n</svg>\n";
  return o.str();
}

}  // namespace mpt
