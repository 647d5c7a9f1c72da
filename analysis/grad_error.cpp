// Per-layer weight-gradient error of activation-cache policies against the exact gradient.
#include "actlab/analysis/grad_error.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "actlab/analysis/spectrum.h"
#include "actlab/autograd/functions.h"
#include "actlab/autograd/tape.h"
#include "actlab/core/allocator.h"
#include "actlab/core/error.h"
#include "actlab/layers/checkpoint.h"
#include "actlab/layers/layers.h"

namespace actlab {
namespace {

struct WeightLayer {
  std::string path, kind;
  Variable weight;
};

std::vector<WeightLayer> weight_layers(Module& model) {
  std::vector<WeightLayer> out;
  for (const auto& [path, pointer] : model.named_modules()) {
    Module& m = pointer ? *pointer : model;  // NOTE: the root comes without a shared_ptr
    const char* kind = dynamic_cast<Conv2d*>(&m)        ? "Conv2d"
                       : dynamic_cast<Linear*>(&m)      ? "Linear"
                       : dynamic_cast<BatchNorm2d*>(&m) ? "BatchNorm2d"
                       : dynamic_cast<LayerNorm*>(&m)   ? "LayerNorm"
                                                        : nullptr;
    if (!kind) continue;
    for (const auto& [name, param] : m.named_parameters())
      if (name == "weight") out.push_back({path.empty() ? "(root)" : path, kind, param});
  }
  return out;
}

// One training-step forward/backward under `set`, stochastic rounding seeded with o.seed + draw; returns a
// copy of each layer's weight gradient.
std::vector<Tensor> weight_gradients(Module& model, const std::vector<WeightLayer>& layers, const Tensor& images,
                                     const Tensor& labels, const PolicySet& set, const GradErrorOptions& o, int draw,
                                     const ModelStateGuard& state, double* loss_value) {
  state.restore_buffers();
  set_pack_seed(o.seed + static_cast<uint64_t>(draw));
  set_pack_step(0);
  for (const auto& [path, pointer] : model.named_modules())  // same masks every run; the root has no handle
    (pointer ? *pointer : model).set_seed(o.seed);
  for (auto& p : model.parameters()) p.zero_grad();
  {
    TapeClearGuard clear_on_error;
    Variable loss;
    const CheckpointPlan plan = make_checkpoint_plan(model, set.checkpoint());
    {
      ActivationCacheScope scope(set);
      CheckpointScope checkpoints(plan);
      MemTagScope tag(MemTag::Activation);
      loss = cross_entropy(model(Variable(images)), labels, o.label_smoothing);
    }
    *loss_value = static_cast<double>(loss.data().item());
    MemTagScope tag(MemTag::Activation);
    backward(loss);
  }
  std::vector<Tensor> grads;
  for (const auto& layer : layers) {
    const Tensor g = layer.weight.grad();
    ACTLAB_CHECK(g.defined(), "gradient_errors: no gradient reached the weight of ", layer.kind, " '", layer.path,
                 "' (policy ", set.describe(), ")");
    grads.push_back(g.contiguous().clone());
  }
  return grads;
}

// ‖a − b‖_F and ‖b‖_F in double.
void difference_norms(const Tensor& a, const Tensor& b, double* diff_norm, double* ref_norm) {
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = static_cast<double>(pa[i]) - static_cast<double>(pb[i]);
    diff += d * d;
    ref += static_cast<double>(pb[i]) * static_cast<double>(pb[i]);
  }
  *diff_norm = std::sqrt(diff);
  *ref_norm = std::sqrt(ref);
}

// Mean over the Conv2d/Linear layers (norms: over the normalization scales) of each policy's column of
// `errors` (non-finite layer values skipped).
std::vector<double> mean_over_layers(const GradErrorReport& r, std::vector<double> LayerGradError::*errors,
                                     bool norms = false) {
  std::vector<double> mean(r.policies.size(), 0.0);
  for (size_t p = 0; p < r.policies.size(); ++p) {
    int64_t count = 0;
    for (const auto& layer : r.layers) {
      if (is_norm_kind(layer.kind) != norms) continue;
      const double e = (layer.*errors)[p];
      if (!std::isfinite(e)) continue;
      mean[p] += e;
      ++count;
    }
    mean[p] = count > 0 ? mean[p] / static_cast<double>(count) : std::numeric_limits<double>::quiet_NaN();
  }
  return mean;
}

// ‖approx − exact‖_F / ‖exact‖_F (inf when exact is 0 and approx is not).
double relative_difference(const Tensor& approx, const Tensor& exact) {
  double diff = 0, ref = 0;
  difference_norms(approx, exact, &diff, &ref);
  return ref > 0 ? diff / ref : (diff > 0 ? std::numeric_limits<double>::infinity() : 0.0);
}

}  // namespace

bool is_norm_kind(const std::string& kind) { return kind == "BatchNorm2d" || kind == "LayerNorm"; }

