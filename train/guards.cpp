// Non-finite checks, buffer snapshots and the per-step memory check (see train/guards.h).
#include "actlab/train/guards.h"

#include <algorithm>

#include "actlab/autograd/variable.h"
#include "actlab/core/ops.h"
#include "actlab/train/summary.h"  // format_bytes

namespace actlab {
namespace {

// The data tag is the loader's (see MemoryCheck); on a GPU the workspace tag is the cuDNN/cuBLAS
// workspaces, which grow (never shrink) when a new shape, e.g. evaluation's batch, needs more.
bool is_checked(int tag, Device device) {
  return tag != static_cast<int>(MemTag::Data) && !(device.is_cuda() && tag == static_cast<int>(MemTag::Workspace));
}

class FirstNonFinite final : public ForwardObserver {
 public:
  void on_forward(const std::string& path, const Module& module, const Variable& output) override {
    if (!where_.empty() || !output.defined() || output.data().dtype() != DType::F32) return;
    if (!all_finite(output.data())) where_ = "first in layer '" + path + "' (" + module.kind() + ") output";
  }
  const std::string& where() const { return where_; }
 private:
  std::string where_;
};

}  // namespace

bool all_finite(const Tensor& t) {
  ACTLAB_CHECK(t.dtype() == DType::F32, "all_finite: f32 only, got ", dtype_name(t.dtype()));
  if (t.numel() == 0) return true;
  return ops::all_finite(t);  // on a GPU a device reduction: one flag comes back
}

std::vector<std::string> nonfinite_gradients(const Module& model) {
  const auto params = model.named_parameters();
  std::vector<Tensor> grads;
  for (const auto& p : params) {
    grads.push_back(p.second.grad());
    ACTLAB_CHECK(!grads.back().defined() || grads.back().dtype() == DType::F32, "nonfinite_gradients: f32 only, got ",
                 dtype_name(grads.back().dtype()), " for ", p.first);
  }
  const std::vector<bool> finite = ops::all_finite_each(grads);  // on a GPU: one synchronization per step
  std::vector<std::string> bad;
  for (size_t i = 0; i < params.size(); ++i)
    if (!finite[i]) bad.push_back(params[i].first);
  return bad;
}

std::string locate_nonfinite_forward(Module& model, const Tensor& images) {
  if (images.dtype() == DType::F32 && !all_finite(images)) return kNonfiniteInputBatch;
  NoGradGuard no_grad;
  FirstNonFinite observer;
  ForwardObserver* previous = set_forward_observer(&observer);
  try {
    MemTagScope tag(MemTag::Activation);
    model(Variable(images));
  } catch (...) {
    set_forward_observer(previous);
    throw;
  }
  set_forward_observer(previous);
  return observer.where();
}

BufferSnapshot::BufferSnapshot(const Module& model) {
  MemTagScope tag(MemTag::Other);
  for (const auto& b : model.named_buffers()) {
    live_.push_back(b.second);
    copy_.push_back(b.second.clone());
  }
}
void BufferSnapshot::save() {
  for (size_t i = 0; i < live_.size(); ++i) copy_[i].copy_(live_[i]);
}
void BufferSnapshot::restore() {
  for (size_t i = 0; i < live_.size(); ++i) live_[i].copy_(copy_[i]);
}

void MemoryCheck::start_step() {
  joint_peak_ = std::max(joint_peak_, memory_stats(device_).total.peak);
  reset_peak(device_);
}

void MemoryCheck::end_step(const std::string& where) {
  const MemoryStats s = memory_stats(device_);
  joint_peak_ = std::max(joint_peak_, s.total.peak);
  ++steps_;
  for (int t = 0; t < kNumMemTags; ++t) {
    if (!is_checked(t, device_)) continue;
    const TagStats& now = s.by_tag[t];
    const char* tag = mem_tag_name(static_cast<MemTag>(t));
    if (steps_ == 1) baseline_[t] = now.current;
    ACTLAB_CHECK(now.current == baseline_[t], "memory check: after ", where, " live ", tag, " bytes are ",
                 now.current, ", not the ", baseline_[t], " held after the first step (",
                 now.current > baseline_[t] ? "+" : "", now.current - baseline_[t], " bytes)");
    if (steps_ <= warmup_steps_) {
      warmup_peak_[t] = std::max(warmup_peak_[t], now.peak);
    } else {
      ACTLAB_CHECK(now.peak <= warmup_peak_[t], "memory check: in ", where, " the ", tag, " peak reached ", now.peak,
                   " bytes, above the ", warmup_peak_[t], " of the first ", warmup_steps_, " steps (+",
                   now.peak - warmup_peak_[t], " bytes)");
    }
  }
}

int64_t MemoryCheck::epoch_peak() {
  const int64_t p = std::max(joint_peak_, memory_stats(device_).total.peak);
  joint_peak_ = 0;
  return p;
}

int64_t MemoryCheck::baseline_bytes() const {
  int64_t sum = 0;
  for (int t = 0; t < kNumMemTags; ++t)
    if (is_checked(t, device_)) sum += baseline_[t];
  return sum;
}

std::string MemoryCheck::verdict() const {
  if (steps_ == 0) return "memory check: no step ran (stopped before the first), nothing checked";
  return "memory check: live bytes back to " + format_bytes(baseline_bytes()) + " after every step, peak stable (" +
         std::to_string(steps_) + " steps; data-loader bytes" + (device_.is_cuda() ? " and library workspaces" : "") +
         " not checked)";
}

}  // namespace actlab
