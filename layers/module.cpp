// Module bookkeeping: registration, traversal, train/eval, the init random stream.
#include "actlab/layers/module.h"

#include <cmath>

#include <unordered_set>

#include "actlab/autograd/checkpoint.h"
#include "actlab/core/allocator.h"
#include "actlab/layers/checkpoint.h"

namespace actlab {

namespace {
thread_local ForwardObserver* t_forward_observer = nullptr;
}  // namespace

ForwardObserver* set_forward_observer(ForwardObserver* observer) {
  ForwardObserver* previous = t_forward_observer;
  t_forward_observer = observer;
  return previous;
}

Variable Module::operator()(const Variable& x) {
  if (Variable y = checkpoint_forward(*this, name_, x); y.defined()) return y;
  ModulePathScope path(name_);
  Variable y = forward(x);
  // A checkpoint's recompute runs the forward a second time: observers saw it the first time.
  if (t_forward_observer && !recomputing()) t_forward_observer->on_forward(current_module_path(), *this, y);
  return y;
}

Variable& Module::register_parameter(const std::string& name, Tensor value) {
  if (value.storage()->tag() != MemTag::Param) value.storage()->retag(MemTag::Param);
  params_.emplace_back(name, Variable(std::move(value), true));
  return params_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor value) {
  if (value.storage()->tag() != MemTag::Param) value.storage()->retag(MemTag::Param);
  buffers_.emplace_back(name, std::move(value));
  return buffers_.back().second;
}

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Variable>>* params,
                     std::vector<std::pair<std::string, Tensor>>* buffers,
                     std::vector<std::pair<std::string, std::shared_ptr<Module>>>* modules,
                     const std::shared_ptr<Module>& self) const {
  const std::string dot = prefix.empty() ? "" : prefix + ".";
  if (modules) modules->emplace_back(prefix, self);
  if (params)
    for (const auto& p : params_) params->emplace_back(dot + p.first, p.second);
  if (buffers)
    for (const auto& b : buffers_) buffers->emplace_back(dot + b.first, b.second);
  for (const auto& c : children_) c.second->collect(dot + c.first, params, buffers, modules, c.second);
}

std::vector<std::pair<std::string, Variable>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Variable>> out;
  collect("", &out, nullptr, nullptr, nullptr);
  return out;
}

std::vector<Variable> Module::parameters() const {
  std::vector<Variable> out;
  for (auto& p : named_parameters()) out.push_back(p.second);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", nullptr, &out, nullptr, nullptr);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  collect("", nullptr, nullptr, &out, nullptr);
  return out;
}

int64_t Module::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : named_parameters()) n += p.second.data().numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& c : children_) c.second->train(on);
}

void Module::zero_grad() {
  for (auto& p : parameters()) p.zero_grad();
}

void Module::to(Device device) {
  std::unordered_set<Storage*> moved;  // a storage shared by two names moves once
  const auto move = [&](const Tensor& t) {
    if (t.defined() && moved.insert(t.storage().get()).second) t.storage()->move_to(device);
  };
  for (const auto& p : named_parameters()) {
    move(p.second.data());
    move(p.second.impl()->grad);
  }
  for (const auto& b : named_buffers()) move(b.second);
}

namespace {
PhiloxStream& init_stream() {
  static PhiloxStream s(0, 0x1A17);
  return s;
}
}  // namespace
PhiloxStream& init_rng() { return init_stream(); }
void seed_init(uint64_t seed) { init_stream() = PhiloxStream(seed, 0x1A17); }

Tensor trunc_normal_init(const Shape& shape, float std) {
  PhiloxStream& rng = init_rng();
  Tensor t = Tensor::randn(shape, rng, 0.f, std);
  float* p = t.data<float>();
  // A value past 2σ is redrawn from the next pair of the stream, as a one-element randn would (same
  // numbers), but without a tensor and a thread team per redraw: about 4.6 % of the values are redrawn,
  // and allocating for each made building swin_t take seconds.
  for (int64_t i = 0; i < t.numel(); ++i)
    while (std::fabs(p[i]) > 2.f * std) {
      double z, unused;
      philox_normal_pair(rng.seed(), rng.stream(), rng.reserve(2), z, unused);
      p[i] = 0.f + std * static_cast<float>(z);
    }
  return t;
}

}  // namespace actlab
