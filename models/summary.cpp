// Model summary: a ForwardObserver that records output shapes and MACs per module, and the table.
#include "actlab/models/summary.h"

#include <algorithm>
#include <map>

#include "actlab/core/allocator.h"
#include "actlab/layers/layers.h"

namespace actlab {

namespace {

struct Observed {
  Shape output;
  int64_t calls = 0;
  int64_t macs = 0;
};

// Multiply-accumulates of one call, per image. Bias adds, BN, activations and pooling are not counted
// (the usual convention, and the one the PyTorch peer benchmark's count_macs uses).
int64_t macs_per_image(const Module& module, const Shape& out) {
  if (out.empty() || out[0] == 0) return 0;
  const int64_t per_image = shape_numel(out) / out[0];
  if (const auto* conv = dynamic_cast<const Conv2d*>(&module)) {
    const int64_t k = conv->kernel();
    return per_image * (conv->in_channels() / conv->options().groups) * k * k;
  }
  if (const auto* fc = dynamic_cast<const Linear*>(&module)) return per_image * fc->in_features();
  return 0;
}

class SummaryObserver final : public ForwardObserver {
 public:
  void on_forward(const std::string&, const Module& module, const Variable& output) override {
    Observed& o = seen_[&module];
    o.output = output.shape();
    o.calls += 1;
    o.macs += macs_per_image(module, output.shape());
  }
  const Observed* find(const Module* m) const {
    auto it = seen_.find(m);
    return it == seen_.end() ? nullptr : &it->second;
  }
 private:
  std::map<const Module*, Observed> seen_;
};

// Puts the model in eval mode and restores the root's previous mode (on every child) on exit.
class EvalModeScope {
 public:
  explicit EvalModeScope(Module& m) : model_(m), was_training_(m.is_training()) { model_.eval(); }
  ~EvalModeScope() { model_.train(was_training_); }
  EvalModeScope(const EvalModeScope&) = delete;
  EvalModeScope& operator=(const EvalModeScope&) = delete;
 private:
  Module& model_;
  bool was_training_;
};

// 1234567 -> "1,234,567"
std::string grouped(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string pad_right(const std::string& s, size_t w) { return s + std::string(w > s.size() ? w - s.size() : 0, ' '); }
std::string pad_left(const std::string& s, size_t w) { return std::string(w > s.size() ? w - s.size() : 0, ' ') + s; }

}  // namespace

ModelSummaryTable summarize_model(Module& model, const Shape& sample_shape) {
  ACTLAB_CHECK(!sample_shape.empty(), "model_summary: empty sample shape (pass one sample's shape, e.g. (3,32,32))");
  ModelSummaryTable table;
  table.input = Shape{1};
  table.input.insert(table.input.end(), sample_shape.begin(), sample_shape.end());

  SummaryObserver observer;
  {
    EvalModeScope eval(model);  // BN running statistics stay untouched, dropout is off
    NoGradGuard no_grad;
    MemTagScope tag(MemTag::Activation);
    ObserverScope scope(&observer);
    const auto params = model.parameters();  // the probe goes where the model is (cpu or cuda:N)
    const Device device = params.empty() ? Device::cpu() : params.front().data().device();
    table.output = model(Variable(Tensor::zeros(table.input, DType::F32, device))).shape();
  }

  for (const auto& [path, pointer] : model.named_modules()) {
    const Module& module = pointer ? *pointer : model;  // NOTE: the root comes without a shared_ptr
    int64_t own = module.parameter_count();
    for (const auto& child : module.children()) own -= child.second->parameter_count();
    if (!module.children().empty() && own == 0) continue;  // containers are described by their leaves
    ModuleSummary row;
    row.path = path.empty() ? "(root)" : path;
    row.description = module.describe();
    row.parameters = own;
    if (const Observed* o = observer.find(&module)) {
      row.output = o->output;
      row.calls = o->calls;
      row.macs = o->macs;
    }
    table.total_parameters += row.parameters;
    table.total_macs += row.macs;
    table.rows.push_back(std::move(row));
  }
  return table;
}

std::string model_summary(Module& model, const Shape& sample_shape) {
  const ModelSummaryTable t = summarize_model(model, sample_shape);
  const std::vector<std::string> head = {"module", "kind", "output", "params", "MACs"};
  std::vector<std::vector<std::string>> cells;
  for (const auto& r : t.rows) {
    std::string out = r.output.empty() ? "-" : shape_str(r.output);
    if (r.calls > 1) out += " x" + std::to_string(r.calls);
    cells.push_back({r.path, r.description, out, grouped(r.parameters), grouped(r.macs)});
  }
  cells.push_back({"total", model.kind(), shape_str(t.output), grouped(t.total_parameters), grouped(t.total_macs)});
  std::vector<size_t> width(head.size());
  for (size_t c = 0; c < head.size(); ++c) {
    width[c] = head[c].size();
    for (const auto& row : cells) width[c] = std::max(width[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& row) {
    return pad_right(row[0], width[0]) + "  " + pad_right(row[1], width[1]) + "  " + pad_right(row[2], width[2]) +
           "  " + pad_left(row[3], width[3]) + "  " + pad_left(row[4], width[4]) + "\n";
  };
  size_t total_width = 8;
  for (size_t w : width) total_width += w;
  const std::string rule(total_width, '-');
  std::string s = "input " + shape_str(t.input) + "; MACs per image (Conv2d, Linear)\n" + line(head) + rule + "\n";
  for (size_t i = 0; i + 1 < cells.size(); ++i) s += line(cells[i]);
  return s + rule + "\n" + line(cells.back());
}

}  // namespace actlab
