// train_checked: a tiny training loop shared by the suites that check a policy while it trains — at
// every step the bytes the allocator holds under MemTag::ActivationPacked equal what CacheStats recorded
// for the lossy saves, and those equal their closed forms. Returns each step's loss.
#pragma once
#include <doctest/doctest.h>

#include <functional>
#include <vector>

#include "actlab/autograd/functions.h"
#include "actlab/autograd/tape.h"
#include "actlab/compress/policy.h"
#include "actlab/core/allocator.h"
#include "actlab/layers/module.h"
#include "actlab/layers/optim/sgd.h"

namespace actlab::testing {

// packs_tagged: the policy keeps its saves under MemTag::ActivationPacked (every one but exact, which
// keeps the f32 tensors themselves). after_step runs after each update.
inline std::vector<double> train_checked(Module& model, Sgd& opt, const PolicySet& set, const Tensor& x,
                                         const Tensor& labels, int steps, bool packs_tagged,
                                         const std::function<void()>& after_step = {}) {
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    CacheStats::global().reset();
    const int64_t packed_before = memory_stats()[MemTag::ActivationPacked].current;
    Variable loss;
    {
      ActivationCacheScope scope(set);
      MemTagScope tag(MemTag::Activation);
      loss = cross_entropy(model(Variable(x)), labels);
    }
    int64_t lossy_packed = 0, lossy_expected = 0;
    for (const auto& e : CacheStats::global().entries())
      if (e.lossy) lossy_packed += e.bytes_packed, lossy_expected += e.bytes_expected;
    if (packs_tagged) CHECK(memory_stats()[MemTag::ActivationPacked].current - packed_before == lossy_packed);
    CHECK(lossy_packed == lossy_expected);  // at each save's chosen width, for the adaptive policies
    CHECK(lossy_packed > 0);
    losses.push_back(loss.data().item());
    opt.zero_grad();
    backward(loss);
    opt.step();
    if (after_step) after_step();
  }
  return losses;
}

}  // namespace actlab::testing
