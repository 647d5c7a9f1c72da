// AdamW (Loshchilov & Hutter), torch.optim.AdamW semantics with amsgrad off: decoupled weight decay on
// every parameter, bias-corrected moments, each parameter counting its own updates (a parameter without a
// gradient is skipped and its count stays). One fused kernel per parameter (core/ops.h adamw_update_);
// the moments are tagged OptimState. The optimizer vision transformers are trained with. Tested in
// tests/test_optim.cpp.
#pragma once
#include <vector>

#include "actlab/core/error.h"
#include "actlab/layers/optim/optimizer.h"

namespace actlab {

struct AdamwOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Variable> params, const AdamwOptions& opt);
  const char* kind() const override { return kAdamwName; }
  void step() override;
  void set_lr(float lr) override {
    check_lr("AdamW", lr);
    opt_.lr = lr;
  }
  float lr() const override { return opt_.lr; }
  // "exp_avg" and "exp_avg_sq", PyTorch's names for the two moments.
  std::vector<OptimStateSlot> state_slots() override { return {{"exp_avg", &m_}, {"exp_avg_sq", &v_}}; }
  // Each parameter's update count, space-separated in parameter order.
  std::string counters() const override;
  void set_counters(const std::string& text) override;
  const AdamwOptions& options() const { return opt_; }
  const std::vector<int64_t>& updates() const { return updates_; }

 private:
  std::vector<Tensor> m_, v_;
  std::vector<int64_t> updates_;
  AdamwOptions opt_;
};

}  // namespace actlab
