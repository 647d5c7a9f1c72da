// Dependency-free SVG charts for the analysis tools (actlab-ablate, actlab-inspect): line charts
// (one polyline per series, optional log y axis, optional categorical x tick labels) and grouped bar
// charts, with "nice" tick values, grid lines, a legend, escaped text and a colour-blind-safe palette
// (Okabe–Ito). Output is one self-contained SVG string. Tested in tests/test_ablate.cpp ("plot: ...").
#pragma once
#include <string>
#include <vector>

namespace actlab::plot {

// One line. x.size() must equal y.size(); a NaN y is a gap (the polyline is split there). Points are
// drawn in the given order (x need not be sorted, but usually is).
struct Series {
  std::string name;
  std::vector<double> x, y;
};

// log_y: logarithmic y axis (decades); every finite y must then be > 0 (Error otherwise).
// x_tick_labels: when non-empty, x is categorical: tick i sits at x = i and shows label i (e.g. layer
// names); long labels are rotated.
struct LineChart {
  std::string title, x_label, y_label;
  bool log_y = false;
  std::vector<Series> series;
  std::vector<std::string> x_tick_labels;
};

// One cluster of bars: values[i] belongs to BarChart::series_names[i] (sizes must match; NaN = no bar).
struct BarGroup {
  std::string label;
  std::vector<double> values;
};

// Grouped bars: one group per x position, one bar per series inside each group. On a linear axis bars
// grow from 0 (negative values downwards); with log_y every value must be > 0 and bars grow from the
// bottom of the axis.
struct BarChart {
  std::string title, y_label;
  bool log_y = false;
  std::vector<std::string> series_names;
  std::vector<BarGroup> groups;
};

// Self-contained SVG text (<svg ...>...</svg> with an XML declaration). Throws Error on inconsistent
// input (x/y size mismatch, values/series_names mismatch, non-positive values on a log axis).
// An empty chart (no series / no groups) renders axes and the title only.
std::string line_chart_svg(const LineChart& chart);
std::string bar_chart_svg(const BarChart& chart);

// Writes `svg` to `path` atomically (temp file + rename, io/files.h).
void write_svg(const std::string& path, const std::string& svg);

// Helpers exposed for tests and other text writers.
std::string xml_escape(const std::string& text);  // & < > " ' → entities
// About `target` "nice" tick values (1, 2, 2.5, 5 × 10^k steps) covering [lo, hi], first <= lo and
// last >= hi. lo == hi is widened. Requires finite lo <= hi.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

}  // namespace actlab::plot
