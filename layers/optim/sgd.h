// SGD with momentum, dampening, Nesterov and weight decay — PyTorch's torch.optim.SGD semantics,
// applied as one fused pass per parameter. Momentum buffers are tagged OptimState.
// Tested in tests/test_optim.cpp.
#pragma once
#include <vector>

#include "actlab/core/error.h"
#include "actlab/layers/optim/optimizer.h"

namespace actlab {

struct SgdOptions {
  float lr = 0.1f;
  float momentum = 0.9f;
  float dampening = 0.f;
  float weight_decay = 5e-4f;
  bool nesterov = false;
};

class Sgd : public Optimizer {
 public:
  Sgd(std::vector<Variable> params, const SgdOptions& opt);
  const char* kind() const override { return kSgdName; }
  void step() override;
  void set_lr(float lr) override {
    check_lr("SGD", lr);
    opt_.lr = lr;
  }
  float lr() const override { return opt_.lr; }
  // One slot, "momentum" (none when momentum is 0: nothing to keep).
  std::vector<OptimStateSlot> state_slots() override;
  const SgdOptions& options() const { return opt_; }
  // Momentum buffers (undefined until a parameter's first step), in parameter order.
  std::vector<Tensor>& momentum_buffers() { return buffers_; }

 private:
  std::vector<Tensor> buffers_;
  SgdOptions opt_;
};

}  // namespace actlab
