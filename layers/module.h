// Module: the unit models are built from. Registers parameters, buffers and children by name,
// knows train/eval, and pushes its name onto the module path while it runs, so saved tensors and
// memory reports carry paths like "layer2.0.conv1".
// Tested in tests/test_models.cpp (names, parameter counts) and tests/test_autograd.cpp (module paths).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "actlab/autograd/variable.h"

namespace actlab {

class Module {
 public:
  virtual ~Module() = default;
  // Runs forward() with this module's name pushed onto the module path.
  Variable operator()(const Variable& x);
  virtual Variable forward(const Variable& x) = 0;
  virtual std::string kind() const = 0;  // "Conv2d", "BatchNorm2d", ...
  virtual std::string describe() const { return kind(); }  // with hyper-parameters

  std::vector<std::pair<std::string, Variable>> named_parameters() const;
  std::vector<Variable> parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules() const;  // depth first, self first ("", as a null pointer)
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }
  int64_t parameter_count() const;

  // Restarts the random draws of a module that makes any (Dropout, DropPath) from `seed`; a no-op for the
  // rest. The trainer reseeds every module before each step, so masks are a function of the step.
  virtual void set_seed(uint64_t /*seed*/) {}
  // How far this module's own draws have gone since set_seed, and a way back there: a checkpointed
  // segment's recompute rewinds each module to where the forward found it, so it redraws the same masks.
  virtual uint64_t draw_position() const { return 0; }
  virtual void rewind_draws(uint64_t /*position*/) {}

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void zero_grad();
  // Moves every parameter, gradient and buffer of this module and its children to `device`, in place
  // (Storage::move_to): every handle sharing those storages follows — a layer's own reference to its
  // buffers, an optimizer's parameter list. An optimizer's momentum buffers do not: move the model before
  // the first optimizer step (or before restoring a checkpoint, which makes them on the parameters' device).
  void to(Device device);

 protected:
  Variable& register_parameter(const std::string& name, Tensor value);
  Tensor& register_buffer(const std::string& name, Tensor value);
  template <typename M> std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    m->name_ = name;
    children_.emplace_back(name, m);
    return m;
  }

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Variable>>* params,
               std::vector<std::pair<std::string, Tensor>>* buffers,
               std::vector<std::pair<std::string, std::shared_ptr<Module>>>* modules,
               const std::shared_ptr<Module>& self) const;

  std::vector<std::pair<std::string, Variable>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  std::string name_;  // the name its parent registered it under ("" for the root)
};

// Optional, per-thread observer of module forwards, for inspection tools (models/summary.h): when
// one is installed, Module::operator() calls it after forward() returns, with the full module path,
// the module and its output. Costs one pointer test per module call when none is installed.
class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  virtual void on_forward(const std::string& path, const Module& module, const Variable& output) = 0;
};
// Installs `observer` for the calling thread (nullptr removes it); returns the previous one, which
// the caller restores when done. The observer is not owned.
ForwardObserver* set_forward_observer(ForwardObserver* observer);
// Installs an observer for one scope and puts the previous one back on every exit path.
class ObserverScope {
 public:
  explicit ObserverScope(ForwardObserver* o) : previous_(set_forward_observer(o)) {}
  ~ObserverScope() { set_forward_observer(previous_); }
  ObserverScope(const ObserverScope&) = delete;
  ObserverScope& operator=(const ObserverScope&) = delete;

 private:
  ForwardObserver* previous_;
};

// The random stream parameters are initialised from (seed it once per run for reproducibility). One per
// process, not per thread: build models on one thread at a time (two threads building at once race on it,
// and neither model's weights are then reproducible).
PhiloxStream& init_rng();
void seed_init(uint64_t seed);
// N(0, std²) truncated to ±2σ by redrawing, from init_rng() (timm's trunc_normal_, used by the transformer
// layers' weights, class token and position embedding).
Tensor trunc_normal_init(const Shape& shape, float std);

}  // namespace actlab
