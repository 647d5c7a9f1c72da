// SGD with momentum, dampening, Nesterov and weight decay — PyTorch's torch.optim.SGD semantics,
// applied as one fused pass per parameter. Momentum buffers are tagged OptimState.
// Tested in tests/test_optim.cpp.
#pragma once
#include <vector>

#include "actlab/autograd/variable.h"

namespace actlab {

struct SgdOptions {
  float lr = 0.1f;
  float momentum = 0.9f;
  float dampening = 0.f;
  float weight_decay = 5e-4f;
  bool nesterov = false;
};

class Sgd {
 public:
  Sgd(std::vector<Variable> params, const SgdOptions& opt);
  // Updates every parameter that has a gradient; parameters without one are left alone.
  void step();
  void zero_grad();
  void set_lr(float lr) { opt_.lr = lr; }
  float lr() const { return opt_.lr; }
  const SgdOptions& options() const { return opt_; }
  // Momentum buffers (undefined until a parameter's first step), in parameter order.
  std::vector<Tensor>& momentum_buffers() { return buffers_; }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }
 private:
  std::vector<Variable> params_;
  std::vector<Tensor> buffers_;
  SgdOptions opt_;
  int64_t steps_ = 0;
};

}  // namespace actlab
