// Element-wise and shape ops: relu, relu6, add, add_relu, scale, flatten, reshape, permute, slice, roll, split,
// concat, the row broadcasts (add_rows, expand_rows), gather_rows, dropout, drop_path, shortcut_pad.
#include "actlab/autograd/functions.h"

#include <numeric>

#include "actlab/core/ops.h"
#include "actlab/core/philox.h"

namespace actlab {
namespace {

bool wants_grad(const Node::Edge& e) { return e.leaf || !e.node.expired(); }

// The element-wise ops below take their inputs contiguous or channels-last (a bf16 run's activations) as they are,
// and their masks follow memory order: a node hands dy back in its forward's layout.
Tensor in_layout(const Tensor& g, bool channels_last) { return channels_last ? g.channels_last() : g.contiguous(); }

// Two operands in one layout: as they are if they share one, else both contiguous.
std::pair<Tensor, Tensor> same_layout(const Tensor& a, const Tensor& b) {
  const Tensor da = a.dense(), db = b.dense();
  if (da.is_channels_last() == db.is_channels_last()) return {da, db};
  return {a.contiguous(), b.contiguous()};
}

// saves: mask (1 bit/elem, exact).
class ReluNode final : public Node {
 public:
  ReluNode(bool six, bool channels_last) : six_(six), channels_last_(channels_last) {}
  const char* name() const override { return six_ ? "relu6" : "relu"; }
  const SlotList& slots() const override {
    static const SlotList s = {"mask"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    const Tensor dy = in_layout(g[0], channels_last_);
    return {six_ ? ops::relu6_backward(dy, load("mask")) : ops::relu_backward(dy, load("mask"))};
  }
 private:
  bool six_;
  bool channels_last_;
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
  explicit AddReluNode(bool channels_last) : channels_last_(channels_last) {}
  const char* name() const override { return "add_relu"; }
  const SlotList& slots() const override {
    static const SlotList s = {"mask"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    const Tensor dx = ops::relu_backward(in_layout(g[0], channels_last_), load("mask"));
    return {wants_grad(inputs[0]) ? dx : Tensor(), wants_grad(inputs[1]) ? dx : Tensor()};
  }
 private:
  bool channels_last_;
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

// saves: nothing (the inverse order).
class PermuteNode final : public Node {
 public:
  explicit PermuteNode(const std::vector<int64_t>& order) : inverse_(order.size()) {
    for (size_t k = 0; k < order.size(); ++k) inverse_[static_cast<size_t>(order[k])] = static_cast<int64_t>(k);
  }
  const char* name() const override { return "permute"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override { return {g[0].permute(inverse_).contiguous()}; }
 private:
  std::vector<int64_t> inverse_;
};

// saves: nothing (the input shape and the part sizes). An output no gradient reached contributes zeros.
class SplitNode final : public Node {
 public:
  SplitNode(Shape in_shape, int64_t dim, std::vector<int64_t> sizes)
      : in_shape_(std::move(in_shape)), dim_(dim), sizes_(std::move(sizes)) {}
  const char* name() const override { return "split"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    const Device device = [&] {
      for (const Tensor& t : g) if (t.defined()) return t.device();
      return Device::cpu();
    }();
    Tensor dx = Tensor::empty(in_shape_, DType::F32, device);
    int64_t at = 0;
    for (size_t i = 0; i < sizes_.size(); ++i) {
      Tensor part = dx.slice(dim_, at, at + sizes_[i]);
      if (i < g.size() && g[i].defined()) {
        part.copy_(g[i]);
      } else {
        part.zero_();
      }
      at += sizes_[i];
    }
    return {dx};
  }
 private:
  Shape in_shape_;
  int64_t dim_;
  std::vector<int64_t> sizes_;
};

// saves: nothing (where each input sits along dim).
class ConcatNode final : public Node {
 public:
  ConcatNode(int64_t dim, std::vector<int64_t> sizes) : dim_(dim), sizes_(std::move(sizes)) {}
  const char* name() const override { return "concat"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    std::vector<Tensor> grads(sizes_.size());
    int64_t at = 0;
    for (size_t i = 0; i < sizes_.size(); ++i) {
      if (wants_grad(inputs[i])) grads[i] = g[0].slice(dim_, at, at + sizes_[i]).contiguous();
      at += sizes_[i];
    }
    return grads;
  }
 private:
  int64_t dim_;
  std::vector<int64_t> sizes_;
};

// y = x + p with p one row broadcast over dim 0. saves: nothing (p's shape).
class AddRowsNode final : public Node {
 public:
  explicit AddRowsNode(Shape p_shape) : p_shape_(std::move(p_shape)) {}
  const char* name() const override { return "add_rows"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    const Tensor dy = g[0].contiguous();
    std::vector<Tensor> grads(2);
    if (wants_grad(inputs[0])) grads[0] = dy;
    if (wants_grad(inputs[1])) grads[1] = ops::sum_rows(dy, p_shape_);
    return grads;
  }
 private:
  Shape p_shape_;
};

// y = p repeated n times along dim 0. saves: nothing (p's shape).
class ExpandRowsNode final : public Node {
 public:
  explicit ExpandRowsNode(Shape p_shape) : p_shape_(std::move(p_shape)) {}
  const char* name() const override { return "expand_rows"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override { return {ops::sum_rows(g[0].contiguous(), p_shape_)}; }
 private:
  Shape p_shape_;
};

// saves: the per-sample scale (0 or 1/(1-p); one f32 per sample, exact).
class DropPathNode final : public Node {
 public:
  const char* name() const override { return "drop_path"; }
  const SlotList& slots() const override {
    static const SlotList s = {"scale"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    return {ops::scale_rows(g[0].contiguous(), load("scale"))};
  }
};

// saves: nothing (where the slice sits in the input).
class SliceNode final : public Node {
 public:
  SliceNode(Shape in_shape, int64_t dim, int64_t start, int64_t end, int64_t step)
      : in_shape_(std::move(in_shape)), dim_(dim), start_(start), end_(end), step_(step) {}
  const char* name() const override { return "slice"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    Tensor dx = Tensor::zeros(in_shape_, DType::F32, g[0].device());
    dx.slice(dim_, start_, end_, step_).copy_(g[0]);
    return {dx};
  }
 private:
  Shape in_shape_;
  int64_t dim_, start_, end_, step_;
};

// saves: nothing (the shift).
class RollNode final : public Node {
 public:
  RollNode(int64_t shift, int64_t dim) : shift_(shift), dim_(dim) {}
  const char* name() const override { return "roll"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override;
 private:
  int64_t shift_, dim_;
};

// saves: nothing (the factor).
class ScaleNode final : public Node {
 public:
  explicit ScaleNode(float alpha) : alpha_(alpha) {}
  const char* name() const override { return "scale"; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    Tensor dx = g[0].clone();
    dx.mul_(alpha_);
    return {dx};
  }
 private:
  float alpha_;
};

// saves: the index (exact; i64, one per gathered row). The table is a parameter and backward does not read it.
class GatherRowsNode final : public Node {
 public:
  explicit GatherRowsNode(int64_t rows) : rows_(rows) {}
  const char* name() const override { return "gather_rows"; }
  const SlotList& slots() const override {
    static const SlotList s = {"index"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    return {ops::scatter_add_rows(g[0].contiguous(), load("index"), rows_)};
  }
 private:
  int64_t rows_;
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
    return {ops::shortcut_pad_backward(g[0].device().is_cpu() ? g[0].dense() : g[0].contiguous(), in_shape_, stride_)};
  }
 private:
  Shape in_shape_;
  int64_t stride_;
};

}  // namespace

Variable relu(const Variable& x) {
  Tensor mask;
  const Tensor xin = x.data().dense();
  Tensor y = ops::relu_forward(xin, &mask);
  auto node = make_node<ReluNode>({&x}, false, xin.is_channels_last());
  if (node) node->save_exact("mask", mask);
  return make_output(std::move(y), node);
}

Variable relu6(const Variable& x) {
  Tensor mask;
  const Tensor xin = x.data().dense();
  Tensor y = ops::relu6_forward(xin, &mask);
  auto node = make_node<ReluNode>({&x}, true, xin.is_channels_last());
  if (node) node->save_exact("mask", mask);
  return make_output(std::move(y), node);
}

Variable add(const Variable& a, const Variable& b) {
  const auto [da, db] = same_layout(a.data(), b.data());
  Tensor y = ops::add(da, db);
  return make_output(std::move(y), make_node<AddNode>({&a, &b}));
}

Variable add_relu(const Variable& a, const Variable& b) {
  Tensor mask;
  const auto [da, db] = same_layout(a.data(), b.data());
  Tensor y = ops::add_relu_forward(da, db, &mask);
  auto node = make_node<AddReluNode>({&a, &b}, da.is_channels_last());
  if (node) node->save_exact("mask", mask);
  return make_output(std::move(y), node);
}

Variable flatten(const Variable& x, int64_t start_dim) {
  Tensor y = x.data().flatten(start_dim);
  return make_output(std::move(y), make_node<ReshapeNode>({&x}, x.shape()));
}

Variable reshape(const Variable& x, const Shape& shape) {
  Tensor y = x.data().reshape(shape);
  return make_output(std::move(y), make_node<ReshapeNode>({&x}, x.shape()));
}

Variable permute(const Variable& x, const std::vector<int64_t>& order) {
  Tensor y = x.data().permute(order).contiguous();
  return make_output(std::move(y), make_node<PermuteNode>({&x}, order));
}

std::vector<Variable> split(const Variable& x, int64_t dim, const std::vector<int64_t>& sizes) {
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  ACTLAB_CHECK(d >= 0 && d < x.dim(), "split: dim ", dim, " of ", x.data().str());
  ACTLAB_CHECK(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}) == x.size(d), "split: sizes do not add up to ",
               x.size(d), " along dim ", d, " of ", x.data().str());
  auto node = make_node<SplitNode>({&x}, x.shape(), d, sizes);
  std::vector<Variable> out;
  int64_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out.push_back(make_output(x.data().slice(d, at, at + sizes[i]).contiguous(), node, static_cast<int>(i)));
    at += sizes[i];
  }
  return out;
}

Variable concat(const std::vector<Variable>& xs, int64_t dim) {
  ACTLAB_CHECK(!xs.empty(), "concat: no inputs");
  const Tensor& first = xs[0].data();
  const int64_t d = dim < 0 ? dim + first.dim() : dim;
  ACTLAB_CHECK(d >= 0 && d < first.dim(), "concat: dim ", dim, " of ", first.str());
  Shape out_shape = first.shape();
  out_shape[static_cast<size_t>(d)] = 0;
  std::vector<int64_t> sizes;
  std::vector<const Variable*> inputs;
  for (const Variable& v : xs) {
    Shape s = v.shape();
    ACTLAB_CHECK(v.dim() == first.dim(), "concat: ", v.data().str(), " and ", first.str(), " differ in rank");
    sizes.push_back(s[static_cast<size_t>(d)]);
    s[static_cast<size_t>(d)] = 0;
    Shape f = first.shape();
    f[static_cast<size_t>(d)] = 0;
    ACTLAB_CHECK(s == f, "concat: ", v.data().str(), " and ", first.str(), " differ outside dim ", d);
    out_shape[static_cast<size_t>(d)] += sizes.back();
    inputs.push_back(&v);
  }
  Tensor y = Tensor::empty(out_shape, DType::F32, first.device());
  int64_t at = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    // A channels-last input (a bf16 run's activation) is transposed whole first: the copy into a slice would
    // otherwise move one element at a time.
    y.slice(d, at, at + sizes[i]).copy_(xs[i].data().contiguous());
    at += sizes[i];
  }
  return make_output(std::move(y), make_node<ConcatNode>(inputs, d, sizes));
}

Variable add_rows(const Variable& x, const Variable& p) {
  ACTLAB_CHECK(p.dim() == x.dim() && p.size(0) == 1, "add_rows: ", p.data().str(), " is not one row of ", x.data().str());
  Tensor y = ops::add_to_rows(x.data().contiguous(), p.data().contiguous());
  return make_output(std::move(y), make_node<AddRowsNode>({&x, &p}, p.shape()));
}

Variable expand_rows(const Variable& p, int64_t n) {
  ACTLAB_CHECK(p.dim() >= 1 && p.size(0) == 1 && n >= 1, "expand_rows: ", p.data().str(), " to ", n, " rows");
  Shape s = p.shape();
  s[0] = n;
  Tensor y = ops::add_to_rows(Tensor::zeros(s, DType::F32, p.data().device()), p.data().contiguous());
  return make_output(std::move(y), make_node<ExpandRowsNode>({&p}, p.shape()));
}

Variable drop_path(const Variable& x, float p, bool training, uint64_t seed, uint64_t stream) {
  ACTLAB_CHECK(p >= 0.f && p < 1.f, "drop_path: p must be in [0, 1), got ", p);
  if (!training || p == 0.f) return x;
  const int64_t n = x.size(0);
  std::vector<float> scale(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    scale[static_cast<size_t>(i)] = philox_uniform(seed, stream, static_cast<uint64_t>(i)) < p ? 0.f : 1.f / (1.f - p);
  const Tensor s = Tensor::from_vector(scale, {n}).to(x.data().device());
  Tensor y = ops::scale_rows(x.data().contiguous(), s);
  auto node = make_node<DropPathNode>({&x});
  if (node) node->save_exact("scale", s);
  return make_output(std::move(y), node);
}

namespace {
// y = x rolled by shift along dim (element i goes to (i + shift) mod n), as two slice copies.
Tensor roll_tensor(const Tensor& x, int64_t shift, int64_t dim) {
  const int64_t n = x.size(dim), s = ((shift % n) + n) % n;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (s == 0) {
    y.copy_(x);
    return y;
  }
  y.slice(dim, s, n).copy_(x.slice(dim, 0, n - s));
  y.slice(dim, 0, s).copy_(x.slice(dim, n - s, n));
  return y;
}
}  // namespace

std::vector<Tensor> RollNode::backward(const std::vector<Tensor>& g) { return {roll_tensor(g[0], -shift_, dim_)}; }

Variable slice(const Variable& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  Tensor y = x.data().slice(d, start, end, step).contiguous();
  return make_output(std::move(y), make_node<SliceNode>({&x}, x.shape(), d, start, end, step));
}

Variable roll(const Variable& x, int64_t shift, int64_t dim) {
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  ACTLAB_CHECK(d >= 0 && d < x.dim() && x.size(d) > 0, "roll: dim ", dim, " of ", x.data().str());
  return make_output(roll_tensor(x.data(), shift, d), make_node<RollNode>({&x}, shift, d));
}

Variable scale(const Variable& x, float alpha) {
  Tensor y = x.data().contiguous().clone();
  y.mul_(alpha);
  return make_output(std::move(y), make_node<ScaleNode>({&x}, alpha));
}

Variable gather_rows(const Variable& table, const Tensor& index) {
  Tensor y = ops::gather_rows(table.data().contiguous(), index);
  auto node = make_node<GatherRowsNode>({&table}, table.size(0));
  if (node) node->save_exact("index", index);
  return make_output(std::move(y), node);
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
  // A channels-last input stays so on the CPU (ops.h).
  const Tensor xin = x.data().device().is_cpu() ? x.data().dense() : x.data().contiguous();
  Tensor y = ops::shortcut_pad_forward(xin, stride, c_out);
  return make_output(std::move(y), make_node<ShortcutPadNode>({&x}, x.shape(), stride));
}

}  // namespace actlab
