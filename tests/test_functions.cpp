// Autograd functions: every differentiable op's gradients against central differences, and forward
// results against plain reference loops where the kernel suites do not already cover them.
#include <doctest/doctest.h>

#include "actlab/autograd/functions.h"
#include "gradcheck.h"

using namespace actlab;
using actlab::testing::gradcheck;
using actlab::testing::param;

namespace {
// Values kept away from 0 (and 6) so ReLU kinks do not sit inside the finite-difference step.
Variable away_from_kinks(const Shape& s, uint64_t seed) {
  PhiloxStream rng(seed);
  Tensor t = Tensor::rand(s, rng, 0.2f, 1.f);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) if (i % 3 == 0) p[i] = -p[i];
  return Variable(t, true);
}
}  // namespace

TEST_CASE("gradcheck conv2d: strides, padding, groups, bias") {
  struct Case { Shape x, w; Conv2dOptions o; bool bias; };
  const std::vector<Case> cases = {
      {{2, 3, 5, 6}, {4, 3, 3, 3}, {1, 1, 1}, true},
      {{1, 4, 7, 5}, {6, 2, 3, 3}, {2, 1, 2}, false},
      {{2, 3, 6, 6}, {3, 1, 3, 3}, {2, 1, 3}, false},  // depthwise, stride 2
      {{1, 2, 4, 4}, {3, 2, 1, 1}, {1, 0, 1}, true},
  };
  for (const auto& c : cases) {
    std::vector<Variable> in = {param(c.x, 1), param(c.w, 2, 0.5f)};
    if (c.bias) in.push_back(param({c.w[0]}, 3));
    gradcheck([&](std::vector<Variable>& v) { return conv2d(v[0], v[1], c.bias ? v[2] : Variable(), c.o); }, in);
  }
}

TEST_CASE("gradcheck linear, batch_norm (train and eval), pools, shortcut pad") {
  gradcheck([](std::vector<Variable>& v) { return linear(v[0], v[1], v[2]); },
            {param({3, 5}, 1), param({4, 5}, 2), param({4}, 3)});
  Tensor rm = Tensor::zeros({3}), rv = Tensor::full({3}, 1.f);
  gradcheck([&](std::vector<Variable>& v) { return batch_norm(v[0], v[1], v[2], rm, rv, true); },
            {param({4, 3, 3, 2}, 4), param({3}, 5), param({3}, 6)}, 1e-2, 3e-2);
  gradcheck([&](std::vector<Variable>& v) { return batch_norm(v[0], v[1], v[2], rm, rv, false); },
            {param({2, 3, 2, 2}, 7), param({3}, 8), param({3}, 9)});
  gradcheck([](std::vector<Variable>& v) { return max_pool2d(v[0], {2, 2, 0}); }, {param({2, 2, 4, 6}, 10)}, 1e-3);
  gradcheck([](std::vector<Variable>& v) { return max_pool2d(v[0], {3, 2, 1}); }, {param({1, 2, 5, 5}, 11)}, 1e-3);
  gradcheck([](std::vector<Variable>& v) { return avg_pool2d(v[0], {2, 2, 0}); }, {param({2, 2, 4, 4}, 12)});
  gradcheck([](std::vector<Variable>& v) { return global_avg_pool(v[0]); }, {param({2, 3, 3, 3}, 13)});
  gradcheck([](std::vector<Variable>& v) { return shortcut_pad(v[0], 2, 7); }, {param({2, 3, 5, 4}, 14)});
  gradcheck([](std::vector<Variable>& v) { return flatten(v[0], 1); }, {param({2, 3, 2, 2}, 15)});
}

TEST_CASE("gradcheck relu, relu6, add, add_relu, dropout and cross-entropy") {
  gradcheck([](std::vector<Variable>& v) { return relu(v[0]); }, {away_from_kinks({2, 3, 4}, 1)}, 1e-2);
  gradcheck([](std::vector<Variable>& v) { return relu6(v[0]); }, {away_from_kinks({30}, 2)}, 1e-2);
  gradcheck([](std::vector<Variable>& v) { return add(v[0], v[1]); }, {param({5, 2}, 3), param({5, 2}, 4)});
  gradcheck([](std::vector<Variable>& v) { return add_relu(v[0], v[1]); },
            {away_from_kinks({4, 5}, 5), Variable(Tensor::zeros({4, 5}), true)}, 1e-2);
  gradcheck([](std::vector<Variable>& v) { return dropout(v[0], 0.3f, true, 7, 1); }, {param({50}, 6)});
  const Tensor labels = Tensor::zeros({4}, DType::I64);
  labels.data<int64_t>()[1] = 2;
  labels.data<int64_t>()[3] = 4;
  for (float smoothing : {0.f, 0.1f})
    gradcheck([&](std::vector<Variable>& v) { return cross_entropy(v[0], labels, smoothing); }, {param({4, 5}, 8)},
              1e-2);
}

TEST_CASE("a composite network: conv -> bn -> relu -> pool -> linear -> loss") {
  Tensor rm = Tensor::zeros({4}), rv = Tensor::full({4}, 1.f);
  const Tensor labels = Tensor::zeros({2}, DType::I64);
  labels.data<int64_t>()[1] = 1;
  gradcheck(
      [&](std::vector<Variable>& v) {
        Variable h = conv2d(v[0], v[1], Variable(), {1, 1, 1});
        h = relu(batch_norm(h, v[2], v[3], rm, rv, true));
        h = flatten(global_avg_pool(h));
        return cross_entropy(linear(h, v[4], Variable()), labels);
      },
      {param({2, 2, 4, 4}, 1), param({4, 2, 3, 3}, 2, 0.5f), param({4}, 3), param({4}, 4), param({3, 4}, 5)}, 1e-2,
      5e-2);
}
