// actlab-ablate's pieces: the SVG charts (analysis/plot.h: structure, one path per series, bars per
// group × series, one polygon per radar series, escaping, log-axis errors, nice ticks), the presets and
// tables (train/grid.h, Fig. 6 included), Fig. 1's radar from three CSVs (train/radar.h), and a
// tiny grid run through the real actlab-train binary (built next to actlab_tests): results.csv,
// tables.md and figures; finished cells skipped; a checkpointed cell resumed; a failing cell reported
// while the grid goes on.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include "actlab/analysis/plot.h"
#include "actlab/core/allocator.h"
#include "actlab/core/error.h"
#include "tests/error_of.h"
#include "tests/prerequisite.h"
#include "tests/run_command.h"
#include "temp_dir.h"
#include "actlab/train/cli.h"
#include "actlab/train/grid.h"
#include "actlab/train/logging.h"
#include "actlab/train/paper_reference.h"
#include "actlab/train/radar.h"
#include "actlab/train/trainer.h"

using namespace actlab;
using actlab::testing::app_bin;
using actlab::testing::CommandOutput;
using actlab::testing::error_of;
using actlab::testing::run_command;
namespace fs = std::filesystem;

namespace {

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

// Well-formedness of the SVG as XML: every element closed in order, no stray '<' or '&' in text.
bool xml_balanced(const std::string& s, std::string* why) {
  std::vector<std::string> open;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '&') {
      const size_t semi = s.find(';', i);
      const std::string ent = semi == std::string::npos ? "" : s.substr(i, semi - i + 1);
      if (ent != "&amp;" && ent != "&lt;" && ent != "&gt;" && ent != "&quot;" && ent != "&apos;") {
        *why = "bad entity at " + std::to_string(i);
        return false;
      }
    }
    if (s[i] != '<') continue;
    if (s.compare(i, 4, "<!--") == 0) {  // a comment: skipped whole, and it must end
      const size_t close = s.find("-->", i + 4);
      if (close == std::string::npos) { *why = "unclosed comment"; return false; }
      i = close + 2;
      continue;
    }
    const size_t end = s.find('>', i);
    if (end == std::string::npos) { *why = "unclosed tag"; return false; }
    const std::string tag = s.substr(i + 1, end - i - 1);
    if (tag.find('<') != std::string::npos) { *why = "'<' inside a tag"; return false; }
    i = end;
    if (tag[0] == '?') continue;
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) { *why = "mismatched </" + tag.substr(1) + ">"; return false; }
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(tag.substr(0, tag.find_first_of(" \n")));
    }
  }
  if (!open.empty()) *why = "unclosed <" + open.back() + ">";
  return open.empty();
}

// ---- results.csv as rows of name -> value (csv_fields: train/logging.h)
std::vector<std::map<std::string, std::string>> read_results(const fs::path& path, size_t* columns) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  const auto header = csv_fields(line);
  *columns = header.size();
  std::vector<std::map<std::string, std::string>> rows;
  while (std::getline(in, line)) {
    const auto f = csv_fields(line);
    REQUIRE(f.size() == header.size());
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < f.size(); ++i) row[header[i]] = f[i];
    rows.push_back(row);
  }
  return rows;
}

std::string train_bin() { return app_bin("actlab-train"); }

// The grid's progress lines go to a file for the test to read (and stay out of the test output).
class StdoutToFile {
 public:
  explicit StdoutToFile(const std::string& path) {
    std::fflush(stdout);
    saved_ = ::dup(1);
    std::FILE* f = std::fopen(path.c_str(), "a");
    ::dup2(::fileno(f), 1);
    std::fclose(f);
  }
  ~StdoutToFile() {
    std::fflush(stdout);
    ::dup2(saved_, 1);
    ::close(saved_);
  }
 private:
  int saved_ = -1;
};

// A cell of well under a second: the MLP on 256 synthetic 28x28 images, 2 steps of 32, 64 test images
// (a conv net costs seconds of fixed start-up per child; the grid does not care which model it runs).
Cell tiny_cell(const std::string& policy) {
  Cell c;
  c.model = "mlp";
  c.dataset = "synthetic";
  c.policy = policy;
  c.epochs = 1;
  c.batch_size = 32;
  c.steps_per_epoch = 2;
  c.test_limit = 64;
  c.threads = 2;
  c.extra_args = {"--synthetic-size", "256"};
  return c;
}

Grid tiny_grid(const std::vector<std::string>& policies) {
  Grid g;
  g.preset = "test";
  g.tables = {"custom"};
  for (const auto& p : policies) g.add(tiny_cell(p), "custom", p);
  return g;
}

// Runs the grid with its progress in dir/progress.txt; returns run_grid's exit code.
int run_quiet(const Grid& grid, const RunOptions& o, const testing::TempDir& dir) {
  StdoutToFile quiet(dir.file("progress.txt"));
  return run_grid(grid, o);
}

RunOptions run_options(const testing::TempDir& dir) {
  RunOptions o;
  o.out_dir = dir.file("out");
  o.train_bin = train_bin();
  o.command_line = "actlab-ablate (test)";
  return o;
}

// Runs a grid of one paper table whose rows are tiny cells (policy, label, seed) in dir and returns its
// tables.md (the other reports are in run_options(dir).out_dir).
struct TinyRow {
  std::string policy, label;
  int64_t seed = 0;
};
std::string run_tiny_table(const testing::TempDir& dir, const std::string& table, const std::vector<TinyRow>& rows) {
  Grid grid;
  grid.preset = "test";
  grid.tables = {table};
  for (const TinyRow& row : rows) {
    Cell c = tiny_cell(row.policy);
    c.seed = row.seed;
    grid.add(c, table, row.label);
  }
  const RunOptions o = run_options(dir);
  int rc = run_quiet(grid, o, dir);
  INFO(read_all(dir.file("progress.txt")));
  REQUIRE(rc == 0);
  return read_all(fs::path(o.out_dir) / "tables.md");
}

}  // namespace

// ------------------------------------------------------------------ plot
TEST_CASE("plot: line chart is well-formed SVG with one path per series, gaps and a legend") {
  plot::LineChart chart;
  chart.title = "Accuracy";
  chart.x_label = "epoch";
  chart.y_label = "test accuracy (%)";
  chart.series = {{"exact", {1, 2, 3}, {80, 85, 88}},
                  {"division:B=8,Q=2", {1, 2, 3, 4}, {79, NAN, 87, 88.5}},
                  {"lfc:B=8", {1, 2}, {70, 75}}};
  const std::string svg = plot::line_chart_svg(chart);
  std::string why;
  CHECK_MESSAGE(xml_balanced(svg, &why), why);
  CHECK(svg.rfind(plot::kSvgStart, 0) == 0);  // what --radar --out and others replace without --overwrite
  CHECK(count_of(svg, "<svg ") == 1);
  CHECK(count_of(svg, "class=\"series\"") == 3);
  // The NaN splits the second series into two sub-paths; the others have one.
  const size_t second = svg.find("class=\"series\"", svg.find("class=\"series\"") + 1);
  const std::string d = svg.substr(svg.find("d=\"", second), svg.find("\" ", svg.find("d=\"", second)) - svg.find("d=\"", second));
  CHECK(count_of(d, "M") == 2);
  for (const auto& s : chart.series) CHECK(svg.find(">" + plot::xml_escape(s.name) + "</text>") != std::string::npos);
  CHECK(count_of(svg, "<circle") == 8);  // one marker per finite point
  // Categorical x axis: the layer names are the tick labels; long ones are rotated.
  plot::LineChart layers{"Error per layer", "layer", "rel. error", true,
                         {{"B=8", {0, 1, 2}, {1e-3, 2e-2, 0.5}}}, {"conv1", "layer1.0.conv1", "layer4.1.conv2"}};
  std::string lsvg = plot::line_chart_svg(layers);
  CHECK_MESSAGE(xml_balanced(lsvg, &why), why);
  CHECK(lsvg.find(">layer4.1.conv2</text>") != std::string::npos);
  CHECK(lsvg.find(">0.001</text>") != std::string::npos);  // decade ticks of the log axis
  CHECK(lsvg.find("rotate(-40") == std::string::npos);    // three labels fit side by side
  layers.series[0].x.clear();
  layers.series[0].y.clear();
  layers.x_tick_labels.clear();
  for (int i = 0; i < 20; ++i) {  // twenty do not: rotated
    layers.x_tick_labels.push_back("layer" + std::to_string(i / 4) + "." + std::to_string(i % 4) + ".downsample.0");
    layers.series[0].x.push_back(i);
    layers.series[0].y.push_back(0.01 * (i + 1));
  }
  lsvg = plot::line_chart_svg(layers);
  CHECK_MESSAGE(xml_balanced(lsvg, &why), why);
  CHECK(count_of(lsvg, "rotate(-40") == 20);
}

TEST_CASE("plot: on a log axis a 0 is a gap, and a series that is 0 everywhere says so in its legend") {
  // An exact policy's gradient error beside a lossy one's, per layer: exact's zeros have no place on the
  // log axis, and a legend entry with nothing drawn would read as a series the chart forgot.
  plot::LineChart chart{"Error per layer", "layer", "rel. error", true,
                        {{"division", {0, 1, 2}, {0.1, 0, 0.3}}, {"exact", {0, 1, 2}, {0, 0, 0}}},
                        {"conv1", "conv2", "fc"}};
  const std::string svg = plot::line_chart_svg(chart);
  std::string why;
  CHECK_MESSAGE(xml_balanced(svg, &why), why);
  CHECK(count_of(svg, "class=\"series\"") == 2);
  const size_t first = svg.find("class=\"series\""), second = svg.find("class=\"series\"", first + 1);
  const std::string d0 = svg.substr(first, second - first);
  CHECK(count_of(d0, "<circle") == 2);     // the 0 inside the series is a gap: two isolated points
  CHECK(svg.find("d=\"M0 0\"", second) != std::string::npos);  // nothing of exact is drawn
  CHECK(count_of(svg, "(0 everywhere: not drawn on the log axis)") == 1);
  CHECK(svg.find("class=\"legend-note\"") > svg.find(">exact</text>"));  // under exact's entry, not division's
  // On a linear axis a 0 is a value like any other: drawn, no note.
  chart.log_y = false;
  const std::string linear = plot::line_chart_svg(chart);
  CHECK(linear.find("not drawn") == std::string::npos);
  CHECK(linear.find("d=\"M0 0\"") == std::string::npos);
}

