// actlab-train: train a model with a chosen activation-cache policy and report accuracy, speed and
// memory. All work is in train/trainer.cpp; this file merges checkpoint, config file and flags into a
// TrainConfig (train/config_file.h) and maps errors (2, 3 out of memory) and stop signals (128+sig)
// to exit codes. Tested end to end by tests/cli/bad_input.sh, tests/cli/resume.sh,
// tests/cli/crash_resume.sh and tests/cli/nonfinite.sh.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <set>

#include "compress/policy.h"
#include "core/allocator.h"
#include "models/registry.h"
#include "train/checkpoint.h"
#include "train/cli.h"
#include "train/config_file.h"
#include "train/trainer.h"

using namespace actlab;

namespace {

// Precedence: built-in defaults < the --resume checkpoint's stored configuration < --config FILE <
// flags given on the command line.
TrainConfig effective_config(const FlagParser& flags) {
  TrainConfig c;
  const std::string resume = flags.get("resume");
  if (!resume.empty()) c = config_from_json(checkpoint_state(read_safetensors(resume)).config_json);
  std::set<std::string> given;
  for (const auto& o : flags.effective())
    if (flags.given(o.first)) given.insert(o.first);
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
  c.resume = resume;
  c.summary_only = flags.given("summary") && flags.get_bool("summary");
  return c;
}

// Test hooks (documented in docs/reliability.md, used by tests/cli/nonfinite.sh): inject a NaN at
// ACTLAB_INJECT_NAN_STEP (1-based global step) for ACTLAB_INJECT_NAN_COUNT steps into the input
// batch or, with ACTLAB_INJECT_NAN_INTO=grad, into a gradient.
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
}

}  // namespace

