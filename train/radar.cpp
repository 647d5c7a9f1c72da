// Fig. 1's radar from the grid's, actlab-memtable's and bench_train's CSVs (train/radar.h): reading the
// three files by column name, joining them by canonical policy string, and the chart's axes.
// Tested in tests/test_ablate.cpp ("radar: ...").
#include "actlab/train/radar.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "actlab/core/error.h"
#include "actlab/train/cli.h"
#include "actlab/train/grid.h"
#include "actlab/train/logging.h"
#include "actlab/train/paper_reference.h"
#include "actlab/train/step.h"

namespace actlab {
namespace {

// A CSV file as rows of column name → field; `what` names the flag it came from in every error.
struct CsvTable {
  std::string path, what;
  std::vector<std::map<std::string, std::string>> rows;
  void require(const std::vector<std::string>& columns, const char* writer) const {
    for (const auto& c : columns)
      ACTLAB_CHECK(rows.empty() || rows[0].count(c), what, " file '", path, "' has no column '", c, "' (is it ",
                   writer, " output?)");
  }
};

CsvTable read_csv(const std::string& path, const std::string& what) {
  ACTLAB_CHECK(!path.empty(), what, " file not given");
  std::ifstream in(path);
  ACTLAB_CHECK(in.good(), what, " file '", path, "' cannot be read: ", std::strerror(errno));
  CsvTable t{path, what, {}};
  std::string line;
  ACTLAB_CHECK(static_cast<bool>(std::getline(in, line)), what, " file '", path, "' is empty");
  if (line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // a UTF-8 byte-order mark (a spreadsheet's save)
  const std::vector<std::string> header = csv_fields(line);
  for (int64_t n = 2; std::getline(in, line); ++n) {
    if (line.empty() || line == "\r") continue;
    const std::vector<std::string> f = csv_fields(line);
    ACTLAB_CHECK(f.size() == header.size(), what, " file '", path, "' line ", n, ": ", f.size(), " fields, the header has ",
                 header.size());
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < f.size(); ++i) row[header[i]] = f[i];
    t.rows.push_back(std::move(row));
  }
  ACTLAB_CHECK(!t.rows.empty(), what, " file '", path, "' has a header but no rows");
  return t;
}

// Every radar input is a size, a rate or an accuracy: a finite number >= 0 (and > 0 where the radar
// divides by it: memory and throughput, named by `positive`).
double number(const CsvTable& t, const std::map<std::string, std::string>& row, const std::string& column,
              bool positive = false) {
  const std::string& s = row.at(column);
  double v = 0;
  ACTLAB_CHECK(parse_float(s, &v) && (positive ? v > 0 : v >= 0), t.what, " file '", t.path, "': column '", column,
               "' holds '", s, "', not a finite number ", positive ? "> 0" : ">= 0");
  return v;
}

// Fig. 1 compares the methods at fp32: a row of another precision (a "POLICY@bf16" entry, or a precision
// column that says so: docs/precision.md) is another axis, left out.
bool fp32_row(const std::map<std::string, std::string>& row) {
  if (row.count("precision") && !row.at("precision").empty() && row.at("precision") != "fp32") return false;
  return parse_run_entry(row.at("policy"), Precision::F32).precision == Precision::F32;
}

// "28×28×1": an input shape as the radar's errors name it.
std::string input_text(int64_t image_size, int64_t channels) {
  return std::to_string(image_size) + "×" + std::to_string(image_size) + "×" + std::to_string(channels);
}

// The input shape columns a file must carry; `writer`: the tool that writes them (an older one did not).
void require_input_columns(const CsvTable& t, const char* writer, const char* remedy) {
  for (const char* c : {"image_size", "channels"})
    ACTLAB_CHECK(t.rows[0].count(c), t.what, " file '", t.path, "' has no column '", c, "', which says the input it ",
                 "was measured at (an older ", writer, "'s; ", remedy, ")");
}

// Per canonical policy, the mean of `column` over the fp32 rows of `model` at the grid's `batch` and input:
// activation memory grows with the batch and the image, and img/s changes with both, so a row of another
// batch or input shape is another measurement.
std::map<std::string, double> per_policy(const CsvTable& t, const std::string& model, int64_t batch,
                                         int64_t image_size, int64_t channels, const std::string& column) {
  std::map<std::string, std::pair<double, int>> sums;
  std::set<std::string> models, inputs;
  std::set<int64_t> batches;
  const std::string wanted = input_text(image_size, channels);
  for (const auto& row : t.rows) {
    models.insert(row.at("model"));
    if (row.at("model") != model || !fp32_row(row)) continue;
    const int64_t b = static_cast<int64_t>(number(t, row, "batch", true));
    batches.insert(b);
    if (b != batch) continue;
    const std::string shape = input_text(static_cast<int64_t>(number(t, row, "image_size", true)),
                                         static_cast<int64_t>(number(t, row, "channels", true)));
    inputs.insert(shape);
    if (shape != wanted) continue;
    auto& s = sums[canonical_policy(parse_run_entry(row.at("policy"), Precision::F32).policy)];
    s.first += number(t, row, column, true);
    s.second += 1;
  }
  std::string listed;
  for (const auto& m : models) listed += (listed.empty() ? "" : ", ") + m;
  ACTLAB_CHECK(!batches.empty(), t.what, " file '", t.path, "' has no rows for model ", model, " (it has: ", listed, ")");
  std::string listed_batches;
  for (int64_t b : batches) listed_batches += (listed_batches.empty() ? "" : ", ") + std::to_string(b);
  ACTLAB_CHECK(batches.count(batch), t.what, " file '", t.path, "' has no rows for ", model, " at batch ", batch,
               ", the grid's batch (it has batch ", listed_batches, "); measure it at batch ", batch);
  std::string listed_inputs;
  for (const auto& i : inputs) listed_inputs += (listed_inputs.empty() ? "" : ", ") + i;
  ACTLAB_CHECK(inputs.count(wanted), t.what, " file '", t.path, "' has no rows for ", model, " at batch ", batch,
               " with ", wanted, " inputs, the grid's (it has ", listed_inputs, "); measure it with --image-size ",
               image_size, " --channels ", channels);
  std::map<std::string, double> out;
  for (const auto& [policy, s] : sums) out[policy] = s.first / s.second;
  ACTLAB_CHECK(out.count("exact"), t.what, " file '", t.path, "' has no Normal (exact) row for ", model, " at batch ",
               batch, " with ", wanted, " inputs; the radar measures every method against it");
  return out;
}

bool listed_in_fig6(const std::string& tables) {
  const auto t = split_list(tables, ';');
  return std::find(t.begin(), t.end(), "fig6") != t.end();
}

}  // namespace

std::pair<double, double> radar_range(double lo0, double hi0) {
  ACTLAB_CHECK(std::isfinite(lo0) && std::isfinite(hi0) && lo0 <= hi0, "radar_range: bad range [", lo0, ", ", hi0, "]");
  double raw = (hi0 - lo0) / 4;
  if (raw <= 0) raw = std::max(std::abs(hi0), 1.0) * 0.05;  // one value: a small range below it
  for (double mag = std::pow(10.0, std::floor(std::log10(raw)));; mag *= 10)
    for (double m : {1.0, 2.0, 2.5, 5.0}) {
      const double step = m * mag;
      double lo = std::floor(lo0 / step) * step;
      if (lo > lo0) lo -= step;  // k·step rounded a hair above lo0
      if (lo + 4 * step >= hi0) return {lo, lo + 4 * step};
    }
}

RadarData read_radar_data(const RadarInputs& in) {
  const CsvTable results = read_csv(in.results_csv, "--results");
  results.require({"table", "model", "dataset", "policy", "final_test_acc", "status"}, "actlab-ablate results.csv");
  ACTLAB_CHECK(results.rows[0].count("batch"), "--results file '", results.path, "' has no column 'batch', which "
               "picks the memory and throughput rows (an older actlab-ablate's; rewrite it with actlab-ablate "
               "--report-only --out DIR)");
  require_input_columns(results, "actlab-ablate", "rewrite it with actlab-ablate --report-only --out DIR");
  // (Cells whose summaries predate the input shape get empty columns there: see below.)
  const CsvTable memory = read_csv(in.memory_csv, "--memory");
  memory.require({"model", "batch", "policy", "activation_gib"}, "actlab-memtable --csv");
  require_input_columns(memory, "actlab-memtable", "measure it again");
  const CsvTable speed = read_csv(in.throughput_csv, "--throughput");
  speed.require({"model", "batch", "policy", "img_per_s"}, "bench_train --csv");
  require_input_columns(speed, "bench_train", "measure it again");

  bool any_fig6 = false;
  for (const auto& row : results.rows) any_fig6 = any_fig6 || listed_in_fig6(row.at("table"));
  std::vector<const std::map<std::string, std::string>*> rows, unfinished;
  std::set<std::string> groups;
  for (const auto& row : results.rows) {
    if (any_fig6 && !listed_in_fig6(row.at("table"))) continue;
    if (!in.model.empty() && row.at("model") != in.model) continue;
    if (!in.dataset.empty() && row.at("dataset") != in.dataset) continue;
    if (!fp32_row(row)) continue;
    (row.at("status") == "done" ? rows : unfinished).push_back(&row);
    if (row.at("status") == "done") groups.insert(row.at("model") + " on " + row.at("dataset"));
  }
  std::string chosen = in.model.empty() ? "" : " of model " + in.model;
  if (!in.dataset.empty()) chosen += (chosen.empty() ? " on " : " and data set ") + in.dataset;
  ACTLAB_CHECK(!rows.empty(), "--results file '", in.results_csv, "' has no finished runs", chosen);
  std::string listed;
  for (const auto& g : groups) listed += (listed.empty() ? "" : ", ") + g;
  ACTLAB_CHECK(groups.size() == 1, "--results file '", in.results_csv, "' holds runs of ", listed,
               "; choose one with --model and --dataset");

  RadarData d;
  d.model = rows[0]->at("model");
  d.dataset = rows[0]->at("dataset");
  std::set<int64_t> batches;
  for (const auto* row : rows) batches.insert(static_cast<int64_t>(number(results, *row, "batch", true)));
  std::string listed_batches;
  for (int64_t b : batches) listed_batches += (listed_batches.empty() ? "" : ", ") + std::to_string(b);
  ACTLAB_CHECK(batches.size() == 1, "--results file '", in.results_csv, "' holds runs of ", d.model, " on ", d.dataset,
               " at batches ", listed_batches, "; the radar compares the methods at one batch");
  d.batch = *batches.begin();
  std::set<std::string> inputs;
  for (const auto* row : rows) {
    // A cell run before actlab-train recorded its input (or on images that are not square) has empty
    // columns: say which cell, why, and what to do, rather than that '' is not a number.
    const std::string cell = row->count("cell") ? row->at("cell") : row->at("policy");
    ACTLAB_CHECK(!row->at("image_size").empty() && !row->at("channels").empty(), "--results file '", in.results_csv,
                 "': cell ", cell, " records no input shape (its summary.json is from an actlab-train that did not "
                 "record one, or its images are not square); run the cell again, or fill in its image_size and "
                 "channels by hand");
    d.image_size = static_cast<int64_t>(number(results, *row, "image_size", true));
    d.channels = static_cast<int64_t>(number(results, *row, "channels", true));
    inputs.insert(input_text(d.image_size, d.channels));
  }
  std::string listed_inputs;
  for (const auto& i : inputs) listed_inputs += (listed_inputs.empty() ? "" : ", ") + i;
  ACTLAB_CHECK(inputs.size() == 1, "--results file '", in.results_csv, "' holds runs of ", d.model, " on ", d.dataset,
               " with inputs ", listed_inputs, "; the radar compares the methods at one input shape");
  const auto act = per_policy(memory, d.model, d.batch, d.image_size, d.channels, "activation_gib");
  const auto rate = per_policy(speed, d.model, d.batch, d.image_size, d.channels, "img_per_s");
  std::vector<std::string> order;
  std::map<std::string, std::map<int64_t, double>> acc;  // policy -> seed -> accuracy
  for (const auto* row : rows) {
    const std::string policy = canonical_policy(row->at("policy"));
    if (!acc.count(policy)) order.push_back(policy);
    const int64_t seed = row->count("seed") ? std::atoll(row->at("seed").c_str()) : 0;
    acc[policy][seed] = number(results, *row, "final_test_acc");
  }
  for (const auto* row : unfinished) {  // a method none of whose runs finished is named, not dropped silently
    if (row->at("model") != d.model || row->at("dataset") != d.dataset) continue;
    const std::string policy = canonical_policy(row->at("policy"));
    if (acc.count(policy)) continue;
    const std::string who = paper_method_name(policy) + " (" + policy + "): ";
    const std::string why = who + "no finished run in '" + results.path + "' (" + row->at("status") + ")";
    if (std::find(d.skipped.begin(), d.skipped.end(), why) == d.skipped.end()) d.skipped.push_back(why);
  }
  const auto normal = acc.find("exact");
  auto mean = [](const std::map<int64_t, double>& by_seed) {
    double sum = 0;
    for (const auto& [seed, v] : by_seed) sum += v;
    return sum / static_cast<double>(by_seed.size());
  };
  for (const auto& policy : order) {
    RadarPoint p;
    p.policy = policy;
    p.method = paper_method_name(policy);
    const auto& mine = acc[policy];
    p.accuracy = mean(mine);
    p.seeds = static_cast<int>(mine.size());
    // Other seeds than Normal's: Normal's mean plus the difference where both ran (a one-seed Checkpoint
    // or SWAP run then sits on Normal's accuracy, as its run equals Normal's there).
    const auto same_seeds = [](const std::map<int64_t, double>& a, const std::map<int64_t, double>& b) {
      return a.size() == b.size() &&
             std::equal(a.begin(), a.end(), b.begin(), [](const auto& x, const auto& y) { return x.first == y.first; });
    };
    if (normal != acc.end() && policy != "exact" && !same_seeds(mine, normal->second)) {
      const double diff = mean_difference_at_shared_seeds(mine, normal->second);
      if (std::isfinite(diff)) {
        p.accuracy = mean(normal->second) + diff;
        p.paired_with_normal = true;
      }
    }
    const auto m = act.find(policy), s = rate.find(policy);
    const std::string who = p.method + " (" + policy + "): ";
    if (m == act.end()) d.skipped.push_back(who + "not in '" + memory.path + "'");
    else if (!(m->second > 0)) d.skipped.push_back(who + "no activation memory in '" + memory.path + "'");
    else if (s == rate.end()) d.skipped.push_back(who + "not in '" + speed.path + "'");
    else if (!(s->second > 0)) d.skipped.push_back(who + "no throughput in '" + speed.path + "'");
    else {
      p.memory_saving = act.at("exact") / m->second;
      p.throughput_ratio = s->second / rate.at("exact");
      d.points.push_back(p);
    }
  }
  return d;
}

plot::RadarChart radar_chart(const RadarData& d) {
  double acc_lo = 1e300, acc_hi = -1e300, mem_hi = 1, speed_hi = 1;
  for (const RadarPoint& p : d.points) {
    acc_lo = std::min(acc_lo, p.accuracy);
    acc_hi = std::max(acc_hi, p.accuracy);
    mem_hi = std::max(mem_hi, p.memory_saving);
    speed_hi = std::max(speed_hi, p.throughput_ratio);
  }
  if (d.points.empty()) acc_lo = acc_hi = 0;
  // Below the worst method by half the spread (at least half a point), so that no method sits at the
  // centre, where the three axes meet and a polygon would lose its shape.
  const auto acc = radar_range(acc_lo - std::max(0.5 * (acc_hi - acc_lo), 0.5), acc_hi);
  // Memory on a log axis, rings ×2^k apart: savings span 1× (Normal) to ~50× (SWAP keeps almost nothing).
  double mem_lo = 0.5;
  for (const RadarPoint& p : d.points) mem_lo = std::min(mem_lo, std::exp2(std::floor(std::log2(p.memory_saving))));
  const double per_ring = std::exp2(std::max(1.0, std::ceil(std::log2(mem_hi / mem_lo) / 4)));
  const auto speed = radar_range(0, speed_hi);
  plot::RadarChart c;
  c.title = "Fig. 1: accuracy, memory and throughput per method (" + d.model + ", " + d.dataset + ")";
  c.axes = {{"test accuracy (%)", acc.first, acc.second, false},
            {"activation memory saving (× Normal, batch " + std::to_string(d.batch) + ", log)", mem_lo,
             mem_lo * std::pow(per_ring, 4), true},
            {"throughput (× Normal, batch " + std::to_string(d.batch) + ")", speed.first, speed.second, false}};
  for (const RadarPoint& p : d.points) c.series.push_back({p.method, {p.accuracy, p.memory_saving, p.throughput_ratio}});
  return c;
}

}  // namespace actlab
