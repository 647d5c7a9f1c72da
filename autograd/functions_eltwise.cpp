// Element-wise and shape ops: relu, relu6, add, add_relu, flatten, dropout, shortcut_pad.
#include "actlab/autograd/functions.h"
#include "actlab/core/ops.h"

namespace actlab {
namespace {

bool wants_grad(const Node::Edge& e) { return e.leaf || !e.node.expired(); }

// saves: mask (1 bit/elem, exact).
class ReluNode final : public Node {
 public:
  explicit ReluNode(bool six) : six_(six) {}
  const char* name() const override { return six_ ? "relu6" : "relu"; }
  const SlotList& slots() const override {
    static const SlotList s = {"mask"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    const Tensor dy = g[0].contiguous();
    return {six_ ? ops::relu6_backward(dy, load("mask")) : ops::relu_backward(dy, load("mask"))};
  }
 private:
  bool six_;
};

// saves: nothing.
class AddNode final : public Node {
 public:
  const char* name() const override { return "add"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override { return {g[0], g[0]}; }
};

// saves: mask of a + b > 0 (1 bit/elem, exact).
class AddReluNode final : public Node {
 public:
  const char* name() const override { return "add_relu"; }
  const SlotList& slots() const override {
    static const SlotList s = {"mask"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    const Tensor dx = ops::relu_backward(g[0].contiguous(), load("mask"));
    return {wants_grad(inputs[0]) ? dx : Tensor(), wants_grad(inputs[1]) ? dx : Tensor()};
  }
};

// saves: nothing (the input shape).
class ReshapeNode final : public Node {
 public:
  explicit ReshapeNode(Shape in_shape) : in_shape_(std::move(in_shape)) {}
  const char* name() const override { return "reshape"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override { return {g[0].reshape(in_shape_)}; }
 private:
  Shape in_shape_;
};

// saves: keep mask (1 bit/elem, exact).
class DropoutNode final : public Node {
 public:
  explicit DropoutNode(float p) : p_(p) {}
  const char* name() const override { return "dropout"; }
  const SlotList& slots() const override {
    static const SlotList s = {"mask"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    return {ops::dropout_backward(g[0].contiguous(), load("mask"), p_)};
  }
 private:
  float p_;
};

// saves: nothing (shape and stride).
class ShortcutPadNode final : public Node {
 public:
  ShortcutPadNode(Shape in_shape, int64_t stride) : in_shape_(std::move(in_shape)), stride_(stride) {}
  const char* name() const override { return "shortcut_pad"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    return {ops::shortcut_pad_backward(g[0].contiguous(), in_shape_, stride_)};
  }
 private:
  Shape in_shape_;
  int64_t stride_;
};

}  // namespace

Variable relu(const Variable& x) {
  Tensor mask;
  Tensor y = ops::relu_forward(x.data().contiguous(), &mask);
  auto node = make_node<ReluNode>({&x}, false);
  if (node) node->save_exact("mask", mask);
  return make_output(std::move(y), node);
}

Variable relu6(const Variable& x) {
  Tensor mask;
  Tensor y = ops::relu6_forward(x.data().contiguous(), &mask);
  auto node = make_node<ReluNode>({&x}, true);
  if (node) node->save_exact("mask", mask);
  return make_output(std::move(y), node);
}

Variable add(const Variable& a, const Variable& b) {
  Tensor y = ops::add(a.data().contiguous(), b.data().contiguous());
  return make_output(std::move(y), make_node<AddNode>({&a, &b}));
}

Variable add_relu(const Variable& a, const Variable& b) {
  Tensor mask;
  Tensor y = ops::add_relu_forward(a.data().contiguous(), b.data().contiguous(), &mask);
  auto node = make_node<AddReluNode>({&a, &b});
  if (node) node->save_exact("mask", mask);
  return make_output(std::move(y), node);
}

Variable flatten(const Variable& x, int64_t start_dim) {
  Tensor y = x.data().flatten(start_dim);
  return make_output(std::move(y), make_node<ReshapeNode>({&x}, x.shape()));
}

Variable dropout(const Variable& x, float p, bool training, uint64_t seed, uint64_t stream) {
  if (!training || p == 0.f) return x;
  Tensor mask;
  Tensor y = ops::dropout_forward(x.data().contiguous(), p, seed, stream, &mask);
  auto node = make_node<DropoutNode>({&x}, p);
  if (node) node->save_exact("mask", mask);
  return make_output(std::move(y), node);
}

Variable shortcut_pad(const Variable& x, int64_t stride, int64_t c_out) {
  Tensor y = ops::shortcut_pad_forward(x.data().contiguous(), stride, c_out);
  return make_output(std::move(y), make_node<ShortcutPadNode>({&x}, x.shape(), stride));
}

}  // namespace actlab
