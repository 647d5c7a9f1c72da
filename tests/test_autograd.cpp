// Tape autograd: accumulation, release of saved tensors, NoGradGuard, the exact policy path.
#include <doctest/doctest.h>

#include <cstring>
#include <set>
#include <string>

#include "actlab/autograd/functions.h"
#include "actlab/autograd/tape.h"
#include "actlab/compress/policy.h"
#include "actlab/core/ops.h"

using namespace actlab;

namespace {
Variable param(const Shape& s, uint64_t seed) {
  PhiloxStream rng(seed);
  return Variable(Tensor::randn(s, rng), true);
}
bool bit_equal(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}
}  // namespace

TEST_CASE("a tensor used twice accumulates both gradients") {
  Variable x = param({3, 4}, 1);
  backward(add(x, x), Tensor::full({3, 4}, 1.f));
  for (float g : x.grad().to_vector()) CHECK(g == 2.f);

  // Used by two different ops, reached through different paths.
  Variable y = param({2, 6}, 2);
  Variable w = param({3, 6}, 3);
  Variable out = add(linear(y, w, Variable()), linear(y, w, Variable()));
  backward(out, Tensor::full({2, 3}, 1.f));
  Tensor gw_twice = w.grad().clone();
  Variable out1 = linear(y, w, Variable());
  w.zero_grad();
  backward(out1, Tensor::full({2, 3}, 1.f));
  const auto once = w.grad().to_vector(), twice = gw_twice.to_vector();
  for (size_t i = 0; i < once.size(); ++i) CHECK(twice[i] == doctest::Approx(2 * once[i]));
}

TEST_CASE("a saved tensor written in place before backward is an error, not a gradient of other values") {
  for (const bool write_weight : {false, true}) {
    CAPTURE(write_weight);
    Variable w = param({3, 4}, 5);
    PhiloxStream rng(6);
    Tensor x = Tensor::randn({2, 4}, rng);
    Variable out = linear(Variable(x), w, Variable());  // saves x (for w's gradient) and w (for x's)
    if (write_weight) w.data().mul_(3.f);
    else x.mul_(2.f);
    CHECK_THROWS_WITH_AS(backward(out, Tensor::full({2, 3}, 1.f)), doctest::Contains("modified in place after it was saved"),
                         Error);
    Tape::current().clear();
  }
  // A walk that fails leaves nodes it had not reached: they go too, with their saves. A seed refused up front
  // changes nothing.
  {
    Variable a = param({2, 4}, 9);
    Variable h = relu(a);  // recorded first, walked after the linear node that fails
    Variable w2 = param({3, 4}, 10);
    Variable y = linear(h, w2, Variable());
    w2.data().mul_(2.f);
    CHECK_THROWS(backward(y, Tensor::full({5}, 1.f)));
    CHECK(Tape::current().size() == 2);
    CHECK_THROWS_WITH_AS(backward(y, Tensor::full({2, 3}, 1.f)), doctest::Contains("modified in place"), Error);
    CHECK(Tape::current().size() == 0);
  }
  // A pack that copied the tensor is checked too while the tensor lives.
  Variable w = param({3, 4}, 7);
  PhiloxStream rng(8);
  Tensor x = Tensor::randn({2, 4}, rng);
  {
    const PolicySet set(parse_policy("quant:Q=8"));
    ActivationCacheScope scope(set);
    Variable out = linear(Variable(x), w, Variable());
    x.fill_(1.f);
    CHECK_THROWS_WITH_AS(backward(out, Tensor::full({2, 3}, 1.f)), doctest::Contains("modified in place"), Error);
    Tape::current().clear();
  }
}

TEST_CASE("gradients accumulate across backward calls until zero_grad") {
  Variable x = param({4}, 4);
  backward(relu(add(x, x)), Tensor::full({4}, 1.f));
  const auto first = x.grad().to_vector();
  backward(relu(add(x, x)), Tensor::full({4}, 1.f));
  const auto second = x.grad().to_vector();
  for (size_t i = 0; i < first.size(); ++i) CHECK(second[i] == 2 * first[i]);
  x.zero_grad();
  CHECK(!x.grad().defined());
}

TEST_CASE("saved tensors are released after backward and memory returns to its baseline") {
  Variable w = param({8, 3, 3, 3}, 5);
  Variable x(Tensor::full({4, 3, 16, 16}, 0.5f));
  Tensor rm = Tensor::zeros({8}), rv = Tensor::full({8}, 1.f);
  Variable gamma(Tensor::full({8}, 1.f), true), beta(Tensor::zeros({8}), true);
  // Warm up once so the leaf gradients exist, then measure.
  for (int round = 0; round < 2; ++round) {
    const MemoryStats before = memory_stats();
    Variable y;
    {
      MemTagScope tag(MemTag::Activation);
      y = relu(batch_norm(conv2d(x, w, Variable(), {1, 1, 1}), gamma, beta, rm, rv, true));
    }
    CHECK(Tape::current().size() == 3);
    CHECK(Tape::current().saved_bytes() > 0);
    CHECK(memory_stats()[MemTag::Activation].current > before[MemTag::Activation].current);
    backward(flatten(global_avg_pool(y)), Tensor::full({4, 8}, 1.f));
    y = Variable();
    CHECK(Tape::current().size() == 0);
    const MemoryStats after = memory_stats();
    if (round == 1) {
      for (int t = 0; t < kNumMemTags; ++t)
        CHECK_MESSAGE(after.by_tag[t].current == before.by_tag[t].current, "tag ", mem_tag_name(static_cast<MemTag>(t)));
    }
  }
}

