// Fig. 4 quantities: capturing conv (and Linear) inputs with a forward observer, band energies of their
// DCT, and policy round trips; plus ModelStateGuard.
#include "actlab/analysis/spectrum.h"

#include <cmath>
#include <limits>

#include "actlab/analysis/dct.h"
#include "actlab/autograd/tape.h"
#include "actlab/core/allocator.h"
#include "actlab/core/error.h"
#include "actlab/layers/layers.h"

namespace actlab {
namespace {

// Keeps the analysis' own packs out of the per-layer cache report of a training run.
class CacheStatsPause {
 public:
  CacheStatsPause() : was_enabled_(CacheStats::global().enabled()) { CacheStats::global().set_enabled(false); }
  ~CacheStatsPause() { CacheStats::global().set_enabled(was_enabled_); }
  CacheStatsPause(const CacheStatsPause&) = delete;
  CacheStatsPause& operator=(const CacheStatsPause&) = delete;
 private:
  bool was_enabled_;
};

class InputCapture final : public ForwardObserver {
 public:
  explicit InputCapture(bool include_linear) : include_linear_(include_linear) {}
  void on_forward(const std::string& path, const Module& module, const Variable& output) override {
    const char* kind = nullptr;
    if (dynamic_cast<const Conv2d*>(&module)) kind = "Conv2d";
    else if (include_linear_ && dynamic_cast<const Linear*>(&module)) kind = "Linear";
    if (!kind) return;
    // The conv/linear op returns its node's output directly, so grad_fn() is that op's node and its
    // "input" slot is what the exact policy kept: the tensor the layer saw, not a copy.
    const std::shared_ptr<Node> node = output.grad_fn();
    ACTLAB_CHECK(node && node->has_saved("input"), "capture_layer_inputs: ", kind, " '", path,
                 "' recorded no input (is its weight frozen?)");
    captured_.push_back({path, kind, node->load("input")});
  }
  std::vector<CapturedInput> take() { return std::move(captured_); }
 private:
  bool include_linear_;
  std::vector<CapturedInput> captured_;
};

}  // namespace

ModelStateGuard::ModelStateGuard(Module& model)
    : model_(model), training_(model.is_training()), pack_step_(pack_step()) {
  for (const auto& [name, buffer] : model.named_buffers()) buffers_.emplace_back(buffer, buffer.clone());
  for (const auto& [name, param] : model.named_parameters()) {
    const auto& impl = param.impl();
    grads_.push_back({impl, impl->grad.defined() ? impl->grad.clone() : Tensor(), impl->grad_stale});
  }
}

ModelStateGuard::~ModelStateGuard() {
  restore_buffers();
  for (auto& g : grads_) {
    g.impl->grad = std::move(g.grad);
    g.impl->grad_stale = g.stale;
  }
  model_.train(training_);
  set_pack_step(pack_step_);
}

void ModelStateGuard::restore_buffers() const {
  for (const auto& [live, snapshot] : buffers_) {
    Tensor target = live;  // NOTE: a shallow handle on the module's own storage
    target.copy_(snapshot);
  }
}

std::vector<CapturedInput> capture_layer_inputs(Module& model, const Tensor& images, bool train_mode,
                                                bool include_linear) {
  ACTLAB_CHECK(images.defined() && images.dtype() == DType::F32 && images.dim() == 4,
               "capture_layer_inputs: images must be (N,C,H,W) f32, got ", images.defined() ? images.str() : "none");
  ACTLAB_CHECK(grad_enabled(), "capture_layer_inputs: needs autograd recording (called inside a NoGradGuard)");
  ACTLAB_CHECK(Tape::current().size() == 0, "capture_layer_inputs: the tape holds ", Tape::current().size(),
               " nodes of a step in progress; run the analysis between steps");
  ModelStateGuard state(model);
  model.train(train_mode);
  CacheStatsPause pause;
  const PolicySet exact;  // inputs are kept as they are, so the capture is the map itself
  InputCapture capture(include_linear);
  {
    TapeClearGuard clear_tape;
    ActivationCacheScope policies(exact);
    MemTagScope tag(MemTag::Activation);
    ObserverScope observe(&capture);
    model(Variable(images));
  }
  return capture.take();
}

double BandEnergy::high_over_low() const {
  if (lambda_low == 0.0) return lambda_high == 0.0 ? std::numeric_limits<double>::quiet_NaN()
                                                   : std::numeric_limits<double>::infinity();
  return lambda_high / lambda_low;
}

BandEnergy band_energy(const Tensor& x, double ratio) {
  ACTLAB_CHECK(x.defined() && x.dtype() == DType::F32 && x.dim() >= 2,
               "band_energy: needs an f32 map of rank >= 2, got ", x.defined() ? x.str() : "none");
  const int64_t h = x.size(-2), w = x.size(-1);
  const LowPassMask m = low_pass_mask(h, w, ratio);
  BandEnergy e;
  e.kept_rows = m.kept_rows;
  e.kept_cols = m.kept_cols;
  e.planes = x.numel() / (h * w);
  if (e.planes == 0) return e;
  const Tensor coeffs = dct2d(x);
  const float* c = coeffs.data<float>();
  const uint8_t* mask = m.mask.data();
  const int64_t hw = h * w, planes = e.planes;
  double low_sum = 0, high_sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : low_sum, high_sum)
  for (int64_t p = 0; p < planes; ++p) {
    double low = 0, high = 0;
    for (int64_t i = 0; i < hw; ++i) {
      const double v = static_cast<double>(c[p * hw + i]);
      if (mask[i]) low += v * v;
      else high += v * v;
    }
    low_sum += std::sqrt(low);
    high_sum += std::sqrt(high);
  }
  e.lambda_low = low_sum / static_cast<double>(planes);
  e.lambda_high = high_sum / static_cast<double>(planes);
  return e;
}

