// Checkpoint plans and the module-call hook (layers/checkpoint.h).
#include "actlab/layers/checkpoint.h"

#include <cmath>
#include <memory>

#include "actlab/autograd/checkpoint.h"
#include "actlab/autograd/tape.h"
#include "actlab/layers/layers.h"

namespace actlab {
namespace {

thread_local const CheckpointPlan* t_plan = nullptr;

// The segment the forward is in: its node, which segment of the plan, and the output it handed out last
// (a block that consumes exactly that output joins the segment).
struct OpenSegment {
  std::weak_ptr<CheckpointNode> node;
  int segment = -1;
  std::weak_ptr<VariableImpl> output;
  size_t tape_size = 0;  // the tape's length when `output` was handed out
};
thread_local OpenSegment t_open;

std::string join(const std::string& parent, const std::string& name) {
  return parent.empty() ? name : parent + "." + name;
}

bool is_sequential(const Module& m) { return dynamic_cast<const Sequential*>(&m) != nullptr; }

void collect_blocks(const Module& m, const std::string& path, std::vector<std::string>& out) {
  for (const auto& c : m.children()) {
    const Module& child = *c.second;
    const std::string child_path = join(path, c.first);
    if (!is_sequential(m)) {
      if (is_sequential(child)) collect_blocks(child, child_path, out);
      continue;
    }
    if (child.children().empty()) continue;  // a lone layer between blocks: left to run plainly
    const size_t before = out.size();
    if (is_sequential(child)) collect_blocks(child, child_path, out);
    if (out.size() == before) out.push_back(child_path);  // a block (or a Sequential of plain layers)
  }
}

}  // namespace

std::vector<std::string> checkpoint_blocks(const Module& model) {
  std::vector<std::string> out;
  collect_blocks(model, "", out);
  return out;
}

CheckpointPlan make_checkpoint_plan(const Module& model, const CheckpointRequest& request) {
  CheckpointPlan plan;
  if (!request.any()) return plan;
  ACTLAB_CHECK(request.segments == 0 || request.modules.empty(),
               "checkpoint: give either segments (checkpoint:segments=K) or module rules (PATTERN=checkpoint), not both");
  if (request.segments != 0) {
    plan.blocks = checkpoint_blocks(model);
    const int64_t n = static_cast<int64_t>(plan.blocks.size());
    ACTLAB_CHECK(n > 0, "checkpoint: this model has no blocks (modules inside Sequential containers) to cut into "
                        "segments; checkpoint chosen modules with --policy-rule 'PATTERN=checkpoint'");
    int64_t k = request.segments == CheckpointRequest::kAutoSegments
                    ? std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(n))))
                    : request.segments;
    k = std::min(k, n);
    // Segment s holds blocks [round(s·n/k), round((s+1)·n/k)); the last one is not checkpointed.
    for (int64_t s = 0; s + 1 < k; ++s)
      for (int64_t b = (s * n + k / 2) / k; b < ((s + 1) * n + k / 2) / k; ++b)
        plan.segment_of[plan.blocks[b]] = static_cast<int>(s);
    plan.segments = static_cast<int>(k - 1);
    return plan;
  }
  const auto modules = model.named_modules();
  for (const std::string& pattern : request.modules) {
    bool matched = false;
    for (const auto& m : modules) {
      if (m.first.empty() || !glob_match(pattern, m.first)) continue;
      matched = true;
      // Outermost only: a module inside one already checkpointed runs inside that one's recompute.
      bool inside = false;
      for (const auto& chosen : plan.segment_of)
        inside = inside || m.first.compare(0, chosen.first.size() + 1, chosen.first + ".") == 0;
      if (inside || plan.segment_of.count(m.first)) continue;
      for (auto it = plan.segment_of.begin(); it != plan.segment_of.end();)  // a new outer one replaces inner ones
        it = it->first.compare(0, m.first.size() + 1, m.first + ".") == 0 ? plan.segment_of.erase(it) : std::next(it);
      plan.segment_of[m.first] = plan.segments++;
    }
    ACTLAB_CHECK(matched, "checkpoint rule '", pattern, "=checkpoint' matches no module of this model");
  }
  int index = 0;  // renumber: one segment per module (erased inner ones left gaps)
  for (auto& s : plan.segment_of) s.second = index++;
  plan.segments = index;
  return plan;
}

CheckpointScope::CheckpointScope(const CheckpointPlan& plan) : previous_(t_plan) {
  t_plan = &plan;
  t_open = OpenSegment{};
}

CheckpointScope::~CheckpointScope() {
  t_plan = previous_;
  t_open = OpenSegment{};
}

Variable checkpoint_forward(Module& module, const std::string& name, const Variable& x) {
  if (!t_plan || !grad_enabled() || recomputing()) return {};
  const std::string parent = current_module_path();
  const std::string path = join(parent, name);
  const auto found = t_plan->segment_of.find(path);
  if (found == t_plan->segment_of.end()) return {};
  const int segment = found->second;

  std::vector<Variable> parameters = module.parameters();
  bool any_grad = x.requires_grad();
  for (const Variable& p : parameters) any_grad = any_grad || p.requires_grad();
  if (!any_grad) return {};

  // Where each module of the block stands in its random draws, so the recompute redraws the same masks.
  std::vector<std::pair<Module*, uint64_t>> draws{{&module, module.draw_position()}};
  for (const auto& m : module.named_modules())
    if (m.second) draws.emplace_back(m.second.get(), m.second->draw_position());  // the root's entry has none
  CheckpointNode::Unit unit = [block = &module, parent, draws](const Variable& in) {
    for (const auto& d : draws) d.first->rewind_draws(d.second);
    ModulePathScope scope(parent);
    return (*block)(in);
  };

  std::shared_ptr<CheckpointNode> node = t_open.node.lock();
  // Joined only when this block consumes the last output directly and nothing was recorded since: a
  // recorded op could hold an edge to that output, whose gradient the node would then mistake for the
  // segment's.
  const bool extend = node && t_open.segment == segment && t_open.output.lock() == x.impl() &&
                      Tape::current().size() == t_open.tape_size;
  if (!extend) {
    node = std::make_shared<CheckpointNode>(x.requires_grad(), current_policy_set());
    detail::wire_inputs(*node, {&x});
    node->module_path = path;
    node->save_lossy("input", x.data().contiguous());
    Tape::current().record(node);
  }
  Variable y;
  {
    NoGradGuard no_grad;
    y = module(x);
  }
  node->append(std::move(unit), parameters);
  if (extend) {
    // The previous block's output now lives only inside the segment: refuse any other use of it.
    VariableImpl& inner = *x.impl();
    inner.checkpoint_inner = true;
    inner.requires_grad = false;
    inner.grad_fn.reset();
  }
  Variable out = make_output(y.data(), node);
  t_open = OpenSegment{node, segment, out.impl(), Tape::current().size()};
  return out;
}

}  // namespace actlab
