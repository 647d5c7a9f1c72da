// Gradient checkpointing on the tape: a segment of a forward runs with no recording and is recorded
// as one CheckpointNode that keeps only the segment's input (through the policy in force, so
// "checkpoint + DIVISION" keeps a packed input). Its backward re-runs the segment's forward from that
// input onto a tape of its own, walks that tape with the gradient of the segment's output and hands
// back the gradient of the input; the parameters' gradients are accumulated by that inner walk. Which
// modules form segments is chosen above (layers/checkpoint.h). Tested in tests/test_baselines.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "actlab/autograd/variable.h"

namespace actlab {

// True while a CheckpointNode re-runs a forward (on this thread). Ops with side effects beyond their
// output consult it: batch norm must not update its running statistics a second time, and a
// module that is itself a checkpoint unit must run plainly rather than open a segment inside backward.
bool recomputing();

class CheckpointNode final : public Node {
 public:
  // Re-runs one block's forward on its input (with its random draws rewound to where the forward's
  // started). Captures no tensor: the block is reached through its module and the input is the slot.
  using Unit = std::function<Variable(const Variable&)>;

  // The policies in force when the segment ran forward are the ones its recompute saves through (backward
  // runs outside the step's ActivationCacheScope); the set must outlive the backward, as the step's does.
  CheckpointNode(bool input_requires_grad, const PolicySet& policies)
      : input_requires_grad_(input_requires_grad), policies_(&policies) {}
  const char* name() const override { return "checkpoint"; }
  const SlotList& slots() const override;  // "input"
  // Adds the next block of the segment and the parameters it uses, whose gradients the recompute
  // accumulates (the edges make the tape's grad-ready hook wait for this node before calling them final).
  void append(Unit unit, const std::vector<Variable>& parameters);
  size_t units() const { return units_.size(); }
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) override;

 private:
  std::vector<Unit> units_;
  bool input_requires_grad_;
  const PolicySet* policies_;
};

// What checkpointing cost since the last reset (per process): the recomputed forwards' time and count.
struct RecomputeStats {
  int64_t segments = 0;
  double seconds = 0;
};
RecomputeStats recompute_stats();
void reset_recompute_stats();

}  // namespace actlab
