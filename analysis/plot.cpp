// SVG line, grouped-bar and radar charts (see plot.h). Layout: title on top, y axis label rotated on the
// left, plot area with grid lines, legend in a right-hand column, x tick labels rotated by 40° when
// they would collide. Coordinates are written with one decimal; text is XML-escaped.
// Tested in tests/test_ablate.cpp ("plot: ...").
#include "actlab/analysis/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "actlab/core/error.h"
#include "actlab/io/files.h"

namespace actlab::plot {
namespace {

// Okabe & Ito (2008), ordered so that neighbouring series differ in hue and lightness; the yellow,
// hard to see on white, comes last.
const char* const kPalette[] = {"#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7",
                                "#56B4E9", "#000000", "#F0E442"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);
const char* colour(size_t i) { return kPalette[i % kPaletteSize]; }

constexpr double kCharWidth = 6.6;  // average glyph advance of 11-12 px sans-serif, for layout only
constexpr double kNoteCharWidth = 5.5;  // the same at the legend notes' 10 px

std::string num(double v) {  // coordinate
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", std::abs(v) < 0.05 ? 0.0 : v);
  return buf;
}

// A tick label with just enough decimals for the tick step (0.25 → 2, 20 → 0); %g beyond 1e6.
std::string tick_label(double v, double step) {
  char buf[40];
  if (v == 0) return "0";
  if (std::abs(v) >= 1e6 || std::abs(v) < 1e-4) {
    std::snprintf(buf, sizeof buf, "%.3g", v);
    return buf;
  }
  int decimals = 0;
  for (double s = step; decimals < 6 && std::abs(s - std::round(s)) > 1e-9 * std::max(1.0, std::abs(s)); s *= 10)
    ++decimals;
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string log_label(double v) {
  char buf[40];
  if (v >= 1e-3 && v < 1e6) {
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%.0e", v);
  return buf;
}

std::string value_label(double v) {  // 3 significant digits; whole numbers from 100 to a million
  char buf[40];
  std::snprintf(buf, sizeof buf, std::abs(v) >= 100 && std::abs(v) < 1e6 ? "%.0f" : "%.3g", v);
  return buf;
}

std::string truncate_label(const std::string& s, size_t max_chars) {
  if (s.size() <= max_chars) return s;
  return s.substr(0, max_chars - 1) + "\u2026";
}

// A value axis: where ticks go and how a value maps to [0, 1] of the axis length.
struct Axis {
  bool log = false;
  double lo = 0, hi = 1;  // domain (log: of log10 values)
  std::vector<double> ticks;
  std::vector<std::string> labels;
  double frac(double v) const {
    const double t = log ? std::log10(v) : v;
    return hi > lo ? (t - lo) / (hi - lo) : 0.5;
  }
};

// integral: the values are whole numbers (epochs, counts): no fractional ticks.
Axis linear_axis(double lo, double hi, bool integral = false) {
  Axis a;
  a.ticks = nice_ticks(lo, hi, 6);
  if (integral && a.ticks.size() > 1 && a.ticks[1] - a.ticks[0] < 1) {
    a.ticks.clear();
    for (double t = std::floor(lo); t <= std::ceil(hi) + 0.5; t += 1) a.ticks.push_back(t);
    if (a.ticks.size() == 1) a.ticks.push_back(a.ticks[0] + 1);
  }
  a.lo = a.ticks.front();
  a.hi = a.ticks.back();
  const double step = a.ticks.size() > 1 ? a.ticks[1] - a.ticks[0] : 1.0;
  for (double t : a.ticks) a.labels.push_back(tick_label(t, step));
  return a;
}

// Decades covering [lo, hi] (both > 0); within two decades also the 2× and 5× marks.
Axis log_axis(double lo, double hi) {
  Axis a;
  a.log = true;
  int d0 = static_cast<int>(std::floor(std::log10(lo) + 1e-12));
  int d1 = static_cast<int>(std::ceil(std::log10(hi) - 1e-12));
  if (d1 <= d0) d1 = d0 + 1;
  a.lo = d0;
  a.hi = d1;
  const int every = std::max(1, (d1 - d0 + 7) / 8);
  for (int d = d0; d <= d1; ++d) {
    const double base = std::pow(10.0, d);
    if ((d - d0) % every == 0) {
      a.ticks.push_back(base);
      a.labels.push_back(log_label(base));
    }
    if (d1 - d0 <= 2 && d < d1)
      for (double m : {2.0, 5.0}) {
        a.ticks.push_back(m * base);
        a.labels.push_back(log_label(m * base));
      }
  }
  return a;
}

Axis value_axis(const std::vector<double>& values, bool log, bool include_zero, const char* what) {
  bool integral = true;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double v : values) {
    if (std::isnan(v)) continue;
    ACTLAB_CHECK(std::isfinite(v), what, ": value ", v, " is not finite");
    ACTLAB_CHECK(!log || v > 0, what, ": log axis needs values > 0, got ", v);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    integral = integral && v == std::round(v);
  }
  if (lo > hi) return log ? log_axis(1, 10) : linear_axis(0, 1);  // nothing to show
  if (log) return log_axis(lo, hi);
  if (include_zero) {
    lo = std::min(lo, 0.0);
    hi = std::max(hi, 0.0);
  }
  return linear_axis(lo, hi, integral);
}

// The frame all charts share: canvas, plot rectangle and the text around it.
struct Frame {
  double width = 760, height = 460;
  double left = 72, top = 46, plot_w = 0, plot_h = 0;
  double x(double frac) const { return left + frac * plot_w; }
  double y(double frac) const { return top + (1.0 - frac) * plot_h; }
};

// Legend width from the longest name or note (notes: empty, or one per legend entry); bottom margin from
// the x tick labels (rotated when crowded).
Frame make_frame(const std::vector<std::string>& legend, const std::vector<std::string>& x_labels, double slots,
                 bool* rotate, const std::vector<std::string>& notes = {}) {
  Frame f;
  size_t longest_name = 0, longest_tick = 0, longest_note = 0;
  for (const auto& s : legend) longest_name = std::max(longest_name, std::min<size_t>(s.size(), 32));
  for (const auto& s : x_labels) longest_tick = std::max(longest_tick, std::min<size_t>(s.size(), 28));
  for (const auto& s : notes) longest_note = std::max(longest_note, s.size());
  const double legend_w = legend.empty() ? 20
                                         : 44 + std::max(kCharWidth * static_cast<double>(longest_name),
                                                         kNoteCharWidth * static_cast<double>(longest_note));
  f.plot_w = f.width - f.left - legend_w;
  const double slot_px = f.plot_w / std::max(1.0, slots);
  *rotate = kCharWidth * static_cast<double>(longest_tick) + 6 > slot_px;
  if (*rotate) {  // the first label runs cos(40°) of its length left of its tick: keep it on the canvas
    const double overhang = 0.77 * kCharWidth * static_cast<double>(longest_tick) - slot_px / 2 + 8;
    f.left = std::max(f.left, overhang);
    f.plot_w = f.width - f.left - legend_w;
  }
  // sin(40°) of the rotated label's length, plus room for the axis label below it.
  const double bottom = 56 + (*rotate ? 0.64 * kCharWidth * static_cast<double>(longest_tick) - 8 : 0);
  f.height += *rotate ? bottom - 56 : 0;
  f.plot_h = f.height - f.top - bottom;
  return f;
}

void open_svg(std::ostringstream& o, const Frame& f, const std::string& title) {
  o << kSvgStart << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(f.width) << "\" height=\"" << num(f.height)
    << "\" viewBox=\"0 0 " << num(f.width) << ' ' << num(f.height)
    << "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
    << "<title>" << xml_escape(title) << "</title>\n"
    << "<rect x=\"0\" y=\"0\" width=\"" << num(f.width) << "\" height=\"" << num(f.height) << "\" fill=\"#ffffff\"/>\n"
    << "<text x=\"" << num(f.width / 2) << "\" y=\"26\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">"
    << xml_escape(title) << "</text>\n";
}

// Horizontal grid lines + y tick labels, the y axis label, and the frame's left and bottom edges.
void draw_y_axis(std::ostringstream& o, const Frame& f, const Axis& a, const std::string& label) {
  o << "<g class=\"y-axis\" stroke=\"#dddddd\" stroke-width=\"1\">\n";
  for (double t : a.ticks)
    o << "<line x1=\"" << num(f.left) << "\" y1=\"" << num(f.y(a.frac(t))) << "\" x2=\"" << num(f.left + f.plot_w)
      << "\" y2=\"" << num(f.y(a.frac(t))) << "\"/>\n";
  o << "</g>\n<g class=\"y-ticks\" text-anchor=\"end\" fill=\"#333333\">\n";
  for (size_t i = 0; i < a.ticks.size(); ++i)
    o << "<text x=\"" << num(f.left - 6) << "\" y=\"" << num(f.y(a.frac(a.ticks[i])) + 4) << "\">"
      << xml_escape(a.labels[i]) << "</text>\n";
  o << "</g>\n";
  const double cy = f.top + f.plot_h / 2;
  o << "<text x=\"16\" y=\"" << num(cy) << "\" text-anchor=\"middle\" transform=\"rotate(-90 16 " << num(cy)
    << ")\">" << xml_escape(label) << "</text>\n";
  o << "<path d=\"M" << num(f.left) << ' ' << num(f.top) << "V" << num(f.top + f.plot_h) << "H"
    << num(f.left + f.plot_w) << "\" fill=\"none\" stroke=\"#333333\" stroke-width=\"1\"/>\n";
}

// One x tick label at px (centre of its slot), rotated when `rotate`.
void x_tick_text(std::ostringstream& o, const Frame& f, double px, const std::string& text, bool rotate) {
  const double y = f.top + f.plot_h + 16;
  const std::string shown = xml_escape(truncate_label(text, 28));
  if (rotate)
    o << "<text x=\"" << num(px) << "\" y=\"" << num(y) << "\" text-anchor=\"end\" transform=\"rotate(-40 "
      << num(px) << ' ' << num(y) << ")\">" << shown << "</text>\n";
  else
    o << "<text x=\"" << num(px) << "\" y=\"" << num(y) << "\" text-anchor=\"middle\">" << shown << "</text>\n";
}

// notes: empty, or one per name; a non-empty note is a second, smaller line under its entry.
void draw_legend(std::ostringstream& o, const Frame& f, const std::vector<std::string>& names, bool bars,
                 const std::vector<std::string>& notes = {}) {
  const double x = f.left + f.plot_w + 16;
  o << "<g class=\"legend\">\n";
  double y = f.top + 8;
  for (size_t i = 0; i < names.size(); ++i, y += 20) {
    if (bars)
      o << "<rect x=\"" << num(x) << "\" y=\"" << num(y - 6) << "\" width=\"18\" height=\"12\" fill=\"" << colour(i)
        << "\"/>\n";
    else
      o << "<line x1=\"" << num(x) << "\" y1=\"" << num(y) << "\" x2=\"" << num(x + 18) << "\" y2=\"" << num(y)
        << "\" stroke=\"" << colour(i) << "\" stroke-width=\"2.5\"/>\n";
    o << "<text x=\"" << num(x + 24) << "\" y=\"" << num(y + 4) << "\">" << xml_escape(truncate_label(names[i], 32))
      << "</text>\n";
    if (i < notes.size() && !notes[i].empty()) {
      y += 14;
      o << "<text class=\"legend-note\" x=\"" << num(x + 24) << "\" y=\"" << num(y + 4)
        << "\" font-size=\"10\" fill=\"#666666\">" << xml_escape(notes[i]) << "</text>\n";
    }
  }
  o << "</g>\n";
}

// One path per series; a NaN starts a new sub-path (a gap). Every point gets a marker while there
// are at most 60, beyond that only the isolated ones (which a path alone would not show).
void draw_series(std::ostringstream& o, const Frame& f, const Axis& xa, const Axis& ya, const Series& s,
                 const char* stroke) {
  std::string d;
  std::vector<size_t> points, isolated;
  for (size_t i = 0; i < s.x.size(); ++i) {
    if (std::isnan(s.y[i])) continue;
    const bool joined = i > 0 && !std::isnan(s.y[i - 1]);
    d += (joined ? "L" : (d.empty() ? "M" : " M")) + num(f.x(xa.frac(s.x[i]))) + ' ' + num(f.y(ya.frac(s.y[i])));
    points.push_back(i);
    if (!joined && (i + 1 == s.x.size() || std::isnan(s.y[i + 1]))) isolated.push_back(i);
  }
  o << "<path class=\"series\" d=\"" << (d.empty() ? "M0 0" : d) << "\" fill=\"none\" stroke=\"" << stroke
    << "\" stroke-width=\"2\" stroke-linejoin=\"round\"><title>" << xml_escape(s.name) << "</title></path>\n";
  o << "<g fill=\"" << stroke << "\">\n";
  for (size_t i : points.size() <= 60 ? points : isolated)
    o << "<circle cx=\"" << num(f.x(xa.frac(s.x[i]))) << "\" cy=\"" << num(f.y(ya.frac(s.y[i])))
      << "\" r=\"3\"><title>" << xml_escape(s.name) << ": " << s.y[i] << "</title></circle>\n";
  o << "</g>\n";
}

std::string close_svg(std::ostringstream& o) {
  o << "</svg>\n";
  return o.str();
}

}  // namespace

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  ACTLAB_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "nice_ticks: bad range [", lo, ", ", hi, "]");
  ACTLAB_CHECK(target >= 2, "nice_ticks: target must be >= 2, got ", target);
  if (hi - lo <= 1e-12 * std::max(1.0, std::abs(lo))) {  // one value: a small range around it
    const double pad = lo != 0 ? std::abs(lo) * 0.1 : 1.0;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / (target - 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double m : {1.0, 2.0, 2.5, 5.0})
    if (m * mag >= raw * (1 - 1e-9)) {
      step = m * mag;
      break;
    }
  const double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
  std::vector<double> ticks;
  for (double k = first; k <= last + 0.5; k += 1) {
    const double t = k * step;  // k·step, not a running sum, so no drift
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

std::string line_chart_svg(const LineChart& chart) {
  std::vector<double> all_x, all_y;
  std::vector<std::string> names, notes;
  std::vector<Series> drawn = chart.series;  // on a log axis, with every 0 made a gap (plot.h)
  for (Series& s : drawn) {
    ACTLAB_CHECK(s.x.size() == s.y.size(), "line chart '", chart.title, "': series '", s.name, "' has ", s.x.size(),
                 " x values but ", s.y.size(), " y values");
    for (double v : s.x) ACTLAB_CHECK(std::isfinite(v), "line chart '", chart.title, "': series '", s.name,
                                      "' has a non-finite x value ", v);
    bool zero = false, positive = false;
    if (chart.log_y)
      for (double& v : s.y) {
        ACTLAB_CHECK(!(v < 0), "line chart '", chart.title, "': series '", s.name, "': log axis needs values >= 0, got ",
                     v);
        positive = positive || v > 0;
        if (v == 0) {
          zero = true;
          v = std::nan("");
        }
      }
    // Without the note, a series of zeros (exact's error) would look like a series the chart forgot.
    notes.push_back(zero && !positive ? "(0 everywhere: not drawn on the log axis)" : "");
    all_x.insert(all_x.end(), s.x.begin(), s.x.end());
    all_y.insert(all_y.end(), s.y.begin(), s.y.end());
    names.push_back(s.name);
  }
  const Axis ya = value_axis(all_y, chart.log_y, false, ("line chart '" + chart.title + "'").c_str());
  const bool categorical = !chart.x_tick_labels.empty();
  Axis xa;
  if (categorical) {  // x = 0..n-1 at slot centres
    xa.lo = -0.5;
    xa.hi = static_cast<double>(chart.x_tick_labels.size()) - 0.5;
  } else {
    xa = value_axis(all_x, false, false, "x axis");
  }
  bool rotate = false;
  const std::vector<std::string> x_labels = categorical ? chart.x_tick_labels : xa.labels;
  const double slots = categorical ? static_cast<double>(x_labels.size()) : static_cast<double>(xa.ticks.size());
  const Frame f = make_frame(names, x_labels, slots, &rotate, notes);
  std::ostringstream o;
  open_svg(o, f, chart.title);
  draw_y_axis(o, f, ya, chart.y_label);
  o << "<g class=\"x-ticks\" fill=\"#333333\">\n";
  if (categorical) {
    // Show at most ~40 labels; beyond that every k-th one.
    const size_t every = std::max<size_t>(1, (x_labels.size() + 39) / 40);
    for (size_t i = 0; i < x_labels.size(); i += every)
      x_tick_text(o, f, f.x(xa.frac(static_cast<double>(i))), x_labels[i], rotate);
  } else {
    for (size_t i = 0; i < xa.ticks.size(); ++i) x_tick_text(o, f, f.x(xa.frac(xa.ticks[i])), xa.labels[i], rotate);
  }
  o << "</g>\n";
  const double label_y = f.height - 12;
  o << "<text x=\"" << num(f.left + f.plot_w / 2) << "\" y=\"" << num(label_y) << "\" text-anchor=\"middle\">"
    << xml_escape(chart.x_label) << "</text>\n";
  for (size_t si = 0; si < drawn.size(); ++si) draw_series(o, f, xa, ya, drawn[si], colour(si));
  draw_legend(o, f, names, false, notes);
  return close_svg(o);
}

std::string bar_chart_svg(const BarChart& chart) {
  std::vector<double> all;
  std::vector<std::string> group_labels;
  for (const BarGroup& g : chart.groups) {
    ACTLAB_CHECK(g.values.size() == chart.series_names.size(), "bar chart '", chart.title, "': group '", g.label,
                 "' has ", g.values.size(), " values for ", chart.series_names.size(), " series");
    all.insert(all.end(), g.values.begin(), g.values.end());
    group_labels.push_back(g.label);
  }
  const Axis ya = value_axis(all, chart.log_y, true, ("bar chart '" + chart.title + "'").c_str());
  bool rotate = false;
  const double n_groups = static_cast<double>(std::max<size_t>(1, chart.groups.size()));
  const Frame f = make_frame(chart.series_names, group_labels, n_groups, &rotate);
  std::ostringstream o;
  open_svg(o, f, chart.title);
  draw_y_axis(o, f, ya, chart.y_label);
  const double slot = f.plot_w / n_groups;
  const double n_series = static_cast<double>(std::max<size_t>(1, chart.series_names.size()));
  const double bar_w = 0.8 * slot / n_series;
  // Bars grow from 0 on a linear axis (down for negative values), from the bottom on a log axis.
  const double base_frac = ya.log ? 0.0 : ya.frac(0.0);
  // Values printed on the bars while they stay readable (each bar at least ~4 digits wide).
  const bool label_values = bar_w * 0.92 >= 26;
  o << "<g class=\"x-ticks\" fill=\"#333333\">\n";
  for (size_t gi = 0; gi < chart.groups.size(); ++gi)
    x_tick_text(o, f, f.left + slot * (static_cast<double>(gi) + 0.5), chart.groups[gi].label, rotate);
  o << "</g>\n";
  for (size_t gi = 0; gi < chart.groups.size(); ++gi) {
    const BarGroup& g = chart.groups[gi];
    for (size_t si = 0; si < g.values.size(); ++si) {
      const double v = g.values[si];
      if (std::isnan(v)) continue;
      const double x = f.left + slot * (static_cast<double>(gi) + 0.1) + bar_w * static_cast<double>(si);
      const double y0 = f.y(base_frac), y1 = f.y(ya.frac(v));
      o << "<rect class=\"bar\" x=\"" << num(x) << "\" y=\"" << num(std::min(y0, y1)) << "\" width=\""
        << num(bar_w * 0.92) << "\" height=\"" << num(std::abs(y0 - y1)) << "\" fill=\"" << colour(si) << "\"><title>"
        << xml_escape(g.label + " / " + chart.series_names[si]) << ": " << v << "</title></rect>\n";
      if (label_values)  // the value above the bar (below it for a negative one)
        o << "<text x=\"" << num(x + bar_w * 0.46) << "\" y=\"" << num(v < 0 ? y1 + 12 : y1 - 4)
          << "\" text-anchor=\"middle\" font-size=\"10\" fill=\"#333333\">" << value_label(v) << "</text>\n";
    }
  }
  if (!ya.log && base_frac > 0)  // a zero line when the axis reaches below 0
    o << "<line x1=\"" << num(f.left) << "\" y1=\"" << num(f.y(base_frac)) << "\" x2=\"" << num(f.left + f.plot_w)
      << "\" y2=\"" << num(f.y(base_frac)) << "\" stroke=\"#333333\"/>\n";
  draw_legend(o, f, chart.series_names, true);
  return close_svg(o);
}

std::string radar_chart_svg(const RadarChart& chart) {
  const size_t n = chart.axes.size();
  ACTLAB_CHECK(n >= 3, "radar chart '", chart.title, "': needs at least 3 axes, got ", n);
  for (const RadarAxis& a : chart.axes)
    ACTLAB_CHECK(std::isfinite(a.lo) && std::isfinite(a.hi) && a.lo < a.hi && (!a.log || a.lo > 0), "radar chart '",
                 chart.title, "': axis '", a.label, "' has range [", a.lo, ", ", a.hi, "]; it needs lo < hi",
                 a.log ? " and lo > 0 (log axis)" : "");
  const auto frac = [](const RadarAxis& a, double v) {
    return a.log ? std::log(v / a.lo) / std::log(a.hi / a.lo) : (v - a.lo) / (a.hi - a.lo);
  };
  const auto ring_value = [](const RadarAxis& a, int ring) {  // the value on ring 0..4
    return a.log ? a.lo * std::pow(a.hi / a.lo, ring / 4.0) : a.lo + ring * (a.hi - a.lo) / 4;
  };
  const double kPi = 3.14159265358979323846;
  const auto point = [&](size_t k, double frac) {  // frac of the radius along axis k
    const double angle = 2 * kPi * static_cast<double>(k) / static_cast<double>(n);
    return num(kRadarCentreX + kRadarRadius * frac * std::sin(angle)) + "," +
           num(kRadarCentreY - kRadarRadius * frac * std::cos(angle));
  };
  std::vector<std::string> names;
  for (const RadarSeries& s : chart.series) {
    ACTLAB_CHECK(s.values.size() == n, "radar chart '", chart.title, "': series '", s.name, "' has ", s.values.size(),
                 " values for ", n, " axes");
    for (size_t k = 0; k < n; ++k)
      ACTLAB_CHECK(std::isfinite(s.values[k]) && s.values[k] >= chart.axes[k].lo && s.values[k] <= chart.axes[k].hi,
                   "radar chart '", chart.title, "': series '", s.name, "' has ", s.values[k], " on axis '",
                   chart.axes[k].label, "', outside [", chart.axes[k].lo, ", ", chart.axes[k].hi, "]");
    names.push_back(s.name);
  }
  Frame f;  // the shared frame supplies the canvas, title and legend column; the radar ignores its plot area
  size_t longest = 0;
  for (const auto& name : names) longest = std::max(longest, std::min<size_t>(name.size(), 32));
  f.left = 0;
  f.plot_w = 2 * kRadarCentreX + 20;  // the radar and its axis labels, then the legend column
  f.width = std::max(f.width, f.plot_w + 60 + kCharWidth * static_cast<double>(longest));
  f.height = 2 * kRadarCentreY - 30;
  std::ostringstream o;
  open_svg(o, f, chart.title);
  o << "<g class=\"rings\" fill=\"none\" stroke=\"#dddddd\" stroke-width=\"1\">\n";
  for (int ring = 1; ring <= 4; ++ring) {
    std::string pts;
    for (size_t k = 0; k < n; ++k) pts += (k ? " " : "") + point(k, ring / 4.0);
    o << "<polygon points=\"" << pts << "\"/>\n";
  }
  for (size_t k = 0; k < n; ++k)
    o << "<polyline points=\"" << point(k, 0) << " " << point(k, 1) << "\" stroke=\"#aaaaaa\"/>\n";
  o << "</g>\n<g class=\"ring-labels\" font-size=\"10\" fill=\"#666666\">\n";
  for (size_t k = 0; k < n; ++k) {  // each axis's own scale: its value at every ring, lo at the centre
    const RadarAxis& a = chart.axes[k];
    for (int ring = 1; ring <= 4; ++ring) {  // not ring 0: the centre is shared by every axis
      const std::string at = point(k, ring / 4.0);
      const double v = ring_value(a, ring);
      const std::string label = a.log ? value_label(v) : tick_label(v, (a.hi - a.lo) / 4);
      o << "<text x=\"" << at.substr(0, at.find(',')) << "\" y=\"" << at.substr(at.find(',') + 1)
        << "\" dx=\"4\" dy=\"-3\">" << xml_escape(label) << "</text>\n";
    }
  }
  o << "</g>\n<g class=\"axis-labels\" font-weight=\"bold\">\n";
  for (size_t k = 0; k < n; ++k) {
    // Beyond the axis tip, centred, the "(...)" detail on a second line, and moved in so that its widest
    // line stays inside the radar's column: labels of lower axes run sideways off the canvas (or into the
    // legend) when anchored at the tip.
    const std::string& label = chart.axes[k].label;
    const size_t cut = label.find(" (");
    const std::vector<std::string> lines =
        cut == std::string::npos ? std::vector<std::string>{label}
                                 : std::vector<std::string>{label.substr(0, cut), label.substr(cut + 1)};
    size_t widest = 0;
    for (const auto& line : lines) widest = std::max(widest, line.size());
    const double half = kCharWidth * static_cast<double>(widest) / 2;
    const double angle = 2 * kPi * static_cast<double>(k) / static_cast<double>(n);
    double x = kRadarCentreX + (kRadarRadius + 18) * std::sin(angle);
    x = std::min(std::max(x, half + 4), f.plot_w - half - 4);
    const bool above = std::cos(angle) > 0;
    double y = kRadarCentreY - (kRadarRadius + 18) * std::cos(angle) + 4;
    if (above) y -= 14.0 * static_cast<double>(lines.size() - 1);  // the last line at the tip
    else y += 10;
    o << "<text x=\"" << num(x) << "\" y=\"" << num(y) << "\" text-anchor=\"middle\">";
    for (size_t i = 0; i < lines.size(); ++i)
      o << "<tspan x=\"" << num(x) << "\" dy=\"" << (i == 0 ? "0" : "14") << "\">" << xml_escape(lines[i]) << "</tspan>";
    o << "</text>\n";
  }
  o << "</g>\n";
  for (size_t si = 0; si < chart.series.size(); ++si) {
    const RadarSeries& s = chart.series[si];
    std::string pts, tip = s.name;
    for (size_t k = 0; k < n; ++k) {
      const RadarAxis& a = chart.axes[k];
      pts += (k ? " " : "") + point(k, frac(a, s.values[k]));
      tip += "; " + a.label + " " + value_label(s.values[k]);
    }
    o << "<polygon class=\"series\" points=\"" << pts << "\" fill=\"" << colour(si) << "\" fill-opacity=\"0.12\" stroke=\""
      << colour(si) << "\" stroke-width=\"2\" stroke-linejoin=\"round\"><title>" << xml_escape(tip)
      << "</title></polygon>\n";
  }
  draw_legend(o, f, names, false);
  return close_svg(o);
}

void write_svg(const std::string& path, const std::string& svg) { write_text_atomic(path, svg); }

}  // namespace actlab::plot
