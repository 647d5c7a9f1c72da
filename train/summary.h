// What a training run reports: one row per epoch and the run's summary (the log, the summary JSON and
// the closing lines are written from these by train/logging.h), and the byte formatting they share.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace actlab {

struct EpochRow {
  int64_t epoch = 0;
  double lr = 0, train_loss = 0, train_acc = 0, test_loss = 0, test_acc = 0;
  double img_per_s = 0;            // median over the epoch's steps (first step of the run excluded; NaN if none)
  int64_t peak_bytes = 0;          // allocator peak over the epoch's training steps (all tags)
  int64_t activation_bytes = 0;    // the activation measure (docs/measures.md), last step of the epoch
  double wall_s = 0;
  double acgc_bits = -1;           // acgc's average width over its saves' last packs (-1: no acgc policy)
};

struct TrainSummary {
  std::vector<EpochRow> epochs;
  int64_t epochs_before = 0;  // epochs a resumed run's checkpoint had done: epochs_done() counts them too
  int64_t epochs_done() const { return epochs_before + static_cast<int64_t>(epochs.size()); }
  double final_test_acc = 0;
  double median_img_per_s = 0;
  int64_t peak_bytes = 0;
  int64_t reserved_peak_bytes = 0;  // bytes held from the system at most (live + cached blocks; >= peak)
  // The memory of one step, the last good one (docs/measures.md): the saves are a part of its activation memory.
  int64_t activation_bytes = 0;     // allocator bytes after forward+loss minus before, minus logits/loss
  int64_t saved_raw_bytes = 0;      // f32 bytes offered to the policy (lossy saves)
  int64_t saved_packed_bytes = 0;   // what the policy kept of them
  int64_t saved_expected_bytes = 0; // the closed form for the same tensors
  int64_t steps = 0;
  double wall_s = 0;
  std::string data_note;            // e.g. "fashion-mnist from /usr/share/datasets/fashion-mnist"
  int64_t input_channels = 0, input_height = 0, input_width = 0;  // the images the model read
  std::string policy;               // the policy set with its rules, as the run's header prints it
  double final_test_loss = 0;
  double best_test_acc = -1;        // over the whole run, resumed epochs included (-1: none)
  // Set when the run stopped early (a signal, or stop_after_steps): the signal (0 for the test hook),
  // where it stopped (1-based epoch, steps done in it) and the checkpoint written ("" without save_dir).
  bool interrupted = false;
  int stop_signal = 0;
  int64_t stop_epoch = 0, stop_step = 0;
  std::string stop_checkpoint;
  int64_t skipped_steps = 0;        // --on-nonfinite=skip-step: updates dropped in this process
  // Set when the run stopped on non-finite values (--on-nonfinite): its error line. The summary file is
  // then written before the error, so a grid can tell a run that diverged from one that failed.
  std::string diverged;
  // --loss-scale: the scale at the end ("none": 1) and the updates this process skipped for an overflow.
  double loss_scale = 1;
  int64_t overflow_skips = 0;
  // --distributed: ranks, and the gradient all-reduces' time over the run: their own time, the CPU time
  // they cost this rank's host threads, and the part the training thread waited for (the rest ran behind
  // backward). median_img_per_s is per rank.
  int64_t world_size = 1;
  int rank = 0;                     // this process's rank; the others leave the closing lines to rank 0
  double comm_s = 0, comm_exposed_s = 0, comm_cpu_s = 0;
  std::string memory_check;         // --check-memory: the verdict line (empty when not checked)
};

std::string format_bytes(int64_t bytes);  // "45.21 MiB"

}  // namespace actlab
