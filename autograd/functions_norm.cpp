// batch_norm: forward (training or eval) plus its node.
#include "actlab/autograd/functions.h"
#include "actlab/core/ops.h"

namespace actlab {
namespace {

bool wants_grad(const Node::Edge& e) { return e.leaf || !e.node.expired(); }

// saves (training): input x (lossy_ok), gamma (parameter), mean and invstd (C floats each, exact).
// saves (eval with grad): input x (lossy_ok), gamma, running mean and var (exact).
class BatchNormNode final : public Node {
 public:
  BatchNormNode(bool training, float eps) : training_(training), eps_(eps) {}
  const char* name() const override { return "batchnorm2d"; }
  const SlotList& slots() const override {
    static const SlotList s = {"input", "weight", "mean", "invstd", "running_mean", "running_var"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) override {
    const Tensor dy = grad_outputs[0].contiguous();
    Tensor dgamma, dbeta, dx;
    if (training_) {
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
};

}  // namespace

Variable batch_norm(const Variable& x, const Variable& gamma, const Variable& beta, Tensor& running_mean,
                    Tensor& running_var, bool training, float momentum, float eps) {
  const Tensor xin = x.data().contiguous();
  if (!training) {
    Tensor y = ops::batchnorm_forward_eval(xin, gamma.data(), beta.data(), running_mean, running_var, eps);
    auto node = make_node<BatchNormNode>({&x, &gamma, &beta}, false, eps);
    if (node) {
      node->save_lossy("input", xin);
      node->save_exact("weight", gamma.data());
      node->save_exact("running_mean", running_mean.clone());
      node->save_exact("running_var", running_var.clone());
    }
    return make_output(std::move(y), node);
  }
  Tensor mean, invstd;
  Tensor y = ops::batchnorm_forward_train(xin, gamma.data(), beta.data(), running_mean, running_var, momentum,
                                          eps, &mean, &invstd);
  auto node = make_node<BatchNormNode>({&x, &gamma, &beta}, true, eps);
  if (node) {
    node->save_lossy("input", xin);
    node->save_exact("weight", gamma.data());
    node->save_exact("mean", mean);
    node->save_exact("invstd", invstd);
  }
  return make_output(std::move(y), node);
}

}  // namespace actlab
