// Variable, Node saved slots, the tape and the backward walk.
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "actlab/autograd/tape.h"
#include "actlab/autograd/variable.h"

namespace actlab {
namespace {
thread_local bool t_grad_enabled = true;
thread_local std::string t_module_path;

// Adds `incoming` into `slot`. The first gradient is adopted without a copy; a second one is added
// into a private copy if the first is shared with anything else (e.g. add's backward hands the same
// tensor to both inputs).
void accumulate(Tensor& slot, const Tensor& incoming) {
  if (!slot.defined()) {
    slot = incoming;
    return;
  }
  // A channels-last slot (a bf16 run's activation gradient) stays so; anything else is made contiguous.
  const bool channels_last = slot.is_channels_last();
  if (!channels_last && !slot.is_contiguous()) {
    slot = slot.contiguous();
  } else if (slot.storage().use_count() > 1) {
    Tensor own = channels_last ? Tensor::empty_channels_last(slot.shape(), slot.dtype(), slot.device())
                               : Tensor::empty(slot.shape(), slot.dtype(), slot.device());
    own.copy_(slot);
    slot = own;
  }
  slot.add_(channels_last ? incoming.channels_last() : incoming.contiguous());
}

void accumulate_leaf(VariableImpl& leaf, const Tensor& incoming) {
  ACTLAB_CHECK(incoming.shape() == leaf.data.shape(), "gradient ", incoming.str(), " for a leaf of ",
               leaf.data.str());
  if (!leaf.grad.defined() || leaf.grad.shape() != leaf.data.shape()) {
    leaf.grad = Tensor::empty_tagged(leaf.data.shape(), MemTag::Grad, DType::F32, leaf.data.device());
    leaf.grad_stale = true;
  }
  if (leaf.grad_stale) {
    leaf.grad.copy_(incoming);
    leaf.grad_stale = false;
  } else {
    leaf.grad.add_(incoming.contiguous());
  }
}
}  // namespace

Variable::Variable(Tensor data, bool requires_grad) : impl_(std::make_shared<VariableImpl>()) {
  impl_->data = std::move(data);
  impl_->requires_grad = requires_grad;
}

// ---------------------------------------------------------------- Node
const Node::SlotList& Node::slots() const {
  static const SlotList none;
  return none;
}

void Node::save(const char* slot, const Tensor& t, bool lossy_ok, int min_bits, bool channels_last) {
  const SlotList& declared = slots();
  if (std::none_of(declared.begin(), declared.end(), [&](const char* d) { return std::strcmp(d, slot) == 0; })) {
    std::string names;
    for (const char* d : declared) names += (names.empty() ? "" : ", ") + std::string(d);
    ACTLAB_FAIL(name(), " (", module_path, "): save into undeclared slot '", slot, "' (its slots: ",
                names.empty() ? "none" : names, ")");
  }
  const SaveInfo info{name(), slot, lossy_ok, module_path, min_bits, channels_last};
  for (auto& s : saved_) {
    if (s.first == slot) {
      s.second = SavedTensor(t, info);
      return;
    }
  }
  saved_.emplace_back(slot, SavedTensor(t, info));
}

const SavedTensor& Node::saved(const std::string& slot) const {
  for (const auto& s : saved_)
    if (s.first == slot) return s.second;
  ACTLAB_FAIL(name(), " (", module_path, "): nothing saved in slot '", slot,
              "' (released already? backward may run only once per forward)");
}

Tensor Node::load(const std::string& slot) const { return saved(slot).unpack(); }

Tensor Node::load_blocked(const std::string& slot, int channel_block) const {
  return saved(slot).unpack_blocked(channel_block);
}

Tensor Node::load_channels_last(const std::string& slot) const { return saved(slot).unpack_channels_last(); }

Tensor Node::load_bf16(const std::string& slot) const { return saved(slot).unpack_bf16(); }

Tensor Node::exact_bf16_keep(const std::string& slot) const { return saved(slot).exact_bf16_keep(); }

std::unique_ptr<ChannelReader> Node::load_channels(const std::string& slot) const {
  return saved(slot).channel_reader();
}

bool Node::has_saved(const std::string& slot) const {
  return std::any_of(saved_.begin(), saved_.end(), [&](const auto& s) { return s.first == slot; });
}

size_t Node::saved_bytes() const {
  size_t n = 0;
  for (const auto& s : saved_) n += s.second.nbytes();
  return n;
}

// ---------------------------------------------------------------- guards
NoGradGuard::NoGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = previous_; }
bool grad_enabled() { return t_grad_enabled; }

ModulePathScope::ModulePathScope(const std::string& name) : previous_length_(t_module_path.size()) {
  if (name.empty()) return;
  if (!t_module_path.empty()) t_module_path += '.';
  t_module_path += name;
}
ModulePathScope::~ModulePathScope() { t_module_path.resize(previous_length_); }
const std::string& current_module_path() { return t_module_path; }

// ---------------------------------------------------------------- tape
namespace {
thread_local Tape* t_current_tape = nullptr;
}  // namespace

