// make_model: the one place model names from the command line become modules.
// Tested in tests/test_models.cpp.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "layers/module.h"

namespace actlab {

struct ModelSpec {
  std::string name;         // "resnet20", "resnet18", ...
  int64_t in_channels = 3;
  int64_t num_classes = 10;
  int64_t image_size = 32;
};

std::shared_ptr<Module> make_model(const ModelSpec& spec);
// Names accepted by make_model, with a one-line description each.
std::vector<std::pair<std::string, std::string>> model_names();

}  // namespace actlab
