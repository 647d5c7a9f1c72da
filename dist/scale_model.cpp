// The data-parallel step model (dist/scale_model.h).
#include "actlab/dist/scale_model.h"

#include <algorithm>

#include "actlab/core/error.h"
#include "actlab/dist/reducer.h"

namespace actlab {

double ring_allreduce_seconds(double bytes, int64_t ranks, const RingLink& link) {
  ACTLAB_CHECK(ranks >= 1 && bytes >= 0 && link.bytes_per_s > 0 && link.latency_s >= 0,
               "ring_allreduce_seconds: ranks >= 1, bytes >= 0, bandwidth > 0 and latency >= 0, got ", ranks, ", ",
               bytes, ", ", link.bytes_per_s, ", ", link.latency_s);
  if (ranks == 1) return 0.0;
  // Reduce-scatter then all-gather: 2(N−1) steps, each moving one N-th of the buffer.
  const double steps = 2.0 * static_cast<double>(ranks - 1);
  return steps / static_cast<double>(ranks) * bytes / link.bytes_per_s + steps * link.latency_s;
}

StepPrediction predict_step(const std::vector<ParamCost>& params, const StepInputs& in, int64_t ranks,
                            const RingLink& link) {
  ACTLAB_CHECK(ranks >= 1, "predict_step: ranks must be >= 1, got ", ranks);
  ACTLAB_CHECK(in.compute_s >= 0, "predict_step: compute time must be >= 0, got ", in.compute_s);
  ACTLAB_CHECK(in.backward_share > 0 && in.backward_share <= 1, "predict_step: backward share must be in (0, 1], got ",
               in.backward_share);
  std::vector<int64_t> bytes;
  for (const ParamCost& p : params) {
    ACTLAB_CHECK(p.bytes >= 0 && p.ready >= 0 && p.ready <= 1, "predict_step: a parameter has ", p.bytes,
                 " bytes and ready share ", p.ready);
    bytes.push_back(p.bytes);
  }
  StepPrediction out;
  out.compute_s = in.compute_s;
  if (params.empty()) return out;
  const auto buckets = assign_buckets(bytes, in.bucket_cap_bytes, in.bucket_tail_bytes);
  out.buckets = static_cast<int64_t>(buckets.size());
  const double backward_start = (1.0 - in.backward_share) * in.compute_s;
  const double backward_s = in.backward_share * in.compute_s;
  double busy_until = 0;  // the communication channel: all-reduces one after another, in bucket order
  for (const auto& bucket : buckets) {
    double ready = 0;
    int64_t n = 0;
    for (size_t i : bucket) {
      ready = std::max(ready, params[i].ready);
      n += params[i].bytes;
    }
    const double cost = ring_allreduce_seconds(static_cast<double>(n), ranks, link);
    busy_until = std::max(busy_until, backward_start + ready * backward_s) + cost;
    out.comm_s += cost;
  }
  out.exposed_s = std::max(0.0, busy_until - in.compute_s);
  return out;
}

}  // namespace actlab
