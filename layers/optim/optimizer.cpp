// Optimizer's shared parts: zero_grad and the state buffers made on a parameter's first update.
#include "actlab/layers/optim/optimizer.h"

#include <cmath>
#include <set>

#include "actlab/core/error.h"

namespace actlab {

Optimizer::Optimizer(std::vector<Variable> params) : params_(std::move(params)) {
  std::set<const VariableImpl*> seen;
  for (size_t i = 0; i < params_.size(); ++i) {
    ACTLAB_CHECK(params_[i].defined(), "optimizer parameter ", i, " is an undefined Variable");
    ACTLAB_CHECK(seen.insert(params_[i].impl().get()).second, "optimizer parameter ", i,
                 " is listed twice: each step would update it twice");
  }
}

void Optimizer::check_lr(const char* who, float lr) {
  ACTLAB_CHECK(lr >= 0.f && std::isfinite(lr), who, ": learning rate must be >= 0 and finite, got ", lr);
}

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = {kSgdName, kAdamwName};
  return names;
}

const char* optimizer_title(const std::string& name) {
  check_optimizer_name(name);
  return name == kSgdName ? "SGD" : "AdamW";
}

void check_optimizer_name(const std::string& name) {
  for (const auto& n : optimizer_names())
    if (n == name) return;
  std::string known;
  for (const auto& n : optimizer_names()) known += (known.empty() ? "" : " or ") + n;
  ACTLAB_FAIL("unknown optimizer '", name, "' (", known, ")");
}

void Optimizer::set_counters(const std::string& text) {
  ACTLAB_CHECK(text.empty(), "optimizer '", kind(), "' keeps no counters, but the checkpoint has '", text, "'");
}

void Optimizer::set_decays(std::vector<bool> decays) {
  ACTLAB_CHECK(decays.size() == params_.size(), "set_decays: ", decays.size(), " flags for ", params_.size(),
               " parameters");
  decays_ = std::move(decays);
}

std::vector<bool> decays_but_norms_biases_embeddings(const std::vector<std::pair<std::string, Variable>>& named) {
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  std::vector<bool> out;
  for (const auto& [name, p] : named) {
    const bool embedding = name == "cls_token" || ends_with(name, ".cls_token") || name == "pos_embed" ||
                           ends_with(name, ".pos_embed") || ends_with(name, "relative_position_bias_table");
    out.push_back(!(p.data().dim() <= 1 || ends_with(name, "bias") || embedding));
  }
  return out;
}

void Optimizer::zero_grad() {
  for (auto& p : params_) p.zero_grad();
}

bool Optimizer::ensure_state(std::vector<Tensor>& buffers, size_t i, bool zeroed) {
  Tensor& b = buffers.at(i);
  if (b.defined()) return false;
  const Tensor& p = params_[i].data();
  b = Tensor::empty_tagged(p.shape(), MemTag::OptimState, DType::F32, p.device());
  if (zeroed) b.zero_();
  return true;
}

}  // namespace actlab
