// Chapter 01 — floating-point formats and their limits.
// Depends on: range_report.hpp, range_classify.hpp (classify, log2_bin: the
// per-element math the CUDA reduction runs too), explain.hpp (printing),
// plot/svg_chart.hpp (the SVG histogram).
#include "mpt/formats/range_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "mpt/formats/explain.hpp"
#include "mpt/plot/svg_chart.hpp"

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

// Table order: what survives first, then what is lost, then what was never
// a number to begin with.
constexpr RangeClass kTableOrder[] = {
    RangeClass::exact,    RangeClass::rounded, RangeClass::subnormal_result, RangeClass::flushed_to_zero,
    RangeClass::overflow, RangeClass::zero,    RangeClass::nonfinite};

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
  struct Want {
    int lo, hi;
  };
  std::vector<Want> wants = {
      {m.subnormal_bin - 1, m.subnormal_bin}, {m.normal_bin - 1, m.normal_bin}, {m.max_bin, m.max_bin + 1}};
  auto distance = [&](const Want& w) { return std::max({0, span.lo - w.lo, w.hi - span.hi}); };
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
      << (std::isnan(r.min_nonzero) ? std::string("none") : shortest_decimal(r.min_nonzero)) << "\n";
  o << "\n";

  // The class table.
  std::size_t count_width = 5;
  for (RangeClass c : kTableOrder) count_width = std::max(count_width, std::to_string(r.count(c)).size());
  count_width = std::max(count_width, std::to_string(r.total()).size());
  o << "  " << pad_right("class", 18) << pad_left("count", count_width) << "  " << pad_left("fraction", 8)
    << "\n";
  for (RangeClass c : kTableOrder)
    o << "  " << pad_right(class_label(c), 18) << pad_left(std::to_string(r.count(c)), count_width) << "  "
      << pad_left(percent(r.fraction(c)), 8) << "\n";
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
    o << "  ---- " << text << " " << std::string(text.size() < 50 ? 50 - text.size() : 2, '-') << "\n";
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
  o << "  " << pad_left("k", 5) << "  " << pad_right("region", 19) << "  " << pad_left("count", count_w)
    << "\n";
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
          1, static_cast<std::size_t>(std::llround(
                 static_cast<double>(bar_width) * static_cast<double>(b.count) / static_cast<double>(peak))));
    o << "  " << pad_left(std::to_string(b.log2_lo), 5) << "  "
      << pad_right(std::string(bin_region_name(b.region)), 19) << "  "
      << pad_left(std::to_string(b.count), count_w) << (len ? "  " + std::string(len, '#') : "") << "\n";
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
  std::uint64_t peak = 0;
  for (const HistogramBin& b : r.histogram()) peak = std::max(peak, b.count);

  const std::string name(f.name);
  plot::Chart c;
  c.width = 760;
  c.height = 360;
  c.title = std::to_string(r.total()) + " values against " + name + ": overflow " +
            percent(r.fraction(RangeClass::overflow)) + ", flushed to zero " +
            percent(r.fraction(RangeClass::flushed_to_zero)) + ", subnormal " +
            percent(r.fraction(RangeClass::subnormal_result));
  c.description =
      "log2|x| histogram against the " + name + " range. " + std::to_string(r.total()) + " values:";
  for (RangeClass cls : kTableOrder)
    c.description += std::string(" ") + class_label(cls) + " " + std::to_string(r.count(cls)) + ";";
  // One bar per power of two: bin k spans [2^k, 2^(k+1)) on a log2 axis,
  // ticked as the old hand-drawn one was (at most 16 bins between ticks).
  c.x.scale = plot::Scale::log2;
  c.x.min = std::ldexp(1.0, span.lo);
  c.x.max = std::ldexp(1.0, span.hi + 1);
  c.x.max_ticks = 17;
  c.x.label = "|x| (log2 scale, one bar per power of two)";
  c.y.label = "count";
  c.y.whole_ticks = true;
  if (peak > 0) {
    c.y.min = 0;
    c.y.max = static_cast<double>(peak);
  }

  // One series per region, so each has its colour and legend entry.
  const BinRegion regions[] = {BinRegion::below_min_subnormal, BinRegion::subnormal, BinRegion::normal,
                               BinRegion::above_max};
  for (BinRegion reg : regions) {
    plot::Series s;
    s.kind = plot::Kind::bars;
    s.name = std::string(bin_region_name(reg));
    s.colour = region_colour(reg);
    s.css_class = "bin";
    for (const HistogramBin& b : r.histogram()) {
      if (b.region != reg) continue;
      s.bars.push_back(
          {std::ldexp(1.0, b.log2_lo), std::ldexp(1.0, b.log2_lo + 1), static_cast<double>(b.count),
           "2^" + std::to_string(b.log2_lo) + " <= |x| < 2^" + std::to_string(b.log2_lo + 1) + ": " +
               std::to_string(b.count) + " (" + std::string(bin_region_name(b.region)) + ")"});
    }
    c.series.push_back(std::move(s));
  }

  // The three landmarks, as vertical lines at their exact positions (max
  // sits inside its bin). A landmark beyond the span is pinned to the edge,
  // dashed, and labelled "off scale".
  struct Marker {
    const char* cls;
    std::string label;
    double value;
  };
  const Marker markers[] = {
      {"min-subnormal", "min subnormal " + power_of_two_or_decimal(m.min_subnormal), m.min_subnormal},
      {"min-normal", "min normal " + power_of_two_or_decimal(m.min_normal), m.min_normal},
      {"max", "max " + shortest_decimal(static_cast<float>(m.max)), m.max},
  };
  for (const Marker& mk : markers) {
    const bool off = mk.value < c.x.min || mk.value > c.x.max;
    c.rules.push_back({std::clamp(mk.value, c.x.min, c.x.max), mk.label + (off ? " (off scale)" : ""),
                       "#cc0000", off, std::string("marker ") + mk.cls});
  }
  return plot::to_svg(c);
}

}  // namespace mpt