Tape& Tape::current() {
  thread_local Tape tape;
  return t_current_tape ? *t_current_tape : tape;
}

TapeScope::TapeScope(Tape& tape) : previous_(t_current_tape) { t_current_tape = &tape; }
TapeScope::~TapeScope() { t_current_tape = previous_; }

void Tape::clear() {
  // Release newest first: the same order backward frees memory in.
  while (!nodes_.empty()) nodes_.pop_back();
  if (ends_pack_step_) end_pack_step();
}

size_t Tape::saved_bytes() const {
  size_t n = 0;
  for (const auto& node : nodes_) n += node->saved_bytes();
  return n;
}

void Tape::backward(const Variable& root, const Tensor& grad) {
  ACTLAB_CHECK(root.defined() && root.requires_grad(), "backward of a value that does not require grad");
  MemTagScope tag(MemTag::Activation);
  Tensor seed = grad;
  if (!seed.defined()) seed = Tensor::full(root.shape(), 1.f);
  ACTLAB_CHECK(seed.shape() == root.shape(), "backward: gradient ", seed.str(), " for ", root.data().str());
  if (auto node = root.grad_fn()) {
    accumulate(node->grad_outputs[root.impl()->output_index], seed);
  } else {
    ACTLAB_CHECK(!root.impl()->is_op_output,
                 "backward through a graph that was already freed (backward runs once per forward)");
    accumulate_leaf(*root.impl(), seed);
    clear();
    return;
  }
  // With a grad-ready hook: how many edges of the nodes not yet walked point at each leaf.
  std::unordered_map<VariableImpl*, int> pending;
  if (grad_ready_hook_)
    for (const auto& n : nodes_)
      for (const Node::Edge& e : n->inputs)
        if (e.leaf) ++pending[e.leaf.get()];
  auto walked = [&](const Node& n) {
    if (!grad_ready_hook_) return;
    for (const Node::Edge& e : n.inputs)
      if (e.leaf && --pending[e.leaf.get()] == 0) grad_ready_hook_(*e.leaf);
  };
  // A backward that fails part way (a save changed in place, out of memory) has consumed part of the graph:
  // what is left cannot be walked again, so it goes too, saved tensors and all, as after a whole walk.
  try {
    for (size_t i = nodes_.size(); i-- > 0;) {
      std::shared_ptr<Node> node = std::move(nodes_[i]);
      nodes_.pop_back();
      const bool reached = std::any_of(node->grad_outputs.begin(), node->grad_outputs.end(),
                                       [](const Tensor& g) { return g.defined(); });
      if (!reached) {  // not on the path to root: its saved tensors go with it
        walked(*node);
        continue;
      }
      std::vector<Tensor> grads_in = node->backward(node->grad_outputs);
      node->release_saved();
      node->grad_outputs.clear();
      ACTLAB_CHECK(grads_in.size() == node->inputs.size(), node->name(), " returned ", grads_in.size(),
                   " gradients for ", node->inputs.size(), " inputs");
      for (size_t j = 0; j < grads_in.size(); ++j) {
        if (!grads_in[j].defined()) continue;
        const Node::Edge& e = node->inputs[j];
        if (e.leaf) {
          accumulate_leaf(*e.leaf, grads_in[j]);
        } else if (auto producer = e.node.lock()) {
          accumulate(producer->grad_outputs[e.index], grads_in[j]);
        }
      }
      walked(*node);
    }
  } catch (...) {
    clear();
    throw;
  }
  clear();
}

void backward(const Variable& root, const Tensor& grad) { Tape::current().backward(root, grad); }

Variable make_output(Tensor data, const std::shared_ptr<Node>& node, int index) {
  Variable v(std::move(data), node != nullptr);
  if (node) {
    v.impl()->grad_fn = node;
    v.impl()->output_index = index;
    v.impl()->is_op_output = true;
    if (static_cast<int>(node->grad_outputs.size()) <= index) node->grad_outputs.resize(index + 1);
  }
  return v;
}

namespace detail {
bool wire_inputs(Node& node, const std::vector<const Variable*>& inputs) {
  node.module_path = current_module_path();
  node.inputs.resize(inputs.size());
  bool any = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Variable* v = inputs[i];
    ACTLAB_CHECK(!v || !v->impl()->checkpoint_inner, node.name(), " (", node.module_path,
                 "): its input was made inside a checkpointed segment, which keeps only the segment's input "
                 "and output; checkpoint the modules whose outputs are used elsewhere one by one "
                 "(--policy-rule 'PATTERN=checkpoint') or leave this model unsegmented");
    if (!v || !v->requires_grad()) continue;
    any = true;
    if (auto producer = v->grad_fn()) {
      node.inputs[i].node = producer;
      node.inputs[i].index = v->impl()->output_index;
    } else {
      ACTLAB_CHECK(!v->impl()->is_op_output,
                   "an op's input comes from a graph whose backward already ran; compute it again");
      node.inputs[i].leaf = v->impl();
    }
  }
  return any;
}
}  // namespace detail

}  // namespace actlab
