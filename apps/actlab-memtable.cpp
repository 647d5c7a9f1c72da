// actlab-memtable: total and activation memory of one training step for a model × batch × policy grid,
// in the shape of the DIVISION paper's Table 1(a), measured by the tracking allocator.
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <sstream>

#include <limits>
#include <map>

#include "actlab/compress/policy.h"
#include "actlab/core/precision.h"
#include "actlab/core/allocator.h"
#include "actlab/io/files.h"
#include "actlab/io/markdown.h"
#include "actlab/train/cli.h"
#include "actlab/train/logging.h"
#include "actlab/train/memtable.h"
#include "actlab/train/paper_reference.h"
#include "actlab/train/step.h"

using namespace actlab;

namespace {
// The first bytes of each output: a file that begins so is an earlier table of this program, which a rerun
// replaces without --overwrite (the rest of each header follows them).
constexpr const char* kMdStart = "| model | batch | method | policy |";
constexpr const char* kCsvStart = "model,batch,policy,method,";
constexpr const char* kKindsStart = "model,batch,policy,save,";
// Policies contain commas ("division:B=8,Q=2"): split on ';' when present, else on ',' only before a
// name: a token whose first ':', '=' or '|' is a ':' ("division:B=8"), or that has none ("exact",
// "exact@bf16"). A parameter ("Q=2") or a parameter before a rule ("R=1|*.attn.proj=division:B=8") goes on
// the policy before it.
std::vector<std::string> split_policies(const std::string& s) {
  if (s.find(';') != std::string::npos) return split_list(s, ';');
  std::vector<std::string> out;
  for (const auto& tok : split_list(s, ',')) {
    const size_t sep = tok.find_first_of(":=|");
    const bool starts_policy = sep == std::string::npos || tok[sep] == ':';
    if (starts_policy || out.empty()) out.push_back(tok);
    else out.back() += "," + tok;
  }
  return out;
}
double gib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); }
// A ratio's CSV cell: empty when it is undefined (NaN), as a missing paper figure's is.
std::string csv_ratio(double v) {
  if (std::isnan(v)) return "";
  std::ostringstream s;
  s << v;
  return s.str();
}
}  // namespace

