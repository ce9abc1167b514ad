// Chapter 01 — the one way the project draws a plot: a small SVG chart writer
// (introduced with Chapter 1's range histogram; Chapter 2's sawtooth uses it too).
// Depends on: the standard library only.
//
// A Chart is plain data: a title, an x and a y axis (linear, or log2 with
// ticks labelled 2^k), series drawn as polylines, step lines, bars or point
// markers, and vertical rules with labels. to_svg() turns it into a
// self-contained SVG document (no scripts, fonts or external files). Every
// number is printed with a fixed format ("%.1f" for coordinates), so the same
// chart gives the same bytes on every machine: the chapters' generated SVGs
// are diffed by their in-sync tests, and notebooks show the same picture
// without any program installed.
#pragma once

#include <string>
#include <vector>

namespace mpt::plot {

/// How an axis maps data to pixels.
enum class Scale {
  linear,  ///< evenly spaced values; ticks at 1, 2 or 5 times a power of ten
  /// log2 of the value; ticks at powers of two, labelled "2^k". Every value
  /// on such an axis must be > 0.
  log2,
};

/// One axis of a chart. The range is [min, max] when min < max is given,
/// otherwise the data's extent (bars on a linear y axis include 0).
struct Axis {
  std::string label;            ///< written under (x) or beside (y) the axis; empty: none
  Scale scale = Scale::linear;  ///< linear or log2
  double min = 0;               ///< lower end of the range (used when min < max)
  double max = 0;               ///< upper end of the range (used when min < max)
  bool grid = false;            ///< light grey lines across the plot at every tick
  int max_ticks = 10;           ///< at most this many ticks (at least 2)
  bool whole_ticks = false;     ///< linear ticks at whole numbers only (counts)
};

/// How a series is drawn.
enum class Kind {
  line,  ///< a polyline through the points, in order
  /// a step line: each point's y holds until the next point's x, where the
  /// line jumps (horizontal then vertical segments), like a loss scale that
  /// changes only at some steps
  step,
  bars,     ///< Series::bars, each a filled rectangle from the baseline up to its height
  markers,  ///< a dot at each point
};

/// A data point.
struct Point {
  double x = 0;  ///< in the x axis' units
  double y = 0;  ///< in the y axis' units
};

/// One bar of a Kind::bars series: from x0 to x1, from the baseline (0 on a
/// linear y axis, the axis minimum on a log2 one) up to `height`.
struct Bar {
  double x0 = 0;      ///< left edge, x units
  double x1 = 0;      ///< right edge, x units (x0 <= x1)
  double height = 0;  ///< top, y units
  std::string tip;    ///< tooltip (an SVG `<title>`); empty: none
};

/// A named set of data drawn one way in one colour; the legend shows one
/// entry per named series, even an empty one (which draws nothing).
struct Series {
  Kind kind = Kind::line;          ///< how to draw it
  std::string name;                ///< the legend entry; empty: not in the legend
  std::string colour = "#1f77b4";  ///< an SVG colour, e.g. "#d62728"
  std::vector<Point> points;       ///< for line, step and markers
  std::vector<Bar> bars;           ///< for bars
  double size = 1.5;               ///< stroke width (line, step) or dot radius (markers), px
  std::string css_class;           ///< class attribute of each element drawn; empty: none
};

/// A vertical line across the plot at x, labelled above the plot (one label
/// row per rule, in order), e.g. a format's smallest normal number. The
/// label starts right of its line, or ends left of it when that keeps it
/// off the lines of earlier rules or inside the picture.
struct Rule {
  double x = 0;                    ///< x units
  std::string label;               ///< text above the plot
  std::string colour = "#cc0000";  ///< line and label colour
  bool dashed = false;             ///< drawn dashed (e.g. a landmark pinned at the edge)
  /// class attribute of the line; the label's is "rule-label <css_class>"
  std::string css_class;
};

/// A whole chart. The plot area is what remains of width x height after the
/// margins for the title, the rule labels, the tick labels and the legend.
struct Chart {
  double width = 760;          ///< SVG width, px
  double height = 360;         ///< SVG height, px
  std::string title;           ///< heading at the top (also the `<title>`); a newline starts a new line
  std::string description;     ///< the `<desc>` element (not drawn); empty: none
  Axis x;                      ///< horizontal axis
  Axis y;                      ///< vertical axis
  std::vector<Series> series;  ///< drawn in order (later ones on top)
  std::vector<Rule> rules;     ///< drawn over the series
};

/// Where a chart's plot area is, and how data map onto it: what to_svg()
/// uses, exposed so that tests and callers can check positions.
struct Frame {
  double left = 0;                ///< x of the plot area's left edge, px
  double top = 0;                 ///< y of its top edge, px
  double right = 0;               ///< x of its right edge, px
  double bottom = 0;              ///< y of its bottom edge, px
  double x_min = 0;               ///< x range actually drawn (data units)
  double x_max = 0;               ///< upper end of the x range
  double y_min = 0;               ///< y range actually drawn (data units)
  double y_max = 0;               ///< upper end of the y range
  Scale x_scale = Scale::linear;  ///< the x axis' scale
  Scale y_scale = Scale::linear;  ///< the y axis' scale
  /// Pixel x of data x: x_min maps to left, x_max to right.
  double px(double x) const;
  /// Pixel y of data y: y_min maps to bottom, y_max to top (SVG y grows down).
  double py(double y) const;
};

/// The frame to_svg() draws `c` in: the margins, and the axis ranges
/// resolved from the axes and the data.
/// \throws std::invalid_argument as to_svg() does.
Frame frame_of(const Chart& c);

/// The chart as an SVG document: `<svg>` with width, height and viewBox, a
/// white background, the title, the axes with ticks and labels, the series,
/// the rules and the legend; it ends in "</svg>\n". The same chart always
/// gives the same bytes.
/// \throws std::invalid_argument (one line naming the series, the point and
///         the value) for a NaN or infinite value, a value <= 0 on a log2
///         axis, a bar with x1 < x0, an axis min or max that is not finite
///         (or, with min < max, not > 0 on a log2 axis), max_ticks < 2, a
///         series size that is not > 0, or a chart too small for its margins.
///         Non-finite values are rejected, never skipped: a plot that leaves
///         points out silently would show something the data do not say.
std::string to_svg(const Chart& c);

/// `s` with &, <, > and " replaced by XML entities, for SVG text and attributes.
std::string xml_escape(const std::string& s);

/// `v` printed with "%.1f" (the coordinate format of to_svg(); -0.0 prints as "0.0").
std::string fixed1(double v);

}  // namespace mpt::plot
