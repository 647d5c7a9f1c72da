// MobileNetV2: InvertedResidual blocks, the network and the three named configurations.
#include "actlab/models/mobilenet_v2.h"

namespace actlab {

namespace {

std::shared_ptr<Module> make_activation(const MobileNetV2Config& c) {
  if (c.relu6) return std::make_shared<ReLU6>();
  return std::make_shared<ReLU>();
}

// torchvision's Conv2dNormActivation: children 0 = conv, 1 = BN, 2 = activation.
std::shared_ptr<Sequential> conv_bn_act(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t groups,
                                        const MobileNetV2Config& c) {
  auto s = std::make_shared<Sequential>();
  s->add(std::make_shared<Conv2d>(in, out, kernel, stride, (kernel - 1) / 2, groups, false, c.conv_init));
  s->add(std::make_shared<BatchNorm2d>(out));
  s->add(make_activation(c));
  return s;
}

struct StageSpec {
  int64_t expand, channels, blocks, stride;
};

}  // namespace

InvertedResidual::InvertedResidual(int64_t in_planes, int64_t out_planes, int64_t stride, int64_t expand_ratio,
                                   const MobileNetV2Config& c)
    : in_(in_planes), out_(out_planes), stride_(stride), expand_(expand_ratio) {
  ACTLAB_CHECK(stride == 1 || stride == 2, "InvertedResidual: stride must be 1 or 2, got ", stride);
  ACTLAB_CHECK(expand_ratio >= 1, "InvertedResidual: expand ratio must be >= 1, got ", expand_ratio);
  const int64_t hidden = in_planes * expand_ratio;
  conv_ = register_module("conv", std::make_shared<Sequential>());
  if (expand_ratio != 1 || c.kuangliu_blocks) conv_->add(conv_bn_act(in_planes, hidden, 1, 1, 1, c));
  conv_->add(conv_bn_act(hidden, hidden, 3, stride, hidden, c));
  conv_->add(std::make_shared<Conv2d>(hidden, out_planes, 1, 1, 0, 1, false, c.conv_init));
  conv_->add(std::make_shared<BatchNorm2d>(out_planes));
  if (c.kuangliu_blocks) {
    use_residual_ = stride == 1;
    if (use_residual_ && in_planes != out_planes) {
      shortcut_ = register_module("shortcut", std::make_shared<Sequential>());
      shortcut_->add(std::make_shared<Conv2d>(in_planes, out_planes, 1, 1, 0, 1, false, c.conv_init));
      shortcut_->add(std::make_shared<BatchNorm2d>(out_planes));
    }
  } else {
    use_residual_ = stride == 1 && in_planes == out_planes;
  }
}

Variable InvertedResidual::forward(const Variable& x) {
  Variable y = (*conv_)(x);
  if (!use_residual_) return y;
  return add(y, shortcut_ ? (*shortcut_)(x) : x);
}

std::string InvertedResidual::describe() const {
  return detail::concat("InvertedResidual(", in_, "->", out_, ", t=", expand_, ", s=", stride_,
                        use_residual_ ? (shortcut_ ? ", conv shortcut" : ", residual") : "", ")");
}

MobileNetV2::MobileNetV2(const MobileNetV2Config& c) {
  ACTLAB_CHECK(c.stem_stride >= 1 && c.stage2_stride >= 1, "MobileNetV2: bad strides stem ", c.stem_stride,
               ", stage 2 ", c.stage2_stride);
  const StageSpec stages[] = {{1, 16, 1, 1},  {6, 24, 2, c.stage2_stride}, {6, 32, 3, 2}, {6, 64, 4, 2},
                              {6, 96, 3, 1},  {6, 160, 3, 2},              {6, 320, 1, 1}};
  constexpr int64_t kStemWidth = 32, kLastWidth = 1280;
  features_ = register_module("features", std::make_shared<Sequential>());
  features_->add(conv_bn_act(c.in_channels, kStemWidth, 3, c.stem_stride, 1, c));
  int64_t in_planes = kStemWidth;
  for (const StageSpec& s : stages) {
    for (int64_t b = 0; b < s.blocks; ++b) {
      features_->add(std::make_shared<InvertedResidual>(in_planes, s.channels, b == 0 ? s.stride : 1, s.expand, c));
      in_planes = s.channels;
    }
  }
  features_->add(conv_bn_act(in_planes, kLastWidth, 1, 1, 1, c));
  pool_ = register_module("avgpool", std::make_shared<GlobalAvgPool>());
  classifier_ = register_module("classifier", std::make_shared<Sequential>());
  classifier_->add(std::make_shared<Dropout>(c.dropout));
  auto fc = classifier_->add(std::make_shared<Linear>(kLastWidth, c.num_classes));
  if (c.classifier_normal_init) {
    MemTagScope tag(MemTag::Param);
    for (auto& [name, p] : fc->named_parameters()) {
      if (name == "weight") p.data().copy_(Tensor::randn(p.shape(), init_rng(), 0.f, 0.01f));
      else p.data().zero_();
    }
  }
}

Variable MobileNetV2::forward(const Variable& x) {
  return (*classifier_)((*pool_)((*features_)(x)));
}

MobileNetV2Config mobilenet_v2_imagenet_config(int64_t in_channels, int64_t num_classes) {
  MobileNetV2Config c;
  c.in_channels = in_channels;
  c.num_classes = num_classes;
  return c;
}

MobileNetV2Config mobilenet_v2_division_config(int64_t in_channels, int64_t num_classes) {
  MobileNetV2Config c;
  c.stem_stride = 1;
  c.stage2_stride = 1;
  c.relu6 = false;
  c.kuangliu_blocks = true;
  c.dropout = 0.f;
  c.classifier_normal_init = false;
  c.conv_init = ConvInit::KaimingUniformDefault;
  c.in_channels = in_channels;
  c.num_classes = num_classes;
  return c;
}

MobileNetV2Config mobilenet_v2_torchcifar_config(int64_t in_channels, int64_t num_classes) {
  MobileNetV2Config c;
  c.stem_stride = 1;
  c.stage2_stride = 1;
  c.dropout = 0.f;
  c.classifier_normal_init = false;
  c.in_channels = in_channels;
  c.num_classes = num_classes;
  return c;
}

}  // namespace actlab
