// One measured training step on random data.
#include "actlab/train/memtable.h"

#include <algorithm>
#include <chrono>

#include "actlab/autograd/saved_tensor.h"
#include "actlab/compress/policy.h"
#include "actlab/layers/optim/sgd.h"
#include "actlab/models/registry.h"
#include "actlab/train/step.h"

namespace actlab {

void random_batch(const StepMemoryConfig& c, Tensor* images, Tensor* labels) {
  PhiloxStream rng(c.seed, 77);
  MemTagScope tag(MemTag::Data);
  *images = Tensor::randn({c.batch, c.in_channels, c.image_size, c.image_size}, rng);
  *labels = Tensor::empty({c.batch}, DType::I64);
  for (int64_t i = 0; i < c.batch; ++i) labels->data<int64_t>()[i] = static_cast<int64_t>(rng.next_below(c.num_classes));
}

StepMemoryResult measure_step_memory(const StepMemoryConfig& c) {
  ACTLAB_CHECK(c.batch >= 1, "batch must be >= 1, got ", c.batch);
  StepMemoryResult r;
  PolicySet policies = parse_policy_set(c.policy);
  check_precision_supported(c.precision, Device::cpu());
  const PrecisionScope precision(c.precision);
  const int64_t start = memory_stats().total.current;
  seed_init(c.seed);
  set_pack_seed(c.seed);
  std::shared_ptr<Module> model = make_model({c.model, c.in_channels, c.num_classes, c.image_size});
  Sgd opt(model->parameters(), {0.01f, 0.9f, 0.f, 5e-4f, false});
  r.model_only_bytes = memory_stats().total.current - start;

  const auto t0 = std::chrono::steady_clock::now();
  const int64_t init = memory_stats().total.current;  // before the batch: the reference's total counts it
  reset_peak();
  {
    Tensor images, labels;
    random_batch(c, &images, &labels);
    StepOptions so;
    so.record_saves = true;
    const StepResult step = run_step(*model, &opt, policies, images, labels, so);
    policies.check_rules_matched(c.model);
    r.activation_bytes = step.activation_bytes;
    r.saved_raw_bytes = step.saved.raw;
    r.saved_packed_bytes = step.saved.packed;
    r.saved_expected_bytes = step.saved.expected;
    r.recompute_seconds = step.recompute_seconds;
    r.recomputed_segments = step.recomputed_segments;
    for (const CacheEntryStats& e : step.saves) {
      auto it = std::find_if(r.by_kind.begin(), r.by_kind.end(), [&](const SaveKindBytes& k) { return k.op == e.op; });
      if (it == r.by_kind.end()) it = r.by_kind.insert(r.by_kind.end(), SaveKindBytes{e.op, e.lossy, 0, 0});
      it->raw += e.bytes_raw;
      it->packed += e.bytes_packed;
    }
    // The reference's total: what was live before backward plus what the step (batch included) added,
    // on the device: a swap policy's host copies are not device memory (on a CPU run they share the one
    // allocator, so they are taken out here and reported apart).
    r.offloaded_bytes = step.offloaded_bytes;
    r.total_bytes = step.total_after_forward - step.offloaded_bytes + (step.total_after_step - init) - start;
  }
  r.peak_bytes = memory_stats().total.peak - start;
  r.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  end_pack_step();
  return r;
}

}  // namespace actlab
