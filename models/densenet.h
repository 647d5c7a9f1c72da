// DenseNet-BC (Huang et al. 2017) with torchvision's structure and names: features.conv0 (norm0, relu0,
// pool0), features.denseblockB.denselayerL.{norm1,relu1,conv1,norm2,relu2,conv2}, features.transitionB.
// {norm,relu,conv,pool}, features.norm5, classifier. DenseNet-121: growth 32, bn_size 4, blocks
// (6,12,24,16), compression 0.5, 64 stem channels. Tested in tests/test_models.cpp and, against
// torchvision's densenet121, in python/tests/test_actlab.py.
#pragma once
#include <memory>
#include <vector>

#include "actlab/layers/layers.h"
#include "actlab/models/resnet.h"  // Stem: the same two stems' geometry as the ResNets'

namespace actlab {

// norm1 → relu1 → conv1 1×1 in→bn_size·growth → norm2 → relu2 → conv2 3×3 → growth channels: the new
// features only; the block concatenates them after its input. x: (N, in, H, W) → (N, growth, H, W).
class DenseLayer final : public Module {
 public:
  DenseLayer(int64_t in_channels, int64_t growth, int64_t bn_size, ConvInit init);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "DenseLayer"; }
 private:
  std::shared_ptr<BatchNorm2d> norm1_, norm2_;
  std::shared_ptr<ReLU> relu1_, relu2_;
  std::shared_ptr<Conv2d> conv1_, conv2_;
};

// denselayer1..L; x ← concat(x, denselayerI(x)) along channels, in torchvision's order (the block input
// first, then each layer's features), so torchvision weights load unchanged. (N, in, H, W) →
// (N, in + L·growth, H, W). NOTE: every layer's norm1 saves its own concatenation through the policy:
// exact training keeps Σ_l (in + l·growth) channels a block, the quadratic memory DenseNet is known for;
// concat itself saves only the sizes.
class DenseBlock final : public Module {
 public:
  DenseBlock(int64_t layers, int64_t in_channels, int64_t growth, int64_t bn_size, ConvInit init);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "DenseBlock"; }
  std::string describe() const override;
  int64_t out_channels() const { return out_; }
 private:
  int64_t in_, out_;
  std::vector<std::shared_ptr<DenseLayer>> layers_;
};

struct DenseNetConfig {
  // ImageNet: conv0 7×7 s2 + norm0 + relu0 + pool0 (3×3 s2 max-pool), torchvision's. Cifar: conv0 3×3 s1
  // alone (no norm0, relu0 or pool0), as in kuangliu's pytorch-cifar DenseNet121, the usual CIFAR
  // DenseNet-121 (6,956,298 parameters at 10 classes). Why: a 32×32 image keeps its resolution into
  // block 1 (blocks at 32², 16², 8², 4² instead of ImageNet's 56²..7²; a stride-2 stem and a max-pool
  // would leave block 4 at 1×1), and denselayer1's norm1 + relu1 already pre-activate the stem's output.
  // kuangliu concatenates (new, old) where torchvision has (old, new); we keep torchvision's order
  // everywhere: the same network up to a permutation of channels, and torchvision weights load as they are.
  Stem stem = Stem::Cifar;
  int64_t growth = 32;
  int64_t bn_size = 4;                      // a dense layer's 1×1 conv outputs bn_size·growth channels
  std::vector<int64_t> blocks{6, 12, 24, 16};
  int64_t stem_channels = 64;               // 2·growth
  float compression = 0.5f;                 // a transition keeps floor(C·compression) channels
  // torchvision's init: Kaiming normal fan_in convs, classifier bias 0 (densenet121_config's ImageNet
  // variant); PyTorch's defaults, which kuangliu's model keeps (it has no init code; the CIFAR variant).
  ConvInit conv_init = ConvInit::KaimingUniformDefault;
  bool classifier_zero_bias = false;
  int64_t in_channels = 3;
  int64_t num_classes = 10;
};

// features (stem, denseblock1, transition1, ..., denseblock4, norm5) → relu → global average pool →
// classifier. Transition: norm → relu → conv 1×1 → 2×2 stride-2 average pool (H → floor(H/2)).
// Input (N, in_channels, H, W) → logits (N, num_classes).
class DenseNet final : public Module {
 public:
  explicit DenseNet(const DenseNetConfig& config);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "DenseNet"; }
 private:
  std::shared_ptr<Sequential> features_;
  std::shared_ptr<ReLU> relu_;  // torchvision's F.relu after norm5
  std::shared_ptr<GlobalAvgPool> pool_;
  std::shared_ptr<Linear> classifier_;
};

// torchvision densenet121: 7,978,856 parameters at 1000 classes (ImageNet stem) / the CIFAR variant above.
DenseNetConfig densenet121_config(Stem stem, int64_t in_channels, int64_t num_classes);

}  // namespace actlab
