// A cost model of data-parallel training on many ranks (docs/scale-out.md): one rank's step is its own
// compute time plus whatever part of its gradient all-reduces backward could not hide. The gradients are
// bucketed exactly as GradReducer buckets them (assign_buckets, tapered tail included); each bucket's
// all-reduce starts once backward has produced all its gradients — a moment taken from the share of
// backward's multiply-accumulates done by then — and the all-reduces run one after another, each costing
// what a ring all-reduce costs: 2(N−1)/N · bytes / bandwidth + 2(N−1) · latency. What it leaves out is
// said in docs/scale-out.md (stragglers, a tree or hierarchical all-reduce, communication stealing compute
// on shared cores). Tested in tests/test_dist.cpp; bench/bench_scale.cpp prints its tables.
#pragma once
#include <cstdint>
#include <vector>

namespace actlab {

// One rank's link in the ring.
struct RingLink {
  double bytes_per_s = 12.5e9;  // 100 Gb/s
  double latency_s = 5e-6;      // per ring step (one message)
};

// Seconds of one ring all-reduce of `bytes` over `ranks` (0 for one rank).
double ring_allreduce_seconds(double bytes, int64_t ranks, const RingLink& link);

// One parameter, in registration order: its gradient bytes and the share of backward (0..1) done when
// its gradient is final (its layer's backward has run: backward goes from the last layer to the first).
struct ParamCost {
  int64_t bytes = 0;
  double ready = 1.0;
};

struct StepInputs {
  double compute_s = 0;                // one rank's step with no communication: forward, backward, update
  double backward_share = 2.0 / 3.0;   // of compute_s: backward, the window the all-reduces can hide in
  int64_t bucket_cap_bytes = int64_t{25} << 20;  // --bucket-mib
  int64_t bucket_tail_bytes = int64_t{1} << 20;  // --bucket-tail-mib (0: fixed buckets)
};

struct StepPrediction {
  double compute_s = 0;
  double comm_s = 0;     // the all-reduces' own time, summed
  double exposed_s = 0;  // how far the last all-reduce runs past the end of backward
  int64_t buckets = 0;
  double step_s() const { return compute_s + exposed_s; }
  double efficiency() const { return step_s() > 0 ? compute_s / step_s() : 0; }  // against no communication
  double hidden_fraction() const { return comm_s > 0 ? 1.0 - exposed_s / comm_s : 1.0; }
};

// The step of one rank among `ranks`, for a model with these parameters (registration order). Throws
// Error for ranks < 1, compute_s < 0, a backward share outside (0, 1], a ready share outside [0, 1] or
// negative bytes.
StepPrediction predict_step(const std::vector<ParamCost>& params, const StepInputs& in, int64_t ranks,
                            const RingLink& link);

}  // namespace actlab
