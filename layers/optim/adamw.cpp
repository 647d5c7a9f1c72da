// AdamW step: one fused kernel per parameter (core/ops.h adamw_update_), and its counters' text form.
#include "actlab/layers/optim/adamw.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "actlab/core/ops.h"

namespace actlab {

AdamW::AdamW(std::vector<Variable> params, const AdamwOptions& opt)
    : Optimizer(std::move(params)), m_(params_.size()), v_(params_.size()), updates_(params_.size(), 0), opt_(opt) {
  check_lr("AdamW", opt.lr);
  ACTLAB_CHECK(opt.beta1 >= 0.f && opt.beta1 < 1.f, "AdamW: beta1 must be in [0, 1), got ", opt.beta1);
  ACTLAB_CHECK(opt.beta2 >= 0.f && opt.beta2 < 1.f, "AdamW: beta2 must be in [0, 1), got ", opt.beta2);
  ACTLAB_CHECK(opt.eps > 0.f && std::isfinite(opt.eps), "AdamW: eps must be > 0, got ", opt.eps);
  ACTLAB_CHECK(opt.weight_decay >= 0.f, "AdamW: weight decay must be >= 0, got ", opt.weight_decay);
}

void AdamW::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Variable& p = params_[i];
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    ensure_state(m_, i, true);
    ensure_state(v_, i, true);
    ops::adamw_update_(p.data(), m_[i], v_[i], g, opt_.lr, opt_.beta1, opt_.beta2, opt_.eps,
                       decay_of(i, opt_.weight_decay), ++updates_[i]);
  }
  ++steps_;
}

std::string AdamW::counters() const {
  std::string s;
  for (size_t i = 0; i < updates_.size(); ++i) s += (i ? " " : "") + std::to_string(updates_[i]);
  return s;
}

void AdamW::set_counters(const std::string& text) {
  std::vector<int64_t> got;
  const char* p = text.c_str();
  while (*p != '\0') {
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(p, &end, 10);
    // Digits only, one space between counts: strtoll alone would take signs and extra spaces.
    ACTLAB_CHECK(*p >= '0' && *p <= '9' && errno == 0 && (*end == '\0' || (*end == ' ' && end[1] != '\0')),
                 "AdamW: the checkpoint's update counts are not a list of counts: '", text, "'");
    got.push_back(n);
    p = *end == ' ' ? end + 1 : end;
  }
  ACTLAB_CHECK(got.size() == updates_.size(), "AdamW: the checkpoint has update counts of ", got.size(),
               " parameters, the model ", updates_.size());
  updates_ = got;
}

}  // namespace actlab
