// A small SVG chart writer for the run report: line series, a shaded band
// (mean ± std), stacked areas, axes with "nice" ticks, a legend, and a
// "no data" panel. Output is plain inline SVG; no script is needed to view it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace lockstep::report {

struct Point {
  double x = 0;
  double y = 0;
};

// One named line (or, in Chart::stacked, one layer of a stacked area).
// Points with a non-finite x or y are skipped; the rest are drawn in x order.
struct Series {
  std::string name;
  std::vector<Point> points;
  std::string color;  // CSS colour; empty: the next palette colour
  bool dashed = false;
};

// A shaded range between lo and hi (e.g. mean - std .. mean + std), drawn
// under the lines. Indices where any of x, lo, hi is non-finite are skipped.
struct Band {
  std::string name;
  std::vector<double> x, lo, hi;
  std::string color;  // empty: the first palette colour
};

struct Chart {
  std::string id;  // the svg's data-chart attribute
  std::string title;
  std::string y_label;
  std::string x_label = "step";
  bool integer_x = true;        // x is a step count: tick spacing at least 1
  std::vector<Series> stacked;  // stacked areas, bottom layer first; a missing x counts as 0
  std::vector<Band> bands;
  std::vector<Series> lines;
  std::string no_data_hint;  // shown in the "no data" panel: which metrics were looked for
};

struct RenderedChart {
  std::string svg;
  int series_drawn = 0;  // lines + bands + layers with at least one finite point
  bool has_data = false;
};

// The chart as one <svg class="chart" data-chart="ID" data-series="N"> element.
// A chart without a single finite point becomes a "no data" panel (class
// "chart nodata", data-series="0") rather than disappearing.
RenderedChart render_chart(const Chart& chart);

// Axis ticks at multiples of 1, 2 or 5 x 10^k covering [lo, hi] with about
// `target` intervals. lo and hi are widened to the enclosing ticks. A zero or
// negative range is widened around the value first.
struct Ticks {
  double lo = 0;
  double hi = 1;
  double step = 1;
  std::vector<double> values;
};
Ticks nice_ticks(double lo, double hi, int target, bool integer);

// A tick label: as many decimals as `step` needs; scientific notation for very
// large or very small magnitudes (with enough digits that ticks stay distinct).
std::string format_tick(double v, double step, double abs_max);

// A value for a tooltip or a table: up to 6 significant digits; "nan", "inf".
std::string format_value(double v);

// Escapes & < > " ' and replaces control characters (other than tab, newline,
// carriage return) with U+FFFD, so any UTF-8 text is safe in HTML text and
// attribute values.
std::string html_escape(std::string_view s);

// At most max_bytes bytes of s, cut at a UTF-8 character boundary.
std::string utf8_prefix(std::string_view s, size_t max_bytes);

}  // namespace lockstep::report