TEST_CASE("plot: bar chart draws one bar per group and series, NaN leaves a gap") {
  plot::BarChart chart{"Activation memory", "MiB", false, {"ResNet-20", "ResNet-18"},
                       {{"exact", {40, 400}}, {"division:B=8,Q=2", {4, NAN}}, {"quant:Q=2", {5, 50}}}};
  const std::string svg = plot::bar_chart_svg(chart);
  std::string why;
  CHECK_MESSAGE(xml_balanced(svg, &why), why);
  CHECK(count_of(svg, "class=\"bar\"") == 5);
  CHECK(svg.find(">ResNet-18</text>") != std::string::npos);
  chart.groups[0].values.pop_back();
  CHECK(error_of([&] { plot::bar_chart_svg(chart); }).find("1 values for 2 series") != std::string::npos);
  // Taller bars for larger values (same series, linear axis from 0).
  plot::BarChart two{"t", "y", false, {"s"}, {{"a", {1}}, {"b", {3}}}};
  const std::string s2 = plot::bar_chart_svg(two);
  auto height = [&](size_t nth) {
    size_t at = 0;
    for (size_t k = 0; k <= nth; ++k) at = s2.find("class=\"bar\"", at + 1);
    const size_t h = s2.find("height=\"", at) + 8;
    return std::stod(s2.substr(h, s2.find('"', h) - h));
  };
  CHECK(height(1) == doctest::Approx(3 * height(0)).epsilon(0.02));
}

TEST_CASE("plot: text is escaped, bad input is refused with a clear error") {
  plot::LineChart chart{"a<b & c>d \"q\"", "x", "y", false, {{"<s&>", {0, 1}, {1, 2}}}, {}};
  const std::string svg = plot::line_chart_svg(chart);
  CHECK(svg.find("a&lt;b &amp; c&gt;d &quot;q&quot;") != std::string::npos);
  CHECK(svg.find("a<b") == std::string::npos);
  CHECK(svg.find("&lt;s&amp;&gt;") != std::string::npos);
  std::string why;
  CHECK_MESSAGE(xml_balanced(svg, &why), why);
  chart.log_y = true;
  chart.series[0].y = {1, -2};
  CHECK(error_of([&] { plot::line_chart_svg(chart); }).find("log axis needs values >= 0, got -2") != std::string::npos);
  plot::BarChart bars{"b", "y", true, {"s"}, {{"g", {0}}}};
  CHECK(error_of([&] { plot::bar_chart_svg(bars); }).find("log axis needs values > 0") != std::string::npos);
  chart.log_y = false;
  chart.series[0].y = {1};
  CHECK(error_of([&] { plot::line_chart_svg(chart); }).find("2 x values but 1 y values") != std::string::npos);
  CHECK(plot::xml_escape("'&'") == "&apos;&amp;&apos;");
}

TEST_CASE("plot: nice ticks cover the range with 1/2/2.5/5 steps") {
  const std::vector<double> t = plot::nice_ticks(0, 97);
  REQUIRE(t.size() >= 2);
  CHECK(t.front() <= 0);
  CHECK(t.back() >= 97);
  CHECK(t[1] - t[0] == doctest::Approx(20));
  for (const auto& [lo, hi] : std::vector<std::pair<double, double>>{{0.013, 0.0171}, {-3, 7}, {5, 5}, {1e6, 3.3e6}}) {
    const auto ticks = plot::nice_ticks(lo, hi);
    CAPTURE(lo);
    CHECK(ticks.size() >= 3);
    CHECK(ticks.size() <= 12);
    const double step = ticks[1] - ticks[0];
    CHECK(ticks.front() <= lo + 1e-9 * step);  // k·step may round a hair above an exact lo
    CHECK(ticks.back() >= hi - 1e-9 * step);
    const double mant = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    CHECK((std::abs(mant - 1) < 1e-6 || std::abs(mant - 2) < 1e-6 || std::abs(mant - 2.5) < 1e-6 ||
           std::abs(mant - 5) < 1e-6));
  }
  CHECK(!error_of([] { plot::nice_ticks(2, 1); }).empty());
}

// ------------------------------------------------------------------ presets and tables
TEST_CASE("ablate: presets build the paper's tables with shared cells run once") {
  const int64_t live = memory_stats().total.current;
  GridOptions o;  // cpu preset, Table 1(c)
  const Grid g = make_grid(o);
  REQUIRE(g.cells.size() == 5);
  std::vector<std::string> policies;
  for (const Cell& c : g.cells) policies.push_back(c.policy);
  CHECK(policies == std::vector<std::string>{"exact", "division:B=8,Q=2", "lfc:B=8", "hfc:B=8,Q=2", "quant:Q=2"});
  CHECK(g.cells[2].tables[0].second == "w/o HFC");
  CHECK(g.cells[1].id() == "resnet20-fashion-mnist-division_B8_Q2-s0");
  double total = 0;
  for (const Cell& c : g.cells) {
    CHECK(c.model == "resnet20");
    CHECK(c.dataset == "fashion-mnist");
    CHECK(c.batch_size == 128);
    total += estimate_cell_seconds(c);
  }
  CHECK(total > 20 * 60);  // the preset is sized for ~35 min on the 2-core machine ...
  CHECK(total < 50 * 60);  // ... and must finish in under an hour
  // MobileNetV2 and ResNet-18 train Fashion-MNIST at the same speed there (172 and 174 img/s), although
  // MobileNetV2 has a sixth of the multiply-accumulates: the estimate counts the data its layers write too.
  Cell mbv2 = g.cells[0], r18 = g.cells[0];
  mbv2.model = "mobilenet_v2", r18.model = "resnet18";
  const double ratio = estimate_cell_seconds(mbv2) / estimate_cell_seconds(r18);
  CHECK(ratio > 0.7);
  CHECK(ratio < 1.4);
  o.tables = {"all"};
  o.seeds = {0, 1};
  const Grid all = make_grid(o);
  std::set<std::string> ids;
  for (const Cell& c : all.cells) ids.insert(c.id());
  CHECK(ids.size() == all.cells.size());
  // 1c, 2b's new B/Q pairs, fig3's HFC-ACT, Table 3 (2(a)'s cells among its own), fig6's baselines, then 1b's
  // four ViT rows
  CHECK(all.cells.size() == 2 * (5 + 8 + 1 + 20 + 5 + 4));
  CHECK(all.cells.back().model == "vit_tiny_cifar");  // the long transformer cells run last
  const Cell& exact = all.cells[0];
  CHECK(exact.tables.size() == 4);  // Normal in 1c, 2b, fig3 and fig6
  int table3 = 0, table2a = 0;
  auto in_table = [](const Cell& c, const std::string& t) {
    return std::any_of(c.tables.begin(), c.tables.end(), [&](const auto& x) { return x.first == t; });
  };
  for (const Cell& c : all.cells) {
    table3 += in_table(c, "3") && c.model == "mobilenet_v2" && c.dataset == "cifar100";
    table2a += in_table(c, "2a");
    if (in_table(c, "2a")) CHECK(in_table(c, "3"));  // Normal and B=8, Q=2 of Table 3, run once
  }
  CHECK(table3 == 2 * 5);
  CHECK(table2a == 2 * 2 * 2);  // seeds × data sets × {Normal, DIVISION}
  o = GridOptions();
  o.tables = {"2a"};  // on its own: MobileNet-V2 on both CIFAR sets, three seeds per row
  const Grid t2a = make_grid(o);
  REQUIRE(t2a.cells.size() == 3 * 2 * 2);
  std::set<std::string> labels, data;
  std::set<int64_t> seeds;
  for (const Cell& c : t2a.cells) {
    CHECK(c.model == "mobilenet_v2");
    CHECK((c.policy == "exact" || c.policy == "division:B=8,Q=2"));
    data.insert(c.dataset), seeds.insert(c.seed), labels.insert(c.tables[0].second);
  }
  CHECK(data == std::set<std::string>{"cifar10", "cifar100"});
  CHECK(seeds == std::set<int64_t>{0, 1, 2});
  CHECK(labels == std::set<std::string>{"Normal", "DIVISION"});
  o = GridOptions();
  o.preset = "paper";
  const Grid paper = make_grid(o);
  CHECK(paper.cells[0].model == "resnet18");
  CHECK(paper.cells[0].dataset == "cifar100");  // the paper's Table 1(c) data set
  CHECK(paper.cells[0].epochs == 100);
  CHECK(paper.cells[0].batch_size == 256);
  o = GridOptions();
  o.policies = {"division:Q=4,B=12", "exact"};
  o.epochs = 2;
  const Grid custom = make_grid(o);
  REQUIRE(custom.cells.size() == 2);
  CHECK(custom.cells[0].policy == "division:B=12,Q=4");
  CHECK(custom.cells[0].epochs == 2);
  auto has_flag = [](const std::vector<std::string>& args, const std::string& flag, const std::string& value) {
    for (size_t i = 0; i + 1 < args.size(); ++i)
      if (args[i] == flag) return args[i + 1] == value;
    return false;
  };
  // Always spelled out: a cell resumed from a GPU run's checkpoint would otherwise inherit "cuda".
  CHECK(has_flag(custom.cells[0].train_args(), "--device", "cpu"));
  o.device = "cuda:1";
  CHECK(has_flag(make_grid(o).cells[0].train_args(), "--device", "cuda:1"));
  o.device = "cpu";
  // A --train-arg may add flags, not change the ones the grid sets: every flag of a cell's command is managed.
  {
    Cell full;
    full.optimizer = "adamw";
    full.steps_per_epoch = full.train_limit = full.test_limit = 5;
    full.precision = "bf16";
    full.data_dir = "/data";
    const auto& managed = grid_managed_flags();
    for (const auto& a : full.train_args())
      if (a.rfind("--", 0) == 0) CHECK_MESSAGE(std::find(managed.begin(), managed.end(), a) != managed.end(), a);
    GridOptions bad;
    bad.policies = {"exact"};
    bad.extra_args = {"--epochs=2"};
    CHECK(error_of([&] { make_grid(bad); }).find("--train-arg --epochs=2: the grid sets --epochs") == 0);
    bad.extra_args = {"--synthetic-size=256"};
    CHECK(make_grid(bad).cells.size() == 1);
  }
  // Two rules that spell one directory name ('*' and '?' both become '-') are two cells all the same: the
  // later takes a hash of its policy, and a rerun of the grid names them the same way.
  o.policies = {"division:B=8,Q=2|blocks.*.attn=exact", "division:B=8,Q=2|blocks.?.attn=exact"};
  o.seeds = {0, 1};
  const Grid rules = make_grid(o);
  REQUIRE(rules.cells.size() == 4);
  std::set<std::string> rule_ids;
  for (const Cell& c : rules.cells) rule_ids.insert(c.id());
  CHECK(rule_ids.size() == 4);
  CHECK(rules.cells[0].id_suffix.empty());
  CHECK(rules.cells.back().id_suffix.rfind("-h", 0) == 0);
  CHECK(rules.cells.back().id_suffix.size() == 10);  // "-h" and 8 hex digits of the policy's FNV-1a
  CHECK(make_grid(o).cells.back().id() == rules.cells.back().id());
  o.seeds = GridOptions().seeds;
  // A POLICY@PRECISION entry is its own cell, named and passed on; the grid's precision covers the rest.
  o.policies = {"exact", "exact@bf16", "division:B=8,Q=2"};
  o.precision = "fp32";
  const Grid mixed = make_grid(o);
  REQUIRE(mixed.cells.size() == 3);
  CHECK(mixed.cells[1].policy == "exact");
  CHECK(mixed.cells[1].precision == "bf16");
  CHECK(mixed.cells[1].run_label() == "exact@bf16");
  CHECK(mixed.cells[1].id() == "resnet20-fashion-mnist-exact-bf16-s0");
  CHECK(mixed.cells[0].id() != mixed.cells[1].id());
  CHECK(has_flag(mixed.cells[1].train_args(), "--precision", "bf16"));
  CHECK_FALSE(has_flag(mixed.cells[0].train_args(), "--precision", "fp32"));  // fp32 cells keep their old flags
  o.precision = "bf16";  // now "exact" is "exact@bf16": the same cell, listed once
  const Grid all_bf16 = make_grid(o);
  REQUIRE(all_bf16.cells.size() == 2);
  CHECK(all_bf16.cells[0].run_label() == "exact@bf16");
  CHECK(all_bf16.cells[1].run_label() == "division:B=8,Q=2@bf16");
  o.policies = {"exact@half"};
  CHECK(error_of([&] { make_grid(o); }).find("unknown precision 'half'") != std::string::npos);
  o.precision = "fp32";
  // An AdamW grid: its own cells (an SGD cell of the same policy is another run), no --momentum, and the
  // weight decay given; an SGD cell's flags stay as they were.
  o.policies = {"exact"};
  o.optimizer = "adamw";
  o.weight_decay = 0.05;
  const Grid adamw = make_grid(o);
  REQUIRE(adamw.cells.size() == 1);
  CHECK(adamw.cells[0].id() == "resnet20-fashion-mnist-exact-adamw-s0");
  CHECK(has_flag(adamw.cells[0].train_args(), "--optimizer", "adamw"));
  CHECK(has_flag(adamw.cells[0].train_args(), "--weight-decay", "0.05"));
  CHECK_FALSE(has_flag(adamw.cells[0].train_args(), "--momentum", "0.9"));
  // Without --lr and --weight-decay an AdamW cell gets AdamW's rates, not SGD's 0.1 and 5e-4.
  o.weight_decay.reset();
  CHECK(has_flag(make_grid(o).cells[0].train_args(), "--lr", "0.001"));
  CHECK(has_flag(make_grid(o).cells[0].train_args(), "--weight-decay", "0.05"));
  o.models = {"vit_tiny_cifar"};
  CHECK(has_flag(make_grid(o).cells[0].train_args(), "--lr", "0.0003"));
  o.lr = 0.002;  // the command line wins
  CHECK(has_flag(make_grid(o).cells[0].train_args(), "--lr", "0.002"));
  o.lr.reset();
  o.models.clear();
  o.optimizer = "sgd";
  o.weight_decay.reset();
  CHECK(has_flag(make_grid(o).cells[0].train_args(), "--momentum", "0.9"));
  CHECK_FALSE(has_flag(make_grid(o).cells[0].train_args(), "--optimizer", "sgd"));
  o.tables = {"2c"};
  o.policies.clear();
  CHECK(error_of([&] { make_grid(o); }).find("unknown table '2c'") != std::string::npos);
  CHECK(error_of([&] { make_grid(o); }).find("use 1b, 1c, 2a, 2b, 3, fig3, fig6 or all") != std::string::npos);
  o.tables = {"1c"};
  o.models = {"resnet7"};
  CHECK(error_of([&] { make_grid(o); }).find("unknown model 'resnet7'") != std::string::npos);
  o.models.clear();
  o.preset = "gpu";
  CHECK(error_of([&] { make_grid(o); }).find("unknown preset") != std::string::npos);
  testing::TempDir empty("ablate_nocifar");
  o = GridOptions();
  o.tables = {"3"};
  o.data_dir = empty.str();
  CHECK(error_of([&] { check_data_present(make_grid(o)); }).find("scripts/get-cifar.sh") != std::string::npos);
  CHECK(memory_stats().total.current == live);
}

