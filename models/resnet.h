// CIFAR-style ResNets: ResNet-20/32/56/110 (He et al. 2016; 16-32-64 widths, option-A shortcuts) and
// ResNet-18/34 with a 3×3 stride-1 stem and no max-pool (64-128-256-512, 1×1 projection shortcuts).
// Parameter names follow torchvision (conv1, bn1, layerK.I.conv1, layerK.I.downsample.0, fc).
// Tested in tests/test_models.cpp.
#pragma once
#include <memory>
#include <vector>

#include "layers/layers.h"

namespace actlab {

enum class Shortcut { A, B };  // A: subsample + zero-pad channels; B: 1×1 conv + BN

class BasicBlock final : public Module {
 public:
  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride, Shortcut shortcut);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "BasicBlock"; }
 private:
  std::shared_ptr<Conv2d> conv1_, conv2_;
  std::shared_ptr<BatchNorm2d> bn1_, bn2_;
  std::shared_ptr<ReLU> relu_;
  std::shared_ptr<Sequential> downsample_;  // option B projection, when shapes change
  int64_t pad_stride_ = 0, pad_out_ = 0;    // option A, when shapes change
};

class ResNetCifar final : public Module {
 public:
  ResNetCifar(const std::vector<int64_t>& widths, const std::vector<int64_t>& blocks, Shortcut shortcut,
              int64_t in_channels, int64_t num_classes);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "ResNetCifar"; }
 private:
  std::shared_ptr<Conv2d> conv1_;
  std::shared_ptr<BatchNorm2d> bn1_;
  std::shared_ptr<ReLU> relu_;
  std::vector<std::shared_ptr<Sequential>> stages_;
  std::shared_ptr<GlobalAvgPool> pool_;
  std::shared_ptr<Linear> fc_;
};

// depth ∈ {20, 32, 56, 110}: 3 stages of (depth−2)/6 blocks, option-A shortcuts (like the paper).
std::shared_ptr<ResNetCifar> resnet_cifar_he(int depth, int64_t in_channels, int64_t num_classes,
                                             Shortcut shortcut = Shortcut::A);
// depth ∈ {18, 34}: 4 stages of BasicBlocks, option-B shortcuts.
std::shared_ptr<ResNetCifar> resnet_cifar_basic(int depth, int64_t in_channels, int64_t num_classes);

}  // namespace actlab