TEST_CASE("NoGradGuard records nothing - backward runs once per forward") {
  Variable x = param({3}, 6);
  {
    NoGradGuard guard;
    Variable y = relu(x);
    CHECK(!y.requires_grad());
    CHECK(Tape::current().size() == 0);
  }
  Variable y = relu(x);
  CHECK(y.requires_grad());
  backward(y, Tensor::full({3}, 1.f));
  CHECK_THROWS_AS(backward(y, Tensor::full({3}, 1.f)), Error);
  Tape::current().clear();
}

TEST_CASE("the exact policy gives bit-identical gradients to reading the tensors directly") {
  Variable x = param({2, 4, 8, 8}, 7);
  Variable w = param({6, 4, 3, 3}, 8);
  PhiloxStream rng(9);
  const Tensor dy = Tensor::randn({2, 6, 8, 8}, rng);
  backward(conv2d(x, w, Variable(), {1, 1, 1}), dy);
  const ops::ConvParams p{1, 1, 1};
  const Tensor dw = ops::conv2d_backward_weight(dy, x.data(), w.shape(), p, false, nullptr);
  const Tensor dx = ops::conv2d_backward_data(dy, w.data(), x.shape(), p);
  CHECK(bit_equal(w.grad(), dw));
  CHECK(bit_equal(x.grad(), dx));
}

TEST_CASE("module paths are recorded on nodes and shape errors are clear") {
  Variable x = param({2, 3}, 10);
  {
    ModulePathScope a("layer1");
    ModulePathScope b("0");
    CHECK(current_module_path() == "layer1.0");
  }
  CHECK(current_module_path().empty());
  Variable w = param({4, 5}, 11);
  try {
    linear(x, w, Variable());
    FAIL("mismatched linear did not throw");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("linear") != std::string::npos);
  }
}

namespace {
// A node type that declares one slot, to show what a save into another name does.
struct OneSlotNode : Node {
  const char* name() const override { return "one_slot"; }
  const SlotList& slots() const override {
    static const SlotList s = {"input"};
    return s;
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override { return {load("input")}; }
};
}  // namespace

TEST_CASE("named saves: an undeclared slot fails at save time, and the node's name and module fill SaveInfo") {
  OneSlotNode node;
  node.module_path = "block.conv";
  const Tensor t = Tensor::zeros({2, 3});
  const std::string err = [&] {
    try {
      node.save_exact("inptu", t);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  CHECK(err.find("one_slot (block.conv): save into undeclared slot 'inptu' (its slots: input)") != std::string::npos);
  CacheStats::global().reset();
  CacheStats::global().set_enabled(true);
  node.save_lossy("input", t);
  CHECK(node.has_saved("input"));
  const auto entries = CacheStats::global().entries();
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].module_path == "block.conv");
  CHECK(entries[0].op == "one_slot.input");
  CHECK(entries[0].lossy);
}

TEST_CASE("named saves: a network's saves keep the report names conv2d.input, batchnorm2d.input, relu.mask") {
  CacheStats::global().reset();
  CacheStats::global().set_enabled(true);
  PhiloxStream rng(4);
  const Variable x(Tensor::randn({2, 3, 8, 8}, rng));
  Variable w, g, b;
  {
    MemTagScope tag(MemTag::Param);  // as a module's parameters are
    w = param({4, 3, 3, 3}, 5);
    g = Variable(Tensor::full({4}, 1.f), true);
    b = Variable(Tensor::zeros({4}), true);
  }
  Tensor rm = Tensor::zeros({4}), rv = Tensor::full({4}, 1.f);
  const Variable y = relu(batch_norm(conv2d(x, w, Variable(), {}), g, b, rm, rv, true, 0.1f, 1e-5f));
  std::set<std::string> ops;
  for (const auto& e : CacheStats::global().entries()) ops.insert(e.op + (e.lossy ? " lossy" : ""));
  CHECK(ops.count("conv2d.input lossy") == 1);
  CHECK(ops.count("batchnorm2d.input lossy") == 1);
  CHECK(ops.count("relu.mask") == 1);
  CHECK(ops.count("conv2d.weight") == 0);  // parameters stay out of the statistics
  Tape::current().clear();
}
