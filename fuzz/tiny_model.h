// The small model the checkpoint fuzz target restores into and fuzz/make_seeds.cpp saves its seed
// checkpoints from: every tensor kind a real checkpoint holds (conv and linear weights, a bias,
// batch-norm parameters and running statistics, SGD momentum), in a few hundred bytes.
#pragma once
#include <memory>

#include "actlab/layers/layers.h"

namespace actlab::fuzz {

inline std::shared_ptr<Sequential> make_tiny_model() {
  auto m = std::make_shared<Sequential>();
  m->add("conv1", std::make_shared<Conv2d>(1, 2, 3, 1, 1));
  m->add("bn1", std::make_shared<BatchNorm2d>(2));
  m->add("relu", std::make_shared<ReLU>());
  m->add("pool", std::make_shared<GlobalAvgPool>());
  m->add("fc", std::make_shared<Linear>(2, 3));
  return m;
}

}  // namespace actlab::fuzz
