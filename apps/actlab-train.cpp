// actlab-train: train a model with a chosen activation-cache policy and report accuracy, speed and
// memory. All work is in train/trainer.cpp; this file maps flags to a TrainConfig and errors to exit codes.
#include <cstdio>
#include <exception>

#include "compress/policy.h"
#include "core/allocator.h"
#include "models/registry.h"
#include "train/cli.h"
#include "train/trainer.h"

using namespace actlab;

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
  flags.add("policy", "string", "exact", "activation-cache policy: " + policy_forms());
  flags.add("policy-rule", "string", "", "per-module override PATTERN=POLICY, e.g. conv1=exact or 'layer1.*=quant:Q=4'",
            true);
  flags.add("no-augment", "bool", "", "disable training augmentation");
  flags.add("steps-per-epoch", "int", "0", "stop each epoch after N steps (0: full epochs)");
  flags.add("train-limit", "int", "0", "use only the first N training images (0: all)");
  flags.add("test-limit", "int", "0", "evaluate on the first N test images (0: all)");
  flags.add("log", "string", "", "per-epoch log file (.csv or .jsonl)");
  flags.add("memory-report", "string", "", "per-layer saved-tensor table of the first step (.csv or .json)");
  flags.add("overwrite", "bool", "", "allow replacing an existing log or memory report");
  flags.add("print-every", "int", "0", "progress line every N steps (0: about 10 per epoch)");
  flags.add("synthetic-size", "int", "2048", "training images of --dataset synthetic");
  flags.add("quiet", "bool", "", "print only errors");
  try {
    if (!flags.parse(argc, argv)) {
      std::printf("%s", flags.help().c_str());
      return 0;
    }
    TrainConfig c;
    c.model = flags.get("model");
    c.dataset = flags.get("dataset");
    c.data_dir = flags.get("data-dir");
    c.epochs = flags.get_int("epochs");
    c.batch_size = flags.get_int("batch-size");
    c.lr = flags.get_float("lr");
    c.momentum = flags.get_float("momentum");
    c.weight_decay = flags.get_float("weight-decay");
    c.nesterov = flags.given("nesterov") && flags.get_bool("nesterov");
    c.schedule = flags.get("schedule");
    c.step_epochs = flags.get_int("step-epochs");
    c.warmup_epochs = flags.get_int("warmup-epochs");
    c.label_smoothing = flags.get_float("label-smoothing");
    const int64_t seed = flags.get_int("seed");
    ACTLAB_CHECK(seed >= 0, "seed must be >= 0, got ", seed);
    c.seed = static_cast<uint64_t>(seed);
    c.threads = flags.get_int("threads");
    c.policy = flags.get("policy");
    c.policy_rules = flags.get_all("policy-rule");
    c.augment = !(flags.given("no-augment") && flags.get_bool("no-augment"));
    c.steps_per_epoch = flags.get_int("steps-per-epoch");
    c.train_limit = flags.get_int("train-limit");
    c.test_limit = flags.get_int("test-limit");
    c.log_file = flags.get("log");
    c.memory_report = flags.get("memory-report");
    c.overwrite = flags.given("overwrite") && flags.get_bool("overwrite");
    c.print_every = flags.get_int("print-every");
    c.synthetic_size = flags.get_int("synthetic-size");
    c.quiet = flags.given("quiet") && flags.get_bool("quiet");
    c.image_size = flags.get_int("image-size");
    c.image_channels = flags.get_int("image-channels");
    c.test_fraction = flags.get_float("test-fraction");
    c.cifar100_coarse = flags.given("coarse") && flags.get_bool("coarse");
    train(c);
    return 0;
  } catch (const OutOfMemory& e) {
    std::fprintf(stderr, "actlab-train: error: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "actlab-train: error: %s\n", e.what());
    return 2;
  }
}
