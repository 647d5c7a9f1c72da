// Model registry: one table of names, descriptions, input-size facts and builders.
#include "actlab/models/registry.h"

#include <cstring>
#include <functional>

#include "actlab/models/densenet.h"
#include "actlab/models/mlp.h"
#include "actlab/models/mobilenet_v2.h"
#include "actlab/models/resnet.h"
#include "actlab/models/swin.h"
#include "actlab/models/vit.h"

namespace actlab {

namespace {

struct ModelEntry {
  const char* name;
  const char* description;
  int64_t native_size;     // 32 CIFAR, 224 ImageNet, 0: any
  // The layers that halve H, in forward order: 'c' maps H to ceil(H/2) (a padded stride-2 conv or
  // max-pool), 'f' to floor(H/2) (an unpadded 2×2 average pool: DenseNet's transitions). Decides the
  // smallest usable input (min_image_size).
  const char* halvings;
  std::function<std::shared_ptr<Module>(const ModelSpec&)> build;
  bool has_drop_path = false;  // build reads ModelSpec::drop_path
};

const std::vector<ModelEntry>& model_table() {
  static const std::vector<ModelEntry> table = {
      {"resnet20", "CIFAR ResNet-20 (He et al.; 0.27M params, option-A shortcuts)", 32, "cc",
       [](const ModelSpec& s) { return resnet_cifar_he(20, s.in_channels, s.num_classes); }},
      {"resnet32", "CIFAR ResNet-32 (option-A shortcuts)", 32, "cc",
       [](const ModelSpec& s) { return resnet_cifar_he(32, s.in_channels, s.num_classes); }},
      {"resnet56", "CIFAR ResNet-56 (option-A shortcuts)", 32, "cc",
       [](const ModelSpec& s) { return resnet_cifar_he(56, s.in_channels, s.num_classes); }},
      {"resnet110", "CIFAR ResNet-110 (option-A shortcuts)", 32, "cc",
       [](const ModelSpec& s) { return resnet_cifar_he(110, s.in_channels, s.num_classes); }},
      {"resnet20b", "CIFAR ResNet-20 with 1x1-conv projection shortcuts", 32, "cc",
       [](const ModelSpec& s) { return resnet_cifar_he(20, s.in_channels, s.num_classes, Shortcut::B); }},
      {"resnet18", "CIFAR ResNet-18 (3x3 stem, no max-pool, 11.17M params)", 32, "ccc",
       [](const ModelSpec& s) { return resnet_torchvision(18, Stem::Cifar, s.in_channels, s.num_classes); }},
      {"resnet34", "CIFAR ResNet-34 (3x3 stem, no max-pool, 21.28M params)", 32, "ccc",
       [](const ModelSpec& s) { return resnet_torchvision(34, Stem::Cifar, s.in_channels, s.num_classes); }},
      {"resnet50", "CIFAR ResNet-50 (3x3 stem, no max-pool, Bottleneck v1.5, 23.52M params)", 32, "ccc",
       [](const ModelSpec& s) { return resnet_torchvision(50, Stem::Cifar, s.in_channels, s.num_classes); }},
      {"wrn28_10", "CIFAR Wide ResNet-28-10 (pre-activation, widths 160/320/640, 36.48M params)", 32, "cc",
       [](const ModelSpec& s) { return wide_resnet_cifar(28, 10, s.in_channels, s.num_classes); }},
      {"preact_resnet164",
       "CIFAR pre-activation ResNet-164 (He et al. 2016: bottleneck, 18 blocks a stage, outputs 64/128/256; 1.70M params)",
       32, "cc", [](const ModelSpec& s) { return preact_resnet_cifar(164, s.in_channels, s.num_classes); }},
      {"densenet121", "CIFAR DenseNet-121 (kuangliu style: 3x3 stem, no norm0 or max-pool; growth 32; 6.96M params)",
       32, "fff",
       [](const ModelSpec& s) {
         return std::make_shared<DenseNet>(densenet121_config(Stem::Cifar, s.in_channels, s.num_classes));
       }},
      {"resnet18_imagenet", "torchvision ResNet-18 (7x7 stem + max-pool, 224x224; 11.69M params)", 224, "ccccc",
       [](const ModelSpec& s) { return resnet_torchvision(18, Stem::ImageNet, s.in_channels, s.num_classes); }},
      {"resnet50_imagenet", "torchvision ResNet-50 (7x7 stem + max-pool, 224x224; 25.56M params)", 224, "ccccc",
       [](const ModelSpec& s) { return resnet_torchvision(50, Stem::ImageNet, s.in_channels, s.num_classes); }},
      {"wrn50_2_imagenet", "torchvision wide_resnet50_2 (bottleneck width x2, 224x224; 68.88M params)", 224, "ccccc",
       [](const ModelSpec& s) {
         return resnet_torchvision(50, Stem::ImageNet, s.in_channels, s.num_classes, 2);
       }},
      {"mobilenet_v2", "MobileNetV2 CIFAR, the DIVISION reference's model (ReLU, conv shortcuts; 2.30M params)", 32,
       "ccc",
       [](const ModelSpec& s) {
         return std::make_shared<MobileNetV2>(mobilenet_v2_division_config(s.in_channels, s.num_classes));
       }},
      {"mobilenet_v2_torchcifar", "MobileNetV2 CIFAR as in the PyTorch peer benchmark's models (ReLU6; 2.24M params)",
       32, "ccc",
       [](const ModelSpec& s) {
         return std::make_shared<MobileNetV2>(mobilenet_v2_torchcifar_config(s.in_channels, s.num_classes));
       }},
      {"mobilenet_v2_imagenet", "torchvision MobileNetV2 (ReLU6, dropout 0.2, 224x224; 3.50M params)", 224, "ccccc",
       [](const ModelSpec& s) {
         return std::make_shared<MobileNetV2>(mobilenet_v2_imagenet_config(s.in_channels, s.num_classes));
       }},
      {"vit_tiny_cifar", "ViT-Tiny for small images (patch 4, width 192, depth 12, 3 heads, drop-path 0.1; timm names; 5.36M params at 32x32)",
       32, "",
       [](const ModelSpec& s) {
         VitConfig c = vit_tiny_cifar_config(s.image_size, s.in_channels, s.num_classes);
         if (s.drop_path >= 0) c.drop_path = s.drop_path;
         return std::make_shared<VisionTransformer>(c);
       },
       true},
      {"densenet121_imagenet", "torchvision DenseNet-121 (7x7 stem + max-pool, growth 32, 224x224; 7.98M params)", 224,
       "ccfff",
       [](const ModelSpec& s) {
         return std::make_shared<DenseNet>(densenet121_config(Stem::ImageNet, s.in_channels, s.num_classes));
       }},
      {"swin_t", "torchvision Swin-T (patch 4, window 7, widths 96-768, depths 2-2-6-2, drop-path 0.2; 224x224; 28.29M params)",
       224, "",
       [](const ModelSpec& s) {
         SwinConfig c = swin_t_config(s.image_size, s.in_channels, s.num_classes);
         if (s.drop_path >= 0) c.drop_path = s.drop_path;
         return make_swin(c);
       },
       true},
      {"mlp", "MLP: flatten, 2 hidden layers of 512 with ReLU, Linear to classes", 0, "",
       [](const ModelSpec& s) {
         return std::make_shared<Mlp>(s.in_channels * s.image_size * s.image_size, std::vector<int64_t>{512, 512},
                                      s.num_classes);
       }},
  };
  return table;
}

std::string all_names() {
  std::string names;
  for (const auto& m : model_table()) names += (names.empty() ? "" : ", ") + std::string(m.name);
  return names;
}

const ModelEntry& find_model(const std::string& name) {
  for (const auto& m : model_table())
    if (name == m.name) return m;
  ACTLAB_FAIL("unknown model '", name, "'; available: ", all_names());
}

}  // namespace

std::vector<std::pair<std::string, std::string>> model_names() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& m : model_table()) out.emplace_back(m.name, m.description);
  return out;
}

