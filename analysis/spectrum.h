// The DIVISION paper's Fig. 4 quantities for a model on a batch: the input map H of every conv layer
// (what an activation-cache policy keeps for that layer's backward), its low- and high-frequency
// energies λᴸ = ‖DCT(H) ⊙ M‖_F and λᴴ = ‖DCT(H) ⊙ (1 − M)‖_F, and what each policy makes of it
// (relative reconstruction error, bits per element). Also ModelStateGuard, which lets the analyses run
// a model without leaving a trace on it. Tested in tests/test_inspect.cpp ("spectrum: ...").
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "actlab/compress/policy.h"
#include "actlab/layers/module.h"

namespace actlab {

// Snapshots what running a model forward/backward changes — buffers (BatchNorm running statistics,
// deep copies), the training flag of the root, every parameter's gradient (deep copy + staleness) and
// the pack-step counter of autograd/saved_tensor.h — and puts all of it back on destruction.
// NOTE: the training flag is restored with model.train(flag), i.e. on every child: a model whose
// children were in mixed modes comes back uniform.
class ModelStateGuard {
 public:
  explicit ModelStateGuard(Module& model);
  ~ModelStateGuard();
  ModelStateGuard(const ModelStateGuard&) = delete;
  ModelStateGuard& operator=(const ModelStateGuard&) = delete;
  // Copies the snapshot buffers back now (between passes that must see the same running statistics).
  void restore_buffers() const;
 private:
  struct SavedGrad {
    std::shared_ptr<VariableImpl> impl;
    Tensor grad;  // deep copy, or undefined
    bool stale = true;
  };
  Module& model_;
  bool training_;
  uint64_t pack_step_;
  std::vector<std::pair<Tensor, Tensor>> buffers_;  // (live buffer, snapshot)
  std::vector<SavedGrad> grads_;
};

// The input a Conv2d (or Linear) module saw in one forward, under the module's full path.
struct CapturedInput {
  std::string path;  // "layer1.0.conv1"
  std::string kind;  // "Conv2d" or "Linear"
  Tensor input;      // (N,C,H,W) for Conv2d, (N,D) for Linear; f32 contiguous, shares the forward's storage
};

// Runs model(images) once and returns the input of every Conv2d (and Linear when include_linear) in
// call order; a module called twice appears twice. images: (N,C,H,W) f32.
// train_mode: BatchNorm uses batch statistics (the maps a training step compresses); otherwise the
// running ones. Either way the model's state is left as found (ModelStateGuard).
// How: a ForwardObserver sees each conv's output; the op node behind that output saved the conv's input
// (exact policy in force here), and that saved tensor is the capture. So recording must be on: throws
// Error inside a NoGradGuard, while the thread's tape holds a step in progress (the capture clears the
// tape), or for a layer whose weight does not require a gradient.
std::vector<CapturedInput> capture_layer_inputs(Module& model, const Tensor& images, bool train_mode = true,
                                                bool include_linear = false);

// λᴸ, λᴴ of a map: for each H×W plane (rank >= 2; leading dims index planes) the Frobenius norms of
// the masked DCT coefficients (low_pass_mask in analysis/dct.h), averaged over all planes.
struct BandEnergy {
  double lambda_low = 0, lambda_high = 0;
  int64_t planes = 0;
  int64_t kept_rows = 0, kept_cols = 0;  // the low-pass block
  // λᴴ / λᴸ: below 1 where the paper's claim λᴸ > λᴴ holds (NaN for an all-zero map).
  double high_over_low() const;
};
BandEnergy band_energy(const Tensor& x, double ratio);

// What a policy makes of a map x: ‖unpack(pack(x)) − x‖_F / ‖x‖_F (0 for x = 0 reconstructed exactly)
// and the bytes its pack holds (bits per element = 8·packed_bytes / numel). Note lfc:/hfc: reconstruct
// on purpose only one component, so their "error" is the other component's share of x.
struct Reconstruction {
  double relative_error = 0;
  double bits_per_element = 0;
  int64_t packed_bytes = 0;
  int64_t numel = 0;
};
// x: f32 (any strides). ctx seeds stochastic rounding exactly as autograd does for a saved tensor.
Reconstruction measure_reconstruction(const ActivationCachePolicy& policy, const Tensor& x, const PackContext& ctx,
                                      const SaveInfo& info = {"conv2d", "input", true, ""});

struct LayerSpectrum {
  std::string path;
  Shape shape;
  bool token_axis = false;  // a (B, T, D) token map: λ of the 1-D DCT along the tokens, per feature
  // false for a Linear layer's (N, D) input: its features have no order to transform along, so it has no
  // λ (energy stays empty); the policies code it all the same, so its reconstruction is measured.
  bool has_spectrum = true;
  BandEnergy energy;
  std::vector<Reconstruction> reconstruction;  // one per policy, in the order given
};
struct SpectrumOptions {
  double ratio = 0.1;      // low-pass cut-off r = W/N (paper Fig. 3(a))
  uint64_t seed = 0;       // stochastic rounding: layer l packs with PackContext{seed, l}
  bool train_mode = true;  // see capture_layer_inputs
};
// One row per captured input of rank 4 (spatial maps) or 3 (token maps, along the tokens), and one without a
// spectrum per input of rank 2 ((N, D) vectors: reconstruction only); others are skipped.
std::vector<LayerSpectrum> layer_spectra(const std::vector<CapturedInput>& inputs,
                                         const std::vector<std::shared_ptr<const ActivationCachePolicy>>& policies,
                                         const SpectrumOptions& options);

}  // namespace actlab
