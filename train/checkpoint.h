// Training checkpoints: the mapping of a model + optimizer + loop position onto the tensors and
// metadata of a safetensors file (io/safetensors.h: the format, its atomic write and checked read).
// Tested in tests/test_checkpoint.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "actlab/core/tensor.h"
#include "actlab/io/safetensors.h"
#include "actlab/layers/module.h"
#include "actlab/layers/optim/optimizer.h"

namespace actlab {

// What the run's epoch log held when a checkpoint was written: its length and the FNV-1a checksum of those
// bytes (hex64), so that a resume can tell the log it continues from another run's log under the same name
// (resumed_log_continues in train/logging.h). bytes 0: no log or an empty one; -1: not recorded (checkpoints
// from before it).
struct LogMark {
  int64_t bytes = -1;
  std::string checksum;
};

// ---- training checkpoints: model parameters and buffers under their torchvision names, the optimizer's
// per-parameter state as "optim.<slot>.<parameter name>" (SGD: optim.momentum.*; AdamW: optim.exp_avg.*,
// optim.exp_avg_sq.*), and the optimizer's name and counters and the loop position as metadata.
struct TrainState {
  std::string model;          // model name (make_model)
  int64_t epoch = 0;          // epochs fully completed
  int64_t step_in_epoch = 0;  // 0: saved at an epoch boundary; k > 0: saved after step k of epoch+1
  int64_t global_step = 0;    // optimizer steps taken in the whole run
  uint64_t pack_step = 0;     // stochastic-rounding stream counter to continue from
  uint64_t seed = 0;
  int64_t optimizer_steps = 0;
  double loss_sum = 0;        // running sums of the unfinished epoch (step_in_epoch > 0)
  int64_t correct = 0, seen = 0;
  double best_acc = -1;       // best test accuracy so far (-1: none evaluated)
  std::string lr_schedule;    // description of the schedule and the rate at global_step
  std::string config_json;    // the full effective run configuration (config_file.h)
  int64_t world_size = 1;     // data-parallel ranks that trained it (1 in checkpoints from before --distributed)
  // The loss scaler's state (layers/optim/loss_scale.h; 1 and 0 in checkpoints from before loss scaling).
  double loss_scale = 1;
  int64_t loss_scale_good_steps = 0;
  std::string data_identity;  // DataSplits::identity of the run's data ("" in checkpoints from before it)
  // Wall seconds the unfinished epoch had run (step_in_epoch > 0; 0 otherwise and in checkpoints from before
  // it), so that a resumed epoch's logged wall time counts the part before the stop.
  double epoch_wall_s = 0;
  LogMark log;  // the epoch log as the checkpoint's own epoch left it (after its row)
};

// Saves model + optimizer + state atomically (write_safetensors).
void save_checkpoint(const std::string& path, const Module& model, Optimizer& opt, const TrainState& state);
// Parses the loop state from a checkpoint's metadata (format version checked).
TrainState checkpoint_state(const SafetensorsFile& file);
// Copies the file's tensors into `model` (parameters and buffers) and `opt` (its state slots, counters
// and step count; opt may be nullptr for evaluation, which ignores the optimizer's part). Every model
// tensor must be present with the same dtype and shape and no other tensor may be, and the file's
// optimizer must be opt's kind (files without the name are SGD's): Error names the first mismatch, and a
// refused file leaves model and optimizer as they were.
void restore_checkpoint(const SafetensorsFile& file, Module& model, Optimizer* opt);

// ---- plain state dicts: weights to and from other programs. The model's parameters and buffers under
// their torchvision names, plus "<module>.num_batches_tracked" (an I64 scalar: PyTorch's batch-norm
// counter, here the optimizer steps taken) for every batch-norm module; no optimizer state and no
// actlab metadata, so PyTorch's model.load_state_dict(safetensors.torch.load_file(path), strict=True)
// takes it. Written atomically (io/safetensors.h).
void export_state_dict(const std::string& path, const Module& model, int64_t batches_tracked);
// Whether `path` is a file export_state_dict wrote ("format": "pt" with write_safetensors' own checksum
// entries; a checkpoint or another program's weights are not): what --export-weights replaces without
// --overwrite.
bool is_exported_state_dict(const std::string& path);
// Copies a plain state dict (written by export_state_dict, or by another program under torchvision names)
// into the model's parameters and buffers. Every tensor of the model must be there with its shape and
// dtype, and the file may hold nothing else (num_batches_tracked entries are read and ignored); otherwise
// one Error names every missing, unexpected and mismatched tensor, and the model is left as it was.
void import_state_dict(const SafetensorsFile& file, Module& model, const std::string& what);

}  // namespace actlab
