// Swin Transformer (Liu et al. 2021) with torchvision's parameter names (features.0 patch embedding +
// LayerNorm, features.1/3/5/7 stages of blocks, features.2/4/6 patch merging, norm, head; between blocks
// the maps are token maps (B, H·W, C), the values torchvision keeps as (B, H, W, C)): swin_t is torchvision's swin_t (28,288,354 parameters, 224², window
// 7). Window attention adds a learned relative-position bias (gathered from a table by a fixed index) and,
// for shifted windows, a constant mask. What each block keeps: docs/policies.md, "Token maps".
// Tested in tests/test_models.cpp and tests/test_vit.cpp.
#pragma once
#include <memory>
#include <vector>

#include "actlab/layers/layers.h"

namespace actlab {

struct SwinConfig {
  int64_t image_size = 224;
  int64_t patch = 4;
  int64_t in_channels = 3;
  int64_t num_classes = 1000;
  int64_t embed_dim = 96;
  std::vector<int64_t> depths = {2, 2, 6, 2};
  std::vector<int64_t> heads = {3, 6, 12, 24};
  int64_t window = 7;
  int64_t mlp_ratio = 4;
  float drop_path = 0.2f;  // block k of n gets drop_path·k/(n−1) (torchvision's rule)
};
SwinConfig swin_t_config(int64_t image_size, int64_t in_channels, int64_t num_classes);

// Multi-head self-attention inside (shifted) windows of a side×side map given as tokens (B, side², C);
// side a multiple of the window.
class ShiftedWindowAttention final : public Module {
 public:
  ShiftedWindowAttention(int64_t dim, int64_t heads, int64_t window, int64_t shift, int64_t side);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "ShiftedWindowAttention"; }
  std::string describe() const override;
 private:
  Tensor shift_mask(int64_t H, int64_t W, Device device) const;  // (1, windows, heads, N, N), 0 or -100
  int64_t dim_, heads_, window_, shift_, side_;
  Variable bias_table_;      // relative_position_bias_table ((2w−1)², heads)
  Tensor position_index_;    // (w⁴) i64: the table row of each (query, key) pair of a window
  std::shared_ptr<Linear> qkv_, proj_;
};

// Builds the model; throws when a stage's map would not be a multiple of the window.
std::shared_ptr<Module> make_swin(const SwinConfig& config);

}  // namespace actlab
