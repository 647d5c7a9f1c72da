// actlab-ablate: reproduce the DIVISION paper's ablation tables with one command. Builds the grid of
// actlab-train runs (train/grid.h) from a preset and table selection or from explicit lists, runs
// the cells that are not done yet as child processes and writes results.csv, tables.md and two SVG
// figures. With --radar it runs nothing and draws the paper's Fig. 1 radar from a finished grid's
// results.csv and the memory and throughput CSVs (train/radar.h). Exit codes: 0 all cells done, 1 some
// failed or not run, 2 bad input, 128+n stopped by signal n. Tested through the library in
// tests/test_ablate.cpp.
#include <climits>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "actlab/analysis/plot.h"
#include "actlab/core/cuda/runtime.h"
#include "actlab/core/device.h"
#include "actlab/core/precision.h"
#include "actlab/core/error.h"
#include "actlab/io/files.h"
#include "actlab/layers/optim/optimizer.h"
#include "actlab/train/cli.h"
#include "actlab/train/grid.h"
#include "actlab/train/radar.h"
#include "actlab/train/step.h"

using namespace actlab;

namespace {

void declare_flags(FlagParser& f) {
  f.add("preset", "string", "cpu",
        "cpu: ResNet-20 on Fashion-MNIST (with --datasets cifar10 or cifar100, the first 40000 training images: --train-limit 50000 takes all), 6 epochs, batch 128 — "
        "Table 1(c) in ~35 min on 2 cores; Table 1(b): ViT-Tiny on Fashion-MNIST, 1 epoch, lr 0.01; paper: ResNet-18 "
        "CIFAR-10, 100 epochs, batch 256 (Table 10); Table 1(b): Swin-T on an ImageNet folder (--data-dir), batch 128, "
        "lr 0.01");
  f.add("table", "string", "1c", "paper table(s), comma-separated: 1b (vision transformers: Normal, Checkpoint, Mesa, DIVISION), 1c, "
        "2a (MobileNet-V2: Normal, DIVISION), 2b, 3, fig3, fig6 (every method's accuracy), all");
  f.add("policies", "string", "",
        "custom grid of these policies instead of a table, ';'-separated (policies contain commas): "
        "'exact;division:B=8,Q=2'",
        true);
  f.add("models", "string", "", "comma-separated models (default: the preset's; Table 3: resnet18,mobilenet_v2; Table 2(a): "
        "mobilenet_v2; Table 1(b): vit_tiny_cifar, paper preset swin_t)");
  f.add("model", "string", "", "same as --models (give one spelling, not both)");
  f.add("datasets", "string", "", "comma-separated data sets (default: the preset's; Tables 2(a) and 3: cifar10,cifar100)");
  f.add("dataset", "string", "", "same as --datasets (give one spelling, not both)");
  f.add("seeds", "string", "",
        "comma-separated seeds for every row; tables show mean ± std over them (default: 0; Fig. 6: 0,1,2 for "
        "Normal, BLPA, AC-GC, ActNN and DIVISION, 0 for Checkpoint and SWAP; Table 1(b): 0,1,2, 0 for Checkpoint; "
        "Table 2(a): 0,1,2)");
  f.add("epochs", "int", "", "epochs per cell (default: the preset's)");
  f.add("batch-size", "int", "", "mini-batch size (default: the preset's)");
  f.add("lr", "float", "",
        "initial learning rate (default 0.1; 0.01 for vit_tiny_cifar and swin_t; with --optimizer adamw 3e-4 for "
        "those and 1e-3 for the CNNs)");
  f.add("optimizer", "string", kSgdName,
        "every cell's optimizer: sgd (momentum 0.9) or adamw (its own --lr and --weight-decay defaults)");
  f.add("weight-decay", "float", "", "every cell's weight decay (default 5e-4; 0.05 with --optimizer adamw)");
  f.add("train-limit", "int", "", "use only the first N training images");
  f.add("test-limit", "int", "", "evaluate on the first N test images");
  f.add("steps-per-epoch", "int", "", "stop each epoch after N steps");
  f.add("threads", "int", "", "CPU threads per cell (default: all cores)");
  f.add("device", "string", "cpu", "where every cell trains: cpu, cuda or cuda:N (the paper preset is GPU scale)");
  f.add("precision", "string", "fp32",
        "every cell's compute precision (" + precision_forms() + "); a --policies entry POLICY@PRECISION names its own");
  f.add("data-dir", "string", "", "data set directory passed to every cell");
  f.add("train-arg", "string", "", "extra actlab-train flag for every cell, e.g. --train-arg=--no-augment", true);
  f.add("out", "string", "", "output directory (default: ablate-<preset>); with --radar the SVG file");
  f.add("train-bin", "string", "", "the actlab-train executable (default: next to this program)");
  f.add("dry-run", "bool", "false", "print the cells, their commands and the time estimate; run nothing");
  f.add("report-only", "bool", "false",
        "regenerate results.csv, tables.md and the figures from the cells; no training. With --out alone, under the "
        "flags that trained the grid there (OUT/command.txt). Refused, writing nothing, when a cell results.csv "
        "records as finished has lost its summary.json or failed.txt, or is not in this grid");
  f.add("radar", "bool", "false",
        "draw Fig. 1's radar (accuracy, memory, throughput per method) from --results, --memory and --throughput "
        "into --out (default: fig1_radar.svg beside --results); no training");
  f.add("results", "string", "", "--radar: the grid's results.csv (accuracy per method)");
  f.add("overwrite", "bool", "false", "--radar: replace an --out file that exists and is not a chart actlab drew");
  f.add("memory", "string", "",
        "--radar: actlab-memtable --csv output (activation memory per method), measured at the grid's batch and "
        "input shape");
  f.add("throughput", "string", "",
        "--radar: bench_train --csv output (img/s per method), measured at the grid's batch and input shape");
}

// The items of list flags `names` (a plural and its singular, or one name), split at ','. A list flag given
// with nothing in it (a script's empty variable) is an error, not the default (`otherwise`) it stands for.
// The two spellings of one list are refused together: merging them would run a list no one wrote, while a
// flag given twice keeps its last value.
std::vector<std::string> list_flag(const FlagParser& f, std::initializer_list<const char*> names, const char* item,
                                   const char* otherwise = "the preset's") {
  const char* given = nullptr;
  for (const char* name : names) {
    if (!f.given(name)) continue;
    ACTLAB_CHECK(!given, "--", given, " and --", name, " are two spellings of one list; give one of them");
    given = name;
  }
  std::vector<std::string> out;
  for (const char* name : names) {
    const std::vector<std::string> items = split_list(f.get(name), ',');
    ACTLAB_CHECK(!f.given(name) || !items.empty(), "--", name, " names no ", item,
                 "; give one or more, separated by ',' (or leave it out for ", otherwise, ")");
    out.insert(out.end(), items.begin(), items.end());
  }
  return out;
}

GridOptions grid_options(const FlagParser& f) {
  GridOptions o;
  o.preset = f.get("preset");
  o.tables = split_list(f.get("table"), ',');
  ACTLAB_CHECK(!o.tables.empty(), "--table is empty; use ", paper_tables_text());
  for (const auto& p : f.get_all("policies"))
    for (const auto& item : split_list(p, ';')) o.policies.push_back(item);
  ACTLAB_CHECK(!f.given("policies") || !o.policies.empty(),
               "--policies names no policy; give one or more, separated by ';' (or leave it out for --table)");
  ACTLAB_CHECK(o.policies.empty() || !f.given("table"),
               "--policies makes a custom grid; it cannot be combined with --table");
  for (const auto& p : o.policies)  // a typo fails now, not after hours of other cells
    canonical_policy(parse_run_entry(p, Precision::F32).policy);
  o.models = list_flag(f, {"models", "model"}, "model");
  o.datasets = list_flag(f, {"datasets", "dataset"}, "dataset");
  o.seeds.clear();
  for (const auto& s : list_flag(f, {"seeds"}, "seed", "seed 0")) {
    int64_t v = 0;
    ACTLAB_CHECK(parse_int(s, &v) && v >= 0, "--seeds needs non-negative integers below 2^63, got '", s, "'");
    o.seeds.push_back(v);
  }
  auto positive = [&](const char* name, std::optional<int64_t>* slot) {
    if (!f.given(name)) return;
    ACTLAB_CHECK(f.get_int(name) >= 1, "--", name, " must be >= 1, got ", f.get_int(name));
    *slot = f.get_int(name);
  };
  positive("epochs", &o.epochs);
  positive("batch-size", &o.batch_size);
  positive("train-limit", &o.train_limit);
  positive("test-limit", &o.test_limit);
  positive("steps-per-epoch", &o.steps_per_epoch);
  positive("threads", &o.threads);
  if (f.given("lr")) {
    ACTLAB_CHECK(f.get_float("lr") > 0, "--lr must be > 0, got ", f.get_float("lr"));
    o.lr = f.get_float("lr");
  }
  o.optimizer = f.get("optimizer");
  check_optimizer_name(o.optimizer);
  if (f.given("weight-decay")) {
    ACTLAB_CHECK(f.get_float("weight-decay") >= 0, "--weight-decay must be >= 0, got ", f.get_float("weight-decay"));
    o.weight_decay = f.get_float("weight-decay");
  }
  o.device = f.get("device");
  const Device device = Device::parse(o.device);  // a typo or a missing GPU fails now, not once per cell
  o.precision = f.get("precision");
  check_precision_supported(parse_precision(o.precision), device);
  for (const auto& p : o.policies) check_precision_supported(parse_run_entry(p, Precision::F32).precision, device);
  ACTLAB_CHECK(device.is_cpu() || device.index < cuda_device_count(), "--device ", o.device, ": ",
               cuda_device_count(), " CUDA device(s) usable here (a CPU-only build, no driver or no GPU gives 0)");
  o.data_dir = f.get("data-dir");
  for (const auto& a : f.get_all("train-arg"))
    if (!a.empty()) o.extra_args.push_back(a);
  return o;
}

// --radar: one SVG from three CSVs; the methods a file lacks are named on stderr and left out.
int draw_radar(const FlagParser& f) {
  RadarInputs in;
  in.results_csv = f.get("results");
  in.memory_csv = f.get("memory");
  in.throughput_csv = f.get("throughput");
  const std::vector<std::string> models = list_flag(f, {"models", "model"}, "model");
  ACTLAB_CHECK(models.size() <= 1, "--radar draws one model, got ", models.size(), " in --model");
  if (!models.empty()) in.model = models[0];
  const std::vector<std::string> datasets = list_flag(f, {"datasets", "dataset"}, "dataset");
  ACTLAB_CHECK(datasets.size() <= 1, "--radar draws one data set, got ", datasets.size(), " in --dataset");
  if (!datasets.empty()) in.dataset = datasets[0];
  const std::string out = f.get("out").empty()
                              ? (std::filesystem::path(in.results_csv).parent_path() / "fig1_radar.svg").string()
                              : f.get("out");
  // Never one of the files it is drawn from (a throughput CSV takes a bench run to measure again), said first;
  // then an existing --out is replaced where it is an earlier chart.
  for (const auto& [path, option] : {std::pair{in.results_csv, "--results"}, std::pair{in.memory_csv, "--memory"},
                                     std::pair{in.throughput_csv, "--throughput"}})
    check_distinct_outputs({{out, "--out"}, {path, option}});
  check_writable(out, f.get_bool("overwrite") || replaceable_output(out, plot::kSvgStart), "--out file");
  const RadarData data = read_radar_data(in);
  for (const auto& s : data.skipped) std::fprintf(stderr, "actlab-ablate: left out of the radar: %s\n", s.c_str());
  ACTLAB_CHECK(!data.points.empty(), "no method has all three values; nothing to draw");
  plot::write_svg(out, plot::radar_chart_svg(radar_chart(data)));
  for (const RadarPoint& p : data.points)
    std::printf("%-12s accuracy %.2f %% (%d seed%s%s), memory saving %.2fx, throughput %.2fx\n", p.method.c_str(),
                p.accuracy, p.seeds, p.seeds == 1 ? "" : "s",
                p.paired_with_normal ? "; Normal's mean + the difference from Normal on the same seeds" : "",
                p.memory_saving, p.throughput_ratio);
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

std::string default_train_bin() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "actlab-train";
  return (std::filesystem::path(std::string(buf, static_cast<size_t>(n))).parent_path() / "actlab-train").string();
}

// The first flag the command line set that is not one of `names` ("" where there is none).
std::string first_given_except(const FlagParser& f, std::initializer_list<const char*> names) {
  for (const auto& option : f.effective()) {
    const std::string& name = option.first;
    if (f.given(name) && std::find(names.begin(), names.end(), name) == names.end()) return name;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  FlagParser flags("actlab-ablate",
                   "Run the DIVISION paper's ablation grids (Table 1(b), 1(c), 2(a), 2(b), 3, Fig. 3, Fig. 6) with actlab-train and write\n"
                   "OUT/results.csv, OUT/tables.md, OUT/acc_per_epoch.svg and OUT/activation_memory.svg. Each cell\n"
                   "runs in OUT/cells/<id>/; finished cells are skipped and interrupted ones resumed, so re-running\n"
                   "the same command continues the grid. Ctrl-C checkpoints the running cell and stops.\n"
                   "Fig. 1's radar from a finished grid: actlab-ablate --radar --results OUT/results.csv --memory mem.csv\n"
                   "--throughput bench.csv --out fig1.svg (mem.csv: actlab-memtable --csv; bench.csv: bench_train --csv).");
  declare_flags(flags);
  try {
    if (!flags.parse(argc, argv)) {
      std::printf("%s", flags.help().c_str());
      return 0;
    }
    ACTLAB_CHECK(!(flags.get_bool("dry-run") && flags.get_bool("report-only")),
                 "--dry-run and --report-only exclude each other");
    // --report-only --out DIR alone reports the grid DIR holds under the flags that trained it (its
    // command.txt; a later --out wins over the one there): they were long to type, and any other set fails.
    const bool out_alone = flags.get_bool("report-only") && flags.given("out") &&
                           first_given_except(flags, {"report-only", "out", "train-bin"}).empty();
    const std::vector<std::string> trained = out_alone ? trained_grid_args(flags.get("out")) : std::vector<std::string>{};
    // What a --report-only refused for its grid's flags is told to do: it depends on where they came from.
    std::string report_hint = "give the flags that trained the grid, or --out alone to take them from its command.txt";
    if (out_alone)
      report_hint = trained.empty() ? "'" + flags.get("out") + "' has no command.txt to take them from; give the flags "
                                      "that trained the grid"
                                    : "they came from " + flags.get("out") + "/command.txt, the last command that "
                                      "trained there; give the flags of the whole grid";
    if (!trained.empty()) {
      std::vector<std::string> args = {argv[0]};
      args.insert(args.end(), trained.begin(), trained.end());
      args.insert(args.end(), argv + 1, argv + argc);
      std::vector<const char*> c_args;
      for (const auto& a : args) c_args.push_back(a.c_str());
      FlagParser again("actlab-ablate", "");
      declare_flags(again);
      again.parse(static_cast<int>(c_args.size()), c_args.data());
      flags = again;
      std::printf("actlab-ablate: the grid's flags from %s/command.txt\n", flags.get("out").c_str());
    }
    if (flags.get_bool("radar")) {  // a grid's flags would change nothing in the chart: said, not ignored
      const std::string grid_flag = first_given_except(
          flags, {"radar", "results", "memory", "throughput", "out", "overwrite", "model", "models", "dataset", "datasets"});
      ACTLAB_CHECK(grid_flag.empty(), "--", grid_flag, " is a grid's flag; --radar draws from --results, --memory and "
                   "--throughput alone");
      return draw_radar(flags);
    }
    // A grid's --out directory is resumed cell by cell, never replaced: the switch would do nothing there.
    ACTLAB_CHECK(!flags.given("overwrite"), "--overwrite applies to --radar's --out file only");
    const Grid grid = make_grid(grid_options(flags));
    RunOptions run;
    run.out_dir = flags.get("out").empty() ? "ablate-" + grid.preset : flags.get("out");
    run.train_bin = flags.get("train-bin").empty() ? default_train_bin() : flags.get("train-bin");
    run.dry_run = flags.get_bool("dry-run");
    run.report_only = flags.get_bool("report-only");
    run.report_hint = report_hint;
    run.command_line = shell_command_line(std::vector<std::string>(argv, argv + argc));
    if (run.dry_run) {
      try {
        check_data_present(grid);
      } catch (const Error& e) {
        std::printf("warning: %s\n", e.what());
      }
    } else if (!run.report_only) {
      check_data_present(grid);
    }
    install_grid_signal_handlers();
    return run_grid(grid, run);
  } catch (const std::exception& e) {
    return report_error("actlab-ablate", e);
  }
}
