// Swin Transformer: windows, shifts, the relative-position bias and the stages (models/swin.h).
#include "actlab/models/swin.h"

#include <cmath>

#include "actlab/models/vit.h"  // PreNormBlock

namespace actlab {

namespace {

// (B, C, H, W) → (B, H·W, C): torchvision's Permute([0, 2, 3, 1]) of features.0 (a module without
// parameters there too), with the map kept as a token map (B, L, C) rather than (B, H, W, C) — the same
// values; every LayerNorm, MLP and merge input is then a 3-D save, which the policies pool along the
// tokens, where a 4-D (B, H, W, C) save would be pooled across W and the channels (docs/policies.md).
class ToTokens final : public Module {
 public:
  Variable forward(const Variable& x) override {
    return reshape(permute(x, {0, 2, 3, 1}), {x.size(0), x.size(2) * x.size(3), x.size(1)});
  }
  std::string kind() const override { return "Permute"; }
};

int64_t map_side(const Variable& tokens, int64_t side) {
  ACTLAB_CHECK(tokens.dim() == 3 && tokens.size(1) == side * side, "swin: expected (B, ", side * side,
               ", C) tokens of a ", side, "x", side, " map, got ", tokens.data().str());
  return side;
}

// (B, H, W, C) → (B·(H/w)·(W/w), w·w, C) and back.
Variable window_partition(const Variable& x, int64_t w) {
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  const Variable parts = permute(reshape(x, {B, H / w, w, W / w, w, C}), {0, 1, 3, 2, 4, 5});
  return reshape(parts, {B * (H / w) * (W / w), w * w, C});
}
Variable window_merge(const Variable& windows, int64_t B, int64_t H, int64_t W, int64_t w) {
  const int64_t C = windows.size(2);
  const Variable parts = permute(reshape(windows, {B, H / w, W / w, w, w, C}), {0, 1, 3, 2, 4, 5});
  return reshape(parts, {B, H, W, C});
}

// torchvision's names: norm1, attn, stochastic_depth, norm2, mlp.0 (Linear) .1 (GELU) .2 (Dropout) .3 .4.
class SwinBlock final : public PreNormBlock {
 public:
  SwinBlock(int64_t dim, int64_t heads, int64_t window, int64_t shift, int64_t side, int64_t mlp_ratio,
            float drop_path) {
    norm1_ = register_module("norm1", std::make_shared<LayerNorm>(dim));
    attn_ = register_module("attn", std::make_shared<ShiftedWindowAttention>(dim, heads, window, shift, side));
    drop_path_ = register_module("stochastic_depth", std::make_shared<DropPath>(drop_path));
    norm2_ = register_module("norm2", std::make_shared<LayerNorm>(dim));
    auto mlp = register_module("mlp", std::make_shared<Sequential>());
    mlp->add(std::make_shared<Linear>(dim, mlp_ratio * dim, true, LinearInit::TruncNormal));
    mlp->add(std::make_shared<GELU>());
    mlp->add(std::make_shared<Dropout>(0.f));
    mlp->add(std::make_shared<Linear>(mlp_ratio * dim, dim, true, LinearInit::TruncNormal));
    mlp->add(std::make_shared<Dropout>(0.f));
    mlp_ = mlp;
  }
  std::string kind() const override { return "SwinTransformerBlock"; }
};

// (B, side², C) → (B, (side/2)², 2C): the four 2×2 phases of the map side by side, LayerNorm(4C), Linear(4C → 2C).
class PatchMerging final : public Module {
 public:
  PatchMerging(int64_t dim, int64_t side) : side_(side) {
    ACTLAB_CHECK(side % 2 == 0, "swin: patch merging needs an even map, got ", side, "x", side);
    reduction_ = register_module("reduction", std::make_shared<Linear>(4 * dim, 2 * dim, false, LinearInit::TruncNormal));
    norm_ = register_module("norm", std::make_shared<LayerNorm>(4 * dim));
  }
  Variable forward(const Variable& tokens) override {
    const int64_t B = tokens.size(0), C = tokens.size(2), s = map_side(tokens, side_);
    const Variable x = reshape(tokens, {B, s, s, C});
    const auto phase = [&](int64_t r, int64_t c) { return slice(slice(x, 1, r, s, 2), 2, c, s, 2); };
    const Variable merged = concat({phase(0, 0), phase(1, 0), phase(0, 1), phase(1, 1)}, 3);
    return (*reduction_)((*norm_)(reshape(merged, {B, (s / 2) * (s / 2), 4 * C})));
  }
  std::string kind() const override { return "PatchMerging"; }
 private:
  int64_t side_;
  std::shared_ptr<Linear> reduction_;
  std::shared_ptr<LayerNorm> norm_;
};

class SwinTransformer final : public Module {
 public:
  explicit SwinTransformer(const SwinConfig& c) : config_(c) {
    ACTLAB_CHECK(c.depths.size() == c.heads.size() && !c.depths.empty(), "swin: depths and heads differ in length");
    ACTLAB_CHECK(c.image_size % c.patch == 0, "swin: image size ", c.image_size, " is not a multiple of the patch ",
                 c.patch);
    features_ = register_module("features", std::make_shared<Sequential>());
    auto stem = std::make_shared<Sequential>();
    stem->add(std::make_shared<Conv2d>(c.in_channels, c.embed_dim, c.patch, c.patch, 0, 1, true,
                                       ConvInit::KaimingUniformDefault));
    stem->add(std::make_shared<ToTokens>());
    stem->add(std::make_shared<LayerNorm>(c.embed_dim));
    features_->add(stem);
    int64_t total = 0, k = 0;
    for (int64_t d : c.depths) total += d;
    int64_t dim = c.embed_dim, side = c.image_size / c.patch;
    const int64_t halvings = static_cast<int64_t>(c.depths.size()) - 1;
    // Every stage's map must be a multiple of the window (or fit inside one), and even before each patch
    // merging. Checked as one rule, so a refusal can name sizes that pass (a multiple of the mergings'
    // 32 alone does not: 32 gives stage 1 an 8x8 map under a 7x7 window).
    const auto fits = [&](int64_t image) {
      int64_t m = image / c.patch;
      for (int64_t s = 0; s <= halvings; ++s, m /= 2)
        if (m < 1 || (m % c.window != 0 && c.window < m) || (s < halvings && m % 2 != 0)) return false;
      return true;
    };
    if (!fits(c.image_size)) {
      std::string maps, sizes;
      for (int64_t s = 0, m = side; s <= halvings; ++s, m /= 2) maps += (s ? ", " : "") + std::to_string(m);
      for (int64_t image = c.patch, found = 0; image <= 4096 && found < 3; image += c.patch)
        if (fits(image)) sizes += (found++ ? ", " : "") + std::to_string(image);
      ACTLAB_FAIL("swin: a ", c.image_size, "x", c.image_size, " image gives its ", halvings + 1, " stages maps of ", maps,
                  " tokens a side; each must be a multiple of the window ", c.window, " (or at most ", c.window,
                  ") and even before a patch merging. Image sizes that fit: ", sizes.empty() ? "none" : sizes,
                  ", ... (224 as designed)");
    }
    for (size_t s = 0; s < c.depths.size(); ++s) {
      // torchvision: no shift where the window covers the whole map.
      const int64_t window = c.window, shift = c.window >= side ? 0 : c.window / 2;
      auto stage = std::make_shared<Sequential>();
      for (int64_t b = 0; b < c.depths[s]; ++b, ++k) {
        const float rate = total > 1 ? c.drop_path * static_cast<float>(k) / static_cast<float>(total - 1) : 0.f;
        stage->add(std::make_shared<SwinBlock>(dim, c.heads[s], std::min(window, side), b % 2 ? shift : 0, side,
                                               c.mlp_ratio, rate));
      }
      features_->add(stage);
      if (s + 1 < c.depths.size()) {
        features_->add(std::make_shared<PatchMerging>(dim, side));
        dim *= 2;
        side /= 2;
      }
    }
    norm_ = register_module("norm", std::make_shared<LayerNorm>(dim));
    head_ = register_module("head", std::make_shared<Linear>(dim, c.num_classes, true, LinearInit::TruncNormal));
  }
  Variable forward(const Variable& x) override {
    ACTLAB_CHECK(x.dim() == 4 && x.size(2) == config_.image_size && x.size(3) == config_.image_size, "swin: built for ",
                 config_.image_size, "x", config_.image_size, " images, got ", x.data().str());
    const Variable h = (*norm_)((*features_)(x));  // (B, L, C)
    // torchvision: permute to (B, C, h, w), average pool, flatten — the mean over the tokens.
    const Variable mean = global_avg_pool(reshape(permute(h, {0, 2, 1}), {h.size(0), h.size(2), h.size(1), 1}));
    return (*head_)(mean);
  }
  std::string kind() const override { return "SwinTransformer"; }
 private:
  SwinConfig config_;
  std::shared_ptr<Sequential> features_;
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Linear> head_;
};

}  // namespace

SwinConfig swin_t_config(int64_t image_size, int64_t in_channels, int64_t num_classes) {
  SwinConfig c;
  c.image_size = image_size;
  c.in_channels = in_channels;
  c.num_classes = num_classes;
  return c;
}

ShiftedWindowAttention::ShiftedWindowAttention(int64_t dim, int64_t heads, int64_t window, int64_t shift, int64_t side)
    : dim_(dim), heads_(heads), window_(window), shift_(shift), side_(side) {
  ACTLAB_CHECK(heads >= 1 && dim % heads == 0, "ShiftedWindowAttention: width ", dim, " over ", heads, " heads");
  ACTLAB_CHECK(window >= 1 && shift >= 0 && shift < window && side % window == 0, "ShiftedWindowAttention: window ",
               window, " shift ", shift, " on a ", side, "x", side, " map");
  const int64_t span = 2 * window - 1, n = window * window;
  {
    MemTagScope tag(MemTag::Param);
    bias_table_ = register_parameter("relative_position_bias_table", trunc_normal_init({span * span, heads}, 0.02f));
  }
  qkv_ = register_module("qkv", std::make_shared<Linear>(dim, 3 * dim, true, LinearInit::TruncNormal));
  proj_ = register_module("proj", std::make_shared<Linear>(dim, dim, true, LinearInit::TruncNormal));
  // Row of (query i, key j): (Δrow + w − 1)·(2w − 1) + (Δcol + w − 1), positions row-major in the window.
  // Tagged as model state: gather_rows saves it for backward, and a save of model state costs no activation
  // memory (SavedTensor leaves Param storage out of the report, as the allocator's activation figure does).
  {
    MemTagScope tag(MemTag::Param);
    position_index_ = Tensor::empty({n * n}, DType::I64);
  }
  int64_t* idx = position_index_.data<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      idx[i * n + j] = (i / window - j / window + window - 1) * span + (i % window - j % window + window - 1);
}

Tensor ShiftedWindowAttention::shift_mask(int64_t H, int64_t W, Device device) const {
  // Regions of the rolled map: [0, H−w), [H−w, H−s), [H−s, H) per axis; pairs from different regions are
  // masked (−100 before the softmax), as in the original Swin code.
  const int64_t w = window_, s = shift_, n = w * w, nh = H / w, nw = W / w;
  const auto region = [&](int64_t v, int64_t size) { return v < size - w ? 0 : v < size - s ? 1 : 2; };
  Tensor mask = Tensor::empty({1, nh * nw, heads_, n, n});
  float* m = mask.data<float>();
  for (int64_t wy = 0; wy < nh; ++wy)
    for (int64_t wx = 0; wx < nw; ++wx)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) {
          const int64_t ri = region(wy * w + i / w, H) * 3 + region(wx * w + i % w, W);
          const int64_t rj = region(wy * w + j / w, H) * 3 + region(wx * w + j % w, W);
          for (int64_t h = 0; h < heads_; ++h) m[(((wy * nw + wx) * heads_ + h) * n + i) * n + j] = ri == rj ? 0.f : -100.f;
        }
  return mask.to(device);
}

