// ResNets: the CIFAR ResNet-20/32/56/110 of He et al. 2016 (16-32-64 widths, option-A shortcuts), the
// torchvision ResNet family (BasicBlock / Bottleneck v1.5, optionally wide) with either a CIFAR stem
// (3×3 stride 1, no max-pool) or the ImageNet stem (7×7 stride 2 + 3×3 stride-2 max-pool), and the
// pre-activation CIFAR ResNets (the Wide ResNets of Zagoruyko & Komodakis 2016, the bottleneck ResNet-164
// of He et al. 2016 "Identity Mappings"). Parameter names follow torchvision (conv1, bn1, layerK.I.conv1,
// layerK.I.downsample.0, fc). Tested in tests/test_models.cpp.
#pragma once
#include <memory>
#include <vector>

#include "actlab/layers/layers.h"

namespace actlab {

enum class Shortcut { A, B };  // A: subsample + zero-pad channels; B: 1×1 conv + BN
enum class Stem { Cifar, ImageNet };  // 3×3 s1 conv; 7×7 s2 conv + 3×3 s2 max-pool (spatial /4)
enum class BlockType { Basic, Bottleneck };

// relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)); 3×3 convs, stride on conv1. Output: planes channels.
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

// torchvision Bottleneck (v1.5: the stride sits on the 3×3 conv): 1×1 in→width, 3×3 width→width
// (stride), 1×1 width→4·planes, each followed by BN; ReLU after the first two and after the residual
// add. width = planes · width_per_group / 64 (64: ResNet-50; 128: Wide ResNet-50-2). The shortcut is
// downsample = (1×1 conv stride s, BN) when the stride or the channel count changes.
class Bottleneck final : public Module {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t in_planes, int64_t planes, int64_t stride, int64_t width_per_group = 64);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "Bottleneck"; }
 private:
  std::shared_ptr<Conv2d> conv1_, conv2_, conv3_;
  std::shared_ptr<BatchNorm2d> bn1_, bn2_, bn3_;
  std::shared_ptr<ReLU> relu_;
  std::shared_ptr<Sequential> downsample_;
};

// Stem, four (or, for He's CIFAR nets, three) stages layer1.. of blocks, global average pool, fc.
// Stage s > 0 starts with a stride-2 block. Input (N, in_channels, H, W) → logits (N, num_classes).
struct ResNetConfig {
  Stem stem = Stem::Cifar;
  BlockType block = BlockType::Basic;
  std::vector<int64_t> widths;  // planes per stage (a Bottleneck stage outputs 4× this)
  std::vector<int64_t> blocks;  // blocks per stage
  Shortcut shortcut = Shortcut::B;  // BasicBlock only; Bottleneck always projects
  int64_t width_per_group = 64;     // Bottleneck only
  int64_t in_channels = 3;
  int64_t num_classes = 10;
};

class ResNet final : public Module {
 public:
  explicit ResNet(const ResNetConfig& config);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "ResNet"; }
 private:
  std::shared_ptr<Conv2d> conv1_;
  std::shared_ptr<BatchNorm2d> bn1_;
  std::shared_ptr<ReLU> relu_;
  std::shared_ptr<MaxPool2d> maxpool_;  // ImageNet stem only
  std::vector<std::shared_ptr<Sequential>> stages_;
  std::shared_ptr<GlobalAvgPool> pool_;
  std::shared_ptr<Linear> fc_;
};

// Pre-activation residual block (He et al. 2016, "Identity Mappings"): every conv is preceded by its own
// BN → ReLU unit (bnK, reluK, convK). Basic (Zagoruyko & Komodakis' wide block): 3×3 in→planes (stride),
// 3×3 planes→planes; output planes. Bottleneck: 1×1 in→planes, 3×3 (stride), 1×1 planes→4·planes.
// Optional dropout before the last conv (WRN's). Output: convs + x, or + shortcut(relu1(bn1(x))) — a bare
// 1×1 conv, no BN, on the pre-activated input as in both papers' code — when the shape changes.
class PreActBlock final : public Module {
 public:
  PreActBlock(int64_t in_planes, int64_t planes, int64_t stride, BlockType block, float dropout = 0.f);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "PreActBlock"; }
  // Channels the block outputs: planes (Basic), 4·planes (Bottleneck).
  static int64_t out_planes(int64_t planes, BlockType block);
 private:
  struct Unit {
    std::shared_ptr<BatchNorm2d> bn;
    std::shared_ptr<ReLU> relu;
    std::shared_ptr<Conv2d> conv;
  };
  std::vector<Unit> units_;           // 2 (Basic) or 3 (Bottleneck), in order
  std::shared_ptr<Dropout> dropout_;  // only when p > 0
  std::shared_ptr<Conv2d> shortcut_;
};

// The CIFAR pre-activation ResNets: conv1 3×3 in→16; layer1..3 of PreActBlocks with planes widths[s]
// (strides 1, 2, 2); then bn_final + relu_final (a pre-activation net ends on BN-ReLU), global average
// pool, fc. WRN-d-k: Basic, widths 16k/32k/64k; ResNet-164: Bottleneck, widths 16/32/64 (outputs 64/128/256).
// (He's code puts layer1.0's BN-ReLU after conv1 instead and skips it in that block: the same function,
// since the block's shortcut is a projection of the pre-activated input too.)
// No torchvision counterpart; names follow the ResNet ones above.
struct PreActResNetConfig {
  BlockType block = BlockType::Basic;
  std::vector<int64_t> widths;  // planes per stage (3 for the CIFAR nets); stage s > 0 starts with stride 2
  int64_t blocks = 0;           // blocks per stage
  float dropout = 0.f;          // in every block, before its last conv
  int64_t in_channels = 3;
  int64_t num_classes = 10;
};

class PreActResNetCifar final : public Module {
 public:
  explicit PreActResNetCifar(const PreActResNetConfig& config);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "PreActResNetCifar"; }
 private:
  std::shared_ptr<Conv2d> conv1_;
  std::vector<std::shared_ptr<Sequential>> stages_;
  std::shared_ptr<BatchNorm2d> bn_final_;
  std::shared_ptr<ReLU> relu_final_;
  std::shared_ptr<GlobalAvgPool> pool_;
  std::shared_ptr<Linear> fc_;
};

// depth ∈ {20, 32, 56, 110}: 3 stages of (depth−2)/6 BasicBlocks, CIFAR stem, option-A shortcuts
// by default (like the paper).
std::shared_ptr<ResNet> resnet_cifar_he(int depth, int64_t in_channels, int64_t num_classes,
                                        Shortcut shortcut = Shortcut::A);
// torchvision's resnet{18,34,50,101,152} with the given stem; width_factor 2 with a Bottleneck depth
// gives wide_resnet{50,101}_2.
std::shared_ptr<ResNet> resnet_torchvision(int depth, Stem stem, int64_t in_channels, int64_t num_classes,
                                           int64_t width_factor = 1);
// depth = 6n+4 (28 for WRN-28-10), widen ≥ 1, dropout in [0, 1).
std::shared_ptr<PreActResNetCifar> wide_resnet_cifar(int depth, int64_t widen, int64_t in_channels,
                                                     int64_t num_classes, float dropout = 0.f);
// He et al. 2016's bottleneck pre-activation ResNet for CIFAR: depth = 9n+2 (164: 18 blocks a stage,
// 1.70M parameters at 10 classes; 1001: 111 blocks).
std::shared_ptr<PreActResNetCifar> preact_resnet_cifar(int depth, int64_t in_channels, int64_t num_classes);

}  // namespace actlab