std::vector<double> GradErrorReport::norm_mean_relative_error() const {
  return mean_over_layers(*this, &LayerGradError::relative_error, true);
}

size_t GradErrorReport::weight_layer_count() const {
  return static_cast<size_t>(
      std::count_if(layers.begin(), layers.end(), [](const LayerGradError& l) { return !is_norm_kind(l.kind); }));
}

size_t GradErrorReport::norm_scale_count() const { return layers.size() - weight_layer_count(); }

std::vector<double> GradErrorReport::mean_relative_error() const {
  return mean_over_layers(*this, &LayerGradError::relative_error);
}

std::vector<double> GradErrorReport::mean_error_of_draws() const {
  return mean_over_layers(*this, &LayerGradError::mean_error);
}

GradErrorReport gradient_errors(Module& model, const Tensor& images, const Tensor& labels,
                                const std::vector<std::shared_ptr<const ActivationCachePolicy>>& policies,
                                const GradErrorOptions& options) {
  std::vector<PolicySet> sets;
  for (const auto& policy : policies) sets.emplace_back(policy);
  return gradient_errors(model, images, labels, sets, options);
}

GradErrorReport gradient_errors(Module& model, const Tensor& images, const Tensor& labels,
                                const std::vector<PolicySet>& policy_sets, const GradErrorOptions& options) {
  ACTLAB_CHECK(images.defined() && images.dtype() == DType::F32 && images.dim() == 4,
               "gradient_errors: images must be (N,C,H,W) f32, got ", images.defined() ? images.str() : "none");
  ACTLAB_CHECK(labels.defined() && labels.dim() == 1 && labels.size(0) == images.size(0),
               "gradient_errors: labels must be (N) for ", images.str(), ", got ",
               labels.defined() ? labels.str() : "none");
  ACTLAB_CHECK(grad_enabled(), "gradient_errors: needs autograd recording (called inside a NoGradGuard)");
  ACTLAB_CHECK(Tape::current().size() == 0, "gradient_errors: the tape holds ", Tape::current().size(),
               " nodes of a step in progress; run the analysis between steps");
  const std::vector<WeightLayer> layers = weight_layers(model);
  ACTLAB_CHECK(std::any_of(layers.begin(), layers.end(), [](const WeightLayer& l) { return !is_norm_kind(l.kind); }),
               "gradient_errors: the model has no Conv2d or Linear layer");
  ACTLAB_CHECK(options.draws >= 1, "gradient_errors: draws must be >= 1, got ", options.draws);

  ModelStateGuard state(model);
  model.train(options.train_mode);
  GradErrorReport report;
  report.draws = options.draws;
  const std::vector<Tensor> exact =
      weight_gradients(model, layers, images, labels, PolicySet(), options, 0, state, &report.loss);
  for (size_t l = 0; l < layers.size(); ++l) {
    LayerGradError row{layers[l].path, layers[l].kind, layers[l].weight.shape(), 0.0, {}, {}};
    double unused = 0;
    difference_norms(exact[l], exact[l], &unused, &row.grad_norm);
    report.layers.push_back(std::move(row));
  }
  for (const PolicySet& set : policy_sets) {
    report.policies.push_back(set.describe());
    // Σ over draws of ∇̂W in double: K equal draws (a lossless policy's) sum to K·g exactly and their mean is g,
    // where an f32 sum rounded (1e-7 of error reported for exact). `mean` holds the first draw's ∇̂W, its
    // shape, until the mean overwrites it.
    std::vector<std::vector<double>> sum(layers.size());
    std::vector<Tensor> mean;
    for (int draw = 0; draw < options.draws; ++draw) {
      double loss = 0;
      std::vector<Tensor> approx = weight_gradients(model, layers, images, labels, set, options, draw, state, &loss);
      // Policies change only what backward reads: a different loss means the forwards differed and the
      // comparison would measure something else.
      ACTLAB_CHECK(loss == report.loss, "gradient_errors: the forward under ", set.describe(), " gave loss ", loss,
                   ", the exact one ", report.loss, " (non-deterministic forward?)");
      for (size_t l = 0; l < layers.size(); ++l) {
        const float* g = approx[l].data<float>();
        if (draw == 0) {
          report.layers[l].relative_error.push_back(relative_difference(approx[l], exact[l]));
          sum[l].assign(g, g + approx[l].numel());
          continue;
        }
        for (int64_t i = 0; i < approx[l].numel(); ++i) sum[l][static_cast<size_t>(i)] += g[i];
      }
      if (draw == 0) mean = std::move(approx);
    }
    // One draw's mean is its gradient, so with draws = 1 mean_error equals relative_error bit for bit.
    for (size_t l = 0; l < layers.size(); ++l) {
      float* m = mean[l].data<float>();
      for (int64_t i = 0; i < mean[l].numel(); ++i)
        m[i] = static_cast<float>(sum[l][static_cast<size_t>(i)] / options.draws);
      report.layers[l].mean_error.push_back(relative_difference(mean[l], exact[l]));
    }
  }
  return report;
}

}  // namespace actlab