// ------------------------------------------------------------------ running through actlab-train
TEST_CASE("ablate: a tiny grid runs through actlab-train, writes the reports, and a second run skips it") {
  REQUIRE_MESSAGE(fs::exists(train_bin()), "build the actlab-train target next to actlab_tests");
  testing::TempDir dir("ablate_grid");
  const Grid grid = tiny_grid({"exact", "division:B=8,Q=2"});
  const RunOptions o = run_options(dir);
  int rc = run_quiet(grid, o, dir);
  const fs::path out(o.out_dir);
  const fs::path cell = out / "cells" / "mlp-synthetic-division_B8_Q2-s0";
  INFO(read_all(dir.file("progress.txt")), read_all(cell / "log.txt"));
  REQUIRE(rc == 0);
  for (const char* f : {"command.txt", "log.txt", "epochs.csv", "summary.json", "ckpt/last.safetensors"})
    CHECK_MESSAGE(fs::exists(cell / f), f);
  CHECK(read_all(cell / "command.txt").find("--policy division:B=8,Q=2") != std::string::npos);
  size_t columns = 0;
  auto rows = read_results(out / "results.csv", &columns);
  CHECK(columns == 27);  // ... status, cell, message, precision, batch, image_size, channels
  REQUIRE(rows.size() == 2);
  CHECK(rows[0]["policy"] == "exact");
  CHECK(rows[0]["precision"] == "fp32");
  CHECK(rows[0]["batch"] == "32");  // the radar takes memory and throughput rows at it, and at its input
  CHECK(rows[0]["image_size"] == "28");  // the synthetic data set's 28×28×1 images, as the run's summary says
  CHECK(rows[0]["channels"] == "1");
  CHECK(rows[1]["policy"] == "division:B=8,Q=2");
  CHECK(rows[1]["B"] == "8");
  CHECK(rows[1]["Q"] == "2");
  for (auto& r : rows) {
    CHECK(r["status"] == "done");
    CHECK(r["epochs_done"] == "1");
    const double acc = std::stod(r["final_test_acc"]);
    CHECK(acc >= 0);
    CHECK(acc <= 100);
    CHECK(std::stoll(r["activation_bytes"]) > 0);
  }
  CHECK(std::stod(rows[0]["compression_measured"]) == doctest::Approx(1.0));
  // The MLP's linear inputs drop to ~4 bits/value (2-bit HFC + a bf16 LFC of 1x8 blocks); its ReLU masks
  // and the loss are not compressed, so the whole step gains less.
  CHECK(std::stod(rows[1]["compression_policy"]) > 5);
  CHECK(std::stod(rows[1]["compression_measured"]) > 1.2);
  CHECK(std::stod(rows[1]["compression_measured"]) < std::stod(rows[1]["compression_policy"]));
  const std::string tables = read_all(out / "tables.md");
  CHECK(tables.find("`exact`") != std::string::npos);
  CHECK(tables.find("`division:B=8,Q=2`") != std::string::npos);
  CHECK(tables.find("nproc") != std::string::npos);
  const std::string acc_svg = read_all(out / "acc_per_epoch.svg");
  CHECK(count_of(acc_svg, "class=\"series\"") == 2);
  CHECK(count_of(read_all(out / "activation_memory.svg"), "class=\"bar\"") == 2);

  // Second run: nothing is trained again.
  const auto stamp = fs::last_write_time(cell / "summary.json");
  {
    StdoutToFile quiet(dir.file("progress2.txt"));
    rc = run_grid(grid, o);
  }
  CHECK(rc == 0);
  CHECK(count_of(read_all(dir.file("progress2.txt")), "skip (done)") == 2);
  CHECK(fs::last_write_time(cell / "summary.json") == stamp);
  CHECK(count_of(read_all(cell / "log.txt"), "==== actlab-ablate") == 1);

  // The same directory with another recipe is refused before anything runs.
  Grid changed = grid;
  changed.cells[0].epochs = 3;
  CHECK(error_of([&] { run_grid(changed, o); }).find("other settings (--epochs 1 there, --epochs 3 now)") !=
        std::string::npos);
}

TEST_CASE("ablate: results.csv's B and Q are the run's policy's, not its rules'") {
  REQUIRE_MESSAGE(fs::exists(train_bin()), "build the actlab-train target next to actlab_tests");
  testing::TempDir dir("ablate_rules");
  const Grid grid = tiny_grid({"division:B=4,Q=4|fc1=quant:Q=2"});
  const RunOptions o = run_options(dir);
  REQUIRE(run_quiet(grid, o, dir) == 0);
  size_t columns = 0;
  auto rows = read_results(fs::path(o.out_dir) / "results.csv", &columns);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0]["B"] == "4");
  CHECK(rows[0]["Q"] == "4");  // was "4|fc1=quant:Q=2"
}

