// MLP for the 1-D path: flatten the image, hidden Linear layers with ReLU (and optional dropout),
// a Linear to the classes. Names: flatten, fc1, relu1, [dropout1], fc2, ..., fc (the classifier).
// Tested in tests/test_models.cpp.
#pragma once
#include <memory>
#include <vector>

#include "actlab/layers/layers.h"

namespace actlab {

class Mlp final : public Module {
 public:
  // in_features: C·H·W of one input; hidden: the hidden widths (may be empty: a linear classifier);
  // dropout p in [0, 1) after each hidden ReLU (none when 0).
  // Input (N, C, H, W) or (N, D) with D = in_features → logits (N, num_classes).
  Mlp(int64_t in_features, const std::vector<int64_t>& hidden, int64_t num_classes, float dropout = 0.f);
  // Runs the children in registration order (like Sequential, but with named children).
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "Mlp"; }
  std::string describe() const override;
 private:
  int64_t in_features_;
  std::vector<int64_t> hidden_;
};

}  // namespace actlab
