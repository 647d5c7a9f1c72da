// SGD step: one fused kernel per parameter (core/ops.h sgd_update_).
#include "actlab/layers/optim/sgd.h"

#include "actlab/core/ops.h"

namespace actlab {

Sgd::Sgd(std::vector<Variable> params, const SgdOptions& opt)
    : Optimizer(std::move(params)), buffers_(params_.size()), opt_(opt) {
  check_lr("SGD", opt.lr);
  ACTLAB_CHECK(opt.momentum >= 0.f, "SGD: momentum must be >= 0, got ", opt.momentum);
  ACTLAB_CHECK(opt.weight_decay >= 0.f, "SGD: weight decay must be >= 0, got ", opt.weight_decay);
  ACTLAB_CHECK(!opt.nesterov || (opt.momentum > 0.f && opt.dampening == 0.f),
               "SGD: Nesterov needs momentum > 0 and dampening 0");
}

void Sgd::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Variable& p = params_[i];
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    // The first step writes the whole buffer (buf = g), so it is not zeroed.
    const bool first = opt_.momentum != 0.f && ensure_state(buffers_, i, false);
    ops::sgd_update_(p.data(), buffers_[i], g, opt_.lr, opt_.momentum, opt_.dampening,
                     decay_of(i, opt_.weight_decay), opt_.nesterov, first);
  }
  ++steps_;
}

std::vector<OptimStateSlot> Sgd::state_slots() {
  if (opt_.momentum == 0.f) return {};
  return {{"momentum", &buffers_}};
}

}  // namespace actlab
