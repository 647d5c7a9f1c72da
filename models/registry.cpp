// Model registry.
#include "models/registry.h"

#include "models/resnet.h"

namespace actlab {

std::vector<std::pair<std::string, std::string>> model_names() {
  return {
      {"resnet20", "CIFAR ResNet-20 (He et al.; 0.27M params, option-A shortcuts)"},
      {"resnet32", "CIFAR ResNet-32 (option-A shortcuts)"},
      {"resnet56", "CIFAR ResNet-56 (option-A shortcuts)"},
      {"resnet110", "CIFAR ResNet-110 (option-A shortcuts)"},
      {"resnet20b", "CIFAR ResNet-20 with 1x1-conv projection shortcuts"},
      {"resnet18", "CIFAR ResNet-18 (3x3 stem, no max-pool, 11.17M params)"},
      {"resnet34", "CIFAR ResNet-34 (3x3 stem, no max-pool)"},
  };
}

std::shared_ptr<Module> make_model(const ModelSpec& spec) {
  ACTLAB_CHECK(spec.in_channels > 0 && spec.num_classes > 1 && spec.image_size > 0, "bad model spec: ",
               spec.in_channels, " channels, ", spec.num_classes, " classes, image ", spec.image_size);
  const std::string& n = spec.name;
  if (n == "resnet20" || n == "resnet32" || n == "resnet56" || n == "resnet110")
    return resnet_cifar_he(std::stoi(n.substr(6)), spec.in_channels, spec.num_classes);
  if (n == "resnet20b") return resnet_cifar_he(20, spec.in_channels, spec.num_classes, Shortcut::B);
  if (n == "resnet18" || n == "resnet34")
    return resnet_cifar_basic(std::stoi(n.substr(6)), spec.in_channels, spec.num_classes);
  std::string names;
  for (const auto& m : model_names()) names += (names.empty() ? "" : ", ") + m.first;
  ACTLAB_FAIL("unknown model '", n, "'; available: ", names);
}

}  // namespace actlab
