// The grid's reports, regenerated from the cell directories on every run: results.csv (one row per
// cell), tables.md (the paper's tables, mean ± std over seeds) and the SVG figures (test accuracy per
// epoch, activation memory per policy; with Fig. 6 selected, its accuracy per method). Declared in train/grid.h (write_reports); tested in
// tests/test_ablate.cpp.
#include "actlab/train/grid.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <sys/utsname.h>
#include <unistd.h>

#include "actlab/analysis/plot.h"
#include "actlab/io/files.h"
#include "actlab/io/markdown.h"
#include "actlab/train/cli.h"
#include "actlab/train/grid_internal.h"
#include "actlab/train/logging.h"
#include "actlab/train/paper_reference.h"

namespace fs = std::filesystem;

namespace actlab {
using namespace grid_detail;

// ------------------------------------------------------------------ policy and data set names
namespace grid_detail {

// The kind of a cell's policy string ("division" of "division:B=8|fc=exact").
std::string policy_kind(const std::string& policy) { return policy.substr(0, policy.find_first_of(":|")); }

std::string display_dataset(const std::string& d) {
  static const std::map<std::string, std::string> names = {
      {"fashion-mnist", "Fashion-MNIST"}, {"mnist", "MNIST"}, {"cifar10", "CIFAR-10"}, {"cifar100", "CIFAR-100"},
      {"folder", "image folder"}};
  const auto it = names.find(d);
  return it == names.end() ? d : it->second;
}

}  // namespace grid_detail

namespace {

// "division:B=8,Q=2" → value of key "B" ("8"), or `fallback` when the policy does not name it.
std::string policy_param(const std::string& policy_string, const std::string& key, const std::string& fallback) {
  // The run's own policy, before any '|' rules (whose parameters are not the cell's B and Q).
  const std::string policy = policy_string.substr(0, policy_string.find('|'));
  const size_t colon = policy.find(':');
  if (colon != std::string::npos)
    for (const auto& kv : split_list(policy.substr(colon + 1), ','))
      if (kv.size() > key.size() && kv.compare(0, key.size() + 1, key + "=") == 0) return kv.substr(key.size() + 1);
  return fallback;
}

// The B and Q columns: the explicit value or the parser's default where the policy uses the key.
std::string policy_b(const std::string& p) {
  const std::string k = policy_kind(p);
  return k == "division" || k == "lfc" || k == "hfc" ? policy_param(p, "B", "8") : "";
}
std::string policy_q(const std::string& p) {
  const std::string k = policy_kind(p);
  if (k == "hfc") return policy_param(p, "Q", "");  // no Q: the f32 residual
  return k == "division" || k == "quant" || k == "pergroup" ? policy_param(p, "Q", "2") : "";
}

std::string display_model(const std::string& m) {
  static const std::map<std::string, std::string> names = {
      {"resnet20", "ResNet-20"}, {"resnet32", "ResNet-32"}, {"resnet56", "ResNet-56"}, {"resnet110", "ResNet-110"},
      {"resnet18", "ResNet-18"}, {"resnet34", "ResNet-34"}, {"resnet50", "ResNet-50"}, {"mobilenet_v2", "MobileNetV2"},
      {"wrn28_10", "WRN-28-10"}, {"vit_tiny_cifar", "ViT-Tiny"}, {"swin_t", "Swin-T"}};
  const auto it = names.find(m);
  return it == names.end() ? m : it->second;
}
std::string group_name(const Cell& c) { return display_model(c.model) + " \u00b7 " + display_dataset(c.dataset); }

// ------------------------------------------------------------------ results of the cells
struct Results {
  const Grid& grid;
  std::vector<CellResult> cells;
  // Exact activation bytes of the same model + data set + batch (same seed preferred) / this cell's: the
  // measured compression. The reference is the fp32 exact cell, so a grid that runs both precisions shows
  // what bf16 saves too (exact@bf16 at 2×); a grid with no fp32 exact cell (a bf16-only grid) takes the
  // exact cell of the cell's own precision. NaN without either.
  double compression(size_t i) const {
    const Cell& c = grid.cells[i];
    const auto exact_bytes = [&](const std::string& precision) {
      double exact = CellResult::kNaN;
      for (size_t j = 0; j < grid.cells.size(); ++j) {
        const Cell& e = grid.cells[j];
        if (e.policy != "exact" || e.precision != precision || e.model != c.model || e.dataset != c.dataset ||
            e.batch_size != c.batch_size || cells[j].activation_bytes <= 0)
          continue;
        if (std::isnan(exact) || e.seed == c.seed) exact = static_cast<double>(cells[j].activation_bytes);
      }
      return exact;
    };
    double exact = exact_bytes("fp32");
    if (std::isnan(exact)) exact = exact_bytes(c.precision);
    return cells[i].activation_bytes > 0 ? exact / static_cast<double>(cells[i].activation_bytes) : CellResult::kNaN;
  }
};

using Metric = double (*)(const Results&, size_t);
double m_final(const Results& r, size_t i) { return r.cells[i].final_test_acc; }
double m_best(const Results& r, size_t i) { return r.cells[i].best_test_acc; }
double m_loss(const Results& r, size_t i) { return r.cells[i].train_loss; }
double m_rate(const Results& r, size_t i) { return r.cells[i].img_per_s; }
double m_act(const Results& r, size_t i) {
  return r.cells[i].activation_bytes > 0 ? static_cast<double>(r.cells[i].activation_bytes) : CellResult::kNaN;
}
double m_comp(const Results& r, size_t i) { return r.compression(i); }
double m_policy_comp(const Results& r, size_t i) {
  const CellResult& c = r.cells[i];
  return c.saved_packed_bytes > 0 ? static_cast<double>(c.saved_raw_bytes) / static_cast<double>(c.saved_packed_bytes)
                                  : CellResult::kNaN;
}

std::string csv_num(double v, const char* format = "%.6g") { return std::isfinite(v) ? fmt(format, v) : ""; }

void write_results_csv(const Results& r, const fs::path& path) {
  std::string out =
      "table,model,dataset,policy,B,Q,seed,epochs,epochs_done,final_test_acc,best_test_acc,train_loss,img_per_s,"
      "activation_bytes,peak_bytes,saved_raw_bytes,saved_packed_bytes,compression_measured,compression_policy,"
      "wall_s,status,cell,message,precision,batch,image_size,channels\n";
  for (size_t i = 0; i < r.grid.cells.size(); ++i) {
    const Cell& c = r.grid.cells[i];
    const CellResult& x = r.cells[i];
    const std::vector<std::string> f = {
        table_list(c, ";"), c.model, c.dataset, c.policy, policy_b(c.policy), policy_q(c.policy), std::to_string(c.seed),
        std::to_string(c.epochs), std::to_string(x.epochs_done), csv_num(x.final_test_acc, "%.4f"),
        csv_num(x.best_test_acc, "%.4f"), csv_num(x.train_loss, "%.6f"), csv_num(x.img_per_s, "%.2f"),
        std::to_string(x.activation_bytes), std::to_string(x.peak_bytes), std::to_string(x.saved_raw_bytes),
        std::to_string(x.saved_packed_bytes), csv_num(r.compression(i), "%.4f"), csv_num(m_policy_comp(r, i), "%.4f"),
        csv_num(x.wall_s, "%.1f"), status_name(x.status), c.id(), x.message, c.precision, std::to_string(c.batch_size),
        x.input_size > 0 ? std::to_string(x.input_size) : "", x.input_channels > 0 ? std::to_string(x.input_channels) : ""};
    std::string line;
    for (const auto& v : f) line += (line.empty() ? "" : ",") + csv_field(v);
    out += line + "\n";
  }
  write_text_atomic(path.string(), out);
}

// "88.93" for one seed, "88.93 ± 0.12" over several (sample std), "*failed*" / "*not run*" when no
// seed has a value; " (2/3 seeds)" when some are missing.
std::string stat_text(const Results& r, const std::vector<size_t>& idx, Metric metric, const char* format,
                      const char* suffix = "") {
  std::vector<double> v;
  for (size_t i : idx)
    if (finished(r.cells[i].status) && std::isfinite(metric(r, i))) v.push_back(metric(r, i));
  if (v.empty()) {
    for (size_t i : idx)
      if (r.cells[i].status == CellStatus::Failed) return "*failed*";
    for (size_t i : idx)
      if (r.cells[i].status == CellStatus::Diverged) return "*diverged*";
    return r.cells[idx[0]].status == CellStatus::Interrupted ? "*interrupted*" : "—";
  }
  double mean = 0, var = 0;
  for (double x : v) mean += x / static_cast<double>(v.size());
  for (double x : v) var += (x - mean) * (x - mean) / std::max<double>(1, static_cast<double>(v.size()) - 1);
  std::string text = fmt(format, mean);
  if (v.size() > 1) text += " ± " + fmt(format, std::sqrt(var));
  text += suffix;
  if (v.size() < idx.size()) text += " (" + std::to_string(v.size()) + "/" + std::to_string(idx.size()) + " seeds)";
  return text;
}

std::string mib_text(const Results& r, const std::vector<size_t>& idx) {
  return stat_text(r, idx, [](const Results& rr, size_t i) { return m_act(rr, i) / (1024.0 * 1024.0); }, "%.2f",
                   " MiB");
}

// A table's cells grouped by model·data set, then by row label (seeds merged), both in the order the table
// added its cells (Grid::table_cells), whatever other tables ran with it.
struct TableGroup {
  std::string name;
  std::vector<std::string> labels;
  std::map<std::string, std::vector<size_t>> cells;  // label → cell indices (one per seed)
};
std::vector<TableGroup> table_groups(const Grid& g, const std::string& table) {
  std::vector<TableGroup> groups;
  const auto listed = g.table_cells.find(table);
  if (listed == g.table_cells.end()) return groups;
  for (size_t i : listed->second)
    for (const auto& [t, label] : g.cells[i].tables) {
      if (t != table) continue;
      const std::string name = group_name(g.cells[i]);
      auto it = std::find_if(groups.begin(), groups.end(), [&](const TableGroup& x) { return x.name == name; });
      if (it == groups.end()) it = groups.insert(groups.end(), TableGroup{name, {}, {}});
      if (!it->cells.count(label)) it->labels.push_back(label);
      it->cells[label].push_back(i);
    }
  return groups;
}

std::string md_row(const std::vector<std::string>& cols) {
  std::string s = "|";
  for (const auto& c : cols) s += " " + md_cell(c) + " |";
  return s + "\n";
}
std::string md_rule(size_t n) { return md_row(std::vector<std::string>(n, "---")); }

// Table 1(c), Fig. 3 and custom grids: one row per method with every metric.
// A custom grid's rows are named by their policies: no separate Method column there.
std::string metrics_table(const Results& r, const TableGroup& g) {
  bool named = false;
  for (const auto& label : g.labels) named = named || label != r.grid.cells[g.cells.at(label)[0]].run_label();
  std::vector<std::string> head = {"Policy", "Test acc. (%)", "Best (%)", "Train loss", "Activation memory",
                                   "Compression", "Saved raw/packed", "img/s"};
  if (named) head.insert(head.begin(), "Method");
  std::string s = md_row(head) + md_rule(head.size());
  for (const auto& label : g.labels) {
    const auto& idx = g.cells.at(label);
    std::vector<std::string> row = {"`" + r.grid.cells[idx[0]].run_label() + "`", stat_text(r, idx, m_final, "%.2f"),
                                    stat_text(r, idx, m_best, "%.2f"), stat_text(r, idx, m_loss, "%.4f"),
                                    mib_text(r, idx), stat_text(r, idx, m_comp, "%.1f", "×"),
                                    stat_text(r, idx, m_policy_comp, "%.1f", "×"), stat_text(r, idx, m_rate, "%.0f")};
    if (named) row.insert(row.begin(), label);
    s += md_row(row);
  }
  return s;
}

// Table 2(b): B down, Q across; accuracy and measured compression in one cell.
std::string table_2b(const Results& r, const TableGroup& g) {
  std::vector<std::string> bs, qs;
  for (const auto& label : g.labels) {
    const std::string& p = r.grid.cells[g.cells.at(label)[0]].policy;
    if (policy_kind(p) != "division" || p.find('|') != std::string::npos) continue;  // the plain B x Q grid
    if (std::find(bs.begin(), bs.end(), policy_b(p)) == bs.end()) bs.push_back(policy_b(p));
    if (std::find(qs.begin(), qs.end(), policy_q(p)) == qs.end()) qs.push_back(policy_q(p));
  }
  std::vector<std::string> head = {"B \\ Q"};
  for (const auto& q : qs) head.push_back("Q=" + q + ": acc. (%) / compression");
  std::string s = md_row(head) + md_rule(head.size());
  for (const auto& b : bs) {
    std::vector<std::string> row = {"B=" + b};
    for (const auto& q : qs) {
      const auto it = g.cells.find("B=" + b + ", Q=" + q);
      row.push_back(it == g.cells.end() ? "" : stat_text(r, it->second, m_final, "%.2f") + " / " +
                                                   stat_text(r, it->second, m_comp, "%.1f", "×"));
    }
    s += md_row(row);
  }
  if (g.cells.count("Normal"))
    s += "\nNormal (exact): " + stat_text(r, g.cells.at("Normal"), m_final, "%.2f") + " %, activation memory " +
         mib_text(r, g.cells.at("Normal")) + ".\n";
  return s;
}

// Table 3: model · data set down, Normal and the (B, Q) settings across; accuracy, then compression.
std::string table_3(const Results& r, const std::vector<TableGroup>& groups) {
  std::vector<std::string> labels;
  for (const auto& g : groups)
    for (const auto& l : g.labels)
      if (std::find(labels.begin(), labels.end(), l) == labels.end()) labels.push_back(l);
  std::string s;
  for (int part = 0; part < 2; ++part) {
    std::vector<std::string> head = {part == 0 ? "Test acc. (%)" : "Compression (measured)"};
    head.insert(head.end(), labels.begin(), labels.end());
    s += (part ? "\n" : "") + md_row(head) + md_rule(head.size());
    for (const auto& g : groups) {
      std::vector<std::string> row = {g.name};
      for (const auto& l : labels) {
        const auto it = g.cells.find(l);
        row.push_back(it == g.cells.end() ? "" : part == 0 ? stat_text(r, it->second, m_final, "%.2f")
                                                           : stat_text(r, it->second, m_comp, "%.1f", "×"));
      }
      s += md_row(row);
    }
  }
  return s;
}

double mean_of(const Results& r, const std::vector<size_t>& idx, Metric metric) {
  double sum = 0;
  int n = 0;
  for (size_t i : idx)
    if (r.cells[i].status == CellStatus::Done && std::isfinite(metric(r, i))) sum += metric(r, i), ++n;
  return n > 0 ? sum / n : CellResult::kNaN;
}

}  // namespace

// Checkpointing with exact saves and SWAP change where backward's inputs live, never their values.
bool grid_detail::same_gradients_as_exact(const std::string& policy, const std::string& precision) {
  const std::string k = policy_kind(policy);
  const std::string tail = "+exact";
  if (policy.find('|') != std::string::npos) return false;  // a rule may code some saves
  return k == "swap" || (k == "checkpoint" && precision == "fp32" && policy.size() > tail.size() &&
                         policy.compare(policy.size() - tail.size(), tail.size(), tail) == 0);
}

namespace {

// "+0.12": a − b, or "—" when either is missing.
std::string delta_text(double a, double b) { return std::isfinite(a) && std::isfinite(b) ? fmt("%+.2f", a - b) : "—"; }

// For the methods whose gradients are exact's bit for bit (Checkpoint with exact saves, SWAP): whether
// each of their runs ended where Normal's did at the same seed, one line per run ("" when none).
std::string exact_gradient_proof(const Results& r, const TableGroup& g) {
  const auto normal_it = g.cells.find("Normal");
  if (normal_it == g.cells.end()) return "";
  std::string proof;
  for (const auto& label : g.labels) {
    const auto& idx = g.cells.at(label);
    if (!same_gradients_as_exact(r.grid.cells[idx[0]].policy, r.grid.cells[idx[0]].precision)) continue;
    for (size_t i : idx)
      for (size_t j : normal_it->second) {
        const CellResult &a = r.cells[i], &e = r.cells[j];
        if (r.grid.cells[j].seed != r.grid.cells[i].seed || r.grid.cells[j].precision != r.grid.cells[i].precision ||
            a.status != CellStatus::Done || e.status != CellStatus::Done)
          continue;
        const bool same = a.train_loss == e.train_loss && a.final_test_acc == e.final_test_acc;
        proof += "- " + label + ", seed " + std::to_string(r.grid.cells[i].seed) + ": train loss " +
                 fmt("%.6f", a.train_loss) + ", test accuracy " + fmt("%.2f", a.final_test_acc) + " % — " +
                 (same ? "identical to Normal's" : "**differs** from Normal's (" + fmt("%.6f", e.train_loss) + ", " +
                                                         fmt("%.2f", e.final_test_acc) + " %)") + "\n";
      }
  }
  if (proof.empty()) return "";
  return "\nCheckpoint (exact saves) and SWAP compute backward from the very values Normal keeps, so their "
         "runs must end where Normal's ends at the same seed:\n\n" + proof;
}

// A row's final accuracies by seed, its finished runs only.
std::map<int64_t, double> accuracy_by_seed(const Results& r, const std::vector<size_t>& idx) {
  std::map<int64_t, double> out;
  for (size_t i : idx)
    if (r.cells[i].status == CellStatus::Done && std::isfinite(r.cells[i].final_test_acc))
      out[r.grid.cells[i].seed] = r.cells[i].final_test_acc;
  return out;
}

// Δ vs Normal at equal seeds (mean_difference_at_shared_seeds): with the same seeds, the difference of the means.
// Said under every table with the column, since a one-seed row's Δ is not its accuracy minus Normal's mean.
constexpr const char* kDeltaNote =
    "\nΔ vs Normal: the mean difference from Normal over the seeds both rows ran (a one-seed row against Normal's "
    "run of that seed, not against Normal's mean).\n";
std::string delta_vs_normal(const Results& r, const TableGroup& g, const std::vector<size_t>& idx) {
  const auto normal = g.cells.find("Normal");
  if (normal == g.cells.end()) return "—";
  return delta_text(mean_difference_at_shared_seeds(accuracy_by_seed(r, idx), accuracy_by_seed(r, normal->second)), 0);
}

// Fig. 6: one row per method, accuracy mean ± std over seeds, its distance from Normal, and the
// paper's figures for the same network and data set where §7.2 of the reference has them. Then, for
// the methods whose gradients are exact's bit for bit, whether their runs ended where Normal's did.
std::string table_fig6(const Results& r, const TableGroup& g) {
  const Cell& first = r.grid.cells[g.cells.at(g.labels[0])[0]];
  const double paper_normal = paper_accuracy("Normal", first.model, first.dataset);
  const std::vector<std::string> head = {"Method", "Policy", "Test acc. (%)", "Δ vs Normal", "Seeds",
                                         "Paper (%)", "Paper Δ vs Normal"};
  std::string s = md_row(head) + md_rule(head.size());
  for (const auto& label : g.labels) {
    const auto& idx = g.cells.at(label);
    const double paper = paper_accuracy(label, first.model, first.dataset);
    s += md_row({label, "`" + r.grid.cells[idx[0]].run_label() + "`", stat_text(r, idx, m_final, "%.2f"),
                 label == "Normal" ? "" : delta_vs_normal(r, g, idx), std::to_string(idx.size()),
                 std::isfinite(paper) ? fmt("%.2f", paper) : "—",
                 label == "Normal" ? "" : delta_text(paper, paper_normal)});
  }
  s += kDeltaNote;
  if (!std::isfinite(paper_normal))
    s += "\nThe paper reports no accuracy for " + group_name(first) +
         " (its §7.2 figures are CIFAR-10/100 and ImageNet runs of ResNet-18, ResNet-164 and DenseNet); "
         "compare the Δ columns, not the accuracies.\n";
  return s + exact_gradient_proof(r, g);
}

// Tables 1(b) and 2(a): one row per method with its accuracy against Normal's at the seeds both ran, its
// memory and speed (the note under the table says why there is no paper column).
std::string methods_vs_normal_table(const Results& r, const TableGroup& g) {
  const std::vector<std::string> head = {"Method", "Policy", "Test acc. (%)", "Δ vs Normal", "Seeds",
                                         "Activation memory", "Compression", "img/s"};
  std::string s = md_row(head) + md_rule(head.size());
  for (const auto& label : g.labels) {
    const auto& idx = g.cells.at(label);
    s += md_row({label, "`" + r.grid.cells[idx[0]].run_label() + "`", stat_text(r, idx, m_final, "%.2f"),
                 label == "Normal" ? "" : delta_vs_normal(r, g, idx), std::to_string(idx.size()),
                 mib_text(r, idx), stat_text(r, idx, m_comp, "%.2f", "×"), stat_text(r, idx, m_rate, "%.1f")});
  }
  return s + kDeltaNote + exact_gradient_proof(r, g);
}

// The paper setting of a methods_vs_normal_table table, whose figures the reference does not hold; nullptr
// for the other tables. The note saying so is printed once under the table, after all its groups.
const char* setting_without_paper_figures(const std::string& t) {
  if (t == "1b") return "Table 1(b), Swin-T on ImageNet";
  if (t == "2a") return "Table 2(a), MobileNet-V2 on CIFAR-10 and CIFAR-100";
  return nullptr;
}

std::string machine_text() {
  struct utsname u {};
  std::string s = ::uname(&u) == 0 ? std::string(u.sysname) + " " + u.release + " " + u.machine : "unknown";
  std::ifstream cpu("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpu, line))
    if (line.rfind("model name", 0) == 0) {
      s += ", " + line.substr(line.find(':') + 2);
      break;
    }
  return s + ", nproc " + std::to_string(::sysconf(_SC_NPROCESSORS_ONLN));
}

std::string recipe_text(const Cell& c) {
  std::string s = std::to_string(c.epochs) + " epochs, batch " + std::to_string(c.batch_size) + ", " +
                  optimizer_title(c.optimizer) + " lr " + fmt("%g", c.lr) +
                  (c.optimizer == kSgdName ? " momentum " + fmt("%g", c.momentum) : "") +
                  " " + c.schedule + ", wd " + fmt("%g", c.weight_decay);
  if (c.train_limit > 0) s += ", first " + std::to_string(c.train_limit) + " training images";
  if (c.steps_per_epoch > 0) s += ", " + std::to_string(c.steps_per_epoch) + " steps per epoch";
  if (c.test_limit > 0) s += ", first " + std::to_string(c.test_limit) + " test images";
  return s + ", " + std::to_string(c.threads) + " threads";
}

const char* table_title(const std::string& t) {
  if (t == "1b") return "Table 1(b): vision transformers — accuracy, activation memory, throughput";
  if (t == "1c") return "Table 1(c): ablation of the LFC and HFC components";
  if (t == "2a") return "Table 2(a): depthwise and pointwise convolutions (MobileNet-V2), Normal and DIVISION";
  if (t == "2b") return "Table 2(b): block size B and HFC bit width Q (DIVISION)";
  if (t == "3") return "Table 3: networks and data sets";
  if (t == "fig3") return "Fig. 3(b)/(c): backward from LFC only or HFC only";
  if (t == "fig6") return "Fig. 6: test accuracy of every method";
  return "Custom grid";
}

std::string tables_markdown(const Results& r, const std::string& command_line) {
  int done = 0, failed = 0, diverged = 0;
  for (const auto& c : r.cells)
    done += c.status == CellStatus::Done, failed += c.status == CellStatus::Failed, diverged += c.status == CellStatus::Diverged;
  const std::time_t now = std::time(nullptr);
  char date[40];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M %Z", std::localtime(&now));
  std::string s = "# DIVISION ablation tables (actlab-ablate)\n\n";
  s += "- preset: **" + r.grid.preset + "** — " + recipe_text(r.grid.cells[0]) + "\n";
  s += "- command: `" + command_line + "`\n- machine: " + machine_text() + "\n- date: " + date + "\n";
  s += "- cells: " + std::to_string(r.cells.size()) + ", " + std::to_string(done) + " done, " +
       std::to_string(failed) + " failed" + (diverged > 0 ? ", " + std::to_string(diverged) + " diverged (stopped on non-finite values: a result, its memory measured)" : "") + "\n";
  s += "- test accuracy: top-1 % after the last epoch (mean ± std over seeds when there are several); "
       "activation memory: allocator bytes held for backward after forward+loss, one step (docs/measures.md); "
       "compression: exact activation memory / this one (same model and data; fp32 exact, or in a grid without "
       "one the exact run at this one's precision); saved raw/packed: the "
       "policy's own ratio over the tensors it compressed\n";
  for (const auto& t : r.grid.tables) {
    s += std::string("\n## ") + table_title(t) + "\n";
    const auto groups = table_groups(r.grid, t);
    if (t == "3") {
      s += "\n" + table_3(r, groups);
      continue;
    }
    for (const auto& g : groups) {
      s += "\n**" + g.name + "**\n\n";
      if (t == "2b") s += table_2b(r, g);
      else if (t == "fig6") s += table_fig6(r, g);
      else if (setting_without_paper_figures(t)) s += methods_vs_normal_table(r, g);
      else s += metrics_table(r, g);
    }
    if (const char* what = setting_without_paper_figures(t))
      s += std::string("\nThe paper's figures (") + what + ") are not in the reference this project works from, "
           "so there is no paper column. img/s is each run's median training throughput: a figure to compare "
           "only when nothing else shared the cores (bench_train's paired runs are the speed measurement).\n";
  }
  return s;
}

// Test accuracy per epoch, one line per model·data set·policy (mean over seeds at each epoch).
plot::LineChart accuracy_chart(const Results& r) {
  plot::LineChart chart{"Test accuracy per epoch", "epoch", "test accuracy (%)", false, {}, {}};
  bool many = false;
  for (const Cell& c : r.grid.cells) many = many || group_name(c) != group_name(r.grid.cells[0]);
  std::vector<std::string> keys;
  std::map<std::string, std::map<int64_t, std::vector<double>>> acc;
  for (size_t i = 0; i < r.grid.cells.size(); ++i) {
    const Cell& c = r.grid.cells[i];
    const std::string key = (many ? group_name(c) + ": " : "") + c.run_label();
    if (!acc.count(key)) keys.push_back(key);
    auto& per_epoch = acc[key];
    for (const auto& [epoch, a] : r.cells[i].test_acc_per_epoch) per_epoch[epoch].push_back(a);
  }
  for (const auto& key : keys) {
    plot::Series series{key, {}, {}};
    for (const auto& [epoch, v] : acc[key]) {
      double mean = 0;
      for (double a : v) mean += a / static_cast<double>(v.size());
      series.x.push_back(static_cast<double>(epoch));
      series.y.push_back(mean);
    }
    chart.series.push_back(std::move(series));
  }
  return chart;
}

// Activation memory per policy (groups), one bar per model·data set (series); MiB, mean over seeds.
plot::BarChart memory_chart(const Results& r) {
  plot::BarChart chart{"Activation memory per training step", "activation memory (MiB)", false, {}, {}};
  std::vector<std::string> policies;
  for (const Cell& c : r.grid.cells) {
    if (std::find(policies.begin(), policies.end(), c.run_label()) == policies.end()) policies.push_back(c.run_label());
    if (std::find(chart.series_names.begin(), chart.series_names.end(), group_name(c)) == chart.series_names.end())
      chart.series_names.push_back(group_name(c));
  }
  for (const auto& p : policies) {
    plot::BarGroup group{p, {}};
    for (const auto& name : chart.series_names) {
      double sum = 0;
      int n = 0;
      for (size_t i = 0; i < r.grid.cells.size(); ++i)
        if (r.grid.cells[i].run_label() == p && group_name(r.grid.cells[i]) == name && r.cells[i].activation_bytes > 0) {
          sum += static_cast<double>(r.cells[i].activation_bytes) / (1024.0 * 1024.0);
          ++n;
        }
      group.values.push_back(n > 0 ? sum / n : CellResult::kNaN);
    }
    chart.groups.push_back(std::move(group));
  }
  return chart;
}

// Fig. 6's bars: test accuracy per method (groups), one bar per model·data set (series), mean over seeds.
plot::BarChart fig6_chart(const Results& r) {
  plot::BarChart chart{"Fig. 6: test accuracy per method", "test accuracy (%)", false, {}, {}};
  const std::vector<TableGroup> groups = table_groups(r.grid, "fig6");
  for (const auto& g : groups) chart.series_names.push_back(g.name);
  for (const auto& g : groups)
    for (const auto& label : g.labels) {
      auto it = std::find_if(chart.groups.begin(), chart.groups.end(), [&](const plot::BarGroup& b) { return b.label == label; });
      if (it == chart.groups.end())
        it = chart.groups.insert(chart.groups.end(), plot::BarGroup{label, std::vector<double>(groups.size(), CellResult::kNaN)});
      it->values[static_cast<size_t>(&g - groups.data())] = mean_of(r, g.cells.at(label), m_final);
    }
  return chart;
}

}  // namespace

double mean_difference_at_shared_seeds(const std::map<int64_t, double>& a, const std::map<int64_t, double>& b) {
  double sum = 0;
  int n = 0;
  for (const auto& [seed, v] : a)
    if (const auto it = b.find(seed); it != b.end()) sum += v - it->second, ++n;
  return n > 0 ? sum / n : CellResult::kNaN;
}

std::vector<std::string> write_reports(const Grid& grid, const std::string& out_dir, const std::string& command_line) {
  const fs::path out(out_dir);
  fs::create_directories(out);
  Results r{grid, {}};
  for (const Cell& c : grid.cells) r.cells.push_back(read_cell((out / "cells" / c.id()).string()));
  write_results_csv(r, out / "results.csv");
  write_text_atomic((out / "tables.md").string(), tables_markdown(r, command_line));
  plot::write_svg((out / "acc_per_epoch.svg").string(), plot::line_chart_svg(accuracy_chart(r)));
  plot::write_svg((out / "activation_memory.svg").string(), plot::bar_chart_svg(memory_chart(r)));
  std::vector<std::string> written = {"results.csv", "tables.md", "acc_per_epoch.svg", "activation_memory.svg"};
  if (std::find(grid.tables.begin(), grid.tables.end(), "fig6") != grid.tables.end()) {
    plot::write_svg((out / "fig6_accuracy.svg").string(), plot::bar_chart_svg(fig6_chart(r)));
    written.push_back("fig6_accuracy.svg");
  }
  return written;
}

}  // namespace actlab
