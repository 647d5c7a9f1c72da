// Model summary: one no-grad, eval-mode forward of a zero input (batch 1) watched through the
// ForwardObserver hook, giving per leaf module its path, description, output shape, parameters and
// multiply-accumulates (Conv2d and Linear only), plus totals. Tested in tests/test_models.cpp.
#pragma once
#include <string>
#include <vector>

#include "actlab/layers/module.h"

namespace actlab {

struct ModuleSummary {
  std::string path;         // "layer1.0.conv1"
  std::string description;  // Module::describe()
  Shape output;             // output of the last call, batch 1; empty when forward never called it
  int64_t calls = 0;        // a module may run more than once per forward (a block's shared ReLU)
  int64_t parameters = 0;   // its own parameters (a leaf has no children to share them with)
  int64_t macs = 0;         // per image, summed over calls: Conv2d K·P·Q·(C/groups)·R·S; Linear in·out
};

struct ModelSummaryTable {
  std::vector<ModuleSummary> rows;  // leaf modules and modules that own parameters, in registration order
  Shape input;                      // (1, ...) as run
  Shape output;
  int64_t total_parameters = 0;     // sum over rows
  int64_t total_macs = 0;           // sum over rows
};

// sample_shape: one sample's shape without the batch dimension ((C,H,W) for images); batch 1 is
// prepended. Runs in eval mode under NoGradGuard (BN running statistics are not touched) and
// restores model.train() to its previous root setting afterwards.
ModelSummaryTable summarize_model(Module& model, const Shape& sample_shape);
// The same as a printable table (one line per row, then a totals line).
std::string model_summary(Module& model, const Shape& sample_shape);

}  // namespace actlab
