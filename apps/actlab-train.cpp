// actlab-train: train a model with a chosen activation-cache policy and report accuracy, speed and
// memory. All work is in train/trainer.cpp; this file merges checkpoint, config file and flags into a
// TrainConfig (train/config_file.h) and maps errors (2, 3 out of memory) and stop signals (128+sig)
// to exit codes. Tested end to end by tests/cli/bad_input.sh, tests/cli/resume.sh,
// tests/cli/crash_resume.sh and tests/cli/nonfinite.sh.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <new>
#include <set>

#include "actlab/core/allocator.h"
#include "actlab/io/files.h"
#include "actlab/train/checkpoint.h"
#include "actlab/train/cli.h"
#include "actlab/train/config_file.h"
#include "actlab/train/logging.h"
#include "actlab/train/trainer.h"

using namespace actlab;

namespace {

// Precedence: built-in defaults < the --resume checkpoint's stored configuration < --config FILE <
// flags given on the command line. An evaluation (--resume with --eval-only) and a branch (a resume that
// saves to another --save-dir) take their output keys (is_output_key) from their own config file and
// flags only: inherited, they rewrote the first run's --summary-json, --log and --export-weights with
// another run's figures, and an evaluation's --quiet hid its result.
TrainConfig effective_config(const FlagParser& flags) {
  std::set<std::string> given;
  for (const auto& o : flags.effective())
    if (flags.given(o.first)) given.insert(o.first);
  const auto merge = [&](TrainConfig c) {
    if (!flags.get("config").empty()) apply_config_file(c, flags.get("config"), given);
    for (const auto& key : given) {
      if (!is_config_key(key)) continue;  // config, resume, summary
      if (key == "policy-rule") {
        c.policy_rules.clear();
        for (const auto& r : flags.get_all(key)) set_config_value(c, key, r);
      } else {
        set_config_value(c, key, flags.get(key));
      }
    }
    return c;
  };
  const std::string resume = flags.get("resume");
  const TrainConfig saved =
      resume.empty() ? TrainConfig() : config_from_json(checkpoint_state(read_safetensors(resume)).config_json);
  TrainConfig c = merge(saved);
  const bool branch = !resume.empty() && !c.eval_only && !c.save_dir.empty() &&
                      (saved.save_dir.empty() || resolved_path(c.save_dir) != resolved_path(saved.save_dir));
  if (!resume.empty() && (c.eval_only || branch)) {
    const TrainConfig own = merge(TrainConfig());
    std::map<std::string, std::string> inherited;
    for (const auto& [key, value] : config_entries(c)) inherited[key] = value;
    std::string dropped;
    for (const auto& [key, value] : config_entries(own)) {
      if (!is_output_key(key)) continue;
      const std::string before = inherited[key];
      if (branch && before != value && is_output_file_key(key))
        dropped += (dropped.empty() ? "" : ", ") + ("--" + key + " '" + before + "'");
      set_config_value(c, key, value);
    }
    if (!dropped.empty())
      c.resume_note = "this resume saves to another --save-dir, so it leaves the first run's outputs alone: " +
                      dropped + " (give them again to write this run's)";
  }
  // --overwrite is this command's permission, not part of the run: a resume never takes it from the
  // checkpoint (a run started with it would otherwise replace another run's log under a mistyped --log).
  if (!resume.empty()) c.overwrite = merge(TrainConfig()).overwrite;
  c.resume = resume;
  c.config_path = flags.get("config");
  c.summary_only = flags.given("summary") && flags.get_bool("summary");
  return c;
}

// Test hooks (documented in docs/reliability.md, used by tests/cli/nonfinite.sh): inject a NaN at
// ACTLAB_INJECT_NAN_STEP (1-based global step) for ACTLAB_INJECT_NAN_COUNT steps into the input
// batch or, with ACTLAB_INJECT_NAN_INTO=grad, into a gradient (=eval: the first test batch after epoch
// ACTLAB_INJECT_NAN_STEP); ACTLAB_STOP_AFTER_STEPS.
void apply_test_hooks(TrainConfig& c) {
  auto env_int = [](const char* name, int64_t fallback) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return fallback;
    char* end = nullptr;
    const long long x = std::strtoll(v, &end, 10);
    ACTLAB_CHECK(*end == '\0', name, " needs an integer, got '", v, "'");
    return static_cast<int64_t>(x);
  };
  c.inject_nan_step = env_int("ACTLAB_INJECT_NAN_STEP", 0);
  c.inject_nan_count = env_int("ACTLAB_INJECT_NAN_COUNT", 1);
  if (const char* into = std::getenv("ACTLAB_INJECT_NAN_INTO")) c.inject_nan_into = into;
  // Stop as on SIGINT after this many global steps (tests/test_dist.cpp: a signal to mpirun ends the
  // job instead of reaching the ranks).
  c.stop_after_steps = env_int("ACTLAB_STOP_AFTER_STEPS", 0);
}

}  // namespace

