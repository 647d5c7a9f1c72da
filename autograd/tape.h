// The tape: nodes in creation order (already a valid reverse-topological order, so backward is a
// reverse walk — no graph search). backward() frees each node's saved tensors right after its
// backward, so saved memory falls layer by layer.
// Tested in tests/test_autograd.cpp.
#pragma once
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "actlab/autograd/variable.h"

namespace actlab {

class Tape {
 public:
  // A tape that ends the pack step when cleared (the step's tape). A checkpoint's recompute records
  // onto a tape made with false: its backward runs inside the step's and must not end it.
  explicit Tape(bool ends_pack_step = true) : ends_pack_step_(ends_pack_step) {}
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  // The tape ops record onto: the thread's own tape, or the one a TapeScope installed.
  static Tape& current();

  void record(std::shared_ptr<Node> node) { nodes_.push_back(std::move(node)); }
  size_t size() const { return nodes_.size(); }
  // Drops every node (and so every saved tensor) without running backward; ends the pack step.
  void clear();
  // Bytes held by all saved tensors of the recorded nodes (each shared pack counted per consumer).
  size_t saved_bytes() const;

  // Runs backward from `root` (seed gradient: ones, or `grad` when given), accumulating into leaf
  // gradients, then clears the tape; also when it fails once the walk has begun (the graph is then
  // part-consumed). A root or seed refused up front leaves the tape as it was.
  void backward(const Variable& root, const Tensor& grad = Tensor());

  // Called during backward once a leaf's gradient is final for this pass: no node left on the tape
  // has an edge to it. Data-parallel training (dist/reducer.h) starts a gradient's all-reduce there,
  // while backward goes on. Empty: no bookkeeping. Leaves no recorded node points at are not reported.
  using GradReadyHook = std::function<void(VariableImpl& leaf)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_hook_ = std::move(hook); }
 private:
  std::vector<std::shared_ptr<Node>> nodes_;
  GradReadyHook grad_ready_hook_;
  bool ends_pack_step_;
};

// Makes `tape` the calling thread's current tape while alive (a checkpoint's recompute, which records
// and walks its own nodes while the step's tape is mid-backward).
class TapeScope {
 public:
  explicit TapeScope(Tape& tape);
  ~TapeScope();
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;
 private:
  Tape* previous_;
};

// loss.backward(): Tape::current().backward(loss).
void backward(const Variable& root, const Tensor& grad = Tensor());

// Clears the current tape when it goes out of scope, so a pass that throws midway leaves no saved
// tensors behind. Every clear, of an empty tape too, ends a pack step (end_pack_step): where the success
// path clears the tape itself (backward does), use TapeClearOnError, or the step advances twice.
class TapeClearGuard {
 public:
  TapeClearGuard() = default;
  ~TapeClearGuard() { Tape::current().clear(); }
  TapeClearGuard(const TapeClearGuard&) = delete;
  TapeClearGuard& operator=(const TapeClearGuard&) = delete;
};

// Clears the current tape only when the scope is left by an exception (run_step: a step that throws
// leaves no saves behind, and a step that succeeds ends one pack step, in its backward). A backward that
// failed part way has cleared the tape and ended the step itself: then nothing is left to do.
class TapeClearOnError {
 public:
  TapeClearOnError() = default;
  ~TapeClearOnError() {
    if (std::uncaught_exceptions() > exceptions_ && pack_step() == step_) Tape::current().clear();
  }
  TapeClearOnError(const TapeClearOnError&) = delete;
  TapeClearOnError& operator=(const TapeClearOnError&) = delete;
 private:
  int exceptions_ = std::uncaught_exceptions();
  uint64_t step_ = pack_step();
};

// Creates node N (constructed from args) for an op with these inputs, wires the edges and records it
// — or returns nullptr when no input needs a gradient or recording is off (then save nothing).
template <typename N, typename... Args>
std::shared_ptr<N> make_node(const std::vector<const Variable*>& inputs, Args&&... args);

// Wraps an op's result: a Variable that requires grad and points at `node` (when node is set).
Variable make_output(Tensor data, const std::shared_ptr<Node>& node, int index = 0);

// ---------------------------------------------------------------- implementation
namespace detail {
bool wire_inputs(Node& node, const std::vector<const Variable*>& inputs);
}

template <typename N, typename... Args>
std::shared_ptr<N> make_node(const std::vector<const Variable*>& inputs, Args&&... args) {
  if (!grad_enabled()) return nullptr;
  bool any = false;
  for (const Variable* v : inputs) any = any || (v && v->requires_grad());
  if (!any) return nullptr;
  auto node = std::make_shared<N>(std::forward<Args>(args)...);
  detail::wire_inputs(*node, inputs);
  Tape::current().record(node);
  return node;
}

}  // namespace actlab
