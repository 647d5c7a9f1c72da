// Central-difference gradient checking through autograd: compares the gradient backward() gives for
// each input with (f(x+h) - f(x-h)) / 2h, where f = Σ out·R for a fixed random R, summed in double.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "actlab/autograd/tape.h"
#include "actlab/core/tensor.h"

namespace actlab::testing {

// A leaf that wants a gradient, N(0, scale²) from Philox(seed): the inputs of the gradient checks.
inline Variable param(const Shape& s, uint64_t seed, float scale = 1.f) {
  PhiloxStream rng(seed);
  return Variable(Tensor::randn(s, rng, 0.f, scale), true);
}

inline double weighted_sum(const Tensor& out, const std::vector<float>& r) {
  const auto v = out.to_vector();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += static_cast<double>(v[i]) * r[i];
  return s;
}

// f builds the output from the variables. Checks every element of every input that requires grad.
// Returns the worst relative error seen (also CHECKed against tol).
inline double gradcheck(const std::function<Variable(std::vector<Variable>&)>& f, std::vector<Variable> inputs,
                        double h = 1e-2, double tol = 2e-2) {
  PhiloxStream rng(99);
  Variable out = f(inputs);
  const Tensor r_t = Tensor::randn(out.shape(), rng);
  const std::vector<float> r = r_t.to_vector();
  for (auto& v : inputs) if (v.requires_grad()) v.zero_grad();
  backward(out, r_t);
  std::vector<Tensor> analytic;
  for (auto& v : inputs) analytic.push_back(v.requires_grad() ? v.grad().clone() : Tensor());
  double worst = 0;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!inputs[k].requires_grad()) continue;
    REQUIRE(analytic[k].defined());
    Tensor& x = inputs[k].data();
    float* p = x.data<float>();
    const auto a = analytic[k].to_vector();
    double scale = 1e-3;
    for (float g : a) scale = std::max(scale, static_cast<double>(std::abs(g)));
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float saved = p[i];
      double fp, fm;
      {
        NoGradGuard ng;
        p[i] = saved + static_cast<float>(h);
        fp = weighted_sum(f(inputs).data(), r);
        p[i] = saved - static_cast<float>(h);
        fm = weighted_sum(f(inputs).data(), r);
      }
      p[i] = saved;
      const double numeric = (fp - fm) / (2 * h);
      const double err = std::abs(numeric - a[i]) / scale;
      worst = std::max(worst, err);
      if (err > tol) {
        CHECK_MESSAGE(err <= tol, "input ", k, " element ", i, ": analytic ", a[i], " numeric ", numeric);
        return worst;
      }
    }
  }
  return worst;
}

}  // namespace actlab::testing