int main(int argc, char** argv) {
  FlagParser flags("actlab-train",
                   "Train a network with activation-compressed training (ACT) and report accuracy, throughput\n"
                   "and memory. Default: ResNet-20 on Fashion-MNIST (Debian's dataset-fashion-mnist), 1 epoch.");
  std::string models;
  for (const auto& m : model_names()) models += (models.empty() ? "" : ", ") + m.first;
  flags.add("model", "string", "resnet20", "model: " + models);
  flags.add("dataset", "string", "fashion-mnist", "data set: fashion-mnist, mnist, cifar10, cifar100, folder, synthetic");
  flags.add("data-dir", "string", "",
            "directory of the data set files (default: Debian's Fashion-MNIST, $ACTLAB_CIFAR_DIR or data/ for CIFAR)");
  flags.add("image-size", "int", "32", "folder data set: resize/crop images to this size");
  flags.add("image-channels", "int", "3", "folder data set: 1 (grey) or 3 (RGB)");
  flags.add("test-fraction", "float", "0.2", "folder data set without train/ and test/: held-out share per class");
  flags.add("coarse", "bool", "", "cifar100: the 20 coarse labels");
  flags.add("epochs", "int", "1", "training epochs");
  flags.add("batch-size", "int", "128", "mini-batch size");
  flags.add("lr", "float", "0.1", "initial learning rate");
  flags.add("momentum", "float", "0.9", "SGD momentum");
  flags.add("weight-decay", "float", "5e-4", "SGD weight decay");
  flags.add("nesterov", "bool", "", "Nesterov momentum");
  flags.add("schedule", "string", "cosine", "learning-rate schedule: cosine, step (x0.1 every --step-epochs), constant");
  flags.add("step-epochs", "int", "30", "step schedule: epochs between decays");
  flags.add("warmup-epochs", "int", "0", "linear learning-rate warm-up epochs");
  flags.add("label-smoothing", "float", "0", "label smoothing of the cross-entropy");
  flags.add("seed", "int", "0", "random seed (init, shuffling, augmentation, stochastic rounding)");
  flags.add("threads", "int", "2", "CPU threads");
  flags.add("device", "string", "cpu",
            "where to train: cpu, cuda or cuda:N (a build configured with -DACTLAB_CUDA=ON and an NVIDIA GPU)");
  flags.add("policy", "string", "exact", "activation-cache policy: " + policy_forms());
  flags.add("policy-rule", "string", "", "per-module override PATTERN=POLICY, e.g. conv1=exact or 'layer1.*=quant:Q=4'",
            true);
  flags.add("no-augment", "bool", "", "disable training augmentation");
  flags.add("steps-per-epoch", "int", "0", "stop each epoch after N steps (0: full epochs)");
  flags.add("train-limit", "int", "0", "use only the first N training images (0: all)");
  flags.add("test-limit", "int", "0", "evaluate on the first N test images (0: all)");
  flags.add("log", "string", "", "per-epoch log file (.csv or .jsonl)");
  flags.add("memory-report", "string", "", "per-layer saved-tensor table of the first step (.csv or .json)");
  flags.add("summary-json", "string", "", "write the final summary (accuracy, img/s, memory, per-epoch rows) as JSON");
  flags.add("overwrite", "bool", "", "allow replacing an existing log or memory report");
  flags.add("print-every", "int", "0", "progress line every N steps (0: about 10 per epoch)");
  flags.add("synthetic-size", "int", "2048", "training images of --dataset synthetic");
  flags.add("quiet", "bool", "", "print only errors");
  flags.add("save-dir", "string", "", "write DIR/last.safetensors every epoch and DIR/best.safetensors on a new best");
  flags.add("resume", "string", "", "continue the run saved in this checkpoint (its configuration is the default)");
  flags.add("eval-only", "bool", "", "with --resume: evaluate the checkpoint on the test split, no training");
  flags.add("summary", "bool", "", "print the model's layer table (shapes, parameters, MACs) and exit");
  flags.add("config", "string", "", "read options from FILE ('key = value' lines; see docs/example.conf)");
  flags.add("on-nonfinite", "string", "stop",
            "a NaN/Inf loss or gradient: stop (save the last good state to --save-dir, name the step and layer, "
            "exit 2) or skip-step (drop that update; stop after " + std::to_string(kMaxConsecutiveSkips) +
            " in a row)");
  flags.add("memory-limit", "string", "",
            "cap the live bytes on the device (e.g. 2GiB): past it the run fails with out of memory, as a smaller "
            "GPU would; finds the batch size that fits");
  flags.add("check-memory", "bool", "",
            "check after every step that live bytes per tag return to the same value and the peak does not grow");
  try {
    if (!flags.parse(argc, argv)) {
      std::printf("%s", flags.help().c_str());
      return 0;
    }
    TrainConfig c = effective_config(flags);
    apply_test_hooks(c);
    install_stop_handlers();
    const TrainSummary s = train(c);
    if (!s.interrupted) return 0;
    const int sig = s.stop_signal != 0 ? s.stop_signal : SIGINT;
    if (s.stop_checkpoint.empty()) {
      std::fprintf(stderr, "actlab-train: interrupted at epoch %lld step %lld; nothing saved (no --save-dir)\n",
                   static_cast<long long>(s.stop_epoch), static_cast<long long>(s.stop_step));
    } else {
      std::fprintf(stderr, "actlab-train: interrupted at epoch %lld step %lld; resume with: actlab-train --resume %s\n",
                   static_cast<long long>(s.stop_epoch), static_cast<long long>(s.stop_step),
                   s.stop_checkpoint.c_str());
    }
    return 128 + sig;
  } catch (const OutOfMemory& e) {
    // One error line; the allocator's table that follows it in the message goes to stdout.
    const std::string what = e.what();
    const size_t eol = what.find('\n');
    std::fprintf(stderr, "actlab-train: error: %s\n", what.substr(0, eol).c_str());
    if (eol != std::string::npos) std::printf("%s", what.substr(eol + 1).c_str());
    return 3;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "actlab-train: error: out of memory: a host allocation failed; try a smaller "
                         "--batch-size or a compressing --policy such as division:B=8,Q=2\n");
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "actlab-train: error: %s\n", e.what());
    return 2;
  }
}
