// Pooling: max (saves u8 argmax), average and global average (save shapes only).
#include "actlab/autograd/functions.h"
#include "actlab/core/ops.h"

namespace actlab {
namespace {

ops::PoolParams to_params(const Pool2dOptions& o) { return {o.kernel, o.stride, o.padding}; }

// saves: argmax (u8 per output element, exact).
class MaxPoolNode final : public Node {
 public:
  MaxPoolNode(Shape in_shape, const Pool2dOptions& opt) : in_shape_(std::move(in_shape)), opt_(opt) {}
  const char* name() const override { return "max_pool2d"; }
  const SlotList& slots() const override {
    static const SlotList s = {"indices"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    return {ops::maxpool2d_backward(g[0].contiguous(), load("indices"), in_shape_, to_params(opt_))};
  }
 private:
  Shape in_shape_;
  Pool2dOptions opt_;
};

// saves: nothing (shapes).
class AvgPoolNode final : public Node {
 public:
  AvgPoolNode(Shape in_shape, const Pool2dOptions& opt, bool global)
      : in_shape_(std::move(in_shape)), opt_(opt), global_(global) {}
  const char* name() const override { return global_ ? "global_avg_pool" : "avg_pool2d"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    const Tensor dy = g[0].contiguous();
    return {global_ ? ops::global_avgpool_backward(dy, in_shape_)
                    : ops::avgpool2d_backward(dy, in_shape_, to_params(opt_))};
  }
 private:
  Shape in_shape_;
  Pool2dOptions opt_;
  bool global_;
};

}  // namespace

Variable max_pool2d(const Variable& x, const Pool2dOptions& opt) {
  Tensor argmax;
  Tensor y = ops::maxpool2d_forward(x.data().contiguous(), to_params(opt), &argmax);
  auto node = make_node<MaxPoolNode>({&x}, x.shape(), opt);
  if (node) node->save_exact("indices", argmax);
  return make_output(std::move(y), node);
}

Variable avg_pool2d(const Variable& x, const Pool2dOptions& opt) {
  Tensor y = ops::avgpool2d_forward(x.data().contiguous(), to_params(opt));
  return make_output(std::move(y), make_node<AvgPoolNode>({&x}, x.shape(), opt, false));
}

Variable global_avg_pool(const Variable& x) {
  Tensor y = ops::global_avgpool_forward(x.data().contiguous());
  return make_output(std::move(y), make_node<AvgPoolNode>({&x}, x.shape(), Pool2dOptions{}, true));
}

}  // namespace actlab
