// GradReducer: data-parallel gradient averaging with overlap. Parameters are grouped into buckets of
// about --bucket-mib each, in the reverse of their registration order (the order backward produces
// their gradients in); as soon as backward has produced every gradient of a bucket (the tape's
// grad-ready hook), the bucket's all-reduce is started on the communicator, so the transfer runs
// while backward computes the layers below. finish() waits for the rest and leaves each parameter's
// gradient, now the average, as a view of its slot in the bucket's flat buffer: from the second step on
// backward writes gradients straight into the buckets, no copy is made in or out, and the buckets are
// the only gradient memory (PyTorch DDP's gradient_as_bucket_view). Tested in tests/test_dist.cpp.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "actlab/autograd/variable.h"
#include "actlab/dist/communicator.h"

namespace actlab {

// Parameter indices per bucket. Parameters are taken from the last to the first; a bucket is closed
// when the next parameter would take it past its cap, so every bucket holds at most its cap except one
// holding a single parameter larger than it. Every index appears exactly once.
// The cap is cap_bytes, tapered towards the end of backward when 0 < tail_bytes < cap_bytes: a bucket
// opened with R bytes of gradients still to come (its own included) takes at most max(tail_bytes, R/2).
// Why: the last bucket can only start once backward has ended, so nothing hides its all-reduce; with
// 25 MiB buckets alone that was 24.1 of ResNet-18's 42.6 MiB. Halving the tail keeps the number of
// all-reduces near log2(total / tail) + total / cap and leaves at most tail_bytes for after backward
// (one parameter larger than that excepted). docs/distributed.md has the measurement.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<int64_t>& param_bytes, int64_t cap_bytes,
                                                int64_t tail_bytes = 0);

// Communication time, summed over the steps since the last reset.
struct OverlapStats {
  int64_t steps = 0;
  int64_t buckets = 0;           // all-reduces started
  int64_t bytes = 0;             // gradient bytes all-reduced
  double comm_s = 0;             // the all-reduces' own time (communication thread or stream)
  double comm_cpu_s = 0;         // the CPU time they cost this process's host threads (CollectiveWork::cpu_seconds)
  double exposed_s = 0;          // time the training thread waited in finish(): communication not hidden
  // Share of the communication that ran behind backward: 1 - exposed / comm (0 without communication).
  double hidden_fraction() const { return comm_s > 0 ? std::max(0.0, 1.0 - exposed_s / comm_s) : 0.0; }
};

// Where the division by the number of ranks happens. AfterSum: finish() scales each summed bucket,
// a pass over every gradient per step. ThroughSeed: the caller starts backward from seed_factor() = 1/N
// times its usual seed, so each rank's gradients arrive already divided and the sum is the average
// (exactly the same numbers when N is a power of two: the factor only moves exponents); the training
// loop uses this one, the pass is saved.
enum class Averaging { AfterSum, ThroughSeed };

class GradReducer {
 public:
  // params: the model's parameters in registration order (the same on every rank); their gradients and
  // the flat buckets live on the parameters' device, which must be the one `comm` serves.
  // bucket_cap_bytes / bucket_tail_bytes: assign_buckets' cap_bytes / tail_bytes.
  GradReducer(std::vector<Variable> params, Communicator& comm, int64_t bucket_cap_bytes, int64_t bucket_tail_bytes = 0,
              Averaging averaging = Averaging::AfterSum);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Arms the current thread's tape for the next backward: each bucket starts its all-reduce when its
  // last gradient is final. Call before backward; finish() disarms.
  void begin_backward();
  // After backward: buckets not started yet start now (a parameter backward did not reach contributes
  // zeros, as on a rank that did reach it the others must still match), then waits for every bucket and
  // makes each gradient the average over ranks (see Averaging), held in its bucket (the gradient is a
  // view of it).
  void finish();
  // Drops an armed step without communicating (the step was abandoned before backward on every rank).
  void cancel();

  // The factor on backward's seed that Averaging::ThroughSeed needs (1 under AfterSum).
  double seed_factor() const;

  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }
  int64_t bucket_bytes(size_t b) const { return static_cast<int64_t>(flat_.at(b).nbytes()); }
  OverlapStats& stats() { return stats_; }

 private:
  void grad_ready(VariableImpl& leaf);
  void start_bucket(size_t b);

  std::vector<Variable> params_;
  std::unordered_map<const VariableImpl*, size_t> index_of_;
  Communicator& comm_;
  std::vector<std::vector<size_t>> buckets_;
  std::vector<size_t> bucket_of_;      // parameter -> bucket
  std::vector<Tensor> flat_;           // per bucket: (sum of the bucket's numels) f32, MemTag::Grad
  std::vector<int64_t> offset_;        // parameter -> element offset in its bucket's flat buffer
  std::vector<size_t> pending_;        // per bucket: gradients not final yet this step
  std::vector<bool> ready_;            // per parameter, this step
  std::vector<std::unique_ptr<CollectiveWork>> work_;  // per bucket, this step
  size_t next_to_start_ = 0;           // buckets start in index order, the same on every rank
  bool armed_ = false;
  Averaging averaging_;
  OverlapStats stats_;
};

}  // namespace actlab
