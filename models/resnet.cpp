// ResNet blocks and networks: BasicBlock, Bottleneck, ResNet (CIFAR or ImageNet stem), the
// pre-activation PreActBlock and PreActResNetCifar, and the depth → configuration factories.
#include "actlab/models/resnet.h"

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

Bottleneck::Bottleneck(int64_t in_planes, int64_t planes, int64_t stride, int64_t width_per_group) {
  ACTLAB_CHECK(planes * width_per_group % 64 == 0, "Bottleneck: planes ", planes, " x width_per_group ",
               width_per_group, " is not a multiple of 64");
  const int64_t width = planes * width_per_group / 64;
  const int64_t out_planes = planes * kExpansion;
  conv1_ = register_module("conv1", std::make_shared<Conv2d>(in_planes, width, 1, 1, 0));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(width));
  conv2_ = register_module("conv2", std::make_shared<Conv2d>(width, width, 3, stride, 1));
  bn2_ = register_module("bn2", std::make_shared<BatchNorm2d>(width));
  conv3_ = register_module("conv3", std::make_shared<Conv2d>(width, out_planes, 1, 1, 0));
  bn3_ = register_module("bn3", std::make_shared<BatchNorm2d>(out_planes));
  relu_ = register_module("relu", std::make_shared<ReLU>());
  if (stride != 1 || in_planes != out_planes) {
    downsample_ = register_module("downsample", std::make_shared<Sequential>());
    downsample_->add(std::make_shared<Conv2d>(in_planes, out_planes, 1, stride, 0));
    downsample_->add(std::make_shared<BatchNorm2d>(out_planes));
  }
}

Variable Bottleneck::forward(const Variable& x) {
  Variable out = (*relu_)((*bn1_)((*conv1_)(x)));
  out = (*relu_)((*bn2_)((*conv2_)(out)));
  out = (*bn3_)((*conv3_)(out));
  const Variable identity = downsample_ ? (*downsample_)(x) : x;
  ModulePathScope path("relu");
  return add_relu(out, identity);
}

ResNet::ResNet(const ResNetConfig& c) {
  ACTLAB_CHECK(c.widths.size() == c.blocks.size() && !c.widths.empty(), "ResNet: ", c.widths.size(),
               " stage widths but ", c.blocks.size(), " block counts");
  const int64_t stem_width = c.widths[0];
  if (c.stem == Stem::ImageNet) {
    conv1_ = register_module("conv1", std::make_shared<Conv2d>(c.in_channels, stem_width, 7, 2, 3));
  } else {
    conv1_ = register_module("conv1", std::make_shared<Conv2d>(c.in_channels, stem_width, 3, 1, 1));
  }
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(stem_width));
  relu_ = register_module("relu", std::make_shared<ReLU>());
  if (c.stem == Stem::ImageNet) maxpool_ = register_module("maxpool", std::make_shared<MaxPool2d>(3, 2, 1));
  int64_t in_planes = stem_width;
  for (size_t s = 0; s < c.widths.size(); ++s) {
    auto stage = register_module("layer" + std::to_string(s + 1), std::make_shared<Sequential>());
    for (int64_t b = 0; b < c.blocks[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      if (c.block == BlockType::Basic) {
        stage->add(std::make_shared<BasicBlock>(in_planes, c.widths[s], stride, c.shortcut));
        in_planes = c.widths[s];
      } else {
        stage->add(std::make_shared<Bottleneck>(in_planes, c.widths[s], stride, c.width_per_group));
        in_planes = c.widths[s] * Bottleneck::kExpansion;
      }
    }
    stages_.push_back(stage);
  }
  pool_ = register_module("avgpool", std::make_shared<GlobalAvgPool>());
  fc_ = register_module("fc", std::make_shared<Linear>(in_planes, c.num_classes));
}

Variable ResNet::forward(const Variable& x) {
  Variable h = (*relu_)((*bn1_)((*conv1_)(x)));
  if (maxpool_) h = (*maxpool_)(h);
  for (auto& stage : stages_) h = (*stage)(h);
  return (*fc_)((*pool_)(h));
}

PreActBlock::PreActBlock(int64_t in_planes, int64_t planes, int64_t stride, BlockType block, float dropout) {
  const int64_t out = out_planes(planes, block);
  struct ConvShape {
    int64_t in, out, kernel, stride;
  };
  // The stride sits on the 3×3 conv: the first of a Basic block, the middle one of a Bottleneck.
  const std::vector<ConvShape> convs =
      block == BlockType::Basic
          ? std::vector<ConvShape>{{in_planes, planes, 3, stride}, {planes, planes, 3, 1}}
          : std::vector<ConvShape>{{in_planes, planes, 1, 1}, {planes, planes, 3, stride}, {planes, out, 1, 1}};
  for (size_t i = 0; i < convs.size(); ++i) {
    const ConvShape& c = convs[i];
    const std::string k = std::to_string(i + 1);
    Unit u;
    u.bn = register_module("bn" + k, std::make_shared<BatchNorm2d>(c.in));
    u.relu = register_module("relu" + k, std::make_shared<ReLU>());
    if (i + 1 == convs.size() && dropout > 0.f)
      dropout_ = register_module("dropout", std::make_shared<Dropout>(dropout));
    u.conv = register_module("conv" + k, std::make_shared<Conv2d>(c.in, c.out, c.kernel, c.stride, c.kernel / 2));
    units_.push_back(u);
  }
  if (stride != 1 || in_planes != out)
    shortcut_ = register_module("shortcut", std::make_shared<Conv2d>(in_planes, out, 1, stride, 0));
}

int64_t PreActBlock::out_planes(int64_t planes, BlockType block) {
  return block == BlockType::Basic ? planes : planes * Bottleneck::kExpansion;
}

