// What the training loop needs of data-parallel training (docs/distributed.md), in one place: opening
// the communicator a run asks for (MPI for CPU ranks, NCCL bootstrapped over MPI for GPU ranks), the
// collective decisions every rank must take together (stop, skip a non-finite step), per-rank figures
// gathered for rank 0's report, and rank 0's weights broadcast to all. Tested through mpirun by
// tests/test_dist.cpp and tests/cli/dist_fault.sh.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "actlab/core/device.h"
#include "actlab/dist/communicator.h"
#include "actlab/layers/layers.h"
#include "actlab/layers/module.h"
#include "actlab/train/config.h"

namespace actlab {

class DistRun {
 public:
  DistRun() = default;  // not distributed: one rank, every collective a no-op
  // Opens the communicator of `config` (MPI_Init happens here) for a run on `device` (host tensors:
  // MPI; a GPU: NCCL, on cuda:<local rank> when config.device is a plain "cuda"). Throws Error in a
  // build without MPI or NCCL.
  DistRun(const TrainConfig& config, Device device);
  Device device() const { return device_; }  // where this rank trains

  bool on() const { return comm_ != nullptr; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  bool lead() const { return rank_ == 0; }  // writes logs, checkpoints, reports; prints progress
  Communicator* comm() const { return comm_.get(); }
  // "rank 1 of 2: " when distributed, "" otherwise: the prefix of this rank's error lines.
  std::string who() const;

  // Refuses, on every rank at once, a job whose ranks were launched with different configurations (an
  // MPMD command line, a script's per-rank variable): they would train on overlapping shards, at different
  // rates, or stop at different steps and leave the others waiting in a collective. Compares every option
  // but those that place a rank and rank 0's outputs (is_placement_or_output_key), and whether the run
  // resumes, evaluates or prints its summary. Collective; a no-op when not distributed.
  void check_same_config(const TrainConfig& config) const;
  // Error on every rank unless all read the data set rank 0 reads (load_data's identity: sizes, classes, a
  // folder's files), checked before the first step: other sizes shard into other step counts, and the job
  // ended in an MPI abort. Collective; a no-op when not distributed.
  void check_same_data(const std::string& identity) const;
  // The ranks on which `flag` is true, in order (empty: none). Collective: every rank calls it.
  std::vector<int> ranks_with(bool flag) const;
  // Every rank's `value`, by rank (just {value} when not distributed). Collective.
  std::vector<double> gather(double value) const;
  // Element-wise sums over the ranks, in place. Collective.
  void sum(std::vector<double>& values) const;
  // Rank 0's parameters and buffers into every rank's model (through host copies). Collective.
  void broadcast_model(Module& model) const;
  // Rank 0's buffers alone (batch norm's running statistics, which each rank updates from its own batches
  // without --sync-bn): before an evaluation, whose shards would otherwise be scored with statistics the
  // checkpoint (rank 0's) does not hold. Collective.
  void broadcast_buffers(Module& model) const;
  // This rank is failing: end the whole job at exit rather than leave the others waiting.
  void fail_job() const;
  // What --sync-bn makes every BatchNorm2d run in training (dist/sync_batch_norm.h over comm()).
  BatchNormTrainFn sync_bn() const;

 private:
  void broadcast(Tensor t) const;  // rank 0's values into t on every rank
  std::string broadcast_text(std::string text) const;  // rank 0's text, on every rank
  std::unique_ptr<Communicator> comm_;
  Device device_ = Device::cpu();
  int rank_ = 0, world_ = 1;
};

// "2 ranks: 1 (0.91 MiB), 0 (0.90 MiB) ... total" style list: the per-rank byte counts with their total.
std::string per_rank_bytes(const std::vector<double>& bytes);

}  // namespace actlab
