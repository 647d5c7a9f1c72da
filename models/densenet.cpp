// DenseNet: DenseLayer, DenseBlock, the network (stem, blocks, transitions, norm5, classifier) and the
// DenseNet-121 configuration.
#include "actlab/models/densenet.h"

namespace actlab {

DenseLayer::DenseLayer(int64_t in_channels, int64_t growth, int64_t bn_size, ConvInit init) {
  const int64_t bottleneck = bn_size * growth;
  norm1_ = register_module("norm1", std::make_shared<BatchNorm2d>(in_channels));
  relu1_ = register_module("relu1", std::make_shared<ReLU>());
  conv1_ = register_module("conv1", std::make_shared<Conv2d>(in_channels, bottleneck, 1, 1, 0, 1, false, init));
  norm2_ = register_module("norm2", std::make_shared<BatchNorm2d>(bottleneck));
  relu2_ = register_module("relu2", std::make_shared<ReLU>());
  conv2_ = register_module("conv2", std::make_shared<Conv2d>(bottleneck, growth, 3, 1, 1, 1, false, init));
}

Variable DenseLayer::forward(const Variable& x) {
  const Variable h = (*conv1_)((*relu1_)((*norm1_)(x)));
  return (*conv2_)((*relu2_)((*norm2_)(h)));
}

DenseBlock::DenseBlock(int64_t layers, int64_t in_channels, int64_t growth, int64_t bn_size, ConvInit init)
    : in_(in_channels), out_(in_channels) {
  ACTLAB_CHECK(layers >= 1 && in_channels >= 1 && growth >= 1 && bn_size >= 1, "DenseBlock: bad sizes: ", layers,
               " layers, ", in_channels, " input channels, growth ", growth, ", bn_size ", bn_size);
  for (int64_t l = 1; l <= layers; ++l) {
    layers_.push_back(register_module("denselayer" + std::to_string(l),
                                      std::make_shared<DenseLayer>(out_, growth, bn_size, init)));
    out_ += growth;
  }
}

Variable DenseBlock::forward(const Variable& x) {
  Variable h = x;  // (N, in + l·growth, H, W) after layer l
  for (auto& layer : layers_) h = concat({h, (*layer)(h)}, 1);
  return h;
}

std::string DenseBlock::describe() const {
  return detail::concat("DenseBlock(", in_, "->", out_, ", ", layers_.size(), " layers)");
}

DenseNet::DenseNet(const DenseNetConfig& c) {
  ACTLAB_CHECK(!c.blocks.empty() && c.compression > 0.f && c.compression <= 1.f && c.stem_channels >= 1,
               "DenseNet: bad configuration: ", c.blocks.size(), " blocks, compression ", c.compression,
               ", stem channels ", c.stem_channels);
  features_ = register_module("features", std::make_shared<Sequential>());
  if (c.stem == Stem::ImageNet) {
    features_->add("conv0", std::make_shared<Conv2d>(c.in_channels, c.stem_channels, 7, 2, 3, 1, false, c.conv_init));
    features_->add("norm0", std::make_shared<BatchNorm2d>(c.stem_channels));
    features_->add("relu0", std::make_shared<ReLU>());
    features_->add("pool0", std::make_shared<MaxPool2d>(3, 2, 1));
  } else {
    features_->add("conv0", std::make_shared<Conv2d>(c.in_channels, c.stem_channels, 3, 1, 1, 1, false, c.conv_init));
  }
  int64_t channels = c.stem_channels;
  for (size_t b = 0; b < c.blocks.size(); ++b) {
    const std::string k = std::to_string(b + 1);
    channels = features_->add("denseblock" + k, std::make_shared<DenseBlock>(c.blocks[b], channels, c.growth,
                                                                             c.bn_size, c.conv_init))
                   ->out_channels();
    if (b + 1 == c.blocks.size()) break;
    // torchvision's _Transition is a Sequential of these four, named so.
    const auto out = static_cast<int64_t>(static_cast<float>(channels) * c.compression);
    ACTLAB_CHECK(out >= 1, "DenseNet: transition ", k, " would keep no channels of ", channels);
    auto transition = features_->add("transition" + k, std::make_shared<Sequential>());
    transition->add("norm", std::make_shared<BatchNorm2d>(channels));
    transition->add("relu", std::make_shared<ReLU>());
    transition->add("conv", std::make_shared<Conv2d>(channels, out, 1, 1, 0, 1, false, c.conv_init));
    transition->add("pool", std::make_shared<AvgPool2d>(2, 2));
    channels = out;
  }
  features_->add("norm5", std::make_shared<BatchNorm2d>(channels));
  relu_ = register_module("relu", std::make_shared<ReLU>());
  pool_ = register_module("avgpool", std::make_shared<GlobalAvgPool>());
  classifier_ = register_module("classifier", std::make_shared<Linear>(channels, c.num_classes));
  if (c.classifier_zero_bias) {
    MemTagScope tag(MemTag::Param);
    for (auto& [name, p] : classifier_->named_parameters())
      if (name == "bias") p.data().zero_();
  }
}

Variable DenseNet::forward(const Variable& x) {
  return (*classifier_)((*pool_)((*relu_)((*features_)(x))));
}

DenseNetConfig densenet121_config(Stem stem, int64_t in_channels, int64_t num_classes) {
  DenseNetConfig c;
  c.stem = stem;
  if (stem == Stem::ImageNet) {
    c.conv_init = ConvInit::KaimingNormalFanIn;
    c.classifier_zero_bias = true;
  }
  c.in_channels = in_channels;
  c.num_classes = num_classes;
  return c;
}

}  // namespace actlab
