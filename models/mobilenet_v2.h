// MobileNetV2 (Sandler et al. 2018) in three variants behind one configuration: torchvision's ImageNet
// model, the CIFAR port the DIVISION reference trains (kuangliu style: plain ReLU, a 1×1-conv shortcut,
// an expand conv even for t = 1) and the peer benchmark's torchvision-structured CIFAR port.
// Parameter names follow torchvision (features.0.0, features.K.conv.J..., classifier.1).
// Tested in tests/test_models.cpp.
#pragma once
#include <memory>

#include "actlab/layers/layers.h"

namespace actlab {

struct MobileNetV2Config {
  int64_t stem_stride = 2;    // 3×3 stem conv, 32 channels: 2 on ImageNet, 1 on CIFAR
  int64_t stage2_stride = 2;  // the (t=6, c=24, n=2) stage: 2 on ImageNet, 1 in the CIFAR ports
  bool relu6 = true;          // ReLU6 modules (torchvision) or plain ReLU modules (DIVISION's CIFAR model)
  // kuangliu structure: every block has the 1×1 expand conv (even t = 1); every stride-1 block adds a
  // residual, through shortcut = (1×1 conv, BN) when the channel count changes. Otherwise torchvision:
  // no expand conv when t = 1, residual only when stride 1 and in == out.
  bool kuangliu_blocks = false;
  float dropout = 0.2f;  // before the classifier (torchvision: 0.2)
  // torchvision initialises the classifier N(0, 0.01) with zero bias; otherwise PyTorch's Linear default.
  bool classifier_normal_init = true;
  // Kaiming-normal fan_out (torchvision) or PyTorch's default conv init (kuangliu's model has no init code).
  ConvInit conv_init = ConvInit::KaimingNormalFanOut;
  int64_t in_channels = 3;
  int64_t num_classes = 1000;
};

// One inverted-residual block: [1×1 expand in→t·in, BN, act] → 3×3 depthwise (stride), BN, act →
// 1×1 project → out, BN; plus the residual described in MobileNetV2Config. Torchvision names: the
// main path is the Sequential "conv" (conv.0 = expand Conv-BN-act, conv.1 = depthwise Conv-BN-act,
// conv.2 = project conv, conv.3 = BN; one index less without the expand), the projection "shortcut.0/1".
class InvertedResidual final : public Module {
 public:
  InvertedResidual(int64_t in_planes, int64_t out_planes, int64_t stride, int64_t expand_ratio,
                   const MobileNetV2Config& config);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "InvertedResidual"; }
  std::string describe() const override;
 private:
  int64_t in_, out_, stride_, expand_;
  bool use_residual_ = false;
  std::shared_ptr<Sequential> conv_;
  std::shared_ptr<Sequential> shortcut_;  // kuangliu: stride 1, in != out
};

// features.0 = stem Conv-BN-act; features.1..17 = InvertedResidual over (t,c,n,s) = (1,16,1,1),
// (6,24,2,s2),(6,32,3,2),(6,64,4,2),(6,96,3,1),(6,160,3,2),(6,320,1,1); features.18 = 1×1 320→1280
// Conv-BN-act; global average pool (the same as the DIVISION reference's avg_pool2d(4) on its 4×4 map
// at 32×32, and defined for any input size); classifier = (Dropout, Linear 1280→classes).
// Input (N, in_channels, H, W) → logits (N, num_classes).
class MobileNetV2 final : public Module {
 public:
  explicit MobileNetV2(const MobileNetV2Config& config);
  Variable forward(const Variable& x) override;
  std::string kind() const override { return "MobileNetV2"; }
 private:
  std::shared_ptr<Sequential> features_;
  std::shared_ptr<GlobalAvgPool> pool_;
  std::shared_ptr<Sequential> classifier_;
};

// torchvision mobilenet_v2 (ImageNet, 224²): 3,504,872 parameters with 1000 classes.
MobileNetV2Config mobilenet_v2_imagenet_config(int64_t in_channels, int64_t num_classes);
// The DIVISION reference's CIFAR model (cifar_models/mobilenetv2.py, kuangliu style): stride-1 stem and
// second stage, plain ReLU, kuangliu blocks, no dropout, PyTorch default init.
MobileNetV2Config mobilenet_v2_division_config(int64_t in_channels, int64_t num_classes);
// The PyTorch peer benchmark's CIFAR port (its mobilenetv2): torchvision blocks and
// ReLU6, stride-1 stem and second stage, no dropout, Kaiming fan_out convs, default Linear init.
MobileNetV2Config mobilenet_v2_torchcifar_config(int64_t in_channels, int64_t num_classes);

}  // namespace actlab
