// acgc: AC-GC (Evans & Aamodt, "AC-GC: Lossy Activation Compression with Guaranteed Convergence",
// NeurIPS 2021) as a policy — per-layer bit widths chosen from a bound on the gradient error, on the
// per-group codec of pergroup. Owns the per-layer state (measured gradient sensitivities, chosen widths,
// the log of width changes). The bound, the closed form and where it departs from AC-GC's code:
// docs/policies.md, "acgc". Tested in tests/test_acgc.cpp.
#pragma once
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "actlab/compress/policies.h"

namespace actlab {

// The smallest width b ∈ {2,4,8} whose stochastic-rounding error, G·R/(4·(2^b − 1)²) in squared norm for
// groups of G values with Σ (max − min)² = R, is at most `budget`; 8 when none is (the codec's widest).
// A zero R takes 2 bits (the narrowest); a NaN R or budget takes 8.
int acgc_width(double range_norm_sum, int64_t group_size, double budget);

class AcgcPolicy final : public ActivationCachePolicy {
 public:
  static constexpr int kInitialBits = 8;  // before a layer's first measurement, and the cap
  static constexpr int kMinBits = 2;      // the narrowest width (AC-GC's code clips at 2 bits too)
  static constexpr size_t kHistory = 10;  // measurements averaged per layer (AC-GC's "mean 100 10")
  // error_bits E: the allowed relative gradient error e = 2^-E; interval I >= 1: steps between
  // measurements; group_size G >= 1. Throws Error on bad values.
  AcgcPolicy(int error_bits, int64_t interval, int64_t group_size);
  std::unique_ptr<Packed> pack(const Tensor& x, const SaveInfo& info, const PackContext& ctx) const override;
  Tensor unpack(const Packed& p, const SaveInfo& info) const override;
  std::string name() const override;  // "acgc:E=0,I=100,G=256"
  bool wants_gradient_sensitivity(const SaveInfo& info) const override;
  void observe_gradient_sensitivity(const SaveInfo& info, const GradientSensitivity& s) const override;

  // pergroup's closed form at width bits ∈ {2,4,8}; 32: the f32 copy of a shape the codec does not take.
  size_t bytes_at(const Shape& shape, int bits) const;
  // The allowed squared norm of the input error of a layer with these measurements: e·mean(reference) /
  // mean(sensitivity) (+inf when the sensitivity is 0).
  double budget(const std::deque<GradientSensitivity>& history) const;

  // Per save (key "module_path/op/role"): the width of its last pack (32: kept as an f32 copy) and how
  // many elements that pack had.
  struct LayerBits {
    std::string key;
    int bits = 0;
    int64_t elems = 0;
    uint64_t step = 0;      // of the last pack
    size_t measurements = 0;  // in the history the width came from
  };
  std::vector<LayerBits> layer_bits() const;  // in key order
  // Σ bits·elems / Σ elems over the saves' last packs (AC-GC's reported "bits"); 0 before any pack.
  double average_bits() const;
  // Every change of a save's width (its first pack included), in the order they happened.
  struct WidthChange {
    uint64_t step = 0;
    std::string key;
    int bits = 0;
  };
  std::vector<WidthChange> width_changes() const;

 private:
  // The closed form at kInitialBits (a layer before its first measurement; the policy holds no layer).
  size_t closed_form_bytes(const Shape& shape) const override;
  // The closed form at the width this layer's last pack took (pergroup's at that width).
  size_t layer_closed_form_bytes(const Shape& shape, const SaveInfo& info) const override;
  struct LayerState {
    std::deque<GradientSensitivity> history;  // oldest first, at most kHistory
    uint64_t measured_step = 0;               // the step of history.back()
    uint64_t pack_step = 0;
    bool measuring = false;  // this step's backward is to report (set by pack)
    int bits = 0;
    int64_t elems = 0;
  };
  const PerGroupPolicy& at_width(int bits) const;

  int error_bits_;
  int64_t interval_;
  int64_t group_size_;
  std::vector<PerGroupPolicy> widths_;  // pergroup at 2, 4, 8 bits: the codec and its closed form
  mutable std::mutex mutex_;
  mutable std::map<std::string, LayerState> layers_;
  mutable std::vector<WidthChange> changes_;
};

// The element-weighted average width over the acgc policies of a set (its default and rules), or -1
// when it has none: what actlab-train prints at each epoch's end.
double acgc_average_bits(const PolicySet& set);

}  // namespace actlab
