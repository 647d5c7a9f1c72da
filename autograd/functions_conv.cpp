// conv2d and linear: forward plus their nodes.
#include "actlab/autograd/functions.h"

#include <algorithm>

#include "actlab/compress/policy.h"
#include "actlab/core/ops.h"
#include "actlab/core/precision.h"

namespace actlab {
namespace {

ops::ConvParams to_params(const Conv2dOptions& o) { return {o.stride, o.padding, o.groups}; }

// Whether the convolution's passes read a bf16 copy of their input as it is (bf16 compute on the CPU): the
// forward the exact keep's copy, backward weights any bf16 form of the save (a bf16 keep, or a plane
// codec's decode to bf16). A GPU rounds its fp32 operands itself.
bool reads_bf16_input(const Tensor& t) { return compute_precision() == Precision::BF16 && t.device().is_cpu(); }

// What acgc's bound needs of a weight layer (compress/policy.h GradientSensitivity): an error dx in the
// input changes dW = Σ dy ⊗ x by at most |dy|²·|dx|² per output position the input reaches, i.e. about
// (kernel area / stride area)·|dy|²·|dx|² in all (AC-GC's flat approximation), against |dW|²; the factor 2
// leaves half of the allowed error to the other saves, as AC-GC's conv bound does.
void observe_weight_sensitivity(const Node& node, double reach, const Tensor& dy, const Tensor& dw) {
  if (!dw.defined() || !node.wants_sensitivity("input")) return;
  node.observe_sensitivity("input", {2.0 * reach * squared_norm(dy), squared_norm(dw)});
}

// saves: input x (lossy_ok, through the policy), weight w (parameter, by reference).
class Conv2dNode final : public Node {
 public:
  Conv2dNode(const Conv2dOptions& opt, bool has_bias, Shape x_shape)
      : opt_(opt), has_bias_(has_bias), x_shape_(std::move(x_shape)) {}
  // The forward wrote its output channels-last: dy comes back in that layout, and so does dx.
  void set_channels_last_output() { channels_last_out_ = true; }
  const char* name() const override { return "conv2d"; }
  const SlotList& slots() const override {
    static const SlotList s = {"input", "weight"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) override {
    const Tensor dy = channels_last_out_ ? grad_outputs[0].channels_last() : grad_outputs[0].contiguous();
    const Tensor w = load("weight");
    std::vector<Tensor> grads(3);
    const bool need_x = inputs[0].leaf || !inputs[0].node.expired();
    const bool need_w = inputs[1].leaf || !inputs[1].node.expired();
    const ops::ConvBackwardScope share(dy);  // dy is reordered for the kernels once, for both passes
    if (need_w) {
      Tensor db;
      // Where the convolution computes on channel blocks and the policy can write them, the input is
      // unpacked straight into that layout: one pass over the activation fewer than unpack + reorder.
      const int channel_block = ops::conv2d_backward_weight_input_block(dy, x_shape_, w.shape(), to_params(opt_), has_bias_);
      const Tensor x_blocked = channel_block > 0 ? load_blocked("input", channel_block) : Tensor();
      // Under bf16 the save's bf16 form (a kept copy, or a plane codec's decode straight to bf16) goes to the
      // bf16 convolution as it is: no f32 tensor to round again.
      const Tensor x_bf16 = !x_blocked.defined() && reads_bf16_input(dy) ? load_bf16("input") : Tensor();
      if (x_blocked.defined()) {
        grads[1] = ops::conv2d_backward_weight_blocked_input(dy, x_blocked, x_shape_, w.shape(), to_params(opt_),
                                                             has_bias_, &db);
      } else if (x_bf16.defined()) {
        grads[1] = ops::conv2d_backward_weight(dy, x_bf16, w.shape(), to_params(opt_), has_bias_, &db);
      } else {
        grads[1] = ops::conv2d_backward_weight(dy, load("input"), w.shape(), to_params(opt_), has_bias_, &db);
      }
      if (has_bias_) grads[2] = db;
      const double reach = static_cast<double>(w.shape()[2] * w.shape()[3]) / static_cast<double>(opt_.stride * opt_.stride);
      observe_weight_sensitivity(*this, reach, dy, grads[1]);
    }
    if (need_x) grads[0] = ops::conv2d_backward_data(dy, w, x_shape_, to_params(opt_));
    return grads;
  }
 private:
  Conv2dOptions opt_;
  bool has_bias_;
  Shape x_shape_;
  bool channels_last_out_ = false;
};

// saves: input x (lossy_ok), weight w (parameter, by reference).
class LinearNode final : public Node {
 public:
  explicit LinearNode(bool has_bias) : has_bias_(has_bias) {}
  const char* name() const override { return "linear"; }
  const SlotList& slots() const override {
    static const SlotList s = {"input", "weight"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) override {
    const Tensor dy = grad_outputs[0].contiguous();
    const Tensor w = load("weight");
    std::vector<Tensor> grads(3);
    if (inputs[1].leaf || !inputs[1].node.expired()) {
      Tensor db;
      grads[1] = ops::linear_backward_weight(dy, load("input"), has_bias_, &db);
      if (has_bias_) grads[2] = db;
      observe_weight_sensitivity(*this, 1.0, dy, grads[1]);
    }
    if (inputs[0].leaf || !inputs[0].node.expired()) grads[0] = ops::linear_backward_data(dy, w);
    return grads;
  }
 private:
  bool has_bias_;
};

}  // namespace

double squared_norm(const Tensor& t) {
  ACTLAB_CHECK(t.dtype() == DType::F32, "squared_norm takes an f32 tensor, got ", t.str());
  MemTagScope tag(MemTag::Workspace);
  const Tensor host = t.to(Device::cpu()).contiguous();
  const float* v = host.data<float>();
  double sum = 0;
  for (int64_t i = 0, n = host.numel(); i < n; ++i) sum += static_cast<double>(v[i]) * v[i];
  return sum;
}

Variable conv2d(const Variable& x, const Variable& w, const Variable& b, const Conv2dOptions& opt) {
  const Tensor bias = b.defined() ? b.data() : Tensor();
  // Under bf16 on the CPU an exact keep is the bf16 copy the convolution would make of its input on the way in:
  // saved first, the forward reads that copy (the same bits, core/cpu/conv.h), reading half the bytes, and the
  // input is converted once. Where the forward computes channels-last the copy is made in that layout, and it
  // reads it with no reorder (as do backward weights whose kernel takes that layout: on AMX, all of ResNet-18's).
  // There, when every policy in force takes a channels-last save (PolicySet::takes_channels_last_flow), the output stays
  // channels-last too (no transpose back), and batch norm, the ReLUs and the adds after it keep that layout, so the
  // next convolution's save is made from a channels-last input with no transpose (docs/precision.md). Elsewhere
  // the forward runs first, so a bad shape fails before a node or a pack.
  const bool keep_first = w.requires_grad() && reads_bf16_input(x.data());
  // A node is recorded (make_node) and the policies take the flow: the output goes channels-last if the kernel
  // reads that layout, and the question is asked for that output layout.
  const bool may_flow = keep_first && grad_enabled() && current_policy_set().takes_channels_last_flow();
  const bool reads_channels_last =
      keep_first && ops::conv2d_bf16_reads_channels_last(x.data(), w.shape(), to_params(opt), b.defined(), may_flow);
  const Tensor input = reads_channels_last ? x.data().dense() : x.data().contiguous();
  Tensor y = keep_first ? Tensor() : ops::conv2d_forward(input, w.data(), bias, to_params(opt));
  auto node = make_node<Conv2dNode>({&x, &w, b.defined() ? &b : nullptr}, opt, b.defined(), x.shape());
  if (node && w.requires_grad()) {
    if (reads_channels_last)
      node->save_lossy_channels_last("input", input);
    else
      node->save_lossy("input", input);
  }
  if (keep_first) {
    const Tensor keep = node ? node->exact_bf16_keep("input") : Tensor();
    const bool channels_last_out = node && reads_channels_last && may_flow;
    if (channels_last_out) node->set_channels_last_output();
    // Without the keep (SWAP's offload) the f32 input is read in the output's layout, rounded on the way in.
    const Tensor operand = keep.defined() ? keep : channels_last_out ? input.channels_last() : input.contiguous();
    y = ops::conv2d_forward(operand, w.data(), bias, to_params(opt), channels_last_out);
  }
  if (node) node->save_exact("weight", w.data());
  return make_output(std::move(y), node);
}

Variable linear(const Variable& x, const Variable& w, const Variable& b) {
  const Tensor bias = b.defined() ? b.data() : Tensor();
  Tensor y = ops::linear_forward(x.data().contiguous(), w.data(), bias);
  auto node = make_node<LinearNode>({&x, &w, b.defined() ? &b : nullptr}, b.defined());
  if (node) {
    if (w.requires_grad()) node->save_lossy("input", x.data().contiguous());
    node->save_exact("weight", w.data());
  }
  return make_output(std::move(y), node);
}

}  // namespace actlab
