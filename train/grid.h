// The ablation grid behind actlab-ablate: cells (one actlab-train run each), the paper's presets and
// tables (DIVISION Table 1(b), 1(c), 2(b), 3, Fig. 3(b)/(c) and Fig. 6), running the cells as child processes with
// skip / resume / failure bookkeeping in OUT/cells/<id>/, and the reports (results.csv, tables.md and
// SVG figures) regenerated from the cell directories. Implemented in grid.cpp (cells, running),
// grid_presets.cpp (presets, tables, estimates) and grid_report.cpp (reports). Tested in
// tests/test_ablate.cpp.
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "actlab/layers/optim/optimizer_names.h"

namespace actlab {

// One actlab-train run. Everything here becomes a flag of the child's command line.
struct Cell {
  std::string model = "resnet20";
  std::string dataset = "fashion-mnist";
  std::string policy = "exact";    // passed verbatim to --policy (make_grid writes canonical_policy's spelling)
  int64_t seed = 0;
  int64_t epochs = 1;
  int64_t batch_size = 128;
  std::string optimizer = kSgdName;   // --optimizer: sgd (with momentum) or adamw; adamw is part of the cell's identity
  double lr = 0.1, momentum = 0.9, weight_decay = 5e-4;
  std::string schedule = "cosine";
  int64_t steps_per_epoch = 0, train_limit = 0, test_limit = 0;  // 0: unlimited
  int64_t threads = 2;
  std::string device = "cpu";           // --device of the child (cpu, cuda, cuda:N); like threads, not part of the recipe
  std::string precision = "fp32";       // --precision of the child (docs/precision.md); part of the cell's identity
  std::string data_dir;                 // empty: the child's default
  std::vector<std::string> extra_args;  // appended verbatim, e.g. {"--synthetic-size", "256"}
  // (table, row label in that table): "1c" + "w/o HFC", "fig3" + "LFC-ACT", "custom" + the policy.
  // A cell shared by several tables (the exact run) is run once and listed in each.
  std::vector<std::pair<std::string, std::string>> tables;

