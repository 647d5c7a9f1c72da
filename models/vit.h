// Vision transformers: ViT (Dosovitskiy et al.) with timm's parameter names — patch_embed.proj, cls_token,
// pos_embed, blocks.i.{norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2}, norm, head — for small
// images (vit_tiny_cifar: patch 4, width 192, depth 12, 3 heads). What each block keeps for backward, and in
// which layout the policies see it: docs/policies.md, "Token maps". Tested in tests/test_models.cpp and
// tests/test_vit.cpp.
#pragma once
#include <memory>

#include "actlab/layers/layers.h"

namespace actlab {

struct VitConfig {
  int64_t image_size = 32;
  int64_t patch = 4;
  int64_t in_channels = 3;
  int64_t num_classes = 10;
  int64_t dim = 192;
  int64_t depth = 12;
  int64_t heads = 3;
  int64_t mlp_ratio = 4;
  float drop_path = 0.1f;  // the deepest block's rate; block i gets drop_path·i/(depth−1) (timm's rule)
};
VitConfig vit_tiny_cifar_config(int64_t image_size, int64_t in_channels, int64_t num_classes);

// Multi-head self-attention on (B, T, D): qkv → (B, heads, T, D/heads) maps, softmax(q·kᵀ/√d)·v, proj.
class Attention final : public Module {
 public:
  Attention(int64_t dim, int64_t heads);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "Attention"; }
  std::string describe() const override;
 private:
  int64_t dim_, heads_;
  std::shared_ptr<Linear> qkv_, proj_;
};

// The pre-norm residual block of ViT and Swin: h = x + drop_path(attn(norm1(x))), then
// h + drop_path(mlp(norm2(h))). Each model's block registers the parts under its own names.
class PreNormBlock : public Module {
 public:
  Variable forward(const Variable& x) override;
 protected:
  std::shared_ptr<Module> norm1_, attn_, drop_path_, norm2_, mlp_;
};

// ViT's block (timm names: norm1, attn, drop_path, norm2, mlp.fc1/act/fc2).
class TransformerBlock final : public PreNormBlock {
 public:
  TransformerBlock(int64_t dim, int64_t heads, int64_t mlp_ratio, float drop_path);
  std::string kind() const override { return "TransformerBlock"; }
};

// Images (N, C, H, W) → logits (N, classes): patch embedding (a stride-patch conv), class token, learned
// position embedding, the blocks, a final LayerNorm and a linear head on the class token.
class VisionTransformer final : public Module {
 public:
  explicit VisionTransformer(const VitConfig& config);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "VisionTransformer"; }
  std::string describe() const override;
  const VitConfig& config() const { return config_; }
 private:
  VitConfig config_;
  std::shared_ptr<Module> patch_embed_;
  Variable cls_token_, pos_embed_;
  std::shared_ptr<Sequential> blocks_;
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Linear> head_;
};

}  // namespace actlab
