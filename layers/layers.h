// The standard layers: Conv2d, Linear, BatchNorm2d, LayerNorm, ReLU, ReLU6, GELU, MaxPool2d, AvgPool2d,
// GlobalAvgPool, Dropout, DropPath, Flatten, Sequential. Initialisation follows torchvision (and timm for
// the transformer layers: LinearInit::TruncNormal).
// Tested in tests/test_functions.cpp (the ops they call) and tests/test_models.cpp (in networks).
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "actlab/autograd/functions.h"
#include "actlab/layers/module.h"

namespace actlab {

// KaimingNormalFanIn: torchvision's DenseNet (kaiming_normal_ with its default mode).
enum class ConvInit { KaimingNormalFanOut, KaimingNormalFanIn, KaimingUniformDefault };

class Conv2d final : public Module {
 public:
  // weight (out, in/groups, k, k); bias optional. Init: Kaiming normal, fan_out, gain sqrt(2)
  // (torchvision's ResNet/MobileNetV2 init) unless `init` says fan_in or PyTorch's default uniform. A bias
  // starts at 0 under both Kaiming inits, U(±1/sqrt(fan_in)) under the default one.
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride = 1, int64_t padding = 0,
         int64_t groups = 1, bool bias = false, ConvInit init = ConvInit::KaimingNormalFanOut);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "Conv2d"; }
  std::string describe() const override;
  const Variable& weight() const { return weight_; }
  int64_t in_channels() const { return in_; }
  int64_t out_channels() const { return out_; }
  int64_t kernel() const { return kernel_; }
  const Conv2dOptions& options() const { return opt_; }
 private:
  int64_t in_, out_, kernel_;
  Conv2dOptions opt_;
  Variable weight_, bias_;
};

enum class LinearInit {
  Default,      // PyTorch's: weight and bias U(-1/sqrt(in), 1/sqrt(in))
  TruncNormal,  // timm's ViT: weight N(0, 0.02²) truncated to ±2σ, bias 0
};

// Input (..., in_features): every leading dim is a row (token maps (B, T, D) included).
class Linear final : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, LinearInit init = LinearInit::Default);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "Linear"; }
  std::string describe() const override;
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
 private:
  int64_t in_, out_;
  Variable weight_, bias_;
};

// What BatchNorm2d runs in training mode on this thread instead of batch_norm(); empty (the default):
// batch_norm(). Set by data-parallel training with --sync-bn (dist/sync_batch_norm.h), whose statistics
// span every rank's batch, so the models need no other batch-norm module.
using BatchNormTrainFn = std::function<Variable(const Variable& x, const Variable& gamma, const Variable& beta,
                                               Tensor& running_mean, Tensor& running_var, float momentum, float eps)>;
void set_batch_norm_train_override(BatchNormTrainFn fn);

class BatchNorm2d final : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, float momentum = 0.1f, float eps = 1e-5f);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "BatchNorm2d"; }
  std::string describe() const override;
  int64_t channels() const { return channels_; }
 private:
  int64_t channels_;
  float momentum_, eps_;
  Variable gamma_, beta_;
  Tensor running_mean_, running_var_;  // share storage with the registered buffers
};

// LayerNorm over the last dimension; weight 1, bias 0 (timm's ViT uses eps 1e-6).
class LayerNorm final : public Module {
 public:
  explicit LayerNorm(int64_t features, float eps = 1e-5f);
  Variable forward(const Variable& x) override { return layer_norm(x, gamma_, beta_, eps_); }
  std::string kind() const override { return "LayerNorm"; }
  std::string describe() const override;
 private:
  int64_t features_;
  float eps_;
  Variable gamma_, beta_;
};

class GELU final : public Module {
 public:
  explicit GELU(bool tanh_approx = false) : tanh_approx_(tanh_approx) {}
  Variable forward(const Variable& x) override { return gelu(x, tanh_approx_); }
  std::string kind() const override { return "GELU"; }
 private:
  bool tanh_approx_;
};

class ReLU final : public Module {
 public:
  Variable forward(const Variable& x) override { return relu(x); }
  std::string kind() const override { return "ReLU"; }
};

class ReLU6 final : public Module {
 public:
  Variable forward(const Variable& x) override { return relu6(x); }
  std::string kind() const override { return "ReLU6"; }
};

class MaxPool2d final : public Module {
 public:
  MaxPool2d(int64_t kernel, int64_t stride, int64_t padding = 0) : opt_{kernel, stride, padding} {}
  Variable forward(const Variable& x) override { return max_pool2d(x, opt_); }
  std::string kind() const override { return "MaxPool2d"; }
 private:
  Pool2dOptions opt_;
};

class AvgPool2d final : public Module {
 public:
  AvgPool2d(int64_t kernel, int64_t stride, int64_t padding = 0) : opt_{kernel, stride, padding} {}
  Variable forward(const Variable& x) override { return avg_pool2d(x, opt_); }
  std::string kind() const override { return "AvgPool2d"; }
 private:
  Pool2dOptions opt_;
};

class GlobalAvgPool final : public Module {
 public:
  Variable forward(const Variable& x) override { return global_avg_pool(x); }
  std::string kind() const override { return "GlobalAvgPool"; }
};

class Flatten final : public Module {
 public:
  Variable forward(const Variable& x) override { return flatten(x, 1); }
  std::string kind() const override { return "Flatten"; }
};

// A module whose forward draws random numbers: call k after set_seed(s) draws philox(s, k, i) for its
// element (Dropout) or sample (DropPath) i.
class SeededModule : public Module {
 public:
  void set_seed(uint64_t seed) override {
    seed_ = seed;
    calls_ = 0;
  }
  uint64_t draw_position() const override { return calls_; }
  void rewind_draws(uint64_t position) override { calls_ = position; }
 protected:
  uint64_t seed() const { return seed_; }
  uint64_t next_call() { return calls_++; }
 private:
  uint64_t seed_ = 0;
  uint64_t calls_ = 0;
};

class Dropout final : public SeededModule {
 public:
  explicit Dropout(float p);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "Dropout"; }
 private:
  float p_;
};

// Stochastic depth on a residual branch: whole samples dropped with probability p (drop_path).
class DropPath final : public SeededModule {
 public:
  explicit DropPath(float p);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "DropPath"; }
  std::string describe() const override;
 private:
  float p_;
};

// Runs its children in order; children are named "0", "1", ... (torchvision naming).
class Sequential final : public Module {
 public:
  Sequential() = default;
  template <typename M> std::shared_ptr<M> add(std::shared_ptr<M> m) {
    return register_module(std::to_string(size_++), std::move(m));
  }
  template <typename M> std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) {
    ++size_;
    return register_module(name, std::move(m));
  }
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "Sequential"; }
  size_t size() const { return size_; }
 private:
  size_t size_ = 0;
};

}  // namespace actlab