int64_t min_image_size(const std::string& name) {
  // Backwards from the last halving layer, which must see 2×2: to hand the next one m, a ceil layer needs
  // an input of 2m − 1, a floor layer one of 2m.
  const std::string halvings = find_model(name).halvings;
  if (halvings.empty()) return 1;
  int64_t need = 2;
  for (size_t i = halvings.size() - 1; i-- > 0;) need = halvings[i] == 'f' ? 2 * need : 2 * need - 1;
  return need;
}

int64_t native_image_size(const std::string& name) { return find_model(name).native_size; }

bool model_has_drop_path(const std::string& name) { return find_model(name).has_drop_path; }

std::string models_with_drop_path() {
  std::vector<std::string> names;
  for (const ModelEntry& m : model_table())
    if (m.has_drop_path) names.push_back(m.name);
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return out;
}

void check_drop_path(const std::string& model, double rate, const std::string& what) {
  ACTLAB_CHECK(rate == -1 || (rate >= 0 && rate < 1), what, " must be in [0, 1), or -1 for the model's own rate; got ",
               rate);
  ACTLAB_CHECK(rate == -1 || model_has_drop_path(model), what, ": model '", model,
               "' has no drop path (stochastic depth); ", models_with_drop_path(), " have");
}

void check_models(const std::vector<std::string>& names, int64_t in_channels, int64_t num_classes, int64_t image_size) {
  for (const auto& name : names) {
    find_model(name);  // an unknown name: the list of known ones
    const int64_t least = min_image_size(name);
    ACTLAB_CHECK(image_size >= least, "image size ", image_size, " is too small for ", name, " (at least ", least, ")");
    make_model({name, in_channels, num_classes, image_size});
  }
}

std::shared_ptr<Module> make_model(const ModelSpec& spec) {
  const ModelEntry& m = find_model(spec.name);
  ACTLAB_CHECK(spec.in_channels > 0 && spec.num_classes > 1 && spec.image_size > 0, "bad model spec for '",
               spec.name, "': ", spec.in_channels, " channels, ", spec.num_classes, " classes, image ",
               spec.image_size);
  check_drop_path(spec.name, spec.drop_path);
  const int64_t min_size = min_image_size(spec.name);
  ACTLAB_CHECK(spec.image_size >= min_size, "model '", spec.name, "' halves the image ", std::strlen(m.halvings),
               " times, so a ", spec.image_size, "x", spec.image_size,
               " input would reach a stride-2 layer smaller than 2x2; it needs image_size >= ", min_size,
               " (designed for ", m.native_size, "x", m.native_size, ")");
  return m.build(spec);
}

}  // namespace actlab