Reconstruction measure_reconstruction(const ActivationCachePolicy& policy, const Tensor& x, const PackContext& ctx,
                                      const SaveInfo& info) {
  ACTLAB_CHECK(x.defined() && x.dtype() == DType::F32, "measure_reconstruction: needs an f32 tensor, got ",
               x.defined() ? x.str() : "none");
  const Tensor xc = x.contiguous();
  std::unique_ptr<Packed> packed;
  {
    MemTagScope tag(MemTag::ActivationPacked);
    packed = policy.pack(xc, info, ctx);
  }
  const Tensor y = policy.unpack(*packed, info).contiguous();
  ACTLAB_CHECK(y.shape() == xc.shape(), "measure_reconstruction: ", policy.name(), " unpacked ", y.str(), " for ",
               xc.str());
  const float* a = xc.data<float>();
  const float* b = y.data<float>();
  const int64_t n = xc.numel();
  double diff = 0, norm = 0;
#pragma omp parallel for schedule(static) reduction(+ : diff, norm)
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(b[i]) - static_cast<double>(a[i]);
    diff += d * d;
    norm += static_cast<double>(a[i]) * static_cast<double>(a[i]);
  }
  Reconstruction r;
  r.numel = n;
  r.packed_bytes = static_cast<int64_t>(packed->nbytes());
  r.bits_per_element = n > 0 ? 8.0 * static_cast<double>(r.packed_bytes) / static_cast<double>(n) : 0.0;
  r.relative_error = norm > 0 ? std::sqrt(diff / norm) : (diff > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  return r;
}

std::vector<LayerSpectrum> layer_spectra(const std::vector<CapturedInput>& inputs,
                                         const std::vector<std::shared_ptr<const ActivationCachePolicy>>& policies,
                                         const SpectrumOptions& options) {
  low_pass_mask(1, 1, options.ratio);  // reject a bad ratio before any work
  std::vector<LayerSpectrum> out;
  for (size_t l = 0; l < inputs.size(); ++l) {
    const CapturedInput& in = inputs[l];
    if (in.input.dim() < 2 || in.input.dim() > 4) continue;
    LayerSpectrum row;
    row.path = in.path;
    row.shape = in.input.shape();
    row.token_axis = in.input.dim() == 3;
    row.has_spectrum = in.input.dim() != 2;  // an (N, D) vector's features are in no order a frequency runs along
    if (row.token_axis) {
      // (B, T, D) → (B, D, T, 1): every feature's sequence over the tokens is one T×1 plane, so the 2-D DCT
      // is the 1-D DCT along the tokens — the axis the token-map policies pool along.
      const Shape& s = in.input.shape();
      row.energy = band_energy(in.input.permute({0, 2, 1}).contiguous().reshape({s[0], s[2], s[1], 1}), options.ratio);
    } else if (row.has_spectrum) {
      row.energy = band_energy(in.input, options.ratio);
    }
    const SaveInfo info{in.kind == "Linear" ? "linear" : "conv2d", "input", true, in.path};
    for (const auto& policy : policies)
      row.reconstruction.push_back(measure_reconstruction(*policy, in.input, {options.seed, l}, info));
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace actlab
