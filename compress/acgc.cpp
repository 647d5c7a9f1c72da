// AcgcPolicy (compress/acgc.h): per-layer widths from AC-GC's gradient-error bound, packed by pergroup's
// codec at that width. Tested in tests/test_acgc.cpp.
#include "actlab/compress/acgc.h"

#include <cmath>
#include <limits>

namespace actlab {
namespace {

// AC-GC's code clips its widths to [2, 16] (a sign bit and at least one fraction bit); the codec keeps
// codes inside a byte, so the widths here are its 2, 4 and 8. One bit (two levels per group) is left out:
// ResNet-50 on Fashion-MNIST survives 2-bit saves but its backward blows up under 1-bit ones
// (docs/policies.md, acgc).
constexpr int kWidths[] = {2, 4, 8};

size_t width_index(int bits) { return bits == 2 ? 0 : bits == 4 ? 1 : 2; }

}  // namespace

int acgc_width(double range_norm_sum, int64_t group_size, double budget) {
  if (!(range_norm_sum == range_norm_sum) || !(budget == budget)) return AcgcPolicy::kInitialBits;
  if (range_norm_sum <= 0) return AcgcPolicy::kMinBits;
  // E‖x̃ − x‖² ≤ Σ_groups G·step²/4 with step = range/(2^b − 1): stochastic rounding's variance per value is
  // p(1 − p)·step² ≤ step²/4 (core/codec.h), and the codec's bf16 step is above range/(2^b − 1) by < 2^-7.
  const double error_scale = static_cast<double>(group_size) * range_norm_sum / 4.0;
  for (const int bits : kWidths) {
    const double levels = static_cast<double>((1 << bits) - 1);
    if (error_scale <= budget * levels * levels) return bits;
  }
  return AcgcPolicy::kInitialBits;
}

AcgcPolicy::AcgcPolicy(int error_bits, int64_t interval, int64_t group_size)
    : error_bits_(error_bits), interval_(interval), group_size_(group_size) {
  ACTLAB_CHECK(error_bits >= 0 && error_bits <= 60, "policy acgc: error bits E must be in [0, 60], got ", error_bits);
  ACTLAB_CHECK(interval >= 1, "policy acgc: interval I must be >= 1, got ", interval);
  ACTLAB_CHECK(group_size >= 1, "policy acgc: group size G must be >= 1, got ", group_size);
  for (const int bits : kWidths) widths_.emplace_back(group_size, bits);
}

const PerGroupPolicy& AcgcPolicy::at_width(int bits) const { return widths_[width_index(bits)]; }

double AcgcPolicy::budget(const std::deque<GradientSensitivity>& history) const {
  double sensitivity = 0, reference = 0;
  for (const GradientSensitivity& s : history) sensitivity += s.sensitivity, reference += s.reference;
  if (sensitivity <= 0) return std::numeric_limits<double>::infinity();
  // The means' ratio: the history's count cancels.
  return std::ldexp(reference, -error_bits_) / sensitivity;
}

std::unique_ptr<Packed> AcgcPolicy::pack(const Tensor& x_in, const SaveInfo& info, const PackContext& ctx) const {
  check_defined_input(x_in, name());
  ACTLAB_CHECK(x_in.dtype() == DType::F32, "policy ", name(), " packs f32 tensors, got ", x_in.str());
  const Tensor x = x_in.contiguous();
  const std::string key = save_path(info);
  GroupGeometry g;
  const bool coded = at_width(kInitialBits).group_view(x.shape(), g);
  std::deque<GradientSensitivity> history;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    history = layers_[key].history;
  }
  int bits = 32;
  if (coded) {
    bits = kInitialBits;
    if (!history.empty()) {
      double range_norm_sum = 0;
      for (const double r : sample_range_norms(x, g)) range_norm_sum += r;
      bits = acgc_width(range_norm_sum, group_size_, budget(history));
    }
    bits = code_bits(bits, info);  // the width the pack below takes (PerGroupPolicy widens the same way)
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    LayerState& st = layers_[key];
    // Measured at the first step a layer is seen (as AC-GC measures at its first iteration) and every I
    // steps: a function of the step, so two runs measure at the same steps.
    st.measuring = st.history.empty() || ctx.step % static_cast<uint64_t>(interval_) == 0;
    st.pack_step = ctx.step;
    st.elems = x.numel();
    if (bits != st.bits) changes_.push_back({ctx.step, key, bits});
    st.bits = bits;
  }
  if (!coded) return std::make_unique<PackedPassthrough>(x);
  return at_width(bits).pack(x, info, ctx);
}

