// make_model: the one place model names from the command line become modules, and where a model's
// input-size requirements are checked. Tested in tests/test_models.cpp.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "actlab/layers/module.h"

namespace actlab {

struct ModelSpec {
  std::string name;         // "resnet20", "resnet18", "mobilenet_v2", ... (see model_names())
  int64_t in_channels = 3;
  int64_t num_classes = 10;
  int64_t image_size = 32;  // square inputs of image_size²; the MLP's input width depends on it
  // Stochastic depth of the models that have it (models_with_drop_path()): the deepest block's rate, each
  // model's own rule spreading it over the blocks. -1: the model's default (0.1 and 0.2). What else is
  // accepted is check_drop_path's rule.
  float drop_path = -1.f;
};

// Builds the named model. Throws, listing every name, for an unknown name; throws for a spec the model
// cannot take (channels < 1, classes < 2, or an image so small that a stride-2 layer would see a 1×1 map —
// see min_image_size()). Its weights are drawn from the process-wide init_rng() (layers/module.h): call it
// from one thread at a time.
std::shared_ptr<Module> make_model(const ModelSpec& spec);
// Builds each named model once (channels, classes, image size as given), so that an unknown name, or an
// image size one of the models cannot take, fails before a benchmark's or a table's long work on the
// others. Draws weights from init_rng(), as make_model does.
void check_models(const std::vector<std::string>& names, int64_t in_channels, int64_t num_classes, int64_t image_size);
// Whether the named model (one of model_names()) takes ModelSpec::drop_path, and which models do, as
// "vit_tiny_cifar and swin_t" for messages.
bool model_has_drop_path(const std::string& name);
std::string models_with_drop_path();
// The one rule for a drop-path rate (ModelSpec::drop_path, actlab-train's --drop-path): -1 for the model's
// own, else in [0, 1) and only for a model that has drop path. Throws Error naming what is wrong, with the
// rate called `what` (actlab-train: its flag).
void check_drop_path(const std::string& model, double rate, const std::string& what = "drop path");
// Names accepted by make_model, with a one-line description each.
std::vector<std::pair<std::string, std::string>> model_names();
// The smallest image size the named model accepts: every stride-2 layer must see at least 2×2, so a
// model with k stride-2 layers that each map H to ceil(H/2) needs H > 2^(k-1); a floor(H/2) layer (an
// unpadded 2×2 pool: DenseNet) needs an even 2m to give m. 1 for the MLP.
int64_t min_image_size(const std::string& name);
// The image size the model was designed for (32 for CIFAR models, 224 for ImageNet ones, 0 if none).
int64_t native_image_size(const std::string& name);

}  // namespace actlab