Variable ShiftedWindowAttention::forward(const Variable& tokens) {
  const int64_t B = tokens.size(0), H = map_side(tokens, side_), W = H, w = window_, n = w * w, d = dim_ / heads_;
  const Variable x_in = reshape(tokens, {B, H, W, dim_});
  Variable x = shift_ > 0 ? roll(roll(x_in, -shift_, 1), -shift_, 2) : x_in;
  const Variable windows = window_partition(x, w);  // (B·nW, n, C)
  const int64_t bw = windows.size(0);
  const Variable qkv = permute(reshape((*qkv_)(windows), {bw, n, 3, heads_, d}), {2, 0, 3, 1, 4});
  const std::vector<Variable> parts = split(qkv, 0, {1, 1, 1});
  // q, k and v stay views of one copy, and the scale goes on the product: a scaled copy of q would leave
  // exact keeping k and v's views of that copy, and with them its q third for nothing.
  const Variable q = reshape(parts[0], {bw, heads_, n, d});
  const Variable k = reshape(parts[1], {bw, heads_, n, d});
  const Variable v = reshape(parts[2], {bw, heads_, n, d});
  // Moved to the input's device once and kept there as model state (Param): a copy made here each forward
  // would be an activation, and gather_rows keeps it for backward.
  if (position_index_.device() != x_in.data().device()) {
    MemTagScope tag(MemTag::Param);
    position_index_ = position_index_.to(x_in.data().device());
  }
  const Tensor& index = position_index_;
  const Variable bias =
      reshape(permute(reshape(gather_rows(bias_table_, index), {n, n, heads_}), {2, 0, 1}), {1, heads_, n, n});
  Variable logits = add_rows(scale(matmul(q, k, false, true), 1.f / std::sqrt(static_cast<float>(d))), bias);
  if (shift_ > 0) {
    const Variable mask(shift_mask(H, W, x_in.data().device()));
    logits = reshape(add_rows(reshape(logits, {B, bw / B, heads_, n, n}), mask), {bw, heads_, n, n});
  }
  const Variable out = reshape(permute(matmul(softmax(logits), v), {0, 2, 1, 3}), {bw, n, dim_});
  x = window_merge((*proj_)(out), B, H, W, w);
  if (shift_ > 0) x = roll(roll(x, shift_, 1), shift_, 2);
  return reshape(x, {B, H * W, dim_});
}

std::string ShiftedWindowAttention::describe() const {
  return detail::concat("ShiftedWindowAttention(", dim_, ", heads=", heads_, ", window=", window_, ", shift=", shift_,
                        ", map ", side_, "x", side_, ")");
}

std::shared_ptr<Module> make_swin(const SwinConfig& config) { return std::make_shared<SwinTransformer>(config); }

}  // namespace actlab
