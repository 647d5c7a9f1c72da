// Models: output shapes, parameter counts against the known figures, torchvision-style names.
#include <doctest/doctest.h>

#include <algorithm>
#include <tuple>

#include "autograd/functions.h"
#include "models/registry.h"

using namespace actlab;

namespace {
int64_t count(const std::string& name, int64_t in_ch) {
  return make_model({name, in_ch, 10, 32})->parameter_count();
}
}  // namespace

TEST_CASE("parameter counts match the reference models") {
  // Figures from ../shared/bench/cifar_models.py (PyTorch), counted with sum(p.numel()).
  CHECK(count("resnet20", 3) == 269722);   // He et al. ResNet-20, "0.27M"
  CHECK(count("resnet20", 1) == 269434);
  CHECK(count("resnet20b", 3) == 272474);
  CHECK(count("resnet18", 3) == 11173962);  // CIFAR ResNet-18, "11.17M"
}

TEST_CASE("models produce (N, classes) logits on 28x28 and 32x32 inputs") {
  NoGradGuard no_grad;
  for (const auto& [name, in_ch, size] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
           {"resnet20", 1, 28}, {"resnet20", 3, 32}, {"resnet18", 3, 32}, {"resnet20b", 1, 28}}) {
    auto model = make_model({name, in_ch, 7, size});
    model->eval();
    MemTagScope tag(MemTag::Activation);
    Variable out = (*model)(Variable(Tensor::zeros({2, in_ch, size, size})));
    CHECK_MESSAGE((out.shape() == Shape{2, 7}), name, " gave ", shape_str(out.shape()));
  }
}

TEST_CASE("parameter names follow torchvision") {
  auto model = make_model({"resnet18", 3, 10, 32});
  std::vector<std::string> names;
  for (const auto& p : model->named_parameters()) names.push_back(p.first);
  auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  CHECK(has("conv1.weight"));
  CHECK(has("bn1.weight"));
  CHECK(has("layer1.0.conv1.weight"));
  CHECK(has("layer2.0.downsample.0.weight"));
  CHECK(has("layer2.0.downsample.1.bias"));
  CHECK(has("fc.weight"));
  CHECK(has("fc.bias"));
  std::vector<std::string> buffers;
  for (const auto& b : model->named_buffers()) buffers.push_back(b.first);
  CHECK(std::find(buffers.begin(), buffers.end(), "layer4.1.bn2.running_var") != buffers.end());
}

TEST_CASE("unknown model names are refused with the list of models") {
  try {
    make_model({"resnet19", 3, 10, 32});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("resnet20") != std::string::npos);
  }
}