Variable PreActBlock::forward(const Variable& x) {
  const Variable pre = (*units_[0].relu)((*units_[0].bn)(x));
  Variable out = (*units_[0].conv)(pre);
  for (size_t i = 1; i < units_.size(); ++i) {
    out = (*units_[i].relu)((*units_[i].bn)(out));
    if (dropout_ && i + 1 == units_.size()) out = (*dropout_)(out);
    out = (*units_[i].conv)(out);
  }
  return add(out, shortcut_ ? (*shortcut_)(pre) : x);
}

PreActResNetCifar::PreActResNetCifar(const PreActResNetConfig& c) {
  ACTLAB_CHECK(!c.widths.empty() && c.blocks >= 1, "PreActResNetCifar: needs stage widths and >= 1 block a stage, got ",
               c.widths.size(), " widths, ", c.blocks, " blocks");
  conv1_ = register_module("conv1", std::make_shared<Conv2d>(c.in_channels, 16, 3, 1, 1));
  int64_t in_planes = 16;
  for (size_t s = 0; s < c.widths.size(); ++s) {
    auto stage = register_module("layer" + std::to_string(s + 1), std::make_shared<Sequential>());
    for (int64_t b = 0; b < c.blocks; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      stage->add(std::make_shared<PreActBlock>(in_planes, c.widths[s], stride, c.block, c.dropout));
      in_planes = PreActBlock::out_planes(c.widths[s], c.block);
    }
    stages_.push_back(stage);
  }
  bn_final_ = register_module("bn_final", std::make_shared<BatchNorm2d>(in_planes));
  relu_final_ = register_module("relu_final", std::make_shared<ReLU>());
  pool_ = register_module("avgpool", std::make_shared<GlobalAvgPool>());
  fc_ = register_module("fc", std::make_shared<Linear>(in_planes, c.num_classes));
}

Variable PreActResNetCifar::forward(const Variable& x) {
  Variable h = (*conv1_)(x);
  for (auto& stage : stages_) h = (*stage)(h);
  h = (*relu_final_)((*bn_final_)(h));
  return (*fc_)((*pool_)(h));
}

std::shared_ptr<ResNet> resnet_cifar_he(int depth, int64_t in_channels, int64_t num_classes, Shortcut shortcut) {
  ACTLAB_CHECK(depth >= 8 && (depth - 2) % 6 == 0, "CIFAR ResNet depth must be 6n+2 (20, 32, 56, 110), got ", depth);
  const int64_t n = (depth - 2) / 6;
  ResNetConfig c;
  c.widths = {16, 32, 64};
  c.blocks = {n, n, n};
  c.shortcut = shortcut;
  c.in_channels = in_channels;
  c.num_classes = num_classes;
  return std::make_shared<ResNet>(c);
}

std::shared_ptr<ResNet> resnet_torchvision(int depth, Stem stem, int64_t in_channels, int64_t num_classes,
                                           int64_t width_factor) {
  ResNetConfig c;
  c.stem = stem;
  c.widths = {64, 128, 256, 512};
  c.block = depth >= 50 ? BlockType::Bottleneck : BlockType::Basic;
  switch (depth) {
    case 18: c.blocks = {2, 2, 2, 2}; break;
    case 34: case 50: c.blocks = {3, 4, 6, 3}; break;
    case 101: c.blocks = {3, 4, 23, 3}; break;
    case 152: c.blocks = {3, 8, 36, 3}; break;
    default: ACTLAB_FAIL("torchvision ResNet depth must be 18, 34, 50, 101 or 152, got ", depth);
  }
  // torchvision widens only the bottleneck's inner 3×3 (wide_resnet50_2); a wide BasicBlock is not a thing.
  ACTLAB_CHECK(width_factor == 1 || c.block == BlockType::Bottleneck, "width factor ", width_factor,
               " needs a Bottleneck ResNet (depth >= 50), got depth ", depth);
  ACTLAB_CHECK(width_factor >= 1, "ResNet width factor must be >= 1, got ", width_factor);
  c.width_per_group = 64 * width_factor;
  c.shortcut = Shortcut::B;
  c.in_channels = in_channels;
  c.num_classes = num_classes;
  return std::make_shared<ResNet>(c);
}

std::shared_ptr<PreActResNetCifar> wide_resnet_cifar(int depth, int64_t widen, int64_t in_channels,
                                                     int64_t num_classes, float dropout) {
  ACTLAB_CHECK(depth >= 10 && (depth - 4) % 6 == 0, "Wide ResNet depth must be 6n+4 (16, 22, 28, 40), got ",
               depth);
  ACTLAB_CHECK(widen >= 1, "Wide ResNet widening factor must be >= 1, got ", widen);
  PreActResNetConfig c;
  c.block = BlockType::Basic;
  c.widths = {16 * widen, 32 * widen, 64 * widen};
  c.blocks = (depth - 4) / 6;
  c.dropout = dropout;
  c.in_channels = in_channels;
  c.num_classes = num_classes;
  return std::make_shared<PreActResNetCifar>(c);
}

std::shared_ptr<PreActResNetCifar> preact_resnet_cifar(int depth, int64_t in_channels, int64_t num_classes) {
  ACTLAB_CHECK(depth >= 11 && (depth - 2) % 9 == 0,
               "pre-activation bottleneck ResNet depth must be 9n+2 (164, 1001), got ", depth);
  PreActResNetConfig c;
  c.block = BlockType::Bottleneck;
  c.widths = {16, 32, 64};
  c.blocks = (depth - 2) / 9;  // 3 convs a block in 3 stages, plus conv1 and fc
  c.in_channels = in_channels;
  c.num_classes = num_classes;
  return std::make_shared<PreActResNetCifar>(c);
}

}  // namespace actlab