TEST_CASE("ablate: a cell with a checkpoint but no summary.json is resumed from it") {
  REQUIRE_MESSAGE(fs::exists(train_bin()), "build the actlab-train target next to actlab_tests");
  const int64_t live = memory_stats().total.current;
  testing::TempDir dir("ablate_resume");
  const Grid grid = tiny_grid({"exact"});
  const RunOptions o = run_options(dir);
  const fs::path cell = fs::path(o.out_dir) / "cells" / grid.cells[0].id();
  fs::create_directories(cell);
  {  // what an actlab-train child leaves when it is stopped after its first step
    TrainConfig c;
    c.model = "mlp";
    c.dataset = "synthetic";
    c.synthetic_size = 256;
    c.batch_size = 32;
    c.steps_per_epoch = 2;
    c.test_limit = 64;
    c.epochs = 1;
    c.save_dir = (cell / "ckpt").string();
    c.log_file = (cell / "epochs.csv").string();
    c.summary_json = (cell / "summary.json").string();
    c.stop_after_steps = 1;
    StdoutToFile quiet(dir.file("first.txt"));  // not c.quiet: the resumed child would inherit it
    REQUIRE(train(c).interrupted);
    request_stop(0);
  }
  CHECK(memory_stats().total.current == live);
  CHECK(read_cell(cell.string()).status == CellStatus::Interrupted);
  fs::remove(cell / "summary.json");
  CHECK(read_cell(cell.string()).status == CellStatus::Interrupted);  // the checkpoint says so
  int rc = run_quiet(grid, o, dir);
  INFO(read_all(dir.file("progress.txt")), read_all(cell / "log.txt"));
  CHECK(rc == 0);
  CHECK(read_all(cell / "command.txt").find("--resume") != std::string::npos);
  CHECK(read_all(cell / "log.txt").find("resumed from") != std::string::npos);
  CHECK(read_all(dir.file("progress.txt")).find("resume from epoch 0 step 1") != std::string::npos);
  const CellResult r = read_cell(cell.string());
  CHECK(r.status == CellStatus::Done);
  CHECK(r.epochs_done == 1);
}

TEST_CASE("ablate: one grid per directory, a dry run writes nothing, --report-only needs a grid and names its command") {
  REQUIRE_MESSAGE(fs::exists(train_bin()), "build the actlab-train target next to actlab_tests");
  testing::TempDir dir("ablate_out_dir");
  const Grid grid = tiny_grid({"exact"});
  RunOptions o = run_options(dir);
  RunOptions dry = o;
  dry.dry_run = true;
  {
    StdoutToFile quiet(dir.file("progress.txt"));
    CHECK(run_grid(grid, dry) == 0);
  }
  CHECK_FALSE(fs::exists(o.out_dir));
  RunOptions report = o;
  report.report_only = true;
  report.command_line = "actlab-ablate --report-only (test)";
  CHECK(error_of([&] { run_grid(grid, report); }).find("holds no grid (no cells/ directory)") != std::string::npos);
  CHECK_FALSE(fs::exists(o.out_dir));
  // Another process's lock on the directory (here an flock of this one, on another open file) is refused.
  fs::create_directories(o.out_dir);
  const int fd = ::open((fs::path(o.out_dir) / ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  CHECK(error_of([&] { run_grid(grid, o); }).find("another actlab-ablate is using") == 0);
  CHECK_FALSE(fs::exists(fs::path(o.out_dir) / "cells"));
  ::close(fd);
  {
    StdoutToFile quiet(dir.file("progress.txt"));
    REQUIRE(run_grid(grid, o) == 0);
    REQUIRE(run_grid(grid, report) == 0);
  }
  const std::string tables = read_all(fs::path(o.out_dir) / "tables.md");
  CHECK(tables.find("- command: `" + o.command_line + "`; reports rewritten by `" + report.command_line + "`") !=
        std::string::npos);
  // A copy of the grid that kept only the cells' logs (no summary.json) is not rewritten as unfinished.
  const fs::path results = fs::path(o.out_dir) / "results.csv";
  const std::string csv = read_all(results);
  REQUIRE(csv.find(",done,") != std::string::npos);
  fs::remove(fs::path(o.out_dir) / "cells" / grid.cells[0].id() / "summary.json");
  const std::string why = error_of([&] { run_grid(grid, report); });
  CHECK(why.find("--report-only: 1 of the cells that " + results.string() + " records as finished read as unfinished") ==
        0);
  CHECK(why.find(grid.cells[0].id() + " (done there, ") != std::string::npos);
  CHECK(read_all(results) == csv);
  CHECK(read_all(fs::path(o.out_dir) / "tables.md") == tables);
}

TEST_CASE("ablate: --model with --models (or --dataset with --datasets) is refused, not merged") {
  REQUIRE_MESSAGE(fs::exists(app_bin("actlab-ablate")), "build the actlab-ablate target next to actlab_tests");
  testing::TempDir dir("ablate_two_spellings");
  const std::string app = app_bin("actlab-ablate") + " --out " + dir.file("out");
  const std::string dry = app + " --dry-run";
  const std::pair<const char*, const char*> cases[] = {
      {" --dry-run --model resnet20 --models resnet18", "--models and --model"},
      {" --dry-run --dataset fashion-mnist --datasets mnist", "--datasets and --dataset"},
      {" --radar --results r.csv --model resnet20 --models resnet18", "--models and --model"}};  // a grid flag: refused
  for (const auto& [args, flags] : cases) {
    const CommandOutput o = run_command(app + args);
    INFO(args, ": ", o.text);
    CHECK(o.rc == 2);
    CHECK(o.text.find("actlab-ablate: error: " + std::string(flags) + " are two spellings of one list; give one of them") == 0);
    CHECK(count_of(o.text, "\n") == 1);
  }
  CHECK(run_command(dry + " --model resnet20 --dataset mnist").rc == 0);  // either spelling alone plans its grid
}

TEST_CASE("ablate: a table lists its rows in its own order, whatever other tables ran with it") {
  testing::TempDir dir("ablate_row_order");
  int grids = 0;
  // The rows (first column) of the tables.md section titled `title` of the grid of `tables`. Nothing is
  // run: the reports list every cell as not run.
  const auto section_rows = [&](const std::vector<std::string>& tables, const std::string& title) {
    GridOptions o;
    o.tables = tables;
    const std::string out = dir.file("out" + std::to_string(grids++));
    write_reports(make_grid(o), out, "actlab-ablate (test)");
    const std::string md = read_all(fs::path(out) / "tables.md");
    const size_t from = md.find("\n## " + title);
    REQUIRE(from != std::string::npos);
    std::istringstream section(md.substr(from + 1, md.find("\n## ", from + 1) - from));
    std::vector<std::string> rows;
    for (std::string line; std::getline(section, line);)
      if (line.rfind("| ", 0) == 0 && line.rfind("| ---", 0) != 0) rows.push_back(line.substr(2, line.find(" |") - 2));
    return rows;
  };
  const std::vector<std::string> fig6 = section_rows({"fig6"}, "Fig. 6");
  CHECK(fig6 == std::vector<std::string>{"Method", "Normal", "Checkpoint", "SWAP", "BLPA", "AC-GC", "ActNN", "DIVISION"});
  // Table 1(c) adds Normal and DIVISION first; Fig. 6 shares them and still lists them at its own places.
  CHECK(section_rows({"1c", "fig6"}, "Fig. 6") == fig6);
  CHECK(section_rows({"1c", "fig6"}, "Table 1(c)") == section_rows({"1c"}, "Table 1(c)"));
  const std::vector<std::string> table3 = section_rows({"3"}, "Table 3");
  REQUIRE(table3.size() > 2);
  CHECK(table3[1] == "ResNet-18 · CIFAR-10");
  CHECK(section_rows({"2a", "3"}, "Table 3") == table3);  // Table 2(a)'s MobileNetV2 cells come first there
  // Fig. 6's bars: its methods in the same order.
  GridOptions both;
  both.tables = {"1c", "fig6"};
  write_reports(make_grid(both), dir.file("svg"), "actlab-ablate (test)");
  const std::string svg = read_all(fs::path(dir.file("svg")) / "fig6_accuracy.svg");
  size_t last = 0;
  for (size_t k = 1; k < fig6.size(); ++k) {
    const size_t at = svg.find(">" + fig6[k] + "<");
    INFO(fig6[k]);
    REQUIRE(at != std::string::npos);
    CHECK(at > last);
    last = at;
  }
}

TEST_CASE("ablate: a failing cell is recorded as failed and the grid goes on") {
  REQUIRE_MESSAGE(fs::exists(train_bin()), "build the actlab-train target next to actlab_tests");
  testing::TempDir dir("ablate_fail");
  const Grid grid = tiny_grid({"division:B=0", "exact"});  // B=0 is refused by the child's parser
  const RunOptions o = run_options(dir);
  int rc = run_quiet(grid, o, dir);
  const std::string progress = read_all(dir.file("progress.txt"));
  INFO(progress);
  CHECK(rc == 1);
  CHECK(progress.find("FAILED (exit 2: actlab-train: error:") != std::string::npos);
  size_t columns = 0;
  auto rows = read_results(fs::path(o.out_dir) / "results.csv", &columns);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0]["status"] == "failed");
  CHECK(rows[0]["message"].find("exit 2: actlab-train: error:") == 0);
  CHECK(rows[0]["message"].find("B") != std::string::npos);
  CHECK(rows[1]["status"] == "done");
  CHECK(read_all(fs::path(o.out_dir) / "tables.md").find("*failed*") != std::string::npos);
  // --report-only regenerates the same verdicts without training.
  RunOptions report = o;
  report.report_only = true;
  fs::remove(fs::path(o.out_dir) / "results.csv");
  rc = run_quiet(grid, report, dir);
  CHECK(rc == 1);
  rows = read_results(fs::path(o.out_dir) / "results.csv", &columns);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0]["status"] == "failed");
}

