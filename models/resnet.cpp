// CIFAR ResNets built from BasicBlocks.
#include "models/resnet.h"

namespace actlab {

BasicBlock::BasicBlock(int64_t in_planes, int64_t planes, int64_t stride, Shortcut shortcut) {
  conv1_ = register_module("conv1", std::make_shared<Conv2d>(in_planes, planes, 3, stride, 1));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(planes));
  relu_ = register_module("relu", std::make_shared<ReLU>());
  conv2_ = register_module("conv2", std::make_shared<Conv2d>(planes, planes, 3, 1, 1));
  bn2_ = register_module("bn2", std::make_shared<BatchNorm2d>(planes));
  if (stride != 1 || in_planes != planes) {
    if (shortcut == Shortcut::A) {
      pad_stride_ = stride;
      pad_out_ = planes;
    } else {
      downsample_ = register_module("downsample", std::make_shared<Sequential>());
      downsample_->add(std::make_shared<Conv2d>(in_planes, planes, 1, stride, 0));
      downsample_->add(std::make_shared<BatchNorm2d>(planes));
    }
  }
}

Variable BasicBlock::forward(const Variable& x) {
  Variable out = (*relu_)((*bn1_)((*conv1_)(x)));
  out = (*bn2_)((*conv2_)(out));
  Variable identity = x;
  if (downsample_) {
    identity = (*downsample_)(x);
  } else if (pad_out_ > 0) {
    identity = shortcut_pad(x, pad_stride_, pad_out_);
  }
  ModulePathScope path("relu");
  return add_relu(out, identity);
}

ResNetCifar::ResNetCifar(const std::vector<int64_t>& widths, const std::vector<int64_t>& blocks,
                         Shortcut shortcut, int64_t in_channels, int64_t num_classes) {
  ACTLAB_CHECK(widths.size() == blocks.size() && !widths.empty(), "ResNet: widths and blocks differ in length");
  conv1_ = register_module("conv1", std::make_shared<Conv2d>(in_channels, widths[0], 3, 1, 1));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(widths[0]));
  relu_ = register_module("relu", std::make_shared<ReLU>());
  int64_t in_planes = widths[0];
  for (size_t s = 0; s < widths.size(); ++s) {
    auto stage = register_module("layer" + std::to_string(s + 1), std::make_shared<Sequential>());
    for (int64_t b = 0; b < blocks[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      stage->add(std::make_shared<BasicBlock>(in_planes, widths[s], stride, shortcut));
      in_planes = widths[s];
    }
    stages_.push_back(stage);
  }
  pool_ = register_module("avgpool", std::make_shared<GlobalAvgPool>());
  fc_ = register_module("fc", std::make_shared<Linear>(in_planes, num_classes));
}

Variable ResNetCifar::forward(const Variable& x) {
  Variable h = (*relu_)((*bn1_)((*conv1_)(x)));
  for (auto& stage : stages_) h = (*stage)(h);
  return (*fc_)((*pool_)(h));
}

std::shared_ptr<ResNetCifar> resnet_cifar_he(int depth, int64_t in_channels, int64_t num_classes,
                                             Shortcut shortcut) {
  ACTLAB_CHECK(depth >= 8 && (depth - 2) % 6 == 0, "CIFAR ResNet depth must be 6n+2 (20, 32, 56, 110), got ", depth);
  const int64_t n = (depth - 2) / 6;
  return std::make_shared<ResNetCifar>(std::vector<int64_t>{16, 32, 64}, std::vector<int64_t>{n, n, n}, shortcut,
                                       in_channels, num_classes);
}

std::shared_ptr<ResNetCifar> resnet_cifar_basic(int depth, int64_t in_channels, int64_t num_classes) {
  std::vector<int64_t> blocks;
  if (depth == 18) blocks = {2, 2, 2, 2};
  else if (depth == 34) blocks = {3, 4, 6, 3};
  else ACTLAB_FAIL("CIFAR BasicBlock ResNet depth must be 18 or 34, got ", depth);
  return std::make_shared<ResNetCifar>(std::vector<int64_t>{64, 128, 256, 512}, blocks, Shortcut::B, in_channels,
                                       num_classes);
}

}  // namespace actlab
