// Chapter 01 — floating-point formats and their limits.
// Depends on: format.hpp, range_classify.hpp (the per-element classification
// and log2 binning shared with the CUDA reduction in kernels/); the .cpp
// borrows explain.hpp's number printing and draws with plot/svg_chart.hpp.
//
// A range report answers "what happens to this tensor if I store it in format
// F?": how many values overflow, become subnormal, flush to zero, survive
// exactly or are merely rounded, and where the magnitudes sit (a log2
// histogram) relative to the format's representable range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mpt/formats/format.hpp"
#include "mpt/formats/range_classify.hpp"

namespace mpt {

/// Where a log2 bin [2^k, 2^(k+1)) lies relative to a format's range.
enum class BinRegion : std::uint8_t {
  /// 2^(k+1) <= min subnormal: these magnitudes are below the smallest
  /// subnormal (those above half of it still round up to it under RNE).
  below_min_subnormal,
  subnormal,  ///< min subnormal <= 2^k and 2^(k+1) <= min normal
  /// min normal <= 2^k <= max. The top normal bin also holds values between
  /// max and 2^(emax+1), which overflow; the class counts say how many.
  normal,
  above_max,  ///< 2^k > max: every value in the bin overflows
};

/// Lower-case name of a region ("below min subnormal", "subnormal", ...).
std::string_view bin_region_name(BinRegion r);

/// The region of bin k (values with floor(log2 |x|) == k) for format `f`.
BinRegion bin_region(int k, const FormatSpec& f);

/// One displayed histogram bin.
struct HistogramBin {
  int log2_lo = 0;                       ///< the bin holds 2^log2_lo <= |x| < 2^(log2_lo + 1)
  std::uint64_t count = 0;               ///< finite nonzero inputs in the bin
  BinRegion region = BinRegion::normal;  ///< relative to the report's format
};

/// An inclusive range of log2 bins, lo <= k <= hi.
struct BinSpan {
  int lo = 0;  ///< first bin shown
  int hi = 0;  ///< last bin shown
};

/// The range report of one tensor against one format.
struct RangeReport {
  const Format* format = nullptr;  ///< the format the tensor was measured against
  /// Class counts and the full 277-bin log2 histogram (range_classify.hpp):
  /// the same layout the CUDA reduction fills, so the two compare directly.
  RangeCounts counts;
  /// Largest finite |x|; NaN when the tensor has no finite value.
  float amax = 0;
  /// Smallest nonzero finite |x|; NaN when the tensor has none.
  float min_nonzero = 0;

  /// Elements covered (every element falls in exactly one class).
  std::uint64_t total() const { return counts.total(); }
  /// Elements of class c.
  std::uint64_t count(RangeClass c) const { return counts.count(c); }
  /// count(c) / total(); 0 for an empty tensor.
  double fraction(RangeClass c) const;
  /// Count of log2 bin k (0 outside -149..127).
  std::uint64_t bin_count(int k) const;
  /// The bins worth showing (see display_span()), lowest first.
  std::vector<HistogramBin> histogram() const;
  /// The bins the renderers show: the bins holding data, widened by one
  /// on each side, and widened further to take in the format's three
  /// landmarks (the bins of min subnormal, min normal and max) as long as
  /// the whole span stays within 72 bins; landmarks that would stretch it
  /// further are left out (the renderers then mark them as off scale).
  /// For fp16 and the FP8 formats all three landmarks always fit unless
  /// the data lies far away.
  BinSpan display_span() const;
};

/// Measure `n` floats against format `f` with the shared classify() and
/// log2_bin() of range_classify.hpp.
RangeReport range_report(const float* x, std::size_t n, const Format& f);

/// Wrap counts computed elsewhere (e.g. by the CUDA reduction) in a report;
/// amax and min_nonzero are unknown there and set to NaN.
RangeReport range_report_from_counts(const RangeCounts& counts, const Format& f);

/// Human-readable report: the format's landmarks, an aligned table of the
/// class counts and fractions, and an ASCII bar histogram with the landmark
/// lines drawn between the bins. `bar_width` is the longest bar in characters.
std::string render_text(const RangeReport& r, int bar_width = 40);

/// A self-contained SVG document (no scripts, no external resources), drawn
/// with mpt::plot::to_svg(): the log2 histogram as bars (class "bin")
/// coloured by region, with vertical lines at the format's min subnormal,
/// min normal and max (elements with class "marker min-subnormal",
/// "marker min-normal", "marker max"). The same report gives the same bytes.
std::string render_svg(const RangeReport& r);

}  // namespace mpt
