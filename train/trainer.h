// The training job behind actlab-train: data, model, policy, SGD + schedule, per-step progress,
// per-epoch evaluation and log rows, memory measured as the DIVISION reference measures it,
// checkpoints (save, exact resume, stop on SIGINT/SIGTERM), the non-finite and memory guards
// (train/guards.h) and a final summary. Tested in tests/test_train.cpp (end to end),
// tests/test_checkpoint.cpp (checkpoints, resume) and tests/test_reliability.cpp (guards).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "compress/policy.h"
#include "core/allocator.h"
#include "data/dataset.h"
#include "data/transforms.h"
#include "layers/module.h"

namespace actlab {

struct TrainConfig {
  std::string model = "resnet20";
  std::string dataset = "fashion-mnist";  // fashion-mnist | mnist | cifar10 | cifar100 | folder | synthetic
  std::string data_dir;                   // empty: the data set's default location
  int64_t epochs = 1;
  int64_t batch_size = 128;
  double lr = 0.1;
  double momentum = 0.9;
  double weight_decay = 5e-4;
  bool nesterov = false;
  std::string schedule = "cosine";        // cosine | step | constant
  int64_t warmup_epochs = 0;
  int64_t step_epochs = 30;               // step schedule: decay every N epochs by 0.1
  double label_smoothing = 0.0;
  uint64_t seed = 0;
  int64_t threads = 2;
  std::string device = "cpu";             // cpu | cuda | cuda:N (model, batches, activations and updates there)
  std::string policy = "exact";
  std::vector<std::string> policy_rules;  // "pattern=policy"
  bool augment = true;                    // the data set's standard training augmentation
  int64_t steps_per_epoch = 0;            // 0: full epochs; N: stop each epoch after N steps
  int64_t train_limit = 0;                // 0: all training samples; N: the first N
  int64_t test_limit = 0;                 // 0: the whole test split; N: the first N
  std::string log_file;                   // .csv or .jsonl; one row per epoch
  std::string memory_report;              // per-layer saved-tensor table of the first step (.csv or .json)
  std::string summary_json;               // the final summary as one JSON object (written atomically at the end)
  bool overwrite = false;                 // allow replacing existing log / report files
  int64_t print_every = 0;                // 0: about 10 progress lines per epoch
  int64_t synthetic_size = 2048;          // synthetic data set: training samples (test: a quarter)
  int64_t image_size = 32;                // folder data set: images are resized/cropped to this
  int64_t image_channels = 3;             // folder data set: 1 (grey) or 3 (RGB)
  double test_fraction = 0.2;             // folder data set without train/ and test/: held-out share
  bool cifar100_coarse = false;           // cifar100: the 20 coarse labels instead of the 100 fine ones
  bool quiet = false;
  std::string save_dir;                   // last.safetensors every epoch, best.safetensors on a new best
  std::string resume;                     // checkpoint to continue from (model, data set, batch, seed must match)
  bool eval_only = false;                 // with resume: evaluate the checkpoint, no training
  bool summary_only = false;              // print the model's layer table and return
  int64_t stop_after_steps = 0;           // tests: behave as on SIGINT after this many global steps
  // A NaN or infinity in the loss or in a gradient is caught before the optimizer step, so the
  // weights are still the last good ones. "stop": save them (save_dir/last.safetensors, mid-epoch
  // state) and fail naming the step and the first layer affected; "skip-step": drop the update,
  // count it, and stop as "stop" does after kMaxConsecutiveSkips non-finite steps in a row.
  std::string on_nonfinite = "stop";
  bool check_memory = false;              // MemoryCheck (train/guards.h) after every step
  // A cap on the live bytes the allocator hands out on the run's device ("" none; "2GiB", "512MiB"):
  // past it an allocation throws OutOfMemory, as on a smaller GPU. Finds the batch that fits.
  std::string memory_limit;
  // Test hooks, not configuration keys (actlab-train sets them from the environment variables
  // ACTLAB_INJECT_NAN_STEP, ACTLAB_INJECT_NAN_COUNT, ACTLAB_INJECT_NAN_INTO): make the input batch
  // ("input") or the last parameter's gradient ("grad") hold a NaN at the 1-based global steps
  // [inject_nan_step, inject_nan_step + inject_nan_count); 0: never.
  int64_t inject_nan_step = 0;
  int64_t inject_nan_count = 1;
  std::string inject_nan_into = "input";
};

// --on-nonfinite=skip-step gives up after this many non-finite steps in a row.
constexpr int64_t kMaxConsecutiveSkips = 10;

// Checks every field (and that output files may be written) before anything runs.
void validate(const TrainConfig& config);

struct EpochRow {
  int64_t epoch = 0;
  double lr = 0, train_loss = 0, train_acc = 0, test_loss = 0, test_acc = 0;
  double img_per_s = 0;            // median over the epoch's steps (first step of the run excluded)
  int64_t peak_bytes = 0;          // allocator peak over the epoch's training steps (all tags)
  int64_t activation_bytes = 0;    // reference §5 measure, last step of the epoch
  double wall_s = 0;
};

struct TrainSummary {
  std::vector<EpochRow> epochs;
  double final_test_acc = 0;
  double median_img_per_s = 0;
  int64_t peak_bytes = 0;
  int64_t reserved_peak_bytes = 0;  // bytes held from the system at most (live + cached blocks; >= peak)
  int64_t activation_bytes = 0;     // allocator bytes after forward+loss minus before, minus logits/loss
  int64_t saved_raw_bytes = 0;      // f32 bytes offered to the policy in one step (lossy saves)
  int64_t saved_packed_bytes = 0;   // what the policy kept of them
  int64_t saved_expected_bytes = 0; // the closed form for the same tensors
  int64_t steps = 0;
  double wall_s = 0;
  std::string data_note;            // e.g. "fashion-mnist from /usr/share/datasets/fashion-mnist"
  double final_test_loss = 0;
  double best_test_acc = -1;        // over the whole run, resumed epochs included (-1: none)
  // Set when the run stopped early (a signal, or stop_after_steps): the signal (0 for the test hook),
  // where it stopped (1-based epoch, steps done in it) and the checkpoint written ("" without save_dir).
  bool interrupted = false;
  int stop_signal = 0;
  int64_t stop_epoch = 0, stop_step = 0;
  std::string stop_checkpoint;
  int64_t skipped_steps = 0;        // --on-nonfinite=skip-step: updates dropped in this process
  std::string memory_check;         // --check-memory: the verdict line (empty when not checked)
};

// Loads the train/test splits named by the config (or throws Error saying what is missing and how to
// get it). In train/data_splits.cpp.
struct DataSplits {
  std::shared_ptr<Dataset> train, test;
  std::string note;
  std::string family;                 // normalization / augmentation family ("cifar10", ...)
  TransformConfig train_transforms;   // the family's standard training augmentation + normalization
  TransformConfig test_transforms;    // normalization only
};
DataSplits load_data(const TrainConfig& config);

// Runs the whole job, printing progress to stdout unless config.quiet. With resume it first restores
// the checkpoint (parameters, BN statistics, momentum, loop position, running sums) and continues
// where it stopped, producing bit-identical weights to an uninterrupted run on CPU at a fixed thread
// count. A stop request (signal or stop_after_steps) ends the run after the current step, writes
// save_dir/last.safetensors (mid-epoch state included) and returns with summary.interrupted set.
TrainSummary train(const TrainConfig& config);

// SIGINT/SIGTERM handlers that only record the signal (the trainer polls once per step); the second
// signal of a kind gets the default action, so a second Ctrl-C ends the process at once.
void install_stop_handlers();
int stop_signal();               // 0, or the signal number received
void request_stop(int signal);   // as if `signal` had arrived; 0 clears a request

// Activation memory of one training step as the reference measures it (§5), for a model on a given
// input, with the policies in force. Used by the trainer and the memory tables.
struct StepMemory {
  int64_t activation_bytes = 0;  // live after forward+loss − live before the batch − logits − loss
  int64_t peak_bytes = 0;        // allocator peak during the step (excluding data-loader bytes)
  int64_t base_bytes = 0;        // live before the step (parameters, gradients, optimizer state)
};

std::string format_bytes(int64_t bytes);  // "45.21 MiB"

}  // namespace actlab
