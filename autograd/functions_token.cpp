// The transformer ops: gelu, layer_norm, softmax and matmul, forward plus their nodes.
#include "actlab/autograd/functions.h"
#include "actlab/core/ops.h"

namespace actlab {
namespace {

bool wants_grad(const Node::Edge& e) { return e.leaf || !e.node.expired(); }

// saves: input x (lossy_ok: through the policy). GELU's derivative needs x itself, not a mask, and x
// is as large as a linear layer's input, so it is exactly what a policy should see; nothing is kept in f32
// behind the policy's back.
class GeluNode final : public Node {
 public:
  explicit GeluNode(bool tanh_approx) : tanh_approx_(tanh_approx) {}
  const char* name() const override { return "gelu"; }
  const SlotList& slots() const override {
    static const SlotList s = {"input"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    return {ops::gelu_backward(g[0].contiguous(), load("input"), tanh_approx_)};
  }
 private:
  bool tanh_approx_;
};

// saves: the normalized input x̂ = (x − mean)·rstd (lossy_ok), gamma (parameter) and rstd per row (exact:
// one float a row). Not x: a policy's error in x̂ does not scale with the row's 1/σ, and x̂ is what the
// gradient is written in (measured on vit_tiny_cifar: docs/policies.md, "Token maps").
class LayerNormNode final : public Node {
 public:
  const char* name() const override { return "layer_norm"; }
  const SlotList& slots() const override {
    static const SlotList s = {"normalized", "weight", "rstd"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    Tensor dgamma, dbeta;
    const Tensor dx =
        ops::layernorm_backward(g[0].contiguous(), load("normalized"), load("weight"), load("rstd"), &dgamma, &dbeta);
    std::vector<Tensor> grads(3);
    if (wants_grad(inputs[0])) grads[0] = dx;
    if (wants_grad(inputs[1])) grads[1] = dgamma;
    if (wants_grad(inputs[2])) grads[2] = dbeta;
    return grads;
  }
};

// saves: the output y (lossy_ok, at least kProbabilityBits-bit codes). Softmax's derivative is a function
// of y alone.
class SoftmaxNode final : public Node {
 public:
  explicit SoftmaxNode(float scale) : scale_(scale) {}
  const char* name() const override { return "softmax"; }
  const SlotList& slots() const override {
    static const SlotList s = {"output"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    return {ops::softmax_backward(g[0].contiguous(), load("output"), scale_)};
  }
 private:
  float scale_;
};

// saves: both operands (lossy_ok), as stored. dA = dC·op(B)ᵀ and dB = op(A)ᵀ·dC, written for each transpose
// case so no operand is ever copied into a transposed layout.
class MatmulNode final : public Node {
 public:
  MatmulNode(bool trans_a, bool trans_b) : trans_a_(trans_a), trans_b_(trans_b) {}
  const char* name() const override { return "matmul"; }
  const SlotList& slots() const override {
    static const SlotList s = {"lhs", "rhs"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    const Tensor dc = g[0].contiguous();
    std::vector<Tensor> grads(2);
    if (wants_grad(inputs[0])) {
      const Tensor b = load("rhs");
      // C = op(A)·op(B): d op(A) = dC·op(B)ᵀ; A itself is op(A) or its transpose.
      grads[0] = trans_a_ ? ops::matmul(b, dc, trans_b_, true) : ops::matmul(dc, b, false, !trans_b_);
    }
    if (wants_grad(inputs[1])) {
      const Tensor a = load("lhs");
      grads[1] = trans_b_ ? ops::matmul(dc, a, true, trans_a_) : ops::matmul(a, dc, !trans_a_, false);
    }
    return grads;
  }
 private:
  bool trans_a_, trans_b_;
};

}  // namespace

Variable gelu(const Variable& x, bool tanh_approx) {
  const Tensor xc = x.data().contiguous();
  Tensor y = ops::gelu_forward(xc, tanh_approx);
  auto node = make_node<GeluNode>({&x}, tanh_approx);
  if (node) node->save_lossy("input", xc);
  return make_output(std::move(y), node);
}

Variable layer_norm(const Variable& x, const Variable& gamma, const Variable& beta, float eps) {
  const Tensor xc = x.data().contiguous();
  auto node = make_node<LayerNormNode>({&x, &gamma, &beta});
  Tensor mean, rstd, xhat;
  Tensor y = ops::layernorm_forward(xc, gamma.data(), beta.data(), eps, &mean, &rstd, node ? &xhat : nullptr);
  if (node) {
    node->save_lossy("normalized", xhat);
    node->save_exact("weight", gamma.data());
    node->save_exact("rstd", rstd);
  }
  return make_output(std::move(y), node);
}

Variable softmax(const Variable& x, float scale) {
  Tensor y = ops::softmax_forward(x.data().contiguous(), scale);
  auto node = make_node<SoftmaxNode>({&x}, scale);
  if (node) node->save_lossy("output", y, kProbabilityBits);
  return make_output(std::move(y), node);
}

Variable matmul(const Variable& a, const Variable& b, bool trans_a, bool trans_b) {
  const Tensor ac = a.data().contiguous(), bc = b.data().contiguous();
  Tensor c = ops::matmul(ac, bc, trans_a, trans_b);
  auto node = make_node<MatmulNode>({&a, &b}, trans_a, trans_b);
  if (node) {
    if (b.requires_grad()) node->save_lossy("lhs", ac);
    if (a.requires_grad()) node->save_lossy("rhs", bc);
  }
  return make_output(std::move(c), node);
}

}  // namespace actlab
