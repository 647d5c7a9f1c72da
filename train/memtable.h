// One training step's memory on random data, by the activation measure of train/step.h
// (docs/measures.md): the model × batch × policy grid behind actlab-memtable (the shape of the paper's
// Table 1(a)).
// Tested in tests/test_step.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "actlab/core/precision.h"
#include "actlab/core/tensor.h"

namespace actlab {

struct StepMemoryConfig {
  std::string model = "resnet18";
  int64_t batch = 128;
  int64_t in_channels = 3;
  int64_t image_size = 32;
  int64_t num_classes = 10;
  std::string policy = "exact";
  Precision precision = Precision::F32;  // the step's compute precision (docs/precision.md)
  uint64_t seed = 0;
};

// The saves of one step summed by what they are ("linear.input", "softmax.output", "layer_norm.normalized",
// "conv2d.input", "relu.mask", ...): the per-layer-type view of the memory report.
struct SaveKindBytes {
  std::string op;       // CacheEntryStats::op
  bool lossy = false;   // offered to the policy
  int64_t raw = 0;      // bytes of the tensors saved
  int64_t packed = 0;   // bytes kept (shared packs counted once)
};

struct StepMemoryResult {
  int64_t model_only_bytes = 0;       // parameters + buffers (+ gradient buffers once allocated)
  int64_t activation_bytes = 0;       // StepResult::activation_bytes (docs/measures.md)
  int64_t total_bytes = 0;            // live before backward + what the step added after it (docs/measures.md)
  int64_t peak_bytes = 0;             // the allocator's peak over the step (all tags; on a CPU run, swap's host copies too)
  int64_t offloaded_bytes = 0;        // swap: the saves' host copies after forward (not in total_bytes)
  int64_t saved_raw_bytes = 0;        // f32 bytes offered to the policy (conv/linear/BN inputs)
  int64_t saved_packed_bytes = 0;     // what the policy kept of them
  int64_t saved_expected_bytes = 0;   // the closed form for the same tensors
  double step_seconds = 0;
  double recompute_seconds = 0;        // checkpointing: backward's re-run forwards (StepResult)
  int64_t recomputed_segments = 0;
  std::vector<SaveKindBytes> by_kind;  // in the order each kind first appears in the step
};

// The cell's random batch: N(0, 1) images and uniform labels drawn from Philox (seed, 77), under
// MemTag::Data (so the activation measure counts the images once, as the input batch).
void random_batch(const StepMemoryConfig& config, Tensor* images, Tensor* labels);

// Builds the model, runs one forward + loss + backward + SGD step on random data with the policy in
// force, and measures. Everything it allocates is freed before it returns.
StepMemoryResult measure_step_memory(const StepMemoryConfig& config);

}  // namespace actlab
