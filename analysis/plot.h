// Dependency-free SVG charts for the analysis tools (actlab-ablate, actlab-inspect): line charts
// (one polyline per series, optional log y axis, optional categorical x tick labels), grouped bar
// charts and radar charts (one polygon per series over n axes), with "nice" tick values, grid lines, a legend, escaped text and a colour-blind-safe palette
// (Okabe–Ito). Output is one self-contained SVG string. Tested in tests/test_ablate.cpp ("plot: ...").
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace actlab::plot {

// One line. x.size() must equal y.size(); a NaN y is a gap (the polyline is split there). Points are
// drawn in the given order (x need not be sorted, but usually is).
struct Series {
  std::string name;
  std::vector<double> x, y;
};

// log_y: logarithmic y axis (decades); every finite y must then be >= 0 (Error otherwise). A 0 has no
// place on a log axis: it is a gap, and a series with no y > 0 but some y = 0 (an exact policy's error,
// a band that holds nothing) keeps its legend entry with a second line "(0 everywhere: not drawn on the
// log axis)", so that its missing line is not taken for a missing series.
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

// A radar axis: value lo sits at the centre, hi on the outer ring (lo < hi, both finite). Orient each
// axis so that larger is better (a memory saving, not a memory size): the best series is outermost.
// log: distance grows with log(v / lo) (then lo > 0), so that one method far ahead — SWAP keeps almost
// nothing on the device — does not squeeze the others into the centre.
struct RadarAxis {
  std::string label;
  double lo = 0, hi = 1;
  bool log = false;
};

// values[k] belongs to RadarChart::axes[k]; each must be finite and inside [lo, hi] of its axis.
struct RadarSeries {
  std::string name;
  std::vector<double> values;
};

struct RadarChart {
  std::string title;
  std::vector<RadarAxis> axes;  // at least 3
  std::vector<RadarSeries> series;
};

// The radar's geometry, for callers and tests that place a value: axis k of n points at angle
// 2πk/n clockwise from straight up; value v on it sits at distance d = kRadarRadius·(v − lo)/(hi − lo)
// (log axis: kRadarRadius·log(v/lo)/log(hi/lo)) from (kRadarCentreX, kRadarCentreY), i.e. at
// x = cx + d·sin(angle), y = cy − d·cos(angle).
constexpr double kRadarCentreX = 300, kRadarCentreY = 275, kRadarRadius = 185;

// Self-contained SVG text (<svg ...>...</svg> with an XML declaration). Throws Error on inconsistent
// input (x/y size mismatch, values/series_names mismatch, a negative value on a log line axis, a value <= 0
// on a log bar axis).
// An empty chart (no series / no groups) renders axes and the title only.
std::string line_chart_svg(const LineChart& chart);
std::string bar_chart_svg(const BarChart& chart);
// One closed <polygon class="series"> per series, rings at quarters of every axis labelled with that
// axis's values, and the legend. Throws Error for fewer than 3 axes, a values/axes size mismatch, an
// axis with lo >= hi, or a value outside its axis.
std::string radar_chart_svg(const RadarChart& chart);

// The first bytes of every chart drawn here: a file that begins so is one of them, which a program
// replaces without --overwrite (replaceable_output, io/files.h); any other SVG is a user's.
inline constexpr std::string_view kSvgStart = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!-- drawn by actlab -->\n";
// Writes `svg` to `path` atomically (temp file + rename, io/files.h).
void write_svg(const std::string& path, const std::string& svg);

// Helpers exposed for tests and other text writers.
std::string xml_escape(const std::string& text);  // & < > " ' → entities
// About `target` "nice" tick values (1, 2, 2.5, 5 × 10^k steps) covering [lo, hi], first <= lo and
// last >= hi. lo == hi is widened. Requires finite lo <= hi.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

}  // namespace actlab::plot
