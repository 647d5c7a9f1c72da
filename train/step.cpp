// One training step and the activation measure (train/step.h).
#include "actlab/train/step.h"

#include <utility>

#include "actlab/autograd/checkpoint.h"
#include "actlab/autograd/functions.h"
#include "actlab/autograd/tape.h"
#include "actlab/layers/checkpoint.h"
#include "actlab/models/registry.h"

namespace actlab {

int64_t activation_measure_live(const MemoryStats& s) {
  return s.total.current - s[MemTag::Data].current - s[MemTag::Workspace].current - s[MemTag::Offloaded].current;
}

std::string RunEntry::label() const {
  return precision == Precision::F32 ? policy : policy + "@" + precision_name(precision);
}

RunEntry parse_run_entry(const std::string& entry, Precision fallback) {
  const size_t at = entry.rfind('@');
  if (at == std::string::npos) return {entry, fallback};
  return {entry.substr(0, at), parse_precision(entry.substr(at + 1))};
}

std::vector<RunEntry> parse_run_entries(const std::vector<std::string>& entries, Precision fallback, Device device) {
  std::vector<RunEntry> out;
  for (const auto& e : entries) {
    out.push_back(parse_run_entry(e, fallback));
    parse_policy_set(out.back().policy);
    check_precision_supported(out.back().precision, device);
  }
  return out;
}

void check_run_grid(const std::vector<std::string>& models, const std::vector<RunEntry>& entries,
                    int64_t in_channels, int64_t num_classes, int64_t image_size) {
  check_models(models, in_channels, num_classes, image_size);
  std::vector<std::pair<const RunEntry*, CheckpointRequest>> requests;
  for (const RunEntry& e : entries) {
    const CheckpointRequest request = parse_policy_set(e.policy).checkpoint();
    if (request.any()) requests.emplace_back(&e, request);
  }
  if (requests.empty()) return;  // no model is built twice for a grid that checkpoints nothing
  for (const std::string& name : models) {
    const std::shared_ptr<Module> model = make_model({name, in_channels, num_classes, image_size});
    for (const auto& [entry, request] : requests) {
      try {
        make_checkpoint_plan(*model, request);
      } catch (const Error& e) {
        throw Error("policy '" + entry->label() + "' cannot run on " + name + ": " + e.message(), e.where());
      }
    }
  }
}

StepResult run_step(Module& model, Optimizer* opt, const PolicySet& policies, const Tensor& images, const Tensor& labels,
                    const StepOptions& o) {
  StepResult r;
  const Device device = images.device();
  CacheStats& cache = CacheStats::global();
  const bool was_recording = cache.enabled();
  if (o.record_saves) {
    cache.reset();
    cache.set_enabled(true);
  }
  struct RestoreRecording {
    CacheStats& cache;
    bool on, active;
    ~RestoreRecording() {
      if (active) cache.set_enabled(on);
    }
  } restore{cache, was_recording, o.record_saves};
  TapeClearOnError clear_on_error;  // a step that throws (bad labels, out of memory) leaves no saves on the tape

  const MemoryStats before = memory_stats(device);
  const int64_t before_offloaded = memory_stats()[MemTag::Offloaded].current;
  r.total_before = before.total.current;
  Variable logits, loss;
  const CheckpointPlan plan = make_checkpoint_plan(model, policies.checkpoint());
  reset_recompute_stats();
  {
    ActivationCacheScope scope(policies);
    CheckpointScope checkpoints(plan);
    MemTagScope tag(MemTag::Activation);
    logits = model(Variable(images));
    loss = cross_entropy(logits, labels, o.label_smoothing);
  }
  const MemoryStats after_forward = memory_stats(device);
  r.total_after_forward = after_forward.total.current;
  r.activation_bytes = activation_measure_live(after_forward) - activation_measure_live(before) -
                       static_cast<int64_t>(logits.data().nbytes()) - static_cast<int64_t>(loss.data().nbytes()) +
                       static_cast<int64_t>(images.nbytes());
  // Host stats: on a GPU run the device's do not hold them.
  r.offloaded_bytes = memory_stats()[MemTag::Offloaded].current - before_offloaded;
  r.loss = loss.data().item();
  if (o.after_forward && !o.after_forward(r.loss)) {
    logits = loss = Variable();
    Tape::current().clear();
    r.memory = memory_stats(device);
    r.total_after_step = r.memory.total.current;
    return r;
  }
  r.correct = count_correct(logits.data(), labels);
  logits = Variable();
  if (opt) opt->zero_grad();
  {
    MemTagScope tag(MemTag::Activation);
    backward(loss, o.loss_scale == 1 ? Tensor()
                                     : Tensor::full(loss.shape(), static_cast<float>(o.loss_scale)).to(loss.data().device()));
  }
  loss = Variable();
  r.backward_done = true;
  if (opt && (!o.before_update || o.before_update())) {
    opt->step();
    r.updated = true;
  }
  r.memory = memory_stats(device);
  r.total_after_step = r.memory.total.current;
  const RecomputeStats recompute = recompute_stats();
  r.recompute_seconds = recompute.seconds;
  r.recomputed_segments = recompute.segments;
  if (o.record_saves) {
    r.saves = cache.entries();
    for (const auto& e : r.saves) {
      if (!e.lossy) continue;
      r.saved.raw += e.bytes_raw;
      r.saved.packed += e.bytes_packed;
      r.saved.expected += e.bytes_expected;
    }
  }
  return r;
}

}  // namespace actlab
