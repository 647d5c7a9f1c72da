// Run guards of the trainer (train/trainer.cpp): the non-finite checks behind --on-nonfinite (a
// gradient scan after backward, a diagnostic forward that names the first layer with a non-finite
// output), the snapshot of the model's buffers that lets a bad step be undone, and the per-step
// memory check behind --check-memory. Tested in tests/test_reliability.cpp and tests/cli/nonfinite.sh.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "actlab/core/allocator.h"
#include "actlab/layers/module.h"

namespace actlab {

// True when every element of `t` (f32, any device, any strides) is finite. One pass over the data;
// CPU tensors are scanned in place, others through a host copy.
bool all_finite(const Tensor& t);

// Gradients of `model`'s parameters that hold a NaN or an infinity, in named_parameters() order
// (roughly forward order, so the last one is the nearest the loss). Parameters without a gradient
// are skipped. Cost: one pass over all gradients, a few tenths of a percent of a training step.
std::vector<std::string> nonfinite_gradients(const Module& model);

// What locate_nonfinite_forward says when the batch itself holds a NaN or an infinity.
inline constexpr const char* kNonfiniteInputBatch = "in the input batch";

// Re-runs model's forward on `images` (no tape, same train/eval mode) with a forward observer and
// says where the first non-finite value appears: kNonfiniteInputBatch, "first in layer 'conv1'
// (Conv2d) output", or "" when every output is finite (then the loss itself overflowed). Changes
// the model's buffers like any training-mode forward: snapshot and restore them around it.
std::string locate_nonfinite_forward(Module& model, const Tensor& images);

// Copies of a model's buffers (batch-norm running statistics), saved before each forward so a step
// that turned out non-finite can be undone: the forward has already folded the bad batch statistics
// into the running ones. Held under MemTag::Other (the size of the buffers, e.g. 11 KiB for ResNet-20).
class BufferSnapshot {
 public:
  explicit BufferSnapshot(const Module& model);
  void save();     // buffers -> copies
  void restore();  // copies -> buffers
 private:
  std::vector<Tensor> live_, copy_;
};

// --check-memory: live bytes per allocator tag must come back to the same value after every
// training step (the value after the first step: parameters, gradients, momentum), and no tag's
// per-step peak may exceed its largest peak over the first `warmup_steps` steps. The data tag is
// not checked: the loader's prefetch thread fills and drains its queue on its own schedule; on a GPU
// neither is the workspace tag (cuDNN/cuBLAS workspaces grow when a new shape needs more).
// The step window is one reset_peak() interval; epoch_peak() gives the joint peak over all windows
// since the last call, so the epoch's peak figure survives the per-step resets.
class MemoryCheck {
 public:
  explicit MemoryCheck(Device device = Device::cpu(), int64_t warmup_steps = 3)
      : device_(device), warmup_steps_(warmup_steps) {}
  void start_step();
  // Throws Error naming the step (`where`, e.g. "epoch 1 step 12 (global step 12)") and the tag.
  void end_step(const std::string& where);
  int64_t epoch_peak();
  int64_t steps_checked() const { return steps_; }
  int64_t baseline_bytes() const;  // live bytes after a step, all checked tags together
  std::string verdict() const;     // "memory check: live bytes back to 1.25 MiB after every step, peak stable (N steps)"
 private:
  Device device_;
  int64_t warmup_steps_;
  int64_t steps_ = 0;
  int64_t joint_peak_ = 0;
  std::array<int64_t, kNumMemTags> baseline_{}, warmup_peak_{};
};

}  // namespace actlab
