// Optimizer: what the training step, the checkpoint and the apps need of any update rule (Sgd, AdamW),
// so that none of them names one. Per-parameter state (SGD's momentum, AdamW's two moments) is exposed
// as named slots of one tensor per parameter, which train/checkpoint.cpp stores as
// "optim.<slot>.<parameter name>", and any counters beyond the optimizer's step count as one string.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "actlab/autograd/variable.h"
#include "actlab/layers/optim/optimizer_names.h"

namespace actlab {

// One kind of per-parameter state: buffers[i] belongs to parameter i and is undefined until that
// parameter's first update. Every buffer has its parameter's shape, f32, tagged MemTag::OptimState.
struct OptimStateSlot {
  const char* name;
  std::vector<Tensor>* buffers;
};

class Optimizer {
 public:
  // Every parameter defined and listed once (a second listing would take every step twice).
  explicit Optimizer(std::vector<Variable> params);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // "sgd" or "adamw": the --optimizer name, written into checkpoints so a resume cannot mix them.
  virtual const char* kind() const = 0;
  // Updates every parameter that has a gradient; parameters without one are left alone.
  virtual void step() = 0;
  virtual void set_lr(float lr) = 0;
  virtual float lr() const = 0;
  virtual std::vector<OptimStateSlot> state_slots() = 0;
  // Counters a resume needs besides steps() and the slots (AdamW: each parameter's own update count);
  // "" when there are none. set_counters takes what counters() wrote and refuses anything else, changing
  // nothing when it does.
  virtual std::string counters() const { return ""; }
  virtual void set_counters(const std::string& text);

  void zero_grad();
  // Which parameters take the weight decay, one flag per parameter (default: all). A parameter whose flag
  // is false is updated with weight decay 0, as a PyTorch parameter group with weight_decay 0 is.
  void set_decays(std::vector<bool> decays);
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }
  size_t size() const { return params_.size(); }

 protected:
  // The state buffer of parameter i, made on its first use (zeros when `zeroed`, else left for the
  // update to write whole); returns whether it was made now.
  bool ensure_state(std::vector<Tensor>& buffers, size_t i, bool zeroed);
  // Refuses a negative or non-finite learning rate, for the constructors and set_lr alike; `who` names the
  // optimizer in the message ("SGD", "AdamW").
  static void check_lr(const char* who, float lr);
  // The weight decay parameter i takes: `weight_decay`, or 0 where set_decays excluded it.
  float decay_of(size_t i, float weight_decay) const { return decays_.empty() || decays_[i] ? weight_decay : 0.f; }
  std::vector<Variable> params_;
  std::vector<bool> decays_;
  int64_t steps_ = 0;
};

// The no-decay set of timm's and torchvision's transformer recipes (--no-decay-norm-bias): false for
// biases and every other parameter of at most one dimension (normalization weights), and for the token
// embeddings a transformer learns (cls_token, pos_embed, Swin's relative_position_bias_table, also under a
// prefix such as "encoder.pos_embed"); true for the rest (convolution and linear weights). `named` in the
// optimizer's parameter order. The embeddings' names are timm's and torchvision's, which actlab's models use.
std::vector<bool> decays_but_norms_biases_embeddings(const std::vector<std::pair<std::string, Variable>>& named);

}  // namespace actlab