int main(int argc, char** argv) {
  FlagParser flags("actlab-memtable",
                   "Measure one training step's memory (docs/measures.md: activation = live after forward+loss minus\n"
                   "before, minus logits and loss, plus the input batch; total = live before backward + what the step\n"
                   "added) for every model x batch x policy, and print the table in the shape of the paper's Table 1(a).\n"
                   "Random data. The paper's Table 1(a) with its figures beside: actlab-memtable --table 1a\n"
                   "Example (the paper's setting, chosen by hand):\n"
                   "  actlab-memtable --models resnet50_imagenet,wrn50_2_imagenet --batches 64 --image-size 224 \\\n"
                   "                  --classes 1000 --policies 'exact;division:B=8,Q=2'");
  flags.add("models", "string", "resnet18", "comma-separated model names");
  flags.add("batches", "string", "128", "comma-separated batch sizes");
  flags.add("policies", "string", "exact;division:B=8,Q=2",
            "policies, separated by ';' (or ',' between names), each optionally POLICY@PRECISION (exact@bf16)");
  flags.add("precision", "string", "fp32", "compute precision of the entries that name none: " + precision_forms());
  flags.add("image-size", "int", "32", "input height and width");
  flags.add("channels", "int", "3", "input channels");
  flags.add("classes", "int", "10", "classes");
  flags.add("threads", "int", "2", "CPU threads");
  flags.add("seed", "int", "0", "random seed");
  flags.add("out", "string", "", "also write the Markdown table to this file");
  flags.add("csv", "string", "", "also write one CSV row per cell to this file");
  flags.add("overwrite", "bool", "false",
            "replace an --out, --csv or --by-kind file that exists and is not an earlier table of this program");
  flags.add("by-kind", "string", "",
            "also write, per cell, the saves summed by kind (linear.input, softmax.output, ...) as CSV to this file");
  flags.add("table", "string", "",
            "a paper table's grid (flags given explicitly still win): '1a' = ResNet-50 and WRN-50-2 at 224x224, "
            "batch 64, 1000 classes, every method, with the paper's figures beside; '1b' = Swin-T at 224x224, "
            "batch 128, 1000 classes, Normal / Checkpoint / Mesa / DIVISION");
  try {
    if (!flags.parse(argc, argv)) {
      std::printf("%s", flags.help().c_str());
      return 0;
    }
    const std::string table = flags.get("table");
    ACTLAB_CHECK(table.empty() || table == "1a" || table == "1b", "--table: 1a (ResNet-50/WRN-50-2 memory) or 1b "
                 "(Swin-T memory), got '", table, "'");
    const bool preset = !table.empty();
    const auto pick = [&](const char* flag, const std::string& value) {
      return preset && !flags.given(flag) ? value : flags.get(flag);
    };
    const bool t1a = table == "1a";
    const auto models = split_list(pick("models", t1a ? "resnet50_imagenet,wrn50_2_imagenet" : "swin_t"), ',');
    const auto policies = split_policies(pick(
        "policies", t1a ? "exact;checkpoint;swap;blpa:Q=4;acgc;actnn:G=256,Q=2;division:B=8,Q=2;checkpoint+division:B=8,Q=2"
                        : "exact;checkpoint;mesa:Q=8;division:B=8,Q=2"));
    const auto positive = [](const std::string& text, const char* what) {
      int64_t v = 0;
      ACTLAB_CHECK(parse_int(text, &v) && v >= 1, "bad ", what, " '", text, "': a whole number >= 1 (and < 2^63)");
      return v;
    };
    const int64_t image_size = positive(pick("image-size", "224"), "--image-size");
    const int64_t classes = positive(pick("classes", "1000"), "--classes");
    const int64_t channels = positive(flags.get("channels"), "--channels");
    std::vector<int64_t> batches;
    for (const auto& b : split_list(pick("batches", t1a ? "64" : "128"), ',')) batches.push_back(positive(b, "batch size"));
    ACTLAB_CHECK(!models.empty() && !policies.empty() && !batches.empty(), "empty grid");
    const std::vector<RunEntry> entries =
        parse_run_entries(policies, parse_precision(flags.get("precision")), Device::cpu());
    // A model or an entry late in its list that cannot run fails now, not after the rows before it.
    check_run_grid(models, entries, channels, classes, image_size);
    bool mixed = false;  // some entry is not fp32: a column of rates against the fp32 exact run too
    for (const auto& e : entries) mixed = mixed || e.precision != Precision::F32;
    // The paper's Table 1(a) cells exist for ImageNet inputs only.
    const bool paper_cells = image_size == 224 && classes == 1000 && channels == 3;
    const int64_t threads = flags.get_int("threads");
    ACTLAB_CHECK(threads >= 1, "threads must be >= 1, got ", threads);
    omp_set_num_threads(static_cast<int>(threads));
    // Before the measurements, which can take minutes: an output that cannot be written fails now.
    const bool overwrite = flags.get_bool("overwrite");
    for (const auto& [flag, start] : {std::pair{"out", kMdStart}, std::pair{"csv", kCsvStart}, std::pair{"by-kind", kKindsStart}})
      check_writable(flags.get(flag), overwrite || replaceable_output(flags.get(flag), start),
                     ("--" + std::string(flag) + " file").c_str());
    check_distinct_outputs({{flags.get("out"), "--out"}, {flags.get("csv"), "--csv"}, {flags.get("by-kind"), "--by-kind"}});
    remove_stale_outputs("actlab-memtable", {flags.get("out"), flags.get("csv"), flags.get("by-kind")});

    std::ostringstream md, csv, kinds;
    kinds << kKindsStart << "lossy,raw_mib,kept_mib,rate\n";
    csv << kCsvStart << "total_gib,activation_gib,activation_rate,saved_raw_mib,saved_packed_mib,"
           "saved_expected_mib,measured_vs_closed_form,peak_gib,step_s,recompute_s,offloaded_gib,paper_total_gb,"
           "paper_activation_gb,precision,activation_rate_vs_fp32_exact,threads,image_size,channels\n";
    // The peak includes per-thread workspaces (docs/measures.md), so its column says at how many threads.
    md << kMdStart << " total GiB | activation GiB (rate vs exact) | peak GiB ("
       << threads << (threads == 1 ? " thread" : " threads") << ") | "
          "policy-kept inputs: measured / closed form | recompute s | offloaded GiB |"
       << (mixed ? " rate vs fp32 exact |" : "") << (paper_cells ? " paper total GB | paper activation GB (rate) |" : "")
       << "\n"
       << "|---|---|---|---|---|---|---|---|---|---|" << (mixed ? "---|" : "") << (paper_cells ? "---|---|" : "") << "\n";
    // The header goes to stdout too: the rows printed there as each is measured are unreadable without it.
    std::printf("%s", md.str().c_str());
    for (const auto& model : models) {
      for (int64_t batch : batches) {
        const PaperMemory* paper_normal = paper_cells ? paper_table_1a("Normal", model, batch) : nullptr;
        const auto measure = [&](const RunEntry& entry) {
          StepMemoryConfig c;
          c.model = model;
          c.batch = batch;
          c.in_channels = channels;
          c.image_size = image_size;
          c.num_classes = classes;
          c.policy = entry.policy;
          c.precision = entry.precision;
          c.seed = static_cast<uint64_t>(flags.get_int("seed"));
          std::fprintf(stderr, "measuring %s b%lld %s ...\n", model.c_str(), static_cast<long long>(batch),
                       entry.label().c_str());
          return measure_step_memory(c);
        };
        // The "exact" entries first, per precision: every row's rate divides by them, and each row is printed
        // as soon as it is measured, so a reference measured later would leave the rows before it without a
        // rate. Measuring it first keeps the rows streaming in the list's order.
        std::map<Precision, StepMemoryResult> exact;
        for (const RunEntry& entry : entries)
          if (entry.policy == "exact" && !exact.count(entry.precision)) exact.emplace(entry.precision, measure(entry));
        for (const RunEntry& entry : entries) {
          const std::string& policy = entry.policy;
          const StepMemoryResult r = policy == "exact" ? exact.at(entry.precision) : measure(entry);
          // An undefined ratio is NaN, written as an empty cell (as a missing paper figure is), never a 0
          // that reads as measured: a rate with no exact entry at that precision, a kept / closed form of
          // a policy that keeps nothing on the device (swap: 0 / 0).
          const double undefined = std::numeric_limits<double>::quiet_NaN();
          const auto rate_against = [&](Precision p) {
            const auto it = exact.find(p);
            return it != exact.end() ? static_cast<double>(it->second.activation_bytes) / r.activation_bytes : undefined;
          };
          const double rate = rate_against(entry.precision), rate_fp32 = rate_against(Precision::F32);
          const double vs_closed = r.saved_expected_bytes > 0
                                       ? static_cast<double>(r.saved_packed_bytes) / r.saved_expected_bytes
                                       : undefined;
          const std::string method = paper_method_name(policy);
          const PaperMemory* paper = paper_cells ? paper_table_1a(method, model, batch) : nullptr;
          char row[768];
          std::snprintf(row, sizeof row, "| %s | %lld | %s | %s | %.2f | %.3f%s | %.2f | %.1f / %.1f MiB | %s | %s |",
                        model.c_str(), static_cast<long long>(batch), md_cell(method).c_str(), md_cell(entry.label()).c_str(), gib(r.total_bytes),
                        gib(r.activation_bytes),
                        rate > 0 && policy != "exact" ? (" (" + md_number(rate) + "x)").c_str() : "",
                        gib(r.peak_bytes), r.saved_packed_bytes / 1048576.0, r.saved_expected_bytes / 1048576.0,
                        r.recomputed_segments > 0 ? md_number(r.recompute_seconds).c_str() : "-",
                        r.offloaded_bytes > 0 ? md_number(gib(r.offloaded_bytes)).c_str() : "-");
          std::string line = row;
          if (mixed) {
            std::snprintf(row, sizeof row, " %s |", rate_fp32 > 0 ? (md_number(rate_fp32) + "x").c_str() : "-");
            line += row;
          }
          if (paper_cells) {
            if (!paper) {
              line += " - | - |";
            } else if (paper->total_gb < 0) {
              line += " OOM | OOM |";
            } else {
              std::snprintf(row, sizeof row, " %.2f | %.2f", paper->total_gb, paper->activation_gb);
              line += row;
              if (paper_normal && paper != paper_normal && paper_normal->activation_gb > 0) {
                std::snprintf(row, sizeof row, " (%.1fx)", paper_normal->activation_gb / paper->activation_gb);
                line += row;
              }
              line += " |";
            }
          }
          md << line << "\n";
          std::printf("%s\n", line.c_str());
          std::fflush(stdout);
          csv << model << "," << batch << "," << csv_field(entry.label()) << "," << csv_field(method) << ","
              << gib(r.total_bytes) << "," << gib(r.activation_bytes) << "," << csv_ratio(rate) << ","
              << r.saved_raw_bytes / 1048576.0 << "," << r.saved_packed_bytes / 1048576.0 << ","
              << r.saved_expected_bytes / 1048576.0 << "," << csv_ratio(vs_closed) << "," << gib(r.peak_bytes) << ","
              << r.step_seconds << "," << r.recompute_seconds << "," << gib(r.offloaded_bytes) << ","
              << (paper && paper->total_gb >= 0 ? std::to_string(paper->total_gb) : "") << ","
              << (paper && paper->activation_gb >= 0 ? std::to_string(paper->activation_gb) : "") << ","
              << precision_name(entry.precision) << "," << csv_ratio(rate_fp32) << "," << threads << ","
              << image_size << "," << channels << "\n";
          for (const SaveKindBytes& k : r.by_kind)
            kinds << model << "," << batch << "," << csv_field(entry.label()) << "," << csv_field(k.op) << ","
                  << (k.lossy ? "true" : "false") << "," << k.raw / 1048576.0 << "," << k.packed / 1048576.0 << ","
                  << (k.packed > 0 ? static_cast<double>(k.raw) / k.packed : 0.0) << "\n";
        }
      }
    }
    if (!flags.get("out").empty()) write_text_atomic(flags.get("out"), md.str());
    if (!flags.get("csv").empty()) write_text_atomic(flags.get("csv"), csv.str());
    if (!flags.get("by-kind").empty()) write_text_atomic(flags.get("by-kind"), kinds.str());
    return 0;
  } catch (const std::exception& e) {
    return report_error("actlab-memtable", e);
  }
}
