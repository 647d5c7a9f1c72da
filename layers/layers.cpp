// Layer constructors (torchvision initialisation) and forwards.
#include "actlab/layers/layers.h"

#include <cmath>

#include "actlab/autograd/checkpoint.h"

namespace actlab {

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding,
               int64_t groups, bool bias, ConvInit init)
    : in_(in_channels), out_(out_channels), kernel_(kernel), opt_{stride, padding, groups} {
  ACTLAB_CHECK(in_channels > 0 && out_channels > 0 && kernel > 0 && stride > 0 && padding >= 0 && groups > 0,
               "Conv2d: bad arguments in=", in_channels, " out=", out_channels, " kernel=", kernel,
               " stride=", stride, " padding=", padding, " groups=", groups);
  ACTLAB_CHECK(in_channels % groups == 0 && out_channels % groups == 0, "Conv2d: channels ", in_channels, "->",
               out_channels, " not divisible by groups ", groups);
  MemTagScope tag(MemTag::Param);
  const int64_t fan_in = in_channels / groups * kernel * kernel;
  const int64_t fan_out = out_channels / groups * kernel * kernel;
  const bool kaiming_normal = init == ConvInit::KaimingNormalFanOut || init == ConvInit::KaimingNormalFanIn;
  if (kaiming_normal) {
    const int64_t fan = init == ConvInit::KaimingNormalFanOut ? fan_out : fan_in;
    const float std = std::sqrt(2.0f / static_cast<float>(fan));
    weight_ = register_parameter("weight", Tensor::randn({out_channels, in_channels / groups, kernel, kernel},
                                                         init_rng(), 0.f, std));
  } else {
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    weight_ = register_parameter("weight", Tensor::rand({out_channels, in_channels / groups, kernel, kernel},
                                                        init_rng(), -bound, bound));
  }
  if (bias) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    bias_ = register_parameter("bias", kaiming_normal ? Tensor::zeros({out_channels})
                                           : Tensor::rand({out_channels}, init_rng(), -bound, bound));
  }
}

Variable Conv2d::forward(const Variable& x) { return conv2d(x, weight_, bias_, opt_); }

std::string Conv2d::describe() const {
  return detail::concat("Conv2d(", in_, "->", out_, ", k=", kernel_, ", s=", opt_.stride, ", p=", opt_.padding,
                        opt_.groups > 1 ? ", groups=" + std::to_string(opt_.groups) : "",
                        bias_.defined() ? ", bias" : "", ")");
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, LinearInit init)
    : in_(in_features), out_(out_features) {
  ACTLAB_CHECK(in_features > 0 && out_features > 0, "Linear: bad sizes ", in_features, "->", out_features);
  MemTagScope tag(MemTag::Param);
  if (init == LinearInit::TruncNormal) {
    weight_ = register_parameter("weight", trunc_normal_init({out_features, in_features}, 0.02f));
    if (bias) bias_ = register_parameter("bias", Tensor::zeros({out_features}));
    return;
  }
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_features));
  weight_ = register_parameter("weight", Tensor::rand({out_features, in_features}, init_rng(), -bound, bound));
  if (bias) bias_ = register_parameter("bias", Tensor::rand({out_features}, init_rng(), -bound, bound));
}

LayerNorm::LayerNorm(int64_t features, float eps) : features_(features), eps_(eps) {
  ACTLAB_CHECK(features > 0 && eps > 0.f, "LayerNorm: bad arguments features=", features, " eps=", eps);
  MemTagScope tag(MemTag::Param);
  gamma_ = register_parameter("weight", Tensor::full({features}, 1.f));
  beta_ = register_parameter("bias", Tensor::zeros({features}));
}

std::string LayerNorm::describe() const { return detail::concat("LayerNorm(", features_, ")"); }

Variable Linear::forward(const Variable& x) { return linear(x, weight_, bias_); }

std::string Linear::describe() const { return detail::concat("Linear(", in_, "->", out_, ")"); }

BatchNorm2d::BatchNorm2d(int64_t channels, float momentum, float eps)
    : channels_(channels), momentum_(momentum), eps_(eps) {
  ACTLAB_CHECK(channels > 0, "BatchNorm2d: bad channel count ", channels);
  MemTagScope tag(MemTag::Param);
  gamma_ = register_parameter("weight", Tensor::full({channels}, 1.f));
  beta_ = register_parameter("bias", Tensor::zeros({channels}));
  running_mean_ = register_buffer("running_mean", Tensor::zeros({channels}));
  running_var_ = register_buffer("running_var", Tensor::full({channels}, 1.f));
}

namespace {
thread_local BatchNormTrainFn t_batch_norm_train;
}  // namespace
void set_batch_norm_train_override(BatchNormTrainFn fn) { t_batch_norm_train = std::move(fn); }

Variable BatchNorm2d::forward(const Variable& x) {
  // A checkpoint's recompute sees the same batch again: its statistics must not enter the running
  // averages twice, so it updates throw-away copies.
  Tensor scratch_mean, scratch_var;
  if (is_training() && recomputing()) {
    scratch_mean = running_mean_.clone();
    scratch_var = running_var_.clone();
  }
  Tensor& mean = scratch_mean.defined() ? scratch_mean : running_mean_;
  Tensor& var = scratch_var.defined() ? scratch_var : running_var_;
  if (is_training() && t_batch_norm_train) return t_batch_norm_train(x, gamma_, beta_, mean, var, momentum_, eps_);
  return batch_norm(x, gamma_, beta_, mean, var, is_training(), momentum_, eps_);
}

std::string BatchNorm2d::describe() const { return detail::concat("BatchNorm2d(", channels_, ")"); }

Dropout::Dropout(float p) : p_(p) {
  ACTLAB_CHECK(p >= 0.f && p < 1.f, "Dropout: p must be in [0, 1), got ", p);
}

Variable Dropout::forward(const Variable& x) { return dropout(x, p_, is_training(), seed(), next_call()); }

DropPath::DropPath(float p) : p_(p) {
  ACTLAB_CHECK(p >= 0.f && p < 1.f, "DropPath: p must be in [0, 1), got ", p);
}

Variable DropPath::forward(const Variable& x) { return drop_path(x, p_, is_training(), seed(), next_call()); }

std::string DropPath::describe() const { return detail::concat("DropPath(", p_, ")"); }

Variable Sequential::forward(const Variable& x) {
  Variable h = x;
  for (const auto& c : children()) h = (*c.second)(h);
  return h;
}

}  // namespace actlab
