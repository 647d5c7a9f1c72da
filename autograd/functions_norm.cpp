// batch_norm: forward (training or eval) plus its node.
#include "actlab/autograd/functions.h"
#include "actlab/core/ops.h"

namespace actlab {
namespace {

bool wants_grad(const Node::Edge& e) { return e.leaf || !e.node.expired(); }

// What acgc's bound needs of a batch norm (compress/policy.h GradientSensitivity), after AC-GC's: an error
// dx in channel c's input moves x̂ by rstd·dx and so dx_in by γ·rstd²·dγ·dx/M per element (M = N·H·W, the
// first-order term through the x̂·mean(dy·x̂) part of the backward), a squared norm of
// (γ rstd² dγ / M)²·|dx_c|²; with the error spread evenly over the channels, the mean of that factor over
// the channels times |dx|², against |dx_in|².
GradientSensitivity batchnorm_sensitivity(const Tensor& dx, const Tensor& dgamma, const Tensor& gamma,
                                          const Tensor& invstd) {
  MemTagScope tag(MemTag::Workspace);
  const Tensor g = gamma.to(Device::cpu()).contiguous(), dg = dgamma.to(Device::cpu()).contiguous(),
               r = invstd.to(Device::cpu()).contiguous();
  const int64_t C = g.numel();
  const double M = static_cast<double>(dx.numel()) / static_cast<double>(C);
  double factor = 0;
  for (int64_t c = 0; c < C; ++c) {
    const double rs = r.data<float>()[c];
    const double a = static_cast<double>(g.data<float>()[c]) * rs * rs * static_cast<double>(dg.data<float>()[c]) / M;
    factor += a * a;
  }
  return {C > 0 ? factor / static_cast<double>(C) : 0.0, squared_norm(dx)};
}

// saves (training): input x (lossy_ok), gamma (parameter), mean and invstd (C floats each, exact).
// saves (eval with grad): input x (lossy_ok), gamma, running mean and var (exact).
class BatchNormNode final : public Node {
 public:
  BatchNormNode(bool training, float eps, bool channels_last)
      : training_(training), eps_(eps), channels_last_(channels_last) {}
  const char* name() const override { return "batchnorm2d"; }
  const SlotList& slots() const override {
    static const SlotList s = {"input", "weight", "mean", "invstd", "running_mean", "running_var"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) override {
    // dy in the forward input's layout: channels-last where a bf16 run's convolution wrote it so.
    const Tensor dy = channels_last_ ? grad_outputs[0].channels_last() : grad_outputs[0].contiguous();
    Tensor dgamma, dbeta, dx;
    if (training_ && channels_last_) {
      // The bf16 keep is read as it is (channels-last, widened in the kernel's loop); any other save in f32,
      // channels-last (the plane codecs decode it so): not a bf16 rounding of a lossy decode, whose error would
      // scale with |x| rather than with the codec's range.
      const Tensor kept = exact_bf16_keep("input");
      const Tensor x = kept.defined() && kept.is_channels_last() ? kept : load_channels_last("input");
      dx = ops::batchnorm_backward(dy, x, load("weight"), load("mean"), load("invstd"), &dgamma, &dbeta);
      if (wants_sensitivity("input"))
        observe_sensitivity("input", batchnorm_sensitivity(dx, dgamma, load("weight"), load("invstd")));
    } else if (training_) {
      // A compressed 4-D input is decoded channel by channel inside the backward (bit-identical, and the
      // full-size input is never written out); otherwise it is loaded whole.
      const std::unique_ptr<ChannelReader> reader =
          dy.device().is_cpu() && dy.dim() == 4 ? load_channels("input") : nullptr;
      if (reader) {
        dx = ops::batchnorm_backward_channels(
            dy, reader->shape(), [&](int64_t c, float* out) { reader->read(c, out); }, load("weight"), load("mean"),
            load("invstd"), &dgamma, &dbeta);
      } else {
        dx = ops::batchnorm_backward(dy, load("input"), load("weight"), load("mean"), load("invstd"), &dgamma, &dbeta);
      }
      if (dx.defined() && dgamma.defined() && wants_sensitivity("input"))
        observe_sensitivity("input", batchnorm_sensitivity(dx, dgamma, load("weight"), load("invstd")));
    } else {
      dx = ops::batchnorm_backward_eval(dy, load("input"), load("weight"), load("running_mean"), load("running_var"),
                                        eps_, &dgamma, &dbeta);
    }
    std::vector<Tensor> grads(3);
    if (wants_grad(inputs[0])) grads[0] = dx;
    if (wants_grad(inputs[1])) grads[1] = dgamma;
    if (wants_grad(inputs[2])) grads[2] = dbeta;
    return grads;
  }
 private:
  bool training_;
  float eps_;
  bool channels_last_;
};

}  // namespace

Variable batch_norm(const Variable& x, const Variable& gamma, const Variable& beta, Tensor& running_mean,
                    Tensor& running_var, bool training, float momentum, float eps) {
  if (!training) {
    const Tensor xin = x.data().contiguous();
    Tensor y = ops::batchnorm_forward_eval(xin, gamma.data(), beta.data(), running_mean, running_var, eps);
    auto node = make_node<BatchNormNode>({&x, &gamma, &beta}, false, eps, false);
    if (node) {
      node->save_lossy("input", xin);
      node->save_exact("weight", gamma.data());
      node->save_exact("running_mean", running_mean.clone());
      node->save_exact("running_var", running_var.clone());
    }
    return make_output(std::move(y), node);
  }
  // A channels-last input (a bf16 run's convolution output, on the CPU) is normalized in its layout.
  const Tensor xin = x.data().is_channels_last() && x.data().device().is_cpu() ? x.data() : x.data().contiguous();
  Tensor mean, invstd;
  Tensor y = ops::batchnorm_forward_train(xin, gamma.data(), beta.data(), running_mean, running_var, momentum,
                                          eps, &mean, &invstd);
  auto node = make_node<BatchNormNode>({&x, &gamma, &beta}, true, eps, xin.is_channels_last());
  if (node) {
    node->save_lossy("input", xin);
    node->save_exact("weight", gamma.data());
    node->save_exact("mean", mean);
    node->save_exact("invstd", invstd);
  }
  return make_output(std::move(y), node);
}

}  // namespace actlab
