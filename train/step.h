// One training step (forward, loss, backward, optimizer update) under a policy set, and the one
// definition of the activation measure that every tool reports (docs/measures.md): the trainer,
// actlab-memtable, bench_train, bench_cuda and the tests all call run_step, so a figure means the same
// thing wherever it is printed. Tested in tests/test_step.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "actlab/compress/policy.h"
#include "actlab/core/allocator.h"
#include "actlab/core/precision.h"
#include "actlab/core/tensor.h"
#include "actlab/layers/module.h"
#include "actlab/layers/optim/optimizer.h"

namespace actlab {

// The bytes the activation measure counts as live: every tag but MemTag::Data (the data loader's
// batches, on the host or copied to the device), MemTag::Workspace (library scratch: cuDNN and
// cuBLAS keep theirs across ops once allocated; CPU workspaces are freed inside each op) and
// MemTag::Offloaded (what a swap policy moved to the host; StepResult::offloaded_bytes).
int64_t activation_measure_live(const MemoryStats& stats);

struct StepOptions {
  float label_smoothing = 0;
  // Reset CacheStats before the forward, record this step's saves and return them in
  // StepResult::saves (the per-module report). The recording state is restored afterwards.
  bool record_saves = false;
  // Called after the forward, before backward, with the loss; false ends the step there: no backward,
  // no update (the trainer's non-finite loss guard, which then diagnoses the forward itself).
  std::function<bool(float loss)> after_forward;
  // backward starts from this gradient of the loss instead of 1: the loss scale (layers/optim/loss_scale.h)
  // times, with ranks, the reducer's 1/N (dist/reducer.h, Averaging::ThroughSeed: the all-reduce's sum
  // takes that back out); before_update then sees gradients still times the loss scale and divides it out.
  double loss_scale = 1;
  // Called after backward, before the update; false skips the update (the non-finite gradient guard).
  std::function<bool()> before_update;
};

// What one step's policies kept of the tensors offered as lossy (conv, linear, batch-norm inputs).
struct SavedBytes {
  int64_t raw = 0;       // f32 bytes offered
  int64_t packed = 0;    // what the policies kept
  int64_t expected = 0;  // the closed form for the same shapes
};

struct StepResult {
  float loss = 0;
  int64_t correct = 0;          // argmax(logits) == label
  bool backward_done = false;   // after_forward said yes
  bool updated = false;         // the optimizer stepped
  // The activation measure: activation_measure_live() after forward + loss, minus before the forward,
  // minus the logits and the loss tensors, plus the input batch (which backward of the first layer
  // needs, and which the paper's measure counts).
  int64_t activation_bytes = 0;
  // All-tag live bytes on the step's device before the forward, after forward + loss, after the step.
  int64_t total_before = 0, total_after_forward = 0, total_after_step = 0;
  MemoryStats memory;           // the device's stats when the step ended (peaks by tag; reset by the caller)
  // Checkpointing (PolicySet::checkpoint): the time backward spent re-running segments' forwards, and how many.
  double recompute_seconds = 0;
  int64_t recomputed_segments = 0;
  // Swap (compress/swap.h): bytes the step's saves kept off the device after forward + loss (host memory).
  int64_t offloaded_bytes = 0;
  SavedBytes saved;             // record_saves: the lossy saves' totals
  std::vector<CacheEntryStats> saves;  // record_saves: every save of the step, per module (unpack times too)
};

// One run of a measuring tool's list (bench_train, actlab-memtable): "POLICY" runs at the tool's precision,
// "POLICY@PRECISION" ("exact@bf16") at its own, so that one list compares fp32 and bf16 side by side.
struct RunEntry {
  std::string policy;   // a policy-set string (parse_policy_set)
  Precision precision;
  std::string label() const;  // the policy, with "@bf16" appended when not fp32
};
// Throws Error for an unknown precision (the policy string is parsed where it is used).
RunEntry parse_run_entry(const std::string& entry, Precision fallback);
// Every entry of a benchmark's or a table's list, parsed and checked up front (its policy set, its precision
// on `device`), so that a typo late in the list fails before the measurements of the earlier ones, not
// after them. Throws Error naming the entry.
std::vector<RunEntry> parse_run_entries(const std::vector<std::string>& entries, Precision fallback, Device device);
// Every (model, entry) cell of such a list checked before any is measured, by the rules the step applies:
// each model builds at this input (check_models) and each entry's checkpoint request applies to each model
// (make_checkpoint_plan: a model with no blocks to cut into segments, a checkpoint rule naming none of its
// modules). Throws Error naming the model and the entry. A codec rule that takes no save is found only by a
// step (PolicySet::check_rules_matched).
void check_run_grid(const std::vector<std::string>& models, const std::vector<RunEntry>& entries,
                    int64_t in_channels, int64_t num_classes, int64_t image_size);

// Runs one step of `model` on (images, labels), both on the model's device, with `policies` in force:
// forward and cross-entropy under MemTag::Activation, then zero_grad, backward and opt->step() (opt may
// be nullptr: no update). Stochastic rounding and dropout draw from the streams the caller set. A step that
// throws leaves nothing on the thread's tape.
// Threads: steps of separate models may run on separate threads at once (the tape, the policy scope and
// the pack streams are per thread) and compute what they compute alone, but the memory figures are not
// theirs: activation_bytes reads the process-wide allocator statistics and record_saves the process-wide
// CacheStats, which another thread's step changes (and resets) under it. Measure one step at a time.
StepResult run_step(Module& model, Optimizer* opt, const PolicySet& policies, const Tensor& images, const Tensor& labels,
                    const StepOptions& options = {});

}  // namespace actlab