TEST_CASE("ablate: an exit code of 128+n is not called a death by signal n, a real one is") {
  testing::TempDir dir("ablate_exit_vs_signal");
  // Stand-ins for actlab-train: one exits 137 itself, one is killed by SIGKILL. Both say a last line first.
  const auto stand_in = [&](const std::string& name, const std::string& ending) {
    const std::string path = dir.file(name);
    std::ofstream(path) << "#!/bin/sh\necho 'last words'\n" << ending << "\n";
    fs::permissions(path, fs::perms::owner_all);
    return path;
  };
  const Grid grid = tiny_grid({"exact"});
  const std::pair<std::string, std::string> cases[] = {
      {stand_in("exits_137.sh", "exit 137"), "FAILED (exit 137: last words)"},
      {stand_in("killed.sh", "kill -KILL $$"), "FAILED (killed by signal 9 (Killed): last words)"},
  };
  for (const auto& [bin, expected] : cases) {
    CAPTURE(bin);
    RunOptions o = run_options(dir);
    o.out_dir = dir.file("out_" + fs::path(bin).stem().string());
    o.train_bin = bin;
    CHECK(run_quiet(grid, o, dir) == 1);
    const std::string progress = read_all(dir.file("progress.txt"));
    INFO(progress);
    CHECK(progress.find(expected) != std::string::npos);
  }
}

TEST_CASE("ablate: a cell that diverges is a result: memory kept, accuracy '*diverged*', the grid succeeds") {
  REQUIRE_MESSAGE(fs::exists(train_bin()), "build the actlab-train target next to actlab_tests");
  testing::TempDir dir("ablate_diverge");
  Grid grid = tiny_grid({"division:B=8,Q=2", "exact"});
  grid.cells[0].lr = 1e30;  // non-finite at its second step, as w/o LFC goes in Table 1(c) after a few
  const RunOptions o = run_options(dir);
  int rc = run_quiet(grid, o, dir);
  const std::string progress = read_all(dir.file("progress.txt"));
  INFO(progress);
  CHECK(rc == 0);
  CHECK(progress.find("diverged after") != std::string::npos);
  size_t columns = 0;
  auto rows = read_results(fs::path(o.out_dir) / "results.csv", &columns);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0]["status"] == "diverged");
  CHECK(rows[0]["message"].find("non-finite") == 0);
  CHECK(rows[0]["final_test_acc"].empty());
  CHECK(std::atoll(rows[0]["activation_bytes"].c_str()) > 0);  // measured at the first step
  CHECK(rows[1]["status"] == "done");
  const std::string tables = read_all(fs::path(o.out_dir) / "tables.md");
  CHECK(tables.find("*diverged*") != std::string::npos);
  CHECK(tables.find("1 diverged") != std::string::npos);
  // A rerun keeps the result instead of training it again.
  rc = run_quiet(grid, o, dir);
  CHECK(rc == 0);
  CHECK(read_all(dir.file("progress.txt")).find("skip (diverged)") != std::string::npos);
}

// ------------------------------------------------------------------ Fig. 6 and Fig. 1
TEST_CASE("ablate: Fig. 6 runs every method, three seeds for the close rows and one for the exact-gradient ones") {
  GridOptions o;
  o.tables = {"fig6"};
  const Grid g = make_grid(o);
  std::map<std::string, std::set<int64_t>> seeds;  // label -> seeds
  std::map<std::string, std::string> policy;       // label -> policy
  for (const Cell& c : g.cells) {
    REQUIRE(c.tables.size() == 1);
    CHECK(c.tables[0].first == "fig6");
    CHECK(c.model == "resnet20");
    CHECK(c.dataset == "fashion-mnist");
    CHECK(c.epochs == 6);
    seeds[c.tables[0].second].insert(c.seed);
    policy[c.tables[0].second] = c.policy;
  }
  const std::set<int64_t> three = {0, 1, 2}, one = {0};
  CHECK(seeds.size() == 7);
  for (const char* close : {"Normal", "BLPA", "AC-GC", "ActNN", "DIVISION"}) CHECK_MESSAGE(seeds[close] == three, close);
  for (const char* same : {"Checkpoint", "SWAP"}) CHECK_MESSAGE(seeds[same] == one, same);
  CHECK(g.cells.size() == 5 * 3 + 2);
  CHECK(policy["Normal"] == "exact");
  CHECK(policy["Checkpoint"] == "checkpoint:segments=auto+exact");
  CHECK(policy["SWAP"] == "swap:P=2");
  CHECK(policy["BLPA"] == "blpa:Q=4");
  CHECK(policy["AC-GC"] == "acgc:E=0,I=100,G=256");
  CHECK(policy["ActNN"] == "actnn:G=256,Q=2");
  CHECK(policy["DIVISION"] == "division:B=8,Q=2");
  // Seed 0 of every method comes first: a grid stopped early still has one full column.
  for (size_t i = 0; i < 7; ++i) CHECK(g.cells[i].seed == 0);
  CHECK(g.cells[0].tables[0].second == "Normal");
  CHECK(g.cells[1].id() == "resnet20-fashion-mnist-checkpoint_segmentsauto-exact-s0");
  // Under bf16 checkpointing recomputes from a rounded segment input, so its gradients are no longer
  // Normal's: it runs Normal's three seeds. SWAP (the precision's exact keep, offloaded) stays at one.
  GridOptions b = o;
  b.precision = "bf16";
  std::map<std::string, std::set<int64_t>> bf16_seeds;
  for (const Cell& c : make_grid(b).cells) bf16_seeds[c.tables[0].second].insert(c.seed);
  CHECK(bf16_seeds["Checkpoint"] == three);
  CHECK(bf16_seeds["SWAP"] == one);
  // --seeds given: every row runs exactly those.
  o.seeds = {4};
  CHECK(make_grid(o).cells.size() == 7);
  // The paper preset: the CIFAR-10 ResNet-18 recipe of the paper's Table 10.
  o = GridOptions();
  o.preset = "paper";
  o.tables = {"fig6"};
  const Grid paper = make_grid(o);
  CHECK(paper.cells.size() == 17);
  CHECK(paper.cells[0].model == "resnet18");
  CHECK(paper.cells[0].dataset == "cifar10");
  CHECK(paper.cells[0].epochs == 100);
  // Table 1(c) shares its Normal and DIVISION cells with Fig. 6.
  o = GridOptions();
  o.tables = {"1c", "fig6"};
  const Grid both = make_grid(o);
  // 1c's five; Fig. 6's seed 0 adds Checkpoint, SWAP, BLPA, AC-GC and ActNN; seeds 1 and 2 add Normal, BLPA, AC-GC,
  // ActNN and DIVISION.
  CHECK(both.cells.size() == 5 + 5 + 2 * 5);
  CHECK(both.cells[0].tables.size() == 2);
}

TEST_CASE("ablate: Table 1(b) runs the transformer's methods, ViT-Tiny on the CPU and Swin-T on an image folder") {
  GridOptions o;
  o.tables = {"1b"};
  const Grid g = make_grid(o);
  std::map<std::string, std::set<int64_t>> seeds;
  std::map<std::string, std::string> policy;
  for (const Cell& c : g.cells) {
    REQUIRE(c.tables.size() == 1);
    CHECK(c.tables[0].first == "1b");
    CHECK(c.model == "vit_tiny_cifar");
    CHECK(c.dataset == "fashion-mnist");
    CHECK(c.epochs == 1);
    CHECK(c.lr == doctest::Approx(0.01));  // SGD at the CNNs' 0.1 does not train a ViT (grid_presets.cpp)
    CHECK(c.extra_args.empty());
    seeds[c.tables[0].second].insert(c.seed);
    policy[c.tables[0].second] = c.policy;
  }
  CHECK(g.cells.size() == 3 * 3 + 1);
  CHECK(seeds["Normal"] == std::set<int64_t>{0, 1, 2});
  CHECK(seeds["Mesa"] == std::set<int64_t>{0, 1, 2});
  CHECK(seeds["DIVISION"] == std::set<int64_t>{0, 1, 2});
  CHECK(seeds["Checkpoint"] == std::set<int64_t>{0});
  CHECK(policy["Checkpoint"] == "checkpoint:segments=auto+exact");
  CHECK(policy["Mesa"] == "mesa:Q=8");
  CHECK(policy["DIVISION"] == "division:B=8,Q=2");
  for (size_t i = 0; i < 4; ++i) CHECK(g.cells[i].seed == 0);
  o.lr = 0.02;
  o.epochs = 3;
  CHECK(make_grid(o).cells[0].lr == doctest::Approx(0.02));  // the command line still wins
  CHECK(make_grid(o).cells[0].epochs == 3);
  // The paper preset: Swin-T on an ImageNet-style folder at its own 224², streamed, batch 128.
  o = GridOptions();
  o.preset = "paper";
  o.tables = {"1b"};
  Grid paper = make_grid(o);
  REQUIRE(paper.cells.size() == 10);
  CHECK(paper.cells[0].model == "swin_t");
  CHECK(paper.cells[0].dataset == "folder");
  CHECK(paper.cells[0].batch_size == 128);
  CHECK(paper.cells[0].extra_args == std::vector<std::string>{"--image-size", "224", "--stream"});
  CHECK(error_of([&] { check_data_present(paper); }).find("pass --data-dir ROOT") != std::string::npos);
  testing::TempDir dir("ablate_1b");
  o.data_dir = dir.file("missing");
  CHECK(error_of([&] { check_data_present(make_grid(o)); }).find("is not a directory") != std::string::npos);
  o.data_dir = dir.str();
  check_data_present(make_grid(o));
  o.extra_args = {"--data-workers", "4"};  // the user's flags follow the preset's
  CHECK(make_grid(o).cells[0].extra_args ==
        std::vector<std::string>{"--image-size", "224", "--stream", "--data-workers", "4"});
  // Another model on Table 1(b) keeps the table's rows and that model's recipe.
  o = GridOptions();
  o.tables = {"1b"};
  o.models = {"resnet20"};
  CHECK(make_grid(o).cells[0].lr == doctest::Approx(0.1));
  CHECK(make_grid(o).cells[0].epochs == 6);
}

