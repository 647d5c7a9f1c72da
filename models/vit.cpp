// ViT: the blocks and the patch/position embeddings (models/vit.h).
#include "actlab/models/vit.h"

#include <cmath>

namespace actlab {

namespace {
// patch_embed.proj: a Conv2d with bias; its own module so the name is timm's.
class PatchEmbed final : public Module {
 public:
  PatchEmbed(int64_t in_channels, int64_t dim, int64_t patch)
      : proj_(register_module("proj", std::make_shared<Conv2d>(in_channels, dim, patch, patch, 0, 1, true,
                                                               ConvInit::KaimingUniformDefault))) {}
  // (N, C, H, W) → (N, T, D) with T = (H/patch)·(W/patch) in row-major patch order.
  Variable forward(const Variable& x) override {
    const Variable y = (*proj_)(x);  // (N, D, H', W')
    return permute(flatten(y, 2), {0, 2, 1});
  }
  std::string kind() const override { return "PatchEmbed"; }
 private:
  std::shared_ptr<Conv2d> proj_;
};

}  // namespace

VitConfig vit_tiny_cifar_config(int64_t image_size, int64_t in_channels, int64_t num_classes) {
  VitConfig c;
  c.image_size = image_size;
  c.in_channels = in_channels;
  c.num_classes = num_classes;
  return c;
}

Attention::Attention(int64_t dim, int64_t heads) : dim_(dim), heads_(heads) {
  ACTLAB_CHECK(heads >= 1 && dim % heads == 0, "Attention: width ", dim, " is not a multiple of ", heads, " heads");
  qkv_ = register_module("qkv", std::make_shared<Linear>(dim, 3 * dim, true, LinearInit::TruncNormal));
  proj_ = register_module("proj", std::make_shared<Linear>(dim, dim, true, LinearInit::TruncNormal));
}

Variable Attention::forward(const Variable& x) {
  const int64_t B = x.size(0), T = x.size(1), d = dim_ / heads_;
  // (B, T, 3D) → (3, B, heads, T, d): q, k and v are contiguous parts of one copy.
  const Variable qkv = permute(reshape((*qkv_)(x), {B, T, 3, heads_, d}), {2, 0, 3, 1, 4});
  const std::vector<Variable> parts = split(qkv, 0, {1, 1, 1});
  const Variable q = reshape(parts[0], {B, heads_, T, d});
  const Variable k = reshape(parts[1], {B, heads_, T, d});
  const Variable v = reshape(parts[2], {B, heads_, T, d});
  const Variable attn = softmax(matmul(q, k, false, true), 1.f / std::sqrt(static_cast<float>(d)));
  const Variable out = reshape(permute(matmul(attn, v), {0, 2, 1, 3}), {B, T, dim_});
  return (*proj_)(out);
}

std::string Attention::describe() const { return detail::concat("Attention(", dim_, ", heads=", heads_, ")"); }

Variable PreNormBlock::forward(const Variable& x) {
  const Variable h = add(x, (*drop_path_)((*attn_)((*norm1_)(x))));
  return add(h, (*drop_path_)((*mlp_)((*norm2_)(h))));
}

TransformerBlock::TransformerBlock(int64_t dim, int64_t heads, int64_t mlp_ratio, float drop_path) {
  norm1_ = register_module("norm1", std::make_shared<LayerNorm>(dim, 1e-6f));
  attn_ = register_module("attn", std::make_shared<Attention>(dim, heads));
  drop_path_ = register_module("drop_path", std::make_shared<DropPath>(drop_path));
  norm2_ = register_module("norm2", std::make_shared<LayerNorm>(dim, 1e-6f));
  auto mlp = register_module("mlp", std::make_shared<Sequential>());
  mlp->add("fc1", std::make_shared<Linear>(dim, mlp_ratio * dim, true, LinearInit::TruncNormal));
  mlp->add("act", std::make_shared<GELU>());
  mlp->add("fc2", std::make_shared<Linear>(mlp_ratio * dim, dim, true, LinearInit::TruncNormal));
  mlp_ = mlp;
}

VisionTransformer::VisionTransformer(const VitConfig& c) : config_(c) {
  ACTLAB_CHECK(c.patch >= 1 && c.image_size % c.patch == 0, "vit: image size ", c.image_size,
               " is not a multiple of the patch size ", c.patch);
  ACTLAB_CHECK(c.depth >= 1 && c.mlp_ratio >= 1 && c.num_classes >= 1 && c.in_channels >= 1, "vit: bad config");
  ACTLAB_CHECK(c.drop_path >= 0.f && c.drop_path < 1.f, "vit: drop_path must be in [0, 1), got ", c.drop_path);
  const int64_t side = c.image_size / c.patch, tokens = side * side + 1;
  patch_embed_ = register_module("patch_embed", std::make_shared<PatchEmbed>(c.in_channels, c.dim, c.patch));
  {
    MemTagScope tag(MemTag::Param);
    cls_token_ = register_parameter("cls_token", trunc_normal_init({1, 1, c.dim}, 0.02f));
    pos_embed_ = register_parameter("pos_embed", trunc_normal_init({1, tokens, c.dim}, 0.02f));
  }
  blocks_ = register_module("blocks", std::make_shared<Sequential>());
  for (int64_t i = 0; i < c.depth; ++i) {
    const float rate = c.depth > 1 ? c.drop_path * static_cast<float>(i) / static_cast<float>(c.depth - 1) : c.drop_path;
    blocks_->add(std::make_shared<TransformerBlock>(c.dim, c.heads, c.mlp_ratio, rate));
  }
  norm_ = register_module("norm", std::make_shared<LayerNorm>(c.dim, 1e-6f));
  head_ = register_module("head", std::make_shared<Linear>(c.dim, c.num_classes, true, LinearInit::TruncNormal));
}

Variable VisionTransformer::forward(const Variable& x) {
  ACTLAB_CHECK(x.dim() == 4 && x.size(2) == config_.image_size && x.size(3) == config_.image_size,
               "vit: built for ", config_.image_size, "x", config_.image_size, " images, got ", x.data().str());
  const int64_t B = x.size(0);
  Variable tokens = (*patch_embed_)(x);  // (B, T-1, D)
  tokens = add_rows(concat({expand_rows(cls_token_, B), tokens}, 1), pos_embed_);
  const Variable h = (*norm_)((*blocks_)(tokens));
  const Variable cls = split(h, 1, {1, h.size(1) - 1})[0];  // (B, 1, D)
  return (*head_)(reshape(cls, {B, config_.dim}));
}

std::string VisionTransformer::describe() const {
  return detail::concat("VisionTransformer(", config_.image_size, "px, patch ", config_.patch, ", dim ", config_.dim,
                        ", depth ", config_.depth, ", heads ", config_.heads, ", drop_path ", config_.drop_path, ")");
}

}  // namespace actlab