int main(int argc, char** argv) {
  FlagParser flags("actlab-train",
                   "Train a network with activation-compressed training (ACT) and report accuracy, throughput\n"
                   "and memory. Default: ResNet-20 on Fashion-MNIST (Debian's dataset-fashion-mnist), 1 epoch.");
  add_config_flags(flags);  // every option of a run's configuration (train/config_file.cpp)
  // Command-line only: how the configuration is assembled, and what to do instead of training.
  flags.add("resume", "string", "", "continue the run saved in this checkpoint (its configuration is the default)");
  flags.add("config", "string", "", "read options from FILE ('key = value' lines; see docs/example.conf)");
  flags.add("summary", "bool", "", "print the model's layer table (shapes, parameters, MACs) and exit");
  try {
    if (!flags.parse(argc, argv)) {
      std::printf("%s", flags.help().c_str());
      return 0;
    }
    TrainConfig c = effective_config(flags);
    apply_test_hooks(c);
    // A write past a file-size limit (ulimit -f) fails with EFBIG, one error line with the earlier
    // checkpoint kept, instead of SIGXFSZ ending the process mid-write.
    std::signal(SIGXFSZ, SIG_IGN);
    // An evaluation has no state to save: Ctrl-C ends it at once, as the signal's default does.
    if (!c.eval_only && !c.summary_only) install_stop_handlers();
    const TrainSummary s = train(c);
    if (!s.interrupted) return 0;
    end_progress_line();
    const int sig = s.stop_signal != 0 ? s.stop_signal : SIGINT;
    if (s.rank != 0) {  // --distributed: rank 0 says where the run stopped
    } else if (s.stop_checkpoint.empty()) {
      std::fprintf(stderr, "actlab-train: interrupted at epoch %lld step %lld; nothing saved (no --save-dir)\n",
                   static_cast<long long>(s.stop_epoch), static_cast<long long>(s.stop_step));
    } else {
      // A checkpoint resumes only on as many ranks as wrote it: say how to launch that many.
      const std::string launch = s.world_size > 1 ? "mpirun -np " + std::to_string(s.world_size) +
                                                        " actlab-train --distributed"
                                                  : std::string("actlab-train");
      // A resume does not take --overwrite from the checkpoint (effective_config): the command that goes on
      // passes the permission this one was given (an export or a log it had not yet replaced).
      std::fprintf(stderr, "actlab-train: interrupted at epoch %lld step %lld; resume with: %s --resume %s%s\n",
                   static_cast<long long>(s.stop_epoch), static_cast<long long>(s.stop_step), launch.c_str(),
                   s.stop_checkpoint.c_str(), c.overwrite ? " --overwrite" : "");
    }
    return 128 + sig;
  } catch (const OutOfMemory& e) {
    end_progress_line();
    return report_error("actlab-train", e);  // the allocator's table after the error line goes to stdout
  } catch (const std::bad_alloc&) {
    end_progress_line();
    std::fprintf(stderr, "actlab-train: error: out of memory: a host allocation failed; try a smaller "
                         "--batch-size or a compressing --policy such as division:B=8,Q=2\n");
    return 3;
  } catch (const std::exception& e) {
    end_progress_line();
    std::fprintf(stderr, "actlab-train: error: %s\n", e.what());
    return 2;
  }
}