TEST_CASE("ablate: policy strings have one spelling, checkpoint forms included") {
  CHECK(canonical_policy("exact") == "exact");
  CHECK(canonical_policy("division:Q=4,B=12") == "division:B=12,Q=4");
  CHECK(canonical_policy("checkpoint") == "checkpoint:segments=auto+exact");
  CHECK(canonical_policy("checkpoint:segments=4+division:Q=2,B=8") == "checkpoint:segments=4+division:B=8,Q=2");
  CHECK(canonical_policy(canonical_policy("checkpoint:segments=4")) == "checkpoint:segments=4+exact");
  CHECK(error_of([] { canonical_policy("checkpoint:segs=2"); }).find("checkpoint forms") != std::string::npos);
  CHECK(error_of([] { canonical_policy("divison:B=8"); }) != "");
  GridOptions o;
  o.policies = {"checkpoint", "checkpoint+division:B=8,Q=2"};
  const Grid g = make_grid(o);
  REQUIRE(g.cells.size() == 2);
  CHECK(g.cells[1].policy == "checkpoint:segments=auto+division:B=8,Q=2");
  // The radar's and the tables' method names: checkpointing with exact saves is plain Checkpoint.
  CHECK(paper_method_name("checkpoint:segments=auto+exact") == "Checkpoint");
  CHECK(paper_method_name("checkpoint:segments=auto+division:B=8,Q=2") == "Checkpoint+DIVISION");
  // A policy with per-module rules is one string from list to cell to table, and no paper method.
  o.policies = {"quant:R=1,Q=2|*.attn.proj=division:Q=2,B=8,R=1"};
  const Grid rules = make_grid(o);
  REQUIRE(rules.cells.size() == 1);
  CHECK(rules.cells[0].policy == "quant:Q=2,R=1|*.attn.proj=division:B=8,Q=2,R=1");
  CHECK(rules.cells[0].id() == "resnet20-fashion-mnist-quant_Q2_R1--.attn.projdivision_B8_Q2_R1-s0");
  const std::vector<std::string> args = rules.cells[0].train_args();
  const auto flag = std::find(args.begin(), args.end(), "--policy");
  REQUIRE(flag != args.end());
  CHECK(*(flag + 1) == rules.cells[0].policy);
  CHECK(paper_method_name(rules.cells[0].policy) == rules.cells[0].policy);
  CHECK(paper_method_name("division:B=8,Q=2|head=exact") == "division:B=8,Q=2|head=exact");
  CHECK(paper_accuracy("DIVISION", "resnet18", "cifar10") == doctest::Approx(94.72));
  CHECK(std::isnan(paper_accuracy("DIVISION", "resnet20", "fashion-mnist")));
}

TEST_CASE("plot: radar chart draws one polygon per series, each value where the geometry puts it") {
  plot::RadarChart chart{"Fig. 1 <test>",
                         {{"accuracy (%)", 90, 94, false}, {"memory (×)", 1, 16, true}, {"speed (×)", 0, 2, false}},
                         {{"Normal", {94, 1, 1}}, {"DIVISION", {93, 4, 0.5}}}};
  const std::string svg = plot::radar_chart_svg(chart);
  std::string why;
  CHECK_MESSAGE(xml_balanced(svg, &why), why);
  CHECK(svg.rfind(plot::kSvgStart, 0) == 0);
  CHECK(count_of(svg, "<svg ") == 1);
  CHECK(count_of(svg, "class=\"series\"") == 2);
  CHECK(svg.find("Fig. 1 &lt;test&gt;") != std::string::npos);
  // An axis label's "(...)" detail is its second line.
  for (const char* name : {">Normal</text>", ">DIVISION</text>", ">accuracy</tspan>", ">(%)</tspan>"})
    CHECK_MESSAGE(svg.find(name) != std::string::npos, name);
  // Every axis label inside the radar's column, however long (centred at x, kCharWidth-wide glyphs).
  plot::RadarChart wide = chart;
  for (auto& axis : wide.axes) axis.label += " (a long detail of the kind the memory axis carries)";
  const std::string wide_svg = plot::radar_chart_svg(wide);
  for (size_t at = wide_svg.find("<tspan x=\""); at != std::string::npos; at = wide_svg.find("<tspan x=\"", at + 1)) {
    const double x = std::stod(wide_svg.substr(at + 10));
    const size_t text = wide_svg.find('>', at) + 1;
    const double half = 6.6 * static_cast<double>(wide_svg.find('<', text) - text) / 2;
    CHECK(x - half >= 0);
    CHECK(x + half <= 2 * plot::kRadarCentreX + 20);
  }
  // DIVISION's polygon, by hand: accuracy 93 is 3/4 up axis 0 (straight up); memory 4 is half way out
  // the log axis 1 (120° clockwise; 1× to 16×); speed 0.5 is 1/4 out along axis 2 (240°).
  const size_t at = svg.find("points=\"", svg.find("class=\"series\"", svg.find("class=\"series\"") + 1)) + 8;
  std::istringstream pts(svg.substr(at, svg.find('"', at) - at));
  const double pi = 3.14159265358979323846, r = plot::kRadarRadius;
  const double want[3][2] = {{plot::kRadarCentreX, plot::kRadarCentreY - 0.75 * r},
                             {plot::kRadarCentreX + 0.5 * r * std::sin(2 * pi / 3),
                              plot::kRadarCentreY - 0.5 * r * std::cos(2 * pi / 3)},
                             {plot::kRadarCentreX + 0.25 * r * std::sin(4 * pi / 3),
                              plot::kRadarCentreY - 0.25 * r * std::cos(4 * pi / 3)}};
  for (const auto& w : want) {
    double x = 0, y = 0;
    char comma = 0;
    REQUIRE(static_cast<bool>(pts >> x >> comma >> y));
    CHECK(x == doctest::Approx(w[0]).epsilon(0.001));
    CHECK(y == doctest::Approx(w[1]).epsilon(0.001));
  }
  CHECK(svg.find(">4</text>") != std::string::npos);  // the log axis's second ring: 1 · 16^(2/4)
  chart.series[1].values[1] = 17;
  CHECK(error_of([&] { plot::radar_chart_svg(chart); }).find("17 on axis 'memory (×)', outside [1, 16]") !=
        std::string::npos);
  chart.series[1].values[1] = 4;
  chart.axes[1].lo = 0;
  CHECK(error_of([&] { plot::radar_chart_svg(chart); }).find("lo > 0 (log axis)") != std::string::npos);
  chart.axes[1].lo = 1;
  chart.series[1].values.pop_back();
  CHECK(error_of([&] { plot::radar_chart_svg(chart); }).find("2 values for 3 axes") != std::string::npos);
  chart.axes.pop_back();
  CHECK(error_of([&] { plot::radar_chart_svg(chart); }).find("at least 3 axes") != std::string::npos);
}

