// CheckpointNode: recompute a segment's forward in backward (autograd/checkpoint.h).
#include "actlab/autograd/checkpoint.h"

#include <chrono>
#include <mutex>

#include "actlab/autograd/tape.h"
#include "actlab/core/allocator.h"

namespace actlab {
namespace {
thread_local bool t_recomputing = false;
std::mutex g_recompute_mutex;
RecomputeStats g_recompute;

struct RecomputeFlag {
  bool previous = t_recomputing;
  RecomputeFlag() { t_recomputing = true; }
  ~RecomputeFlag() { t_recomputing = previous; }
};
}  // namespace

bool recomputing() { return t_recomputing; }

const Node::SlotList& CheckpointNode::slots() const {
  static const SlotList s{"input"};
  return s;
}

void CheckpointNode::append(Unit unit, const std::vector<Variable>& parameters) {
  units_.push_back(std::move(unit));
  for (const Variable& p : parameters) {
    if (!p.requires_grad()) continue;
    Edge e;
    e.leaf = p.impl();
    inputs.push_back(std::move(e));
  }
}

std::vector<Tensor> CheckpointNode::backward(const std::vector<Tensor>& grad_outputs) {
  std::vector<Tensor> grads(inputs.size());
  // The recomputed segment's nodes go on a tape of their own, walked right here: the step's tape is
  // in the middle of its own walk, and this segment's saves must be freed before the next node runs.
  Tape inner(false);
  Variable input(load("input"), input_requires_grad_);
  // The input is no longer needed once the recompute holds it (exact: the same storage, kept alive by
  // `input`; packed: the decoded copy), so the pack is freed before the segment's saves are made.
  release_saved();
  Variable output;
  {
    const auto start = std::chrono::steady_clock::now();
    RecomputeFlag flag;
    ActivationCacheScope policies(*policies_);
    TapeScope scope(inner);
    MemTagScope tag(MemTag::Activation);
    output = input;
    for (const Unit& unit : units_) output = unit(output);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard<std::mutex> lock(g_recompute_mutex);
    ++g_recompute.segments;
    g_recompute.seconds += seconds;
  }
  ACTLAB_CHECK(output.shape() == grad_outputs[0].shape(), "checkpoint (", module_path,
               "): the recomputed segment's output ", output.data().str(), " differs from the forward's ",
               grad_outputs[0].str());
  if (output.requires_grad()) {
    TapeScope scope(inner);
    inner.backward(output, grad_outputs[0]);
  }
  if (input_requires_grad_) grads[0] = input.grad();
  return grads;
}

RecomputeStats recompute_stats() {
  std::lock_guard<std::mutex> lock(g_recompute_mutex);
  return g_recompute;
}

void reset_recompute_stats() {
  std::lock_guard<std::mutex> lock(g_recompute_mutex);
  g_recompute = RecomputeStats{};
}

}  // namespace actlab
