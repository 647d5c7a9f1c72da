// The training job behind actlab-train: data, model, policy, SGD + schedule, per-step progress,
// per-epoch evaluation and log rows, memory by the one measure of train/step.h, checkpoints (save,
// exact resume, stop on SIGINT/SIGTERM), the non-finite and memory guards (train/guards.h) and a final
// summary. Tested in tests/test_train.cpp (end to end), tests/test_checkpoint.cpp (checkpoints, resume)
// and tests/test_reliability.cpp (guards).
#pragma once
#include "actlab/train/config.h"
#include "actlab/train/data_splits.h"
#include "actlab/train/stop.h"
#include "actlab/train/summary.h"

namespace actlab {

// Runs the whole job, printing progress to stdout unless config.quiet. With resume it first restores
// the checkpoint (parameters, BN statistics, momentum, loop position, running sums) and continues
// where it stopped, producing bit-identical weights to an uninterrupted run on CPU at a fixed thread
// count. A stop request (signal or stop_after_steps) ends the run after the current step, writes
// save_dir/last.safetensors (mid-epoch state included) and returns with summary.interrupted set.
TrainSummary train(const TrainConfig& config);

}  // namespace actlab
