// bench_train: median images/s of a full training step (forward, loss, backward, SGD) on random
// 3x32x32 inputs, the protocol of ../shared/bench/torch_cpu_train.py (warm-up steps, then at least
// --steps timed steps, continued until --min-time seconds), so the two can be run side by side.
// Also reports the activation memory of the step (train/step.h, docs/measures.md) for each policy, and the median process
// CPU time of a step: CPU ms / (wall ms · threads) is how busy the team kept the cores (with
// OMP_WAIT_POLICY=passive, so that waiting threads sleep instead of spinning). --rounds N repeats the
// policy list N times so that policies can be compared in back-to-back pairs on a shared machine;
// --interleave goes further: one model per policy, and their timed steps alternate one by one, so every
// step of a policy has a step of the first policy next to it and the median of those per-step ratios
// ("paired") is not moved by the slow drifts of a shared machine's speed. --csv FILE also writes one row
// per timed run (model,policy,batch,img_per_s,...), the throughput that actlab-ablate --radar reads, and
// with --interleave the paired ratio against the first entry (paired_ratio, its quartiles).
// An entry of the policy list may name its compute precision, "exact@bf16" (core/precision.h), so that
// --interleave pairs fp32 and bf16 steps; without one it runs at --precision.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "actlab/autograd/saved_tensor.h"
#include "bench/step_timing.h"
#include "actlab/compress/policy.h"
#include "actlab/core/precision.h"
#include "actlab/io/files.h"
#include "actlab/layers/optim/sgd.h"
#include "actlab/models/registry.h"
#include "actlab/train/cli.h"
#include "actlab/train/logging.h"
#include "actlab/train/step.h"

using namespace actlab;
using namespace actlab::bench;

namespace {
// The first bytes of the --csv table: a file that begins so is an earlier run's, replaced without --overwrite.
constexpr const char* kCsvStart = "model,policy,batch,img_per_s,";

// One model, optimizer and random batch trained under one policy: step() is a full training step.
struct TrainStep {
  std::string name;
  std::shared_ptr<Module> model;
  std::unique_ptr<Sgd> opt;
  PolicySet set;
  Precision precision;
  Tensor x, y;
  int64_t activation_bytes = 0;  // of the last step (train/step.h, docs/measures.md)
  bool rules_checked = false;

