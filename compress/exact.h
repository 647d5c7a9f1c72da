// The exact policy: keeps the tensor itself (shares its storage; no copy, no loss). And its 16-bit forms:
// a copy rounded to the nearest bf16 or fp16, which is what `exact` keeps of lossy saves under --precision
// bf16 or fp16 (the tensors an AMP run saves are its low-precision ones; core/precision.h). Tested in
// tests/test_policies.cpp and tests/test_precision.cpp.
#pragma once
#include "actlab/compress/policy.h"
#include "actlab/core/cpu/kernels.h"
#include "actlab/core/ops.h"

namespace actlab {

class PackedExact final : public Packed {
 public:
  explicit PackedExact(Tensor t) : tensor_(std::move(t)) {}
  size_t nbytes() const override { return tensor_.nbytes(); }
  const Shape& shape() const override { return tensor_.shape(); }
  const Tensor& tensor() const { return tensor_; }
 private:
  Tensor tensor_;
};

class ExactPolicy final : public ActivationCachePolicy {
 public:
  std::unique_ptr<Packed> pack(const Tensor& x, const SaveInfo&, const PackContext&) const override {
    check_defined_input(x, name());
    return std::make_unique<PackedExact>(x);
  }
  Tensor unpack(const Packed& p, const SaveInfo&) const override {
    return packed_as<PackedExact>(p, name()).tensor();
  }
  std::string name() const override { return "exact"; }
  bool is_exact() const override { return true; }
 private:
  size_t closed_form_bytes(const Shape& shape) const override { return static_cast<size_t>(shape_numel(shape)) * 4; }
};

// A 16-bit copy (DType::BF16 or F16).
class PackedHalf final : public Packed {
 public:
  explicit PackedHalf(Tensor h) : half_(std::move(h)) {}
  size_t nbytes() const override { return half_.nbytes(); }
  const Shape& shape() const override { return half_.shape(); }
  const Tensor& half() const { return half_; }
 private:
  Tensor half_;
};

class Bf16Policy final : public ActivationCachePolicy {
 public:
  // A save whose consumer computes channels-last (SaveInfo::channels_last) is copied in that layout: the bf16
  // convolution reads it as it is, in forward and in backward, where an (N, C, H, W) copy is reordered twice. A
  // channels-last x (a bf16 run's activation) is copied in its own layout either way: one narrowing pass.
  std::unique_ptr<Packed> pack(const Tensor& x, const SaveInfo& info, const PackContext&) const override {
    check_defined_input(x, name());
    const bool transpose = info.channels_last && x.dim() == 4 && x.device().is_cpu() && !x.is_channels_last();
    return std::make_unique<PackedHalf>(transpose ? ops::to_bf16_channels_last(x) : ops::to_bf16(x.dense()));
  }
  // (N, C, H, W) f32: a channels-last copy is widened in its layout, then transposed (Tensor::contiguous).
  Tensor unpack(const Packed& p, const SaveInfo&) const override { return ops::from_bf16(half_of(p)).contiguous(); }
  // The copy as it is kept: (N, C, H, W) contiguous, or channels-last (Tensor::is_channels_last).
  Tensor unpack_bf16(const Packed& p, const SaveInfo&) const override { return half_of(p); }
  // Batch-norm backward widens one channel at a time into its own buffer: no full-size f32 copy. (Not from a
  // channels-last copy, whose channels are strided: its consumers are convolutions.)
  std::unique_ptr<ChannelReader> channel_reader(const Packed& p, const SaveInfo&) const override {
    const Tensor& h = half_of(p);
    if (h.dim() != 4 || !h.device().is_cpu() || !h.is_contiguous()) return nullptr;
    return std::make_unique<Reader>(h);
  }
  std::string name() const override { return "bf16"; }
  bool takes_channels_last() const override { return true; }

 private:
  size_t closed_form_bytes(const Shape& shape) const override { return static_cast<size_t>(shape_numel(shape)) * 2; }
  const Tensor& half_of(const Packed& p) const {
    const Tensor& h = packed_as<PackedHalf>(p, name()).half();
    ACTLAB_CHECK(h.dtype() == DType::BF16, "policy bf16 cannot unpack a pack it did not make (an fp16 copy)");
    return h;
  }
  class Reader final : public ChannelReader {
   public:
    explicit Reader(const Tensor& h) : h_(h) {}
    // Called from the consumer's parallel channel loop: a plain loop, no OpenMP region of its own (one per
    // plane cost more in team wake-ups than the widening itself: measured on MobileNetV2).
    void read(int64_t c, float* out) const override {
      const int64_t N = h_.size(0), C = h_.size(1), HW = h_.size(2) * h_.size(3);
      const auto* bits = static_cast<const uint16_t*>(h_.raw_data());
      for (int64_t n = 0; n < N; ++n) cpu::from_bf16_serial(out + n * HW, bits + (n * C + c) * HW, HW);
    }
    const Shape& shape() const override { return h_.shape(); }
   private:
    const Tensor& h_;
  };
};

// exact's keep under --precision fp16 (on a GPU): the save rounded to fp16 and widened back for backward.
// Batch norm's backward widens it whole (no channel reader).
class F16Policy final : public ActivationCachePolicy {
 public:
  std::unique_ptr<Packed> pack(const Tensor& x, const SaveInfo&, const PackContext&) const override {
    check_defined_input(x, name());
    return std::make_unique<PackedHalf>(ops::to_f16(x));
  }
  Tensor unpack(const Packed& p, const SaveInfo&) const override {
    const Tensor& h = packed_as<PackedHalf>(p, name()).half();
    ACTLAB_CHECK(h.dtype() == DType::F16, "policy f16 cannot unpack a pack it did not make (a bf16 copy)");
    return ops::from_f16(h);
  }
  std::string name() const override { return "f16"; }
 private:
  size_t closed_form_bytes(const Shape& shape) const override { return static_cast<size_t>(shape_numel(shape)) * 2; }
};

// The shared instances of the three keeps, and the precision's exact keep: what an exact save is kept as at
// the compute precision (core/precision.h) — the tensor itself at fp32, its 16-bit copy under bf16 or fp16.
// SavedTensor keeps exact saves through it, and SWAP offloads what it keeps (compress/swap.h), so the two
// cannot drift apart.
const ExactPolicy& exact_policy();
const Bf16Policy& bf16_policy();
const F16Policy& f16_policy();
const ActivationCachePolicy& exact_keep_policy();

}  // namespace actlab