  // Readable, unique per (model, dataset, policy, precision, optimizer, seed):
  // "resnet20-fashion-mnist-division_B8_Q2-s0", "...-division_B8_Q2-bf16-s0", "...-division_B8_Q2-adamw-s0".
  // The policy's characters outside [A-Za-z0-9._-] become '-', so two rules can spell one id
  // ("blocks.*.attn", "blocks.?.attn"): Grid::add then gives the later cell id_suffix, a hash of its policy.
  std::string id() const;
  std::string id_suffix;  // "" or "-h" + 8 hex digits
  // The policy as the reports name it: with "@bf16" when the cell is not fp32 (train/step.h RunEntry).
  std::string run_label() const;
  // The child's flags without the output paths and without --resume/--overwrite.
  std::vector<std::string> train_args() const;
};

// The actlab-train flags a grid sets for every cell (Cell::train_args, the output paths, --resume and
// --overwrite): a --train-arg naming one of them is refused, since the cell would then run other settings
// than its results are reported under.
const std::vector<std::string>& grid_managed_flags();

struct Grid {
  std::string preset;               // "cpu", "paper" (or "custom" for tests)
  std::vector<std::string> tables;  // selected tables in report order (paper_tables()'s), or "custom"
  std::vector<Cell> cells;          // unique ids, in run order
  // Per table, its cells (indices into `cells`) in the order the table added them: the table's own row
  // and model order, which the reports list it in. The run order cannot serve: a cell shared with a
  // table added earlier (the exact run) runs at that table's place.
  std::map<std::string, std::vector<size_t>> table_cells;
  // Adds `cell` under (table, label); a cell with the same id already present only gains the label.
  void add(const Cell& cell, const std::string& table, const std::string& label);
};

// What the command line asks for. Unset optionals keep the preset's value.
struct GridOptions {
  std::string preset = "cpu";                 // cpu | paper
  std::vector<std::string> tables = {"1c"};   // paper_tables() names or "all" (ignored with policies)
  std::vector<std::string> policies;          // non-empty: a custom grid of these policies
  std::vector<std::string> models, datasets;  // override the tables' model/data set (custom: the grid axes)
  // Every row runs these seeds; empty: each row's default (seed 0; in Fig. 6 seeds 0-2 for Normal, BLPA, AC-GC,
  // ActNN and DIVISION, seed 0 for Checkpoint and SWAP, whose gradients are Normal's bit for bit).
  std::vector<int64_t> seeds;
  std::optional<int64_t> epochs, batch_size, train_limit, test_limit, steps_per_epoch, threads;
  std::optional<double> lr, weight_decay;
  std::string optimizer = kSgdName;
  std::string device = "cpu";
  std::string precision = "fp32";  // every cell's, unless its POLICY@PRECISION entry names one
  std::string data_dir;
  std::vector<std::string> extra_args;
};

// The paper's tables and figures a grid can train, in the order "all" runs and reports them: the ResNet-20
// tables and Table 3 first (1c, 2b, 3, fig3, fig6), then 2a, whose MobileNetV2 seeds beyond Table 3's are
// the grid's longest cells, then 1b's transformers: a grid stopped early has the ResNet tables whole.
const std::vector<std::string>& paper_tables();
// "1b, 1c, 2a, 2b, 3, fig3, fig6 or all": the names --table accepts, for its errors.
std::string paper_tables_text();

// Builds the grid of a preset/table selection or a custom policy list. Throws Error (one line) for an
// unknown preset, table, model or policy string, an empty list, or a seed < 0.
Grid make_grid(const GridOptions& options);
// The one spelling of a run's policy string, checkpoint forms included (parse_policy_set(spec).describe():
// "division:Q=4,B=12" → "division:B=12,Q=4", "checkpoint" → "checkpoint:segments=auto+exact"), so that
// cells, results.csv and the other tools' CSVs name a policy alike. Throws Error for a bad string.
std::string canonical_policy(const std::string& spec);
// The mean over the seeds both hold of a[seed] − b[seed] (NaN when they share none): a method against
// Normal where both ran, for the tables' Δ vs Normal and the radar. Checkpoint and SWAP run one seed and
// equal Normal's run there; against Normal's mean over other seeds too they would show a gap of seeds.
double mean_difference_at_shared_seeds(const std::map<int64_t, double>& a, const std::map<int64_t, double>& b);
// Error naming scripts/get-cifar.sh when a cell needs CIFAR-10/100 that is not where the child will
// look (data_dir, else $ACTLAB_CIFAR_DIR or ./data).
void check_data_present(const Grid& grid);
// Rough wall-clock seconds of one cell on this machine: images per epoch × the model's cost per image
// on the data set's image size (its multiply-accumulates and the elements its layers write, weighted as
// measured on the 2-core development machine) × a per-policy factor (division 1.33×).
double estimate_cell_seconds(const Cell& cell);

// ---- running
// Diverged: the run stopped on non-finite values (its summary.json says so). That is a result, like Done
// (the grid does not run it again and does not fail for it); its accuracy is NaN, its memory measured.
enum class CellStatus { NotRun, Done, Interrupted, Failed, Diverged };
const char* status_name(CellStatus status);  // "not run", "done", "interrupted", "failed", "diverged"
bool finished(CellStatus status);             // Done or Diverged: a result the grid keeps and does not rerun

struct CellResult {
  CellStatus status = CellStatus::NotRun;
  std::string message;  // failed: "exit 2: <last log line>"
  int64_t epochs_done = 0;
  static constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();  // "not measured"
  double final_test_acc = kNaN, best_test_acc = kNaN, train_loss = kNaN, img_per_s = kNaN, wall_s = kNaN;
  int64_t activation_bytes = 0, peak_bytes = 0, saved_raw_bytes = 0, saved_packed_bytes = 0;
  // The images the run's model read, from its summary (0 when it has none yet): results.csv records them,
  // and the radar takes the memory and throughput rows measured at them.
  int64_t input_channels = 0, input_size = 0;
  std::vector<std::pair<int64_t, double>> test_acc_per_epoch;  // (1-based epoch, test accuracy %)
};

// Reads OUT/cells/<id>/ (summary.json, epochs.csv, failed.txt). Never throws for a
// missing or half-written cell: that is NotRun / Interrupted.
CellResult read_cell(const std::string& cell_dir);

struct RunOptions {
  std::string out_dir;
  std::string train_bin;       // the actlab-train executable
  bool dry_run = false;        // print cells, estimates and commands; run nothing, write nothing
  bool report_only = false;    // only regenerate results.csv, tables.md and the figures
  std::string report_hint = "give the flags that trained the grid";  // for a report_only run refused its flags
  std::string command_line;    // the command that started the grid (for tables.md)
};

// Runs every cell that is not done (skip / resume / fresh, see grid.cpp), printing one progress line
// per cell, then regenerates the reports. Returns the process exit code: 0 all cells done, 1 some
// failed or not run, 128+signal when stopped by SIGINT/SIGTERM (forwarded to the running child).
// Throws Error before running anything when a cell directory holds a run with other settings.
int run_grid(const Grid& grid, const RunOptions& options);

// results.csv, tables.md, acc_per_epoch.svg, activation_memory.svg (and fig6_accuracy.svg when Fig. 6
// is selected) in out_dir from the cell directories (cells not run yet appear with status "not run").
// Returns the names of the files written, in that order.
std::vector<std::string> write_reports(const Grid& grid, const std::string& out_dir, const std::string& command_line);

// argv as one shell command line (tokens with special characters in single quotes), as command.txt
// and tables.md show it.
std::string shell_command_line(const std::vector<std::string>& argv);

// The arguments (the program left out) of the command that last trained the grid in `out_dir`, from
// out_dir/command.txt; empty where it holds none. What `actlab-ablate --report-only --out DIR` alone reports
// under, so that a report of a finished grid need not repeat its flags.
std::vector<std::string> trained_grid_args(const std::string& out_dir);

// SIGINT/SIGTERM/SIGHUP handlers for the grid process: the signal is forwarded to the running child (which
// checkpoints and exits) and the grid stops after it; SIGPIPE is ignored, so a dead reader of the output
// does not stop the reports being written. Apps call this once before run_grid.
void install_grid_signal_handlers();

}  // namespace actlab
