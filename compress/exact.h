// The exact policy: keeps the tensor itself (shares its storage; no copy, no loss).
// Tested in tests/test_policies.cpp.
#pragma once
#include "actlab/compress/policy.h"

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
    return std::make_unique<PackedExact>(x);
  }
  Tensor unpack(const Packed& p, const SaveInfo&) const override {
    return static_cast<const PackedExact&>(p).tensor();
  }
  std::string name() const override { return "exact"; }
  size_t expected_bytes(const Shape& shape) const override { return static_cast<size_t>(shape_numel(shape)) * 4; }
  bool is_exact() const override { return true; }
};

}  // namespace actlab
