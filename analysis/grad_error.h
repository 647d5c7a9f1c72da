// Theorem 3.1 of the DIVISION paper made visible: for one batch, the weight gradient ∇W of every
// Conv2d/Linear layer with exact activations, and for each activation-cache policy the gradient ∇̂W of
// the same step (same parameters, same forward — only what backward reads differs), reported per layer
// as ‖∇̂W − ∇W‖_F / ‖∇W‖_F. The scales γ of the BatchNorm2d and LayerNorm layers are reported the same way
// (their gradient Σ dy·x̂ reads the normalized input from the layer's own save), in rows of their own
// kind that the Conv2d/Linear means leave out. Tested in tests/test_inspect.cpp ("grad_error: ...").
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "actlab/compress/policy.h"
#include "actlab/layers/module.h"

namespace actlab {

struct GradErrorOptions {
  uint64_t seed = 0;         // dropout masks, and stochastic rounding: a pass packs with set_pack_seed(seed + draw), pack step 0
  bool train_mode = true;    // BatchNorm with batch statistics, as in a training step
  float label_smoothing = 0;
  // Passes per policy: draw d packs with seed + d (dropout masks stay those of `seed`). The mean of the
  // draws' gradients separates the two kinds of error: an unbiased policy's error of the mean falls as
  // 1/sqrt(draws), a bias stays (see LayerGradError::mean_error).
  int draws = 1;
};

// Whether a LayerGradError::kind is a normalization layer's scale (BatchNorm2d, LayerNorm).
bool is_norm_kind(const std::string& kind);

struct LayerGradError {
  std::string path;              // "layer1.0.conv1"
  std::string kind;              // "Conv2d", "Linear", or a normalization layer's scale: "BatchNorm2d", "LayerNorm"
  Shape weight_shape;
  double grad_norm = 0;          // ‖∇W‖_F of the exact pass
  std::vector<double> relative_error;  // ‖∇̂W − ∇W‖_F / ‖∇W‖_F, one per policy (inf if ∇W = 0 ≠ ∇̂W), first draw
  std::vector<double> mean_error;      // the same for the mean of the draws' ∇̂W (= relative_error when draws = 1)
};

struct GradErrorReport {
  std::vector<std::string> policies;  // policy names, in the order given
  std::vector<LayerGradError> layers; // Conv2d/Linear modules and normalization scales, in named_modules() order
  double loss = 0;                    // the batch loss (identical for every pass)
  int draws = 1;                      // GradErrorOptions::draws
  // Mean over the Conv2d/Linear layers of relative_error, one per policy (non-finite layer values skipped).
  std::vector<double> mean_relative_error() const;
  // Mean over the Conv2d/Linear layers of mean_error, one per policy (non-finite layer values skipped).
  std::vector<double> mean_error_of_draws() const;
  // Mean over the normalization scales of relative_error, one per policy (NaN when the model has none).
  std::vector<double> norm_mean_relative_error() const;
  size_t weight_layer_count() const;  // the Conv2d/Linear rows
  size_t norm_scale_count() const;    // the BatchNorm2d/LayerNorm scale rows (the rest)
};

// images: (N,C,H,W) f32; labels: (N) i64. Runs 1 + policies.size() · draws forward/backward passes. Before each
// pass the BatchNorm buffers are put back to their state at entry (so every pass sees the same running
// statistics, and the model leaves as it came), dropout layers are reseeded with options.seed and the
// stochastic-rounding stream is reset, so passes differ only by the policy and the draw. Gradients of the model's
// parameters, its training flag and the pack-step counter are restored on return (ModelStateGuard).
// Throws Error inside a NoGradGuard or while the thread's tape holds a step in progress.
// NOTE: sets the process-wide pack seed (set_pack_seed) to options.seed and leaves it there.
GradErrorReport gradient_errors(Module& model, const Tensor& images, const Tensor& labels,
                                const std::vector<std::shared_ptr<const ActivationCachePolicy>>& policies,
                                const GradErrorOptions& options = {});
// The same for policy sets (a default plus per-module rules, PolicySet::describe() names them): which
// layers a rule such as "blocks.*.attn=exact" protects, on the same batch and draws.
GradErrorReport gradient_errors(Module& model, const Tensor& images, const Tensor& labels,
                                const std::vector<PolicySet>& policy_sets, const GradErrorOptions& options = {});

}  // namespace actlab