Tensor AcgcPolicy::unpack(const Packed& p, const SaveInfo& info) const {
  if (dynamic_cast<const PackedPassthrough*>(&p)) return at_width(kInitialBits).unpack(p, info);
  return at_width(sample_rows_pack(p, name()).geometry().bits).unpack(p, info);
}

std::string AcgcPolicy::name() const {
  return "acgc:E=" + std::to_string(error_bits_) + ",I=" + std::to_string(interval_) + ",G=" +
         std::to_string(group_size_);
}

size_t AcgcPolicy::bytes_at(const Shape& shape, int bits) const {
  if (bits == 32) return static_cast<size_t>(shape_numel(shape)) * 4;
  return at_width(bits).expected_bytes(shape);
}

size_t AcgcPolicy::closed_form_bytes(const Shape& shape) const { return bytes_at(shape, kInitialBits); }

size_t AcgcPolicy::layer_closed_form_bytes(const Shape& shape, const SaveInfo& info) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = layers_.find(save_path(info));
  return it == layers_.end() || it->second.bits == 0 ? bytes_at(shape, kInitialBits) : bytes_at(shape, it->second.bits);
}

bool AcgcPolicy::wants_gradient_sensitivity(const SaveInfo& info) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = layers_.find(save_path(info));
  return it != layers_.end() && it->second.measuring;
}

void AcgcPolicy::observe_gradient_sensitivity(const SaveInfo& info, const GradientSensitivity& s) const {
  // A non-finite measurement (a step the trainer then stops or skips) would pin the layer's width for
  // kHistory measurements; it is dropped.
  if (!std::isfinite(s.sensitivity) || !std::isfinite(s.reference)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = layers_.find(save_path(info));
  if (it == layers_.end() || !it->second.measuring) return;
  LayerState& st = it->second;
  if (!st.history.empty() && st.measured_step == st.pack_step) {
    // Another consumer of the same pack (pack once): the errors it causes add up (AC-GC sums over a
    // tensor's successors).
    st.history.back().sensitivity += s.sensitivity;
    st.history.back().reference += s.reference;
    return;
  }
  st.history.push_back(s);
  st.measured_step = st.pack_step;
  if (st.history.size() > kHistory) st.history.pop_front();
}

std::vector<AcgcPolicy::LayerBits> AcgcPolicy::layer_bits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<LayerBits> out;
  for (const auto& [key, st] : layers_)
    if (st.bits != 0) out.push_back({key, st.bits, st.elems, st.pack_step, st.history.size()});
  return out;
}

double AcgcPolicy::average_bits() const {
  double bits = 0, elems = 0;
  for (const LayerBits& l : layer_bits()) {
    bits += static_cast<double>(l.bits) * static_cast<double>(l.elems);
    elems += static_cast<double>(l.elems);
  }
  return elems > 0 ? bits / elems : 0.0;
}

std::vector<AcgcPolicy::WidthChange> AcgcPolicy::width_changes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return changes_;
}

double acgc_average_bits(const PolicySet& set) {
  bool any = false;
  double bits = 0, elems = 0;
  for (const ActivationCachePolicy* p : set.policies()) {
    const auto* acgc = dynamic_cast<const AcgcPolicy*>(p);
    if (acgc == nullptr) continue;
    any = true;
    for (const AcgcPolicy::LayerBits& l : acgc->layer_bits()) {
      bits += static_cast<double>(l.bits) * static_cast<double>(l.elems);
      elems += static_cast<double>(l.elems);
    }
  }
  if (!any) return -1;
  return elems > 0 ? bits / elems : 0.0;
}

}  // namespace actlab
