// Models: parameter counts against published / PyTorch-counted figures, (N, classes) outputs at each
// model's native size, torchvision parameter names, gradient checks of the Bottleneck and
// inverted-residual blocks, model_summary totals and MACs, and the registry's refusals.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "actlab/autograd/functions.h"
#include "actlab/autograd/saved_tensor.h"
#include "actlab/core/philox.h"
#include "gradcheck.h"
#include "actlab/layers/optim/sgd.h"
#include "actlab/models/densenet.h"
#include "actlab/models/mlp.h"
#include "actlab/models/mobilenet_v2.h"
#include "actlab/models/registry.h"
#include "actlab/models/resnet.h"
#include "actlab/models/summary.h"
#include "actlab/train/memtable.h"
#include "actlab/train/step.h"

using namespace actlab;

namespace {

int64_t count(const std::string& name, int64_t in_ch, int64_t classes = 10, int64_t size = 32) {
  return make_model({name, in_ch, classes, size})->parameter_count();
}

std::vector<std::string> parameter_names(const Module& m) {
  std::vector<std::string> names;
  for (const auto& p : m.named_parameters()) names.push_back(p.first);
  return names;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

Variable named_parameter(const Module& m, const std::string& name) {
  for (const auto& p : m.named_parameters())
    if (p.first == name) return p.second;
  FAIL("no parameter ", name);
  return Variable();
}

// The DIVISION reference's CIFAR MobileNetV2 (cifar_models/mobilenetv2.py, kuangliu style), counted in
// closed form from its definition (division-reference.md §4): stem conv 3×3 in→32 + BN; per block an
// expand 1×1 in→t·in (present even for t = 1), a depthwise 3×3, a project 1×1 → c, a BN after each, and
// a 1×1 conv + BN shortcut when stride 1 and in ≠ c; head 1×1 320→1280 + BN; Linear 1280→classes.
int64_t division_mobilenet_v2_parameters(int64_t in_channels, int64_t classes) {
  struct Stage { int64_t t, c, n, s; };
  const Stage stages[] = {{1, 16, 1, 1}, {6, 24, 2, 1}, {6, 32, 3, 2}, {6, 64, 4, 2},
                          {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
  int64_t total = in_channels * 32 * 9 + 2 * 32;
  int64_t in = 32;
  for (const Stage& st : stages) {
    for (int64_t b = 0; b < st.n; ++b) {
      const int64_t stride = b == 0 ? st.s : 1, hidden = st.t * in;
      total += in * hidden + 2 * hidden;      // expand + BN
      total += 9 * hidden + 2 * hidden;       // depthwise + BN
      total += hidden * st.c + 2 * st.c;      // project + BN
      if (stride == 1 && in != st.c) total += in * st.c + 2 * st.c;  // shortcut conv + BN
      in = st.c;
    }
  }
  return total + 320 * 1280 + 2 * 1280 + 1280 * classes + classes;
}

}  // namespace

// Every registered model is built once (initialising ~210M parameters is most of this suite's time):
// parameter count against its reference figure, (N, classes) logits at its native size (ImageNet models
// at 64x64 rather than 224x224, to keep the suite fast) and at its smallest accepted size, and
// torchvision parameter names where the architecture has a torchvision counterpart.
TEST_CASE("every registered model: reference parameter count, (N, classes) logits, torchvision names") {
  const int64_t live_before = memory_stats().total.current;
  struct Reference {
    int64_t classes, parameters, size, batch;
  };
  const std::map<std::string, Reference> reference = {
      // Counted with sum(p.numel()) on the PyTorch models of ../shared/bench/cifar_models.py, or on the
      // same architectures written in PyTorch; the rounded figures are those the papers print.
      {"resnet20", {10, 269722, 32, 2}},     // He et al. 2016: "0.27M"
      {"resnet32", {10, 464154, 32, 2}},     // "0.46M"
      {"resnet56", {10, 853018, 32, 1}},     // "0.85M"
      {"resnet110", {10, 1727962, 32, 1}},   // "1.7M"
      {"resnet20b", {10, 272474, 32, 2}},
      {"resnet18", {10, 11173962, 32, 2}},   // DIVISION's CIFAR ResNet-18, "11.17M"
      {"resnet34", {10, 21282122, 32, 1}},
      {"resnet50", {10, 23520842, 32, 1}},   // CIFAR ResNet-50 (Bottleneck), "23.5M"
      {"wrn28_10", {10, 36479194, 32, 1}},   // Zagoruyko & Komodakis 2016: WRN-28-10 "36.5M"
      // He et al. 2016 ("Identity Mappings"): ResNet-164 "1.7M". Closed form: conv1 3·16·9; per bottleneck
      // block (in → w → w → 4w) 2·in + in·w + 2w + 9w² + 2w + 4w² (BNs and convs), 18 blocks a stage at
      // w = 16, 32, 64; shortcut convs 16·64, 64·128, 128·256; bn_final 2·256; fc 256·10 + 10.
      {"preact_resnet164", {10, 1703258, 32, 1}},
      // kuangliu's pytorch-cifar DenseNet121, "6.96M": torchvision's densenet121 (sum(p.numel()) = 7,978,856)
      // with a 3·64·9 stem conv for its 3·64·49 one, no norm0 (−128) and a 1024→10 classifier.
      {"densenet121", {10, 6956298, 32, 2}},
      // torchvision's model documentation (num_params with 1000 classes).
      {"resnet18_imagenet", {1000, 11689512, 64, 1}},
      {"resnet50_imagenet", {1000, 25557032, 64, 1}},
      {"wrn50_2_imagenet", {1000, 68883240, 64, 1}},
      {"mobilenet_v2_imagenet", {1000, 3504872, 64, 2}},
      {"densenet121_imagenet", {1000, 7978856, 64, 1}},
      // ../shared/bench/cifar_models.py mobilenetv2 (PyTorch sum(p.numel())).
      {"mobilenet_v2_torchcifar", {10, 2236682, 32, 2}},
      // Closed form above; PyTorch on the kuangliu definition also gives 2,296,922.
      {"mobilenet_v2", {10, division_mobilenet_v2_parameters(3, 10), 32, 2}},
      // timm/torchvision ViT at 32x32, patch 4 (65 tokens), width 192, depth 12, MLP 768: torchvision's
      // VisionTransformer(image_size=32, patch_size=4, num_layers=12, num_heads=3, hidden_dim=192,
      // mlp_dim=768, num_classes=10) counts the same: patch conv 3·16·192 + 192, class token 192, position
      // embedding 65·192, per block 2·384 (norms) + 192·576 + 576 + 192·192 + 192 + 192·768 + 768 + 768·192 + 192,
      // final norm 384, head 192·10 + 10.
      {"vit_tiny_cifar", {10, 3 * 16 * 192 + 192 + 192 + 65 * 192 +
                                  12 * (2 * 384 + 192 * 576 + 576 + 192 * 192 + 192 + 192 * 768 + 768 + 768 * 192 + 192) +
                                  384 + 192 * 10 + 10, 32, 2}},
      // torchvision's swin_t documentation and sum(p.numel()) on torchvision 0.14's swin_t(): 28,288,354.
      {"swin_t", {1000, 28288354, 224, 1}},
      // (3·32·32→512) + (512→512) + (512→10), weights and biases.
      {"mlp", {10, 3072 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10, 32, 2}},
  };
  const std::map<std::string, std::pair<size_t, std::vector<std::string>>> names = {
      // torchvision resnet50: 161 tensors (conv1/bn1, 16 bottlenecks × 9, 4 downsamples × 3, fc).
      {"resnet50_imagenet",
       {161, {"conv1.weight", "bn1.bias", "layer1.0.conv3.weight", "layer1.0.bn3.weight", "layer1.0.downsample.0.weight",
              "layer3.5.conv2.weight", "layer4.2.bn3.bias", "fc.weight"}}},
      {"resnet18",
       {62, {"conv1.weight", "bn1.weight", "layer1.0.conv1.weight", "layer2.0.downsample.0.weight",
             "layer2.0.downsample.1.bias", "fc.weight", "fc.bias"}}},
      // torchvision mobilenet_v2: 158 tensors; the t = 1 block has no expand conv.
      {"mobilenet_v2_imagenet",
       {158, {"features.0.0.weight", "features.0.1.weight", "features.1.conv.0.0.weight", "features.1.conv.1.weight",
              "features.1.conv.2.bias", "features.2.conv.0.0.weight", "features.2.conv.1.0.weight",
              "features.2.conv.2.weight", "features.17.conv.3.weight", "features.18.0.weight", "features.18.1.bias",
              "classifier.1.weight", "classifier.1.bias"}}},
      {"mobilenet_v2_torchcifar", {158, {"features.1.conv.2.bias", "features.18.1.bias", "classifier.1.weight"}}},
      // DIVISION's CIFAR variant: expand conv even for t = 1 (block 1 has conv.3) and shortcut.0/1 where
      // stride 1 and in != out: blocks 1 (32→16), 2 (16→24), 11 (64→96), 17 (160→320). 173 tensors:
      // stem 3 + 17 blocks × 9 + 4 shortcuts × 3 + head 3 + classifier 2.
      {"mobilenet_v2",
       {173, {"features.1.conv.3.weight", "features.1.shortcut.0.weight", "features.2.shortcut.1.bias",
            "features.11.shortcut.0.weight", "features.17.shortcut.0.weight", "classifier.1.weight"}}},
      // torchvision swin_t: 173 tensors (named_parameters of torchvision 0.14's swin_t()).
      {"swin_t",
       {173, {"features.0.0.weight", "features.0.2.bias", "features.1.0.norm1.weight",
              "features.1.0.attn.relative_position_bias_table", "features.1.0.attn.qkv.weight",
              "features.1.1.attn.proj.bias", "features.1.0.mlp.0.weight", "features.1.0.mlp.3.bias",
              "features.2.reduction.weight", "features.2.norm.weight", "features.5.5.norm2.bias",
              "features.6.reduction.weight", "features.7.1.mlp.3.weight", "norm.weight", "head.bias"}}},
      // timm's names: patch_embed.proj 2 + cls_token + pos_embed + 12 blocks × 12 + norm 2 + head 2 = 152 tensors.
      {"vit_tiny_cifar",
       {152, {"patch_embed.proj.weight", "patch_embed.proj.bias", "cls_token", "pos_embed", "blocks.0.norm1.weight",
              "blocks.0.attn.qkv.weight", "blocks.0.attn.proj.bias", "blocks.5.norm2.bias", "blocks.11.mlp.fc1.weight",
              "blocks.11.mlp.fc2.bias", "norm.weight", "head.bias"}}},
      // torchvision densenet121: 364 tensors (conv0, norm0 2, 58 dense layers × 6, 3 transitions × 3,
      // norm5 2, classifier 2).
      {"densenet121_imagenet",
       {364, {"features.conv0.weight", "features.norm0.weight", "features.denseblock1.denselayer1.norm1.weight",
              "features.denseblock1.denselayer1.conv1.weight", "features.denseblock1.denselayer1.norm2.bias",
              "features.denseblock1.denselayer6.conv2.weight", "features.transition1.norm.weight",
              "features.transition1.conv.weight", "features.denseblock3.denselayer24.norm1.bias",
              "features.transition3.conv.weight", "features.denseblock4.denselayer16.conv2.weight",
              "features.norm5.weight", "features.norm5.bias", "classifier.weight", "classifier.bias"}}},
      {"densenet121",  // the same less norm0
       {362, {"features.conv0.weight", "features.denseblock1.denselayer1.norm1.weight",
              "features.transition2.norm.bias", "features.denseblock4.denselayer16.conv2.weight",
              "features.norm5.bias", "classifier.weight"}}},
      // conv1 + 54 blocks × 9 + 3 shortcut convs + bn_final 2 + fc 2 = 494 tensors.
      {"preact_resnet164",
       {494, {"conv1.weight", "layer1.0.bn1.weight", "layer1.0.conv1.weight", "layer1.0.bn3.bias",
              "layer1.0.conv3.weight", "layer1.0.shortcut.weight", "layer2.0.shortcut.weight", "layer3.17.conv3.weight",
              "bn_final.weight", "fc.bias"}}},
      // conv1 + 12 blocks × 6 + 3 shortcut convs + bn_final 2 + fc 2 = 80 tensors.
      {"wrn28_10",
       {80, {"conv1.weight", "layer1.0.bn1.weight", "layer1.0.shortcut.weight", "layer3.3.conv2.weight",
            "bn_final.weight", "fc.bias"}}},
  };
  for (const auto& [name, description] : model_names()) {
    const auto ref = reference.find(name);
    REQUIRE_MESSAGE(ref != reference.end(), "registered model ", name, " has no reference figure in this test");
    const Reference& r = ref->second;
    const bool fixed_size = name == "vit_tiny_cifar" || name == "swin_t";  // position tables fix the input
    auto model = make_model({name, 3, r.classes, fixed_size ? r.size : 32});
    CHECK_MESSAGE(model->parameter_count() == r.parameters, name);
    if (const auto it = names.find(name); it != names.end()) {
      const auto got = parameter_names(*model);
      if (it->second.first > 0) CHECK_MESSAGE(got.size() == it->second.first, name);
      for (const auto& n : it->second.second) CHECK_MESSAGE(contains(got, n), name, ": no ", n);
    }
    if (name == "mlp") continue;  // its input width is fixed at construction; checked below
    if (fixed_size) {  // built for one image size: run at that one
      NoGradGuard no_grad;
      model->eval();
      MemTagScope tag(MemTag::Activation);
      const Variable out = (*model)(Variable(Tensor::zeros({r.batch, 3, r.size, r.size})));
      CHECK((out.shape() == Shape{r.batch, r.classes}));
      continue;
    }
    NoGradGuard no_grad;
    model->eval();
    for (const int64_t size : {r.size, min_image_size(name)}) {
      MemTagScope tag(MemTag::Activation);
      Variable out = (*model)(Variable(Tensor::zeros({r.batch, 3, size, size})));
      CHECK_MESSAGE((out.shape() == Shape{r.batch, r.classes}), name, " at ", size, " gave ", shape_str(out.shape()));
    }
  }
  CHECK(memory_stats().total.current == live_before);
}

TEST_CASE("models adapt to 1-channel 28x28 inputs (Fashion-MNIST)") {
  const int64_t live_before = memory_stats().total.current;
  CHECK(count("resnet20", 1) == 269434);  // the stem conv loses 2·16·9 weights
  CHECK(count("mobilenet_v2", 1, 100) == division_mobilenet_v2_parameters(1, 100));
  NoGradGuard no_grad;
  for (const char* name : {"resnet20", "resnet20b", "mobilenet_v2", "mobilenet_v2_torchcifar", "mlp"}) {
    auto model = make_model({name, 1, 7, 28});
    model->eval();
    MemTagScope tag(MemTag::Activation);
    Variable out = (*model)(Variable(Tensor::zeros({2, 1, 28, 28})));
    CHECK_MESSAGE((out.shape() == Shape{2, 7}), name, " gave ", shape_str(out.shape()));
  }
  CHECK(memory_stats().total.current == live_before);
}

TEST_CASE("parameter names: the negative cases and the MLP") {
  const auto dv = parameter_names(*make_model({"mobilenet_v2", 3, 10, 32}));
  CHECK(!contains(dv, "features.4.shortcut.0.weight"));  // 24 → 32, stride 2: no residual at all
  CHECK(!contains(dv, "features.3.shortcut.0.weight"));  // 24 → 24: identity residual
  const auto tv = parameter_names(*make_model({"mobilenet_v2_torchcifar", 3, 10, 32}));
  CHECK(!contains(tv, "features.1.conv.3.weight"));      // no expand conv for t = 1
  CHECK(!contains(tv, "features.1.shortcut.0.weight"));
  const auto wrn = parameter_names(*wide_resnet_cifar(16, 2, 3, 10));
  CHECK(contains(wrn, "layer2.0.shortcut.weight"));
  CHECK(!contains(wrn, "layer2.1.shortcut.weight"));
  CHECK(!contains(wrn, "layer1.0.downsample.0.weight"));
  const auto dn = parameter_names(*make_model({"densenet121", 3, 10, 32}));
  CHECK(!contains(dn, "features.norm0.weight"));            // the CIFAR stem is the conv alone
  CHECK(!contains(dn, "features.transition4.conv.weight"));  // no transition after the last block
  CHECK(contains(dn, "features.denseblock3.denselayer24.conv2.weight"));
  CHECK(!contains(dn, "features.denseblock3.denselayer25.conv2.weight"));
  const auto pre = parameter_names(*make_model({"preact_resnet164", 3, 10, 32}));
  CHECK(contains(pre, "layer3.0.shortcut.weight"));
  CHECK(!contains(pre, "layer3.1.shortcut.weight"));  // 256 → 256, stride 1: identity
  CHECK(!contains(pre, "layer1.0.downsample.0.weight"));
  CHECK(!contains(pre, "layer1.0.bn4.weight"));
  const auto mlp = parameter_names(*make_model({"mlp", 1, 10, 28}));
  CHECK((mlp == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc.weight", "fc.bias"}));
}

TEST_CASE("a training step through MobileNetV2 and a Bottleneck ResNet gives every parameter a gradient") {
  const int64_t live_before = memory_stats().total.current;
  {
    ResNetConfig tiny;  // ImageNet stem, two wide Bottleneck stages: every ResNet branch, small
    tiny.stem = Stem::ImageNet;
    tiny.block = BlockType::Bottleneck;
    tiny.widths = {8, 16};
    tiny.blocks = {2, 1};
    tiny.width_per_group = 128;
    tiny.num_classes = 4;
    const std::vector<std::shared_ptr<Module>> models = {make_model({"mobilenet_v2", 3, 4, 8}),
                                                         std::make_shared<ResNet>(tiny)};
    for (const auto& model : models) {
      PhiloxStream rng(3);
      Variable logits;
      {
        MemTagScope tag(MemTag::Activation);
        logits = (*model)(Variable(Tensor::randn({2, 3, 8, 8}, rng)));
      }
      backward(cross_entropy(logits, Tensor::zeros({2}, DType::I64)), Tensor::full({1}, 1.f));
      for (const auto& [pname, p] : model->named_parameters())
        CHECK_MESSAGE(p.grad().defined(), model->kind(), ": no gradient for ", pname);
    }
  }
  CHECK(memory_stats().total.current == live_before);
}

TEST_CASE("DenseNet-121 and pre-activation ResNet-164 train a step under division:B=8,Q=2") {
  const int64_t live_before = memory_stats().total.current;
  {
    const PolicySet division(parse_policy("division:B=8,Q=2"));
    for (const char* name : {"densenet121", "preact_resnet164"}) {
      seed_init(5);
      set_pack_seed(5);
      auto model = make_model({name, 3, 10, 16});
      Sgd opt(model->parameters(), SgdOptions{0.05f, 0.9f, 0.f, 5e-4f, false});
      Tensor x, y;
      {
        MemTagScope tag(MemTag::Data);
        PhiloxStream rng(7, 1);
        x = Tensor::randn({4, 3, 16, 16}, rng);
        y = Tensor::empty({4}, DType::I64);
        for (int64_t i = 0; i < 4; ++i) y.data<int64_t>()[i] = i;
      }
      const Tensor w0 = model->parameters().front().data().clone();
      const StepResult r = run_step(*model, &opt, division, x, y);
      CHECK_MESSAGE(r.backward_done, name);
      CHECK_MESSAGE(r.updated, name);
      CHECK_MESSAGE(std::isfinite(r.loss), name);
      for (const auto& [pname, p] : model->named_parameters())
        CHECK_MESSAGE(p.grad().defined(), name, ": no gradient for ", pname);
      const Tensor w1 = model->parameters().front().data();
      bool moved = false;
      for (int64_t i = 0; i < w0.numel() && !moved; ++i) moved = w0.data<float>()[i] != w1.data<float>()[i];
      CHECK_MESSAGE(moved, name, ": the step left the stem conv unchanged");
    }
  }
  CHECK(memory_stats().total.current == live_before);
}

// DenseNet's known memory cost: every dense layer's norm1 and conv1 save its whole concatenated input
// (concat itself keeps only sizes). The f32 bytes offered to the policy must equal that closed form, the
// policies must keep their own closed form of them, and nothing else may be live after the forward.
TEST_CASE("DenseNet-121 memory: the concatenations saved through the policy, as the closed form counts them") {
  const int64_t live_before = memory_stats().total.current;
  StepMemoryConfig c;
  c.model = "densenet121";
  c.batch = 2;
  c.image_size = 16;
  c.policy = "exact";
  const StepMemoryResult exact = measure_step_memory(c);
  c.policy = "division:B=8,Q=2";
  const StepMemoryResult division = measure_step_memory(c);
  CHECK(memory_stats().total.current == live_before);
  // Floats offered per sample: the image (conv0's input); per dense layer at an S×S map with C input
  // channels norm1 and conv1 C each, norm2 and conv2 4·32 each; per transition norm and conv its input's
  // channels; norm5 1024 at the last map; the classifier's 1024 pooled features.
  const int64_t blocks[] = {6, 12, 24, 16};
  int64_t floats = 3 * 16 * 16, channels = 64, size = 16;
  for (int b = 0; b < 4; ++b) {
    for (int64_t l = 0; l < blocks[b]; ++l) floats += size * size * (2 * (channels + 32 * l) + 2 * 128);
    channels += 32 * blocks[b];
    if (b == 3) break;
    floats += size * size * 2 * channels;
    channels /= 2;
    size /= 2;
  }
  floats += size * size * channels + channels;
  CHECK(exact.saved_raw_bytes == c.batch * floats * 4);
  CHECK(division.saved_raw_bytes == exact.saved_raw_bytes);  // the same tensors offered
  CHECK(exact.saved_packed_bytes == exact.saved_raw_bytes);
  int64_t kept[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const StepMemoryResult& r = i == 0 ? exact : division;
    CHECK(r.saved_packed_bytes == r.saved_expected_bytes);
    for (const SaveKindBytes& k : r.by_kind) kept[i] += k.packed;  // lossy and exact saves
  }
  // The activation measure is the saves and nothing else (no concatenation outlives its consumers), less
  // the labels (data, not counted), plus the image under DIVISION, which packs conv0's input apart from it.
  const int64_t image_bytes = c.batch * 3 * 16 * 16 * 4, label_bytes = c.batch * 8;
  CHECK(exact.activation_bytes == kept[0] - label_bytes);
  CHECK(division.activation_bytes == kept[1] - label_bytes + image_bytes);
  CHECK(division.activation_bytes * 4 < exact.activation_bytes);
}

TEST_CASE("gradcheck: a Bottleneck block with a projection shortcut (training-mode BN)") {
  const int64_t live_before = memory_stats().total.current;
  {
    seed_init(11);
    auto block = std::make_shared<Bottleneck>(4, 2, 2, 128);  // width 4, out 8, stride 2, downsample
    PhiloxStream rng(21);
    std::vector<Variable> in = {Variable(Tensor::randn({2, 4, 5, 5}, rng), true),
                                named_parameter(*block, "conv2.weight"), named_parameter(*block, "bn3.weight"),
                                named_parameter(*block, "downsample.0.weight")};
    // h = 1e-3 keeps the ReLU kinks out of the finite-difference step (worst error seen ≈ 1e-3).
    actlab::testing::gradcheck([&](std::vector<Variable>& v) { return (*block)(v[0]); }, in, 1e-3, 5e-3);
    CHECK(block->named_modules().size() == 11);  // self, conv1-3, bn1-3, relu, downsample(+2)
  }
  Tape::current().clear();
  CHECK(memory_stats().total.current == live_before);
}

TEST_CASE("gradcheck: a dense block (concatenations) and a bottleneck pre-activation block (projection)") {
  const int64_t live_before = memory_stats().total.current;
  {
    // Seed 14: no finite-difference step here crosses a ReLU kink (with seeds that do, one element is
    // off by a few per cent while the rest agree to 4e-4).
    seed_init(14);
    // 2 layers, 3 → 3 + 2·2 channels: denselayer2's norm1 sees (x, denselayer1(x)), so its gradient
    // and the input's run back through both concatenations.
    auto dense = std::make_shared<DenseBlock>(2, 3, 2, 2, ConvInit::KaimingUniformDefault);
    PhiloxStream rng(24);
    std::vector<Variable> in = {Variable(Tensor::randn({2, 3, 4, 4}, rng), true),
                                named_parameter(*dense, "denselayer1.conv1.weight"),
                                named_parameter(*dense, "denselayer2.norm1.weight")};
    actlab::testing::gradcheck([&](std::vector<Variable>& v) { return (*dense)(v[0]); }, in, 1e-3, 5e-3);
    CHECK(dense->out_channels() == 7);

    auto pre = std::make_shared<PreActBlock>(4, 2, 2, BlockType::Bottleneck);  // 4 → 8, stride 2, shortcut
    std::vector<Variable> pin = {Variable(Tensor::randn({2, 4, 5, 5}, rng), true), named_parameter(*pre, "bn1.weight"),
                                 named_parameter(*pre, "conv2.weight"), named_parameter(*pre, "shortcut.weight")};
    actlab::testing::gradcheck([&](std::vector<Variable>& v) { return (*pre)(v[0]); }, pin, 1e-3, 5e-3);
  }
  Tape::current().clear();
  CHECK(memory_stats().total.current == live_before);
}

TEST_CASE("gradcheck: inverted-residual blocks (identity residual, conv shortcut, stride 2)") {
  const int64_t live_before = memory_stats().total.current;
  struct Case { int64_t in, out, stride, t; MobileNetV2Config config; const char* dw_weight; };
  const std::vector<Case> cases = {
      {4, 4, 1, 2, mobilenet_v2_imagenet_config(3, 10), "conv.1.0.weight"},   // ReLU6, x + conv(x)
      {3, 4, 1, 1, mobilenet_v2_division_config(3, 10), "conv.1.0.weight"},   // ReLU, shortcut conv, t=1 expand
      {3, 5, 2, 1, mobilenet_v2_torchcifar_config(3, 10), "conv.0.0.weight"},  // no expand, no residual
  };
  for (const Case& c : cases) {
    seed_init(12);
    auto block = std::make_shared<InvertedResidual>(c.in, c.out, c.stride, c.t, c.config);
    PhiloxStream rng(22);
    std::vector<Variable> in = {Variable(Tensor::randn({2, c.in, 4, 4}, rng), true),
                                named_parameter(*block, c.dw_weight)};
    if (c.in != c.out && c.stride == 1) in.push_back(named_parameter(*block, "shortcut.0.weight"));
    INFO(block->describe());
    actlab::testing::gradcheck([&](std::vector<Variable>& v) { return (*block)(v[0]); }, in, 1e-3, 5e-3);
  }
  Tape::current().clear();
  CHECK(memory_stats().total.current == live_before);
}

TEST_CASE("model_summary: totals equal parameter_count - ResNet-20 MACs from the layer shapes") {
  const int64_t live_before = memory_stats().total.current;
  for (const auto& [in_ch, size] : std::vector<std::pair<int64_t, int64_t>>{{3, 32}, {1, 28}}) {
    auto model = make_model({"resnet20", in_ch, 10, size});
    const ModelSummaryTable t = summarize_model(*model, {in_ch, size, size});
    CHECK(t.total_parameters == model->parameter_count());
    CHECK((t.output == Shape{1, 10}));
    CHECK(model->is_training());  // restored after the eval-mode forward
    for (const auto& [name, buffer] : model->named_buffers()) {  // a training-mode BN would have moved these
      if (name.find("running_var") == std::string::npos) continue;
      const auto v = buffer.to_vector();
      CHECK_MESSAGE(std::all_of(v.begin(), v.end(), [](float x) { return x == 1.f; }), name);
    }
    // Expected MACs: a 3×3 conv producing K×P×P from C channels costs K·P²·C·9.
    const int64_t h1 = size, h2 = (size + 1) / 2, h3 = (h2 + 1) / 2;
    int64_t expected = 16 * h1 * h1 * in_ch * 9;                         // stem
    expected += 6 * (16 * h1 * h1 * 16 * 9);                              // layer1: 3 blocks × 2 convs
    expected += 32 * h2 * h2 * 16 * 9 + 5 * (32 * h2 * h2 * 32 * 9);     // layer2 (first conv from 16 ch)
    expected += 64 * h3 * h3 * 32 * 9 + 5 * (64 * h3 * h3 * 64 * 9);     // layer3
    expected += 64 * 10;                                                  // fc
    CHECK(t.total_macs == expected);
    const auto row = std::find_if(t.rows.begin(), t.rows.end(), [](const ModuleSummary& r) {
      return r.path == "layer2.0.conv1";
    });
    REQUIRE(row != t.rows.end());
    CHECK((row->output == Shape{1, 32, h2, h2}));
    CHECK(row->parameters == 32 * 16 * 9);
    const std::string text = model_summary(*model, {in_ch, size, size});
    CHECK(text.find("layer3.2.bn2") != std::string::npos);
    CHECK(std::count(text.begin(), text.end(), '\n') == static_cast<long>(t.rows.size()) + 5);  // + title, head, 2 rules, total
  }
  {  // Bottleneck, max-pool stem and containers that own nothing.
    ResNetConfig c;
    c.stem = Stem::ImageNet;
    c.block = BlockType::Bottleneck;
    c.widths = {4, 8};
    c.blocks = {2, 1};
    ResNet model(c);
    const ModelSummaryTable t = summarize_model(model, {3, 32, 32});
    CHECK(t.total_parameters == model.parameter_count());
    CHECK((t.output == Shape{1, 10}));
    const auto relu = std::find_if(t.rows.begin(), t.rows.end(), [](const ModuleSummary& r) {
      return r.path == "layer1.0.relu";
    });
    REQUIRE(relu != t.rows.end());
    CHECK(relu->calls == 2);  // after bn1 and bn2; the residual add_relu is not a module call
    const auto pool = std::find_if(t.rows.begin(), t.rows.end(), [](const ModuleSummary& r) {
      return r.path == "maxpool";
    });
    REQUIRE(pool != t.rows.end());
    CHECK((pool->output == Shape{1, 4, 8, 8}));  // 32 → conv1 16 → max-pool 8
  }
  CHECK(memory_stats().total.current == live_before);
}

TEST_CASE("unknown model names are refused with the list of models") {
  try {
    make_model({"resnet19", 3, 10, 32});
    FAIL("no error");
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const auto& m : model_names()) CHECK_MESSAGE(what.find(m.first) != std::string::npos, m.first);
  }
}

TEST_CASE("image sizes: small inputs are refused with the minimum, 28x28 works everywhere it should") {
  // ImageNet stems halve 5 times (conv1, max-pool, layer2..4): 17 → 9 → 5 → 3 → 2 → 1 is the smallest.
  CHECK(min_image_size("resnet50_imagenet") == 17);
  CHECK(min_image_size("mobilenet_v2_imagenet") == 17);
  CHECK(min_image_size("resnet20") == 3);
  CHECK(min_image_size("mobilenet_v2") == 5);
  CHECK(min_image_size("mlp") == 1);
  // DenseNet's transitions are unpadded 2×2 pools, H → floor(H/2): the CIFAR one needs 8 → 4 → 2 → 1, the
  // ImageNet one 29 → 15 → 8 (conv0, pool0, ceil) → 4 → 2 → 1.
  CHECK(min_image_size("densenet121") == 8);
  CHECK(min_image_size("densenet121_imagenet") == 29);
  CHECK(min_image_size("preact_resnet164") == 3);
  CHECK(native_image_size("wrn50_2_imagenet") == 224);
  try {
    make_model({"resnet50_imagenet", 3, 10, 16});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find(">= 17") != std::string::npos);
  }
  CHECK_THROWS_AS(make_model({"resnet18", 1, 10, 4}), Error);
  CHECK_THROWS_AS(make_model({"densenet121", 1, 10, 7}), Error);  // 7 → 3 → 1 → 0
  CHECK_THROWS_AS(make_model({"densenet121_imagenet", 1, 10, 28}), Error);
  NoGradGuard no_grad;
  for (const auto& [name, size] : std::vector<std::pair<std::string, int64_t>>{
           {"mobilenet_v2_imagenet", 28}, {"mobilenet_v2_imagenet", 17}, {"resnet20", 3}, {"densenet121", 28},
           {"densenet121", 9}, {"densenet121_imagenet", 30}}) {
    auto model = make_model({name, 1, 10, size});
    model->eval();
    MemTagScope tag(MemTag::Activation);
    CHECK_MESSAGE(((*model)(Variable(Tensor::zeros({1, 1, size, size}))).shape() == Shape{1, 10}), name);
  }
  // The MLP's width follows the image size; a mismatched input is refused.
  auto mlp = make_model({"mlp", 1, 10, 28});
  CHECK_THROWS_AS((*mlp)(Variable(Tensor::zeros({2, 1, 32, 32}))), Error);
}