namespace {
void write_file(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// A results.csv with the columns the radar reads (and one it ignores), a memtable and a bench_train CSV.
void write_radar_inputs(const testing::TempDir& dir) {
  // results.csv with a UTF-8 byte-order mark, as a spreadsheet saves it; an "@bf16" entry in the other two
  // (actlab-memtable and bench_train take "exact@bf16" in their lists): left out, Fig. 1 is fp32. A memory
  // and a throughput row at 32×32×3 inputs (CIFAR's, not the grid's Fashion-MNIST): left out too.
  write_file(dir.file("results.csv"),
             "\xEF\xBB\xBFtable,model,dataset,policy,seed,final_test_acc,status,cell,batch,image_size,channels\n"
             "1c;fig6,resnet20,fashion-mnist,exact,0,92.0,done,a,128,28,1\n"
             "fig6,resnet20,fashion-mnist,exact,1,93.0,done,b,128,28,1\n"
             "fig6,resnet20,fashion-mnist,checkpoint:segments=auto+exact,0,92.0,done,c,128,28,1\n"
             "fig6,resnet20,fashion-mnist,\"division:B=8,Q=2\",0,92.5,done,d,128,28,1\n"
             "fig6,resnet20,fashion-mnist,\"division:B=8,Q=2\",1,,failed,e,128,28,1\n"
             "fig6,resnet20,fashion-mnist,swap:P=2,0,92.0,done,f,128,28,1\n"
             "1c,resnet20,fashion-mnist,lfc:B=8,0,75.0,done,g,128,28,1\n"
             "fig6,resnet20,fashion-mnist,blpa:Q=4,0,,diverged,h,128,28,1\n");
  write_file(dir.file("mem.csv"),
             "model,batch,policy,method,total_gib,activation_gib,image_size,channels\n"
             "resnet20,128,exact,Normal,1,0.2,28,1\n"
             "resnet20,128,exact@bf16,Normal,1,0.1,28,1\n"
             "resnet20,128,checkpoint,Checkpoint,1,0.05,28,1\n"
             "resnet20,128,\"division:Q=2,B=8\",DIVISION,1,0.02,28,1\n"
             "resnet20,128,\"division:Q=2,B=8\",DIVISION,1,0.5,32,3\n"
             "resnet20,256,exact,Normal,2,0.4,28,1\n"
             "resnet18,128,exact,Normal,3,0.9,28,1\n");
  write_file(dir.file("bench.csv"),
             "model,policy,batch,img_per_s,best_img_per_s,image_size,channels\n"
             "resnet20,exact,128,100,110,28,1\n"
             "resnet20,exact,128,120,130,28,1\n"
             "resnet20,exact,128,5,5,32,3\n"
             "resnet20,exact@bf16,128,500,500,28,1\n"
             "resnet20,checkpoint,128,88,90,28,1\n"
             "resnet20,\"division:B=8,Q=2\",128,66,70,28,1\n"
             "resnet20,swap,128,99,99,28,1\n");
}
}  // namespace

TEST_CASE("radar: the three CSVs are joined by policy, relative to Normal, and drawn") {
  testing::TempDir dir("ablate_radar");
  write_radar_inputs(dir);
  RadarInputs in{dir.file("results.csv"), dir.file("mem.csv"), dir.file("bench.csv"), "", ""};
  const RadarData d = read_radar_data(in);
  CHECK(d.model == "resnet20");
  CHECK(d.batch == 128);  // the grid's; the batch-256 row is not mixed in
  CHECK(d.image_size == 28);  // nor the 32×32×3 rows
  CHECK(d.channels == 1);
  REQUIRE(d.points.size() == 3);
  CHECK(d.points[0].method == "Normal");
  CHECK(d.points[0].accuracy == doctest::Approx(92.5));  // two seeds
  CHECK(d.points[0].seeds == 2);
  CHECK(d.points[0].memory_saving == doctest::Approx(1));
  CHECK(d.points[0].throughput_ratio == doctest::Approx(1));
  CHECK_FALSE(d.points[0].paired_with_normal);
  CHECK(d.points[1].method == "Checkpoint");
  // One seed against Normal's two: Normal's mean plus the difference at seed 0 (none: it is Normal's run).
  CHECK(d.points[1].accuracy == doctest::Approx(92.5));
  CHECK(d.points[1].paired_with_normal);
  CHECK(d.points[1].memory_saving == doctest::Approx(4));
  CHECK(d.points[1].throughput_ratio == doctest::Approx(0.8));  // 88 / mean(100, 120)
  CHECK(d.points[2].method == "DIVISION");
  CHECK(d.points[2].seeds == 1);  // the failed seed is not averaged in
  CHECK(d.points[2].accuracy == doctest::Approx(93.0));  // 92.5 + (92.5 - 92.0) at seed 0
  CHECK(d.points[2].memory_saving == doctest::Approx(10));
  CHECK(d.points[2].throughput_ratio == doctest::Approx(0.6));
  // BLPA has no finished run; SWAP has a throughput but no memory row; lfc is not a Fig. 6 row.
  REQUIRE(d.skipped.size() == 2);
  CHECK(d.skipped[0].find("BLPA (blpa:Q=4): no finished run in '" + dir.file("results.csv") + "' (diverged)") == 0);
  CHECK(d.skipped[1].find("SWAP (swap:P=2): not in '" + dir.file("mem.csv") + "'") == 0);
  const plot::RadarChart chart = radar_chart(d);
  REQUIRE(chart.axes.size() == 3);
  CHECK(chart.axes[0].lo < 92.5);  // the worst method is not at the centre
  CHECK(chart.axes[0].hi >= 93.0);
  CHECK(chart.axes[1].log);
  CHECK(chart.axes[1].lo == 0.5);  // below Normal's 1×
  CHECK(chart.axes[1].hi == doctest::Approx(128));  // 10× needs rings 4× apart: 2, 8, 32, 128
  CHECK(!chart.axes[2].log);
  CHECK(chart.series.size() == 3);
  const std::string svg = plot::radar_chart_svg(chart);
  CHECK(count_of(svg, "class=\"series\"") == 3);
  CHECK(radar_range(0, 10) == std::pair<double, double>(0, 10));
  CHECK(radar_range(0, 1.2) == std::pair<double, double>(0, 2));
  const auto acc = radar_range(91.75, 93.2);  // step 0.5: rings at 91.5, 92, 92.5, 93, 93.5
  CHECK(acc.first == doctest::Approx(91.5));
  CHECK(acc.second == doctest::Approx(93.5));
}

TEST_CASE("radar: a missing or foreign input is one error line naming the file") {
  testing::TempDir dir("ablate_radar_bad");
  write_radar_inputs(dir);
  RadarInputs in{dir.file("results.csv"), dir.file("nothere.csv"), dir.file("bench.csv"), "", ""};
  std::string e = error_of([&] { read_radar_data(in); });
  CHECK(e.find("--memory file '" + dir.file("nothere.csv") + "' cannot be read: No such file or directory") !=
        std::string::npos);
  CHECK(e.find('\n') == std::string::npos);
  in.memory_csv = dir.file("bench.csv");  // a bench_train CSV where the memtable's belongs
  e = error_of([&] { read_radar_data(in); });
  CHECK(e.find("has no column 'activation_gib' (is it actlab-memtable --csv output?)") != std::string::npos);
  in.memory_csv = dir.file("mem.csv");
  in.model = "resnet18";
  CHECK(error_of([&] { read_radar_data(in); }).find("has no finished runs of model resnet18") != std::string::npos);
  in.model.clear();
  write_file(dir.file("bench.csv"), "model,policy,batch,img_per_s,image_size,channels\nresnet20,checkpoint,128,88,28,1\n");
  CHECK(error_of([&] { read_radar_data(in); }).find("no Normal (exact) row for resnet20 at batch 128") !=
        std::string::npos);
  // The radar divides by Normal's throughput and memory: zero, negative, nan or inf is the file's fault.
  for (const std::string v : {"0", "-5", "nan", "inf", "1e400"}) {
    write_file(dir.file("bench.csv"), "model,policy,batch,img_per_s,image_size,channels\nresnet20,exact,128," + v + ",28,1\n");
    CHECK(error_of([&] { read_radar_data(in); })
              .find("--throughput file '" + dir.file("bench.csv") + "': column 'img_per_s' holds '" + v +
                    "', not a finite number > 0") != std::string::npos);
  }
}

TEST_CASE("radar: memory and throughput are taken at the grid's batch and input, a file without them is refused") {
  testing::TempDir dir("ablate_radar_batch");
  write_file(dir.file("results.csv"),
             "table,model,dataset,policy,seed,final_test_acc,status,batch,image_size,channels\n"
             "fig6,resnet20,fashion-mnist,exact,0,92.0,done,128,28,1\n"
             "fig6,resnet20,fashion-mnist,\"division:B=8,Q=2\",0,92.5,done,128,28,1\n");
  // A memtable run with --batches 2,128 lists batch 2 first.
  write_file(dir.file("mem.csv"),
             "model,batch,policy,method,total_gib,activation_gib,image_size,channels\n"
             "resnet20,2,exact,Normal,1,0.01,28,1\n"
             "resnet20,2,\"division:B=8,Q=2\",DIVISION,1,0.002,28,1\n"
             "resnet20,128,exact,Normal,1,0.64,28,1\n"
             "resnet20,128,\"division:B=8,Q=2\",DIVISION,1,0.04,28,1\n");
  write_file(dir.file("bench.csv"),
             "model,policy,batch,img_per_s,image_size,channels\n"
             "resnet20,exact,64,400,28,1\n"
             "resnet20,\"division:B=8,Q=2\",64,100,28,1\n"
             "resnet20,exact,128,100,28,1\n"
             "resnet20,\"division:B=8,Q=2\",128,80,28,1\n");
  RadarInputs in{dir.file("results.csv"), dir.file("mem.csv"), dir.file("bench.csv"), "", ""};
  const RadarData d = read_radar_data(in);
  CHECK(d.batch == 128);
  REQUIRE(d.points.size() == 2);
  CHECK(d.points[1].memory_saving == doctest::Approx(16));     // 0.64 / 0.04, not batch 2's 5
  CHECK(d.points[1].throughput_ratio == doctest::Approx(0.8));  // 80 / 100, not batch 64's 0.25
  CHECK(radar_chart(d).axes[1].label.find("batch 128") != std::string::npos);

  // A throughput run at another batch only: one line naming the file, the grid's batch and the file's.
  write_file(dir.file("bench64.csv"),
             "model,policy,batch,img_per_s,image_size,channels\nresnet20,exact,64,400,28,1\nresnet20,exact,32,500,28,1\n");
  in.throughput_csv = dir.file("bench64.csv");
  std::string e = error_of([&] { read_radar_data(in); });
  CHECK(e.find("--throughput file '" + dir.file("bench64.csv") + "' has no rows for resnet20 at batch 128, the grid's "
               "batch (it has batch 32, 64); measure it at batch 128") == 0);
  CHECK(e.find('\n') == std::string::npos);
  // Memory measured at the grid's batch but at other inputs (CIFAR's 32×32×3, the tools' default, and
  // ImageNet's): refused, naming the shapes and the flags that measure it right.
  write_file(dir.file("mem32.csv"), "model,batch,policy,activation_gib,image_size,channels\n"
                                    "resnet20,128,exact,0.9,32,3\nresnet20,128,exact,9.0,224,3\n");
  in.throughput_csv = dir.file("bench.csv");
  in.memory_csv = dir.file("mem32.csv");
  e = error_of([&] { read_radar_data(in); });
  CHECK(e.find("--memory file '" + dir.file("mem32.csv") + "' has no rows for resnet20 at batch 128 with 28×28×1 "
               "inputs, the grid's (it has 224×224×3, 32×32×3); measure it with --image-size 28 --channels 1") == 0);
  // A file from before the tools recorded the input shape cannot say which rows to take.
  write_file(dir.file("mem_old.csv"), "model,batch,policy,activation_gib\nresnet20,128,exact,0.64\n");
  in.memory_csv = dir.file("mem_old.csv");
  CHECK(error_of([&] { read_radar_data(in); }).find("has no column 'image_size', which says the input it was measured "
                                                    "at (an older actlab-memtable's; measure it again)") !=
        std::string::npos);
  write_file(dir.file("mem2.csv"), "model,batch,policy,activation_gib,image_size,channels\nresnet20,2,exact,0.01,28,1\n");
  in.memory_csv = dir.file("mem2.csv");
  CHECK(error_of([&] { read_radar_data(in); }).find("--memory file '" + dir.file("mem2.csv") +
                                                    "' has no rows for resnet20 at batch 128") == 0);
  in.memory_csv = dir.file("mem.csv");

  // results.csv from before it named the batch (or the input) cannot say which rows to take.
  write_file(dir.file("old.csv"), "table,model,dataset,policy,seed,final_test_acc,status\n"
                                  "fig6,resnet20,fashion-mnist,exact,0,92.0,done\n");
  in.results_csv = dir.file("old.csv");
  CHECK(error_of([&] { read_radar_data(in); }).find("has no column 'batch'") != std::string::npos);
  write_file(dir.file("old2.csv"), "table,model,dataset,policy,seed,final_test_acc,status,batch\n"
                                   "fig6,resnet20,fashion-mnist,exact,0,92.0,done,128\n");
  in.results_csv = dir.file("old2.csv");
  CHECK(error_of([&] { read_radar_data(in); }).find("has no column 'image_size'") != std::string::npos);
  // A done cell whose summary.json predates the input shape: its row's columns are empty.
  write_file(dir.file("old3.csv"), "table,model,dataset,policy,seed,final_test_acc,status,cell,batch,image_size,channels\n"
                                   "fig6,resnet20,fashion-mnist,exact,0,92.0,done,r20-exact-s0,128,,\n");
  in.results_csv = dir.file("old3.csv");
  CHECK(error_of([&] { read_radar_data(in); }).find("cell r20-exact-s0 records no input shape") != std::string::npos);
  // Runs of one model at two batches are two settings, not one radar.
  write_file(dir.file("two.csv"), "table,model,dataset,policy,seed,final_test_acc,status,batch,image_size,channels\n"
                                  "fig6,resnet20,fashion-mnist,exact,0,92.0,done,128,28,1\n"
                                  "fig6,resnet20,fashion-mnist,exact,1,92.0,done,64,28,1\n");
  in.results_csv = dir.file("two.csv");
  CHECK(error_of([&] { read_radar_data(in); }).find("at batches 64, 128; the radar compares the methods at one batch") !=
        std::string::npos);
}

TEST_CASE("ablate: a tiny Table 1(b) grid reports accuracy, memory, compression and throughput per method") {
  REQUIRE_MESSAGE(fs::exists(train_bin()), "build the actlab-train target next to actlab_tests");
  testing::TempDir dir("ablate_1b_run");
  const std::string tables =
      run_tiny_table(dir, "1b", {{"exact", "Normal"}, {"mesa:Q=8", "Mesa"}, {"division:B=8,Q=2", "DIVISION"}});
  INFO(tables);
  CHECK(tables.find("## Table 1(b): vision transformers") != std::string::npos);
  CHECK(tables.find("| Method | Policy | Test acc. (%) | Δ vs Normal | Seeds | Activation memory | Compression | img/s |") !=
        std::string::npos);
  CHECK(tables.find("| Normal | `exact` |") != std::string::npos);
  CHECK(tables.find("| 1.00× |") != std::string::npos);  // Normal against itself
  // Mesa keeps 8-bit codes of the MLP's f32 inputs: compression between 1 and 4 (ranges, labels, the
  // input batch and the exact masks stay).
  const size_t mesa = tables.find("| Mesa | `mesa:Q=8` |");
  REQUIRE(mesa != std::string::npos);
  const std::string mesa_row = tables.substr(mesa, tables.find('\n', mesa) - mesa);
  const size_t times = mesa_row.find("× |");
  REQUIRE(times != std::string::npos);
  const size_t bar = mesa_row.rfind("| ", times);
  const double compression = std::stod(mesa_row.substr(bar + 2, times - bar - 2));
  CHECK(compression > 1.0);
  CHECK(compression < 4.0);
  CHECK(tables.find("not in the reference this project works from") != std::string::npos);
}

TEST_CASE("ablate: a tiny Table 2(a) grid puts DIVISION beside Normal with its accuracy difference") {
  REQUIRE_MESSAGE(fs::exists(train_bin()), "build the actlab-train target next to actlab_tests");
  testing::TempDir dir("ablate_2a_run");
  const std::string tables = run_tiny_table(dir, "2a", {{"exact", "Normal"}, {"division:B=8,Q=2", "DIVISION"}});
  INFO(tables);
  CHECK(tables.find("## Table 2(a): depthwise and pointwise convolutions") != std::string::npos);
  CHECK(tables.find("| Method | Policy | Test acc. (%) | Δ vs Normal | Seeds |") != std::string::npos);
  const size_t row = tables.find("| DIVISION | `division:B=8,Q=2` | ");
  REQUIRE(row != std::string::npos);
  // Its Δ is the signed difference of the two accuracies in the row above and this one.
  const auto cells = split_list(tables.substr(row + 1, tables.find('\n', row) - row - 1), '|');
  const size_t normal = tables.find("| Normal | `exact` | ");
  REQUIRE(normal != std::string::npos);
  const auto normal_cells = split_list(tables.substr(normal + 1, tables.find('\n', normal) - normal - 1), '|');
  REQUIRE(cells.size() >= 4);
  REQUIRE(normal_cells.size() >= 3);
  // (each printed to 2 decimals from unrounded means, so they may differ by one in the last digit)
  CHECK(std::fabs(std::stod(cells[3]) - (std::stod(cells[2]) - std::stod(normal_cells[2]))) <= 0.0101);
  CHECK(tables.find("Table 2(a), MobileNet-V2 on CIFAR-10 and CIFAR-100") != std::string::npos);
}

TEST_CASE("ablate: Table 2(a)'s two data sets share one note on the missing paper figures") {
  GridOptions o;
  o.tables = {"2a"};
  const Grid g = make_grid(o);
  testing::TempDir dir("ablate_2a_note");
  write_reports(g, dir.path().string(), "actlab-ablate --table 2a");  // no cell run: every row "not run"
  const std::string tables = read_all(dir.file("tables.md"));
  INFO(tables);
  CHECK(count_of(tables, "**MobileNetV2 · CIFAR-10**") == 1);
  CHECK(count_of(tables, "**MobileNetV2 · CIFAR-100**") == 1);
  CHECK(count_of(tables, "| Method | Policy | Test acc. (%) | Δ vs Normal |") == 2);
  CHECK(count_of(tables, "are not in the reference this project works from") == 1);
  // ... and under the table, after both groups.
  CHECK(tables.find("are not in the reference") > tables.find("**MobileNetV2 · CIFAR-100**"));
}

TEST_CASE("ablate: a tiny Fig. 6 grid writes the paper's layout and checks SWAP against Normal") {
  REQUIRE_MESSAGE(fs::exists(train_bin()), "build the actlab-train target next to actlab_tests");
  testing::TempDir dir("ablate_fig6");
  const std::string tables =
      run_tiny_table(dir, "fig6", {{"exact", "Normal"}, {"exact", "Normal", 1}, {"swap:P=2", "SWAP"},
                                   {"division:B=8,Q=2", "DIVISION"}});
  INFO(tables);
  CHECK(tables.find("## Fig. 6: test accuracy of every method") != std::string::npos);
  CHECK(tables.find("| Method | Policy | Test acc. (%) | Δ vs Normal | Seeds | Paper (%) | Paper Δ vs Normal |") !=
        std::string::npos);
  CHECK(tables.find("| SWAP | `swap:P=2` |") != std::string::npos);
  // SWAP ran seed 0 only: its Δ is against Normal's seed-0 run (bit for bit the same), not Normal's mean.
  CHECK(tables.find("| SWAP | `swap:P=2` | ") != std::string::npos);
  const size_t swap = tables.find("| SWAP | `swap:P=2` | ");
  const std::string swap_row = tables.substr(swap, tables.find('\n', swap) - swap);
  CHECK(swap_row.find("| +0.00 | 1 |") != std::string::npos);
  // SWAP moves the saves to host memory and back: the run must end exactly where Normal's did.
  CHECK(tables.find("- SWAP, seed 0: train loss") != std::string::npos);
  CHECK(tables.find("identical to Normal's") != std::string::npos);
  CHECK(tables.find("The paper reports no accuracy for") != std::string::npos);
  CHECK(count_of(read_all(fs::path(run_options(dir).out_dir) / "fig6_accuracy.svg"), "class=\"bar\"") == 3);
}

TEST_CASE("ablate: two spellings of one run in one table are one entry of its row") {
  Grid g;
  g.preset = "test";
  g.tables = {"custom"};
  g.add(tiny_cell("exact"), "custom", "exact");
  g.add(tiny_cell("exact"), "custom", "exact");  // `exact;exact@fp32`: the same cell, the same row
  g.add(tiny_cell("exact"), "fig6", "Normal");   // another table's row still lists it
  REQUIRE(g.cells.size() == 1);
  CHECK(g.cells[0].tables ==
        std::vector<std::pair<std::string, std::string>>{{"custom", "exact"}, {"fig6", "Normal"}});
  CHECK(g.table_cells.at("custom") == std::vector<size_t>{0});
}

TEST_CASE("ablate: a bf16 grid compares with its own exact@bf16: SWAP ends where Normal does, compression is measured") {
  REQUIRE_MESSAGE(fs::exists(train_bin()), "build the actlab-train target next to actlab_tests");
  if (!actlab::testing::have_bf16_kernels()) return;
  testing::TempDir dir("ablate_bf16");
  Grid grid;
  grid.preset = "test";
  grid.tables = {"fig6", "1b"};
  for (const auto& [policy, label] : std::vector<std::pair<std::string, std::string>>{
           {"exact", "Normal"}, {"swap:P=2", "SWAP"}, {"checkpoint", "Checkpoint"}, {"division:B=8,Q=2", "DIVISION"}}) {
    Cell c = tiny_cell(canonical_policy(policy));  // as the presets write it: checkpoint:segments=auto+exact
    c.model = "resnet20";
    c.precision = "bf16";
    grid.add(c, "fig6", label);
    if (label == "Normal" || label == "DIVISION") grid.add(c, "1b", label);
  }
  const RunOptions o = run_options(dir);
  const int rc = run_quiet(grid, o, dir);
  INFO(read_all(dir.file("progress.txt")));
  REQUIRE(rc == 0);
  const std::string tables = read_all(fs::path(o.out_dir) / "tables.md");
  INFO(tables);
  CHECK(tables.find("| SWAP | `swap:P=2@bf16` |") != std::string::npos);  // the rows say which precision ran
  CHECK(tables.find("| Checkpoint | `checkpoint") != std::string::npos);
  // SWAP offloads exact@bf16's copies: bit for bit Normal's run. Checkpoint recomputes from a bf16 copy of
  // its segment input, so it is not held to that (it used to be reported as differing).
  CHECK(tables.find("- SWAP, seed 0: train loss") != std::string::npos);
  CHECK(tables.find("identical to Normal's") != std::string::npos);
  CHECK(tables.find("**differs**") == std::string::npos);
  CHECK(tables.find("- Checkpoint, seed 0") == std::string::npos);
  // Compression against the grid's own exact@bf16 run (it was "—" for want of an fp32 exact cell).
  const size_t division = tables.find("| DIVISION | `division:B=8,Q=2@bf16` |", tables.find("## Table 1(b)"));
  REQUIRE(division != std::string::npos);
  const std::string row = tables.substr(division, tables.find('\n', division) - division);
  CHECK(row.find("× |") != std::string::npos);
}
