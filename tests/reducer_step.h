// reduced_grads: one forward and backward of a classifier with its gradients passed through a GradReducer
// (or none), shared by the reducer's CPU suite (tests/test_dist.cpp) and its GPU case
// (tests/test_cuda_dist.cpp), which compare the gradients with and without the reducer.
#pragma once
#include <vector>

#include "actlab/autograd/functions.h"
#include "actlab/dist/reducer.h"
#include "actlab/layers/module.h"

namespace actlab::testing {

// Every parameter's gradient, as floats, after zero_grad, forward on x, cross-entropy against labels and
// backward, with reducer->begin_backward() before backward and reducer->finish() after it when given.
inline std::vector<std::vector<float>> reduced_grads(Module& model, const Tensor& x, const Tensor& labels,
                                                     GradReducer* reducer) {
  for (auto& p : model.parameters()) p.zero_grad();
  Variable loss = cross_entropy(model(Variable(x)), labels);
  if (reducer) reducer->begin_backward();
  backward(loss);
  if (reducer) reducer->finish();
  std::vector<std::vector<float>> grads;
  for (auto& p : model.parameters()) grads.push_back(p.grad().to_vector());
  return grads;
}

}  // namespace actlab::testing
