// Which modules a checkpoint request turns into recomputed segments, and the hook Module::operator()
// calls to run them (the tape side: autograd/checkpoint.h; the request: compress/policy.h).
//
// A model's *blocks* are the children of its Sequential containers that have children of their own
// (a Sequential of such blocks is opened up into its blocks): ResNet's layerK.i, MobileNetV2's
// features.i, ViT's blocks.i, Swin-T's features.S.i and its patch mergings. Run in order they form
// the model's chain; segments=K cuts that chain into K runs of consecutive blocks and checkpoints all
// but the last (checkpoint_sequential's rule: the last segment's backward comes first, so recomputing
// it would buy nothing). Blocks of one segment are joined only while each consumes the previous
// one's output directly; anything else between them starts a new segment (one more input kept).
// Tested in tests/test_baselines.cpp.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "actlab/compress/policy.h"
#include "actlab/layers/module.h"

namespace actlab {

struct CheckpointPlan {
  std::unordered_map<std::string, int> segment_of;  // module path → segment (checkpointed modules only)
  int segments = 0;                                 // checkpointed segments
  std::vector<std::string> blocks;                  // the model's chain (segments=K), for reports
};

// The model's blocks in registration order (the order its forward runs them).
std::vector<std::string> checkpoint_blocks(const Module& model);
// Throws Error when the request cannot apply to this model (no blocks to segment, a rule matching no
// module, both segments and rules).
CheckpointPlan make_checkpoint_plan(const Module& model, const CheckpointRequest& request);

// The plan Module::operator() follows on this thread while alive. A segment still open when the scope
// ends stays recorded (its node is on the tape); nothing carries over to the next scope.
class CheckpointScope {
 public:
  explicit CheckpointScope(const CheckpointPlan& plan);
  ~CheckpointScope();
  CheckpointScope(const CheckpointScope&) = delete;
  CheckpointScope& operator=(const CheckpointScope&) = delete;
 private:
  const CheckpointPlan* previous_;
};

// Called by Module::operator() before anything else: when `module` (registered as `name`) belongs to a
// checkpointed segment of the plan in force and a gradient is being recorded, runs it without recording,
// records or extends the segment's CheckpointNode and returns the output; otherwise an undefined Variable.
Variable checkpoint_forward(Module& module, const std::string& name, const Variable& x);

}  // namespace actlab
