// Variable (a Tensor plus gradient state) and Node (one recorded op with its saved tensors).
// A Variable is a shared handle: copies refer to the same value and gradient.
// Nodes are owned by the Tape (autograd/tape.h); a Variable only holds a weak reference to the
// node that produced it, so clearing the tape frees every saved tensor.
// Tested in tests/test_autograd.cpp.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "actlab/autograd/saved_tensor.h"
#include "actlab/core/tensor.h"

namespace actlab {

class Node;

struct VariableImpl {
  Tensor data;
  Tensor grad;                  // leaves only; persistent across steps (zero_grad marks it stale)
  bool grad_stale = true;       // true: the next accumulation overwrites instead of adding
  bool requires_grad = false;
  std::weak_ptr<Node> grad_fn;  // producing node (non-leaf); expired once the tape is cleared
  int output_index = 0;
  bool is_op_output = false;    // made by an op: once its node is gone, no gradient can flow through it
  // An output of a block inside a checkpointed segment that the next block of the segment consumed: the
  // segment's recompute rebuilds it only on the way to the segment's output, so any other use is refused.
  bool checkpoint_inner = false;
};

class Variable {
 public:
  Variable() = default;
  explicit Variable(Tensor data, bool requires_grad = false);

  bool defined() const { return impl_ != nullptr; }
  const Tensor& data() const { return impl_->data; }
  Tensor& data() { return impl_->data; }
  const Shape& shape() const { return impl_->data.shape(); }
  int64_t size(int64_t d) const { return impl_->data.size(d); }
  int64_t dim() const { return impl_->data.dim(); }
  bool requires_grad() const { return impl_ && impl_->requires_grad; }
  bool is_leaf() const { return impl_->grad_fn.expired(); }
  std::shared_ptr<Node> grad_fn() const { return impl_->grad_fn.lock(); }

  // The accumulated gradient of a leaf (undefined before the first backward or while stale).
  Tensor grad() const { return impl_->grad_stale ? Tensor() : impl_->grad; }
  // Marks the gradient stale: the next backward writes it instead of adding (no memset needed).
  void zero_grad() { impl_->grad_stale = true; }
  // Drops the gradient buffer entirely (frees its memory).
  void clear_grad() { impl_->grad = Tensor(); impl_->grad_stale = true; }

  const std::shared_ptr<VariableImpl>& impl() const { return impl_; }
 private:
  std::shared_ptr<VariableImpl> impl_;
};

// One recorded operation. Subclasses implement backward() and say what they save, slot by slot,
// through save()/load() — the only way a node keeps a tensor (so a policy sees every byte).
class Node {
 public:
  struct Edge {
    std::weak_ptr<Node> node;              // producer of this input (non-leaf), or
    std::shared_ptr<VariableImpl> leaf;    // a leaf that wants a gradient; both empty: no gradient
    int index = 0;
  };

  virtual ~Node() = default;
  virtual const char* name() const = 0;  // the op's name in reports and errors: "conv2d", "relu", ...
  // grad_outputs[i]: gradient w.r.t. output i (undefined if none reached it; then backward is not
  // called unless some other output has one). Returns one gradient per input edge (undefined = none).
  virtual std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) = 0;

  // The slots this node type saves into, declared by each node type that saves anything; a save into
  // any other name fails at save time, in forward, naming the node and its slots (a typo would
  // otherwise show only in backward). The slot name is the SaveInfo role in memory reports.
  using SlotList = std::vector<const char*>;
  virtual const SlotList& slots() const;
  // Keeps t for backward under the policy in force for this node's module: a tensor whose
  // approximation backward tolerates (conv, linear, batch-norm inputs). min_bits: the fewest code bits
  // per element it tolerates (SaveInfo::min_bits; 0: whatever the policy's width).
  void save_lossy(const char* slot, const Tensor& t, int min_bits = 0) { save(slot, t, true, min_bits); }
  // save_lossy of an (N, C, H, W) tensor that backward computes on channels-last (SaveInfo::channels_last).
  void save_lossy_channels_last(const char* slot, const Tensor& t) { save(slot, t, true, 0, true); }
  // Keeps t exactly (masks, indices, weights, statistics, probabilities). Both take the op name
  // (name()) and the module path from the node; identical tensors saved twice in one step are packed once.
  void save_exact(const char* slot, const Tensor& t) { save(slot, t, false); }
  // Returns the tensor saved in slot (reconstructed by the policy for lossy saves).
  Tensor load(const std::string& slot) const;
  // The tensor of slot in the channel-blocked layout (N, C/channel_block, H, W, channel_block) when its policy writes
  // that directly (ActivationCachePolicy::unpack_blocked), else an undefined tensor.
  Tensor load_blocked(const std::string& slot, int channel_block) const;
  // The tensor of slot channels-last (SavedTensor::unpack_channels_last: the policy's direct decode, else a transpose).
  Tensor load_channels_last(const std::string& slot) const;
  // The slot's tensor as a BF16 tensor when its policy keeps or decodes one (SavedTensor::unpack_bf16), else
  // undefined.
  Tensor load_bf16(const std::string& slot) const;
  // The bf16 copy a bf16 run's exact keep of slot holds (SavedTensor::exact_bf16_keep), else undefined: for a
  // forward that computes on it right after the save.
  Tensor exact_bf16_keep(const std::string& slot) const;
  // A channel-by-channel reader of slot when its policy has one (ActivationCachePolicy::channel_reader),
  // else nullptr. The reader must be destroyed before the node releases what it saved.
  std::unique_ptr<ChannelReader> load_channels(const std::string& slot) const;
  bool has_saved(const std::string& slot) const;
  // Whether the policy of slot asks for its gradient sensitivity this step, and the report of it
  // (GradientSensitivity in compress/policy.h): a node measures only when asked, as it costs reductions.
  bool wants_sensitivity(const std::string& slot) const { return saved(slot).wants_gradient_sensitivity(); }
  void observe_sensitivity(const std::string& slot, const GradientSensitivity& s) const {
    saved(slot).observe_gradient_sensitivity(s);
  }
  // Frees everything saved; called by the tape right after this node's backward.
  void release_saved() { saved_.clear(); }
  size_t saved_bytes() const;

  std::vector<Edge> inputs;
  std::vector<Tensor> grad_outputs;  // accumulated by the tape during backward
  std::string module_path;           // module that recorded this node ("layer1.0.conv1")
 private:
  void save(const char* slot, const Tensor& t, bool lossy_ok, int min_bits = 0, bool channels_last = false);
  const SavedTensor& saved(const std::string& slot) const;  // throws Error naming the node when absent
  std::vector<std::pair<std::string, SavedTensor>> saved_;
};

// RAII: no recording while alive (evaluation). Per thread.
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;
 private:
  bool previous_;
};
bool grad_enabled();

// RAII: pushes a component onto the current module path ("layer1" then "0" → "layer1.0").
class ModulePathScope {
 public:
  explicit ModulePathScope(const std::string& name);
  ~ModulePathScope();
  ModulePathScope(const ModulePathScope&) = delete;
  ModulePathScope& operator=(const ModulePathScope&) = delete;
 private:
  size_t previous_length_;
};
const std::string& current_module_path();

}  // namespace actlab
