// TrainConfig: everything a training run is configured by (the option table of train/config_file.cpp
// gives each field its key, help and text form), and validate(), the range and combination checks run
// before anything starts. Tested in tests/test_train.cpp and tests/test_config_file.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "actlab/layers/optim/optimizer_names.h"

namespace actlab {

struct TrainConfig {
  std::string model = "resnet20";
  std::string dataset = "fashion-mnist";  // fashion-mnist | mnist | cifar10 | cifar100 | folder | synthetic
  std::string data_dir;                   // empty: the data set's default location
  int64_t epochs = 1;
  int64_t batch_size = 128;
  double lr = 0.1;
  std::string optimizer = kSgdName;       // sgd | adamw (layers/optim/)
  double momentum = 0.9;                  // SGD
  double weight_decay = 5e-4;             // SGD: added to the gradient; AdamW: decoupled
  bool nesterov = false;                  // SGD
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;  // AdamW
  bool no_decay_norm_bias = false;        // decays_but_norms_biases_embeddings (layers/optim/optimizer.h)
  std::string schedule = "cosine";        // cosine | step | constant
  int64_t warmup_epochs = 0;
  int64_t step_epochs = 30;               // step schedule: decay every N epochs by 0.1
  double label_smoothing = 0.0;
  double drop_path = -1;                  // ModelSpec::drop_path: -1 is the model's own rate (check_drop_path)
  uint64_t seed = 0;
  int64_t threads = 2;
  std::string device = "cpu";             // cpu | cuda | cuda:N (model, batches, activations and updates there)
  // GPU math (cuda::MathOptions in core/cuda/conv.h): cuDNN's algorithms timed per shape, only its
  // deterministic algorithms, TF32 tensor cores for fp32. CPU runs are deterministic and have no TF32.
  bool cudnn_benchmark = false, deterministic = false, tf32 = false;
  std::string policy = "exact";
  std::vector<std::string> policy_rules;  // "pattern=policy"
  std::string precision = "fp32";         // fp32 | bf16 | fp16: what convolutions compute in (core/precision.h)
  // Loss scaling (layers/optim/loss_scale.h): none | dynamic[:init=S,interval=N] | S; "auto": dynamic
  // under fp16, none otherwise.
  std::string loss_scale = "auto";
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
  // Folder data set: decode each image when a batch needs it (data/image_stream.h) instead of all up
  // front; training crops are then RandomResizedCrop + flip.
  bool stream = false;
  // Threads that assemble batches (read, decode, transform); 0: auto (default_data_workers).
  int64_t data_workers = 0;
  bool cifar100_coarse = false;           // cifar100: the 20 coarse labels instead of the 100 fine ones
  bool quiet = false;
  std::string save_dir;                   // last.safetensors every epoch, best.safetensors on a new best
  std::string resume;                     // checkpoint to continue from (model, data set and its identity, batch, seed must match)
  std::string config_path;                // the --config file this configuration was read from (an input: no output may name it)
  // What the lead rank says as the resume starts: the first run's outputs a branch leaves alone (set by
  // apps/actlab-train.cpp, which decides it before the ranks are known).
  std::string resume_note;
  bool eval_only = false;                 // with resume or init_weights: evaluate those weights, no training
  // A plain state dict (train/checkpoint.h) to start a new run from: weights of another program or an
  // export of actlab's, checked name by name. Not with resume.
  std::string init_weights;
  // Where to write the final weights as a plain state dict, for PyTorch's load_state_dict(strict=True).
  std::string export_weights;
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
  // Data-parallel training (docs/distributed.md): launched by mpirun, one process per rank. batch_size
  // is per rank (the global batch is batch_size x ranks), each rank reads its shard of every epoch.
  bool distributed = false;
  double bucket_mib = 25;                 // gradients per all-reduce bucket, MiB
  double bucket_tail_mib = 1;             // the last buckets taper to this size (dist/reducer.h); 0: no taper
  double dist_timeout = 300;              // seconds a collective may take before the run gives up
  bool sync_bn = false;                   // batch-norm statistics over the global batch (CPU ranks)
  // Test hooks, not configuration keys (actlab-train sets them from the environment variables
  // ACTLAB_INJECT_NAN_STEP, ACTLAB_INJECT_NAN_COUNT, ACTLAB_INJECT_NAN_INTO): make the input batch
  // ("input") or the last parameter's gradient ("grad") hold a NaN at the 1-based global steps
  // [inject_nan_step, inject_nan_step + inject_nan_count), or ("eval") the first test batch of the
  // evaluations after those 1-based epochs; 0: never.
  int64_t inject_nan_step = 0;
  int64_t inject_nan_count = 1;
  std::string inject_nan_into = "input";
};

// --on-nonfinite=skip-step gives up after this many non-finite steps in a row.
constexpr int64_t kMaxConsecutiveSkips = 10;

// Checks every field (and that output files may be written) before anything runs.
void validate(const TrainConfig& config);

}  // namespace actlab