  TrainStep(const std::string& model_name, const RunEntry& entry, int64_t B, int64_t C, int64_t S)
      : name(model_name), set(parse_policy_set(entry.policy)), precision(entry.precision) {
    check_precision_supported(precision, Device::cpu());
    seed_init(0);
    set_pack_seed(0);
    model = make_model({name, C, 10, S});
    opt = std::make_unique<Sgd>(model->parameters(), SgdOptions{0.01f, 0.9f, 0.f, 5e-4f, false});
    PhiloxStream rng(0, 5);
    x = Tensor::randn({B, C, S, S}, rng);
    y = Tensor::empty({B}, DType::I64);
    for (int64_t i = 0; i < B; ++i) y.data<int64_t>()[i] = static_cast<int64_t>(rng.next_below(10));
  }
  void step() {
    const PrecisionScope scope(precision);
    activation_bytes = run_step(*model, opt.get(), set, x, y).activation_bytes;
    if (!rules_checked) {  // a --policy-rule that took no save is a typo, as actlab-train says
      set.check_rules_matched(name);
      rules_checked = true;
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  FlagParser flags("bench_train", "Training-step throughput (median img/s) on random inputs.");
  flags.add("models", "string", "resnet20,resnet18", "comma-separated models");
  flags.add("batch", "int", "128", "batch size");
  flags.add("threads", "int", "2", "CPU threads");
  flags.add("policies", "string", "exact", "policies separated by ';', each optionally POLICY@PRECISION (exact@bf16)");
  flags.add("precision", "string", "fp32", "compute precision of the entries that name none: " + precision_forms());
  StepTiming{2, 8, 200, 4}.add_flags(flags);
  flags.add("image-size", "int", "32", "input size");
  flags.add("channels", "int", "3", "input channels");
  flags.add("rounds", "int", "1", "repeat the policy list this many times (paired comparisons)");
  flags.add("interleave", "bool", "false", "one model per policy, timed steps alternating (per-step pairs)");
  flags.add("csv", "string", "", "also write one CSV row per timed run to this file");
  flags.add("overwrite", "bool", "false", "replace a --csv file that exists and is not an earlier table of this program");
  try {
    if (!flags.parse(argc, argv)) {
      std::printf("%s", flags.help().c_str());
      return 0;
    }
    const int64_t threads = flags.get_int("threads"), rounds = flags.get_int("rounds");
    const int64_t B = flags.get_int("batch"), S = flags.get_int("image-size"), C = flags.get_int("channels");
    for (const char* name : {"threads", "rounds", "batch", "image-size", "channels"})
      ACTLAB_CHECK(flags.get_int(name) >= 1, "--", name, " must be >= 1, got ", flags.get_int(name));
    ACTLAB_CHECK(!split_list(flags.get("models"), ',').empty(), "--models is empty; give e.g. resnet20,resnet18");
    ACTLAB_CHECK(!split_list(flags.get("policies"), ';').empty(), "--policies is empty; give e.g. 'exact;division:B=8,Q=2'");
    omp_set_num_threads(static_cast<int>(threads));
    const Precision precision = parse_precision(flags.get("precision"));
    std::vector<std::string> runs;  // the policy list, --rounds times
    for (int64_t round = 0; round < rounds; ++round)
      for (const auto& policy : split_list(flags.get("policies"), ';')) runs.push_back(policy);
    const StepTiming timing = StepTiming::from_flags(flags);
    check_writable(flags.get("csv"), flags.get_bool("overwrite") || replaceable_output(flags.get("csv"), kCsvStart),
                   "--csv file");  // now, not after minutes of timing
    // So is a model or a policy entry late in its list that cannot run.
    const std::vector<std::string> models = split_list(flags.get("models"), ',');
    const auto entries = parse_run_entries(split_list(flags.get("policies"), ';'), precision, Device::cpu());
    check_run_grid(models, entries, C, 10, S);
    ACTLAB_CHECK(!flags.given("rounds") || !flags.get_bool("interleave"),
                 "--rounds repeats the policy list of a run without --interleave; --interleave pairs every step "
                 "(give --steps for more pairs)");
    std::printf("%-12s %-22s %6s %10s %10s %10s %14s %9s %9s\n", "model", "policy", "batch", "img/s", "best", "steps",
                "activation", "wall ms", "cpu ms");
    std::ostringstream csv;
    // With --interleave, paired_* are the entry's step over the first entry's, median and quartiles of the
    // adjacent pairs (the figure the docs compare; empty for the first entry and without --interleave).
    csv << kCsvStart << "best_img_per_s,steps,activation_mib,wall_ms,cpu_ms,threads,"
           "paired_with,paired_ratio,paired_q1,paired_q3,image_size,channels\n";
    struct Paired {
      std::string with;
      double median = 0, q1 = 0, q3 = 0;
    };
    const auto report = [&](const std::string& model, const std::string& policy, const std::vector<double>& ts,
                            const std::vector<double>& cpu, int64_t act, const Paired* paired) {
      const double med = median(ts), best = *std::min_element(ts.begin(), ts.end());
      std::printf("%-12s %-22s %6lld %10.1f %10.1f %10zu %10.1f MiB %9.1f %9.1f\n", model.c_str(), policy.c_str(),
                  static_cast<long long>(B), B / med, B / best, ts.size(), act / 1048576.0, 1e3 * med,
                  1e3 * median(cpu));
      std::fflush(stdout);
      csv << model << "," << csv_field(policy) << "," << B << "," << B / med << "," << B / best << "," << ts.size() << ","
          << act / 1048576.0 << "," << 1e3 * med << "," << 1e3 * median(cpu) << "," << flags.get_int("threads") << ",";
      if (paired) csv << csv_field(paired->with) << "," << paired->median << "," << paired->q1 << "," << paired->q3;
      else csv << ",,,";
      csv << "," << S << "," << C << "\n";
    };
    CacheStats::global().set_enabled(false);
    for (const auto& name : models) {
      if (!flags.get_bool("interleave")) {
        for (const auto& policy : runs) {
          const RunEntry entry = parse_run_entry(policy, precision);
          TrainStep run(name, entry, B, C, S);
          std::vector<double> cpu;
          const std::vector<double> ts = time_steps(timing, [&] { run.step(); }, [] {}, &cpu);
          report(name, entry.label(), ts, cpu, run.activation_bytes, nullptr);
        }
        continue;
      }
      std::vector<std::string> policies;  // the entries' labels
      std::vector<std::unique_ptr<TrainStep>> steps;
      for (const auto& policy : split_list(flags.get("policies"), ';')) {
        const RunEntry entry = parse_run_entry(policy, precision);
        policies.push_back(entry.label());
        steps.push_back(std::make_unique<TrainStep>(name, entry, B, C, S));
      }
      for (int64_t i = 0; i < timing.warmup; ++i)
        for (auto& run : steps) run->step();
      std::vector<std::vector<double>> wall(steps.size()), cpu(steps.size());
      double total = 0;
      while (static_cast<int64_t>(wall[0].size()) < timing.steps ||
             (total < timing.min_time * static_cast<double>(steps.size()) &&
              static_cast<int64_t>(wall[0].size()) < timing.max_steps)) {
        const bool reverse = wall[0].size() % 2 == 1;  // alternate which policy goes first in a round
        for (size_t j = 0; j < steps.size(); ++j) {
          const size_t k = reverse ? steps.size() - 1 - j : j;
          const auto t0 = std::chrono::steady_clock::now();
          const double c0 = process_cpu_seconds();
          steps[k]->step();
          wall[k].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          cpu[k].push_back(process_cpu_seconds() - c0);
          total += wall[k].back();
        }
      }
      std::vector<Paired> paired(steps.size());
      for (size_t k = 1; k < steps.size(); ++k) {
        std::vector<double> ratio;
        for (size_t i = 0; i < wall[k].size(); ++i) ratio.push_back(wall[k][i] / wall[0][i]);
        paired[k] = {policies[0], median(ratio), quantile(ratio, 0.25), quantile(ratio, 0.75)};
      }
      for (size_t k = 0; k < steps.size(); ++k)
        report(name, policies[k], wall[k], cpu[k], steps[k]->activation_bytes, k == 0 ? nullptr : &paired[k]);
      for (size_t k = 1; k < steps.size(); ++k) {
        std::printf("%-12s paired: %s step / %s step, median of %zu adjacent pairs %.3f (quartiles %.3f-%.3f)\n",
                    name.c_str(), policies[k].c_str(), policies[0].c_str(), wall[k].size(), paired[k].median,
                    paired[k].q1, paired[k].q3);
        std::fflush(stdout);
      }
    }
    CacheStats::global().set_enabled(true);
    if (!flags.get("csv").empty()) write_text_atomic(flags.get("csv"), csv.str());
    return 0;
  } catch (const std::exception& e) {
    return report_error("bench_train", e);
  }
}
