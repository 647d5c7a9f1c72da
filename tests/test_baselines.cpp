// The baselines that change where or whether saves are kept rather than how they are coded.
// Gradient checkpointing (autograd/checkpoint.h, layers/checkpoint.h, the checkpoint forms of
// parse_policy_set): with exact saves the gradients and batch-norm statistics are bit-identical to a run
// without it, drop-path masks are redrawn the same, less is kept after forward, checkpoint + DIVISION
// keeps packed segment inputs, and what cannot be checkpointed is refused with one clear error.
// SWAP (compress/swap.h): bit-identical gradients, device bytes vs host bytes, prefetch.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "actlab/autograd/checkpoint.h"
#include "actlab/autograd/functions.h"
#include "actlab/autograd/saved_tensor.h"
#include "actlab/autograd/tape.h"
#include "actlab/compress/swap.h"
#include "actlab/core/philox.h"
#include "actlab/layers/checkpoint.h"
#include "actlab/layers/layers.h"
#include "actlab/models/registry.h"
#include "actlab/train/step.h"
#include "error_of.h"
#include "prerequisite.h"

using namespace actlab;
using actlab::testing::error_of;

namespace {

struct Run {
  std::vector<Tensor> grads;    // every parameter's gradient after one step
  std::vector<Tensor> buffers;  // batch-norm running statistics after it
  StepResult step;
};

// One forward + backward (no update) of a freshly built model under `spec`, with every random stream
// (weights, drop-path masks, stochastic rounding) seeded the same for every spec.
Run one_step(const std::string& model_name, const std::string& spec, int64_t image = 16,
             const std::vector<std::string>& rules = {}, const PolicySet* given = nullptr) {
  seed_init(5);
  set_pack_seed(5);
  set_pack_step(0);
  std::shared_ptr<Module> model = make_model({model_name, 1, 10, image});
  for (const auto& m : model->named_modules())
    if (m.second) m.second->set_seed(11);
  PolicySet set = given ? *given : parse_policy_set(spec);
  for (const auto& r : rules) set.add_rule(r);
  PhiloxStream rng(5, 1);
  Tensor x = Tensor::randn({4, 1, image, image}, rng);
  Tensor y = Tensor::empty({4}, DType::I64);
  for (int64_t i = 0; i < 4; ++i) y.data<int64_t>()[i] = (3 * i) % 10;
  Run r;
  StepOptions options;
  options.record_saves = true;
  r.step = run_step(*model, nullptr, set, x, y, options);
  for (const auto& p : model->parameters()) r.grads.push_back(p.grad().clone());
  for (const auto& b : model->named_buffers()) r.buffers.push_back(b.second.clone());
  return r;
}

bool bit_identical(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.shape() != b.shape()) return false;
  return std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

void check_identical(const Run& a, const Run& b) {
  REQUIRE(a.grads.size() == b.grads.size());
  int64_t differing = 0;
  for (size_t i = 0; i < a.grads.size(); ++i) differing += bit_identical(a.grads[i], b.grads[i]) ? 0 : 1;
  CHECK(differing == 0);
  REQUIRE(a.buffers.size() == b.buffers.size());
  for (size_t i = 0; i < a.buffers.size(); ++i) CHECK(bit_identical(a.buffers[i], b.buffers[i]));
  CHECK(a.step.loss == b.step.loss);
}

double relative_error(const std::vector<Tensor>& a, const std::vector<Tensor>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (int64_t j = 0; j < a[i].numel(); ++j) {
      const double d = a[i].data<float>()[j] - ref[i].data<float>()[j];
      num += d * d;
      den += static_cast<double>(ref[i].data<float>()[j]) * ref[i].data<float>()[j];
    }
  return std::sqrt(num / den);
}

// A block whose output is used twice by its parent: the second use comes after the next block consumed it.
class Reuse final : public Module {
 public:
  Reuse() {
    seq_ = register_module("blocks", std::make_shared<Sequential>());
    for (int i = 0; i < 3; ++i) {
      auto b = std::make_shared<Sequential>();
      b->add(std::make_shared<Linear>(6, 6));
      b->add(std::make_shared<ReLU>());
      blocks_.push_back(seq_->add(b));
    }
  }
  Variable forward(const Variable& x) override {
    ModulePathScope path("blocks");  // the blocks run by hand, under the paths Sequential would give them
    Variable a = (*blocks_[0])(x);
    Variable b = (*blocks_[1])(a);
    return add((*blocks_[2])(b), a);
  }
  std::string kind() const override { return "Reuse"; }
 private:
  std::shared_ptr<Sequential> seq_;
  std::vector<std::shared_ptr<Sequential>> blocks_;
};

}  // namespace

TEST_CASE("checkpoint forms: parse_policy_set reads segments, auto, +POLICY and rules, bad forms are refused") {
  CHECK(parse_policy_set("division:B=8,Q=2").checkpoint().segments == 0);
  CHECK(parse_policy_set("checkpoint").checkpoint().segments == CheckpointRequest::kAutoSegments);
  CHECK(parse_policy_set("checkpoint:segments=auto").checkpoint().segments == CheckpointRequest::kAutoSegments);
  const PolicySet both = parse_policy_set("checkpoint:segments=4+division:B=8,Q=2");
  CHECK(both.checkpoint().segments == 4);
  CHECK(both.default_policy().name() == "division:B=8,Q=2");
  CHECK(parse_policy_set("checkpoint:segments=4").default_policy().is_exact());
  CHECK(both.describe() == "checkpoint:segments=4+division:B=8,Q=2");
  PolicySet rules = parse_policy_set("exact");
  rules.add_rule("layer2.*=checkpoint");
  CHECK(rules.checkpoint().modules == std::vector<std::string>{"layer2.*"});
  CHECK(rules.describe() == "exact|layer2.*=checkpoint");
  // Rules in the string itself ("SET|PATTERN=POLICY|..."): what describe() writes parses back to the same set.
  const PolicySet mixed = parse_policy_set("checkpoint:segments=2+quant:Q=2,R=1|*.attn.proj=division:B=8,Q=2,R=1|"
                                           "head=exact|blocks.0=checkpoint");
  CHECK(mixed.checkpoint().segments == 2);
  CHECK(mixed.checkpoint().modules == std::vector<std::string>{"blocks.0"});
  CHECK(mixed.default_policy().name() == "quant:Q=2,R=1");
  CHECK(mixed.for_module("blocks.3.attn.proj").name() == "division:B=8,Q=2,R=1");
  CHECK(mixed.for_module("head").is_exact());
  CHECK(mixed.for_module("blocks.3.mlp.fc1").name() == "quant:Q=2,R=1");
  CHECK(mixed.describe() ==
        "checkpoint:segments=2+quant:Q=2,R=1|*.attn.proj=division:B=8,Q=2,R=1|head=exact|blocks.0=checkpoint");
  CHECK(parse_policy_set(mixed.describe()).describe() == mixed.describe());
  for (const char* bad : {"exact|", "exact||head=exact", "exact|head", "exact|head=nope", "|head=exact"}) {
    CAPTURE(bad);
    CHECK(!error_of([&] { parse_policy_set(bad); }).empty());
  }
  CHECK(error_of([] { parse_policy_set("exact|"); }).find("empty rule after '|'") != std::string::npos);
  for (const char* bad : {"checkpoint:segments=0", "checkpoint:segments=", "checkpoint:K=2", "checkpoint+",
                          "checkpoint:segments=x", "checkpoint+checkpoint"}) {
    CAPTURE(bad);
    CHECK(error_of([&] { parse_policy_set(bad); }).find("bad policy") != std::string::npos);
  }
  CHECK(error_of([&] { rules.add_rule("layer1.*=checkpoint:segments=2"); }).find("bare word") != std::string::npos);
  // A rule with no policy, or a pattern holding the policy string's own separators, is refused at once.
  CHECK(error_of([&] { rules.add_rule("x", nullptr); }).find("has no policy") != std::string::npos);
  CHECK(error_of([&] { rules.add_rule("a|b", parse_policy("exact")); }).find("holds '|' or '='") != std::string::npos);
  CHECK(error_of([&] { rules.add_rule("a|b=checkpoint"); }).find("holds '|'") != std::string::npos);
}

TEST_CASE("checkpoint plans: blocks of the zoo, segments of consecutive blocks, the last left plain") {
  auto resnet = make_model({"resnet20", 1, 10, 16});
  const std::vector<std::string> blocks = checkpoint_blocks(*resnet);
  REQUIRE(blocks.size() == 9);
  CHECK(blocks.front() == "layer1.0");
  CHECK(blocks.back() == "layer3.2");
  CheckpointRequest request;
  request.segments = 3;
  const CheckpointPlan plan = make_checkpoint_plan(*resnet, request);
  CHECK(plan.segments == 2);
  CHECK(plan.segment_of.size() == 6);
  CHECK(plan.segment_of.at("layer1.0") == 0);
  CHECK(plan.segment_of.at("layer2.0") == 1);
  CHECK(plan.segment_of.count("layer3.0") == 0);
  request.segments = CheckpointRequest::kAutoSegments;  // sqrt(9) = 3
  CHECK(make_checkpoint_plan(*resnet, request).segments == 2);

  auto swin = make_model({"swin_t", 3, 10, 224});  // built, never run
  const auto swin_blocks = checkpoint_blocks(*swin);
  CHECK(swin_blocks.front() == "features.0");
  CHECK(std::find(swin_blocks.begin(), swin_blocks.end(), "features.1.1") != swin_blocks.end());
  CHECK(std::find(swin_blocks.begin(), swin_blocks.end(), "features.2") != swin_blocks.end());  // patch merging
  CHECK(std::find(swin_blocks.begin(), swin_blocks.end(), "features.1") == swin_blocks.end());  // opened up

  CheckpointRequest rule;
  rule.modules = {"layer2*"};  // matches layer2 and everything inside: the outermost only
  const CheckpointPlan outer = make_checkpoint_plan(*resnet, rule);
  CHECK(outer.segments == 1);
  CHECK(outer.segment_of.count("layer2") == 1);

  auto mlp = make_model({"mlp", 1, 10, 8});
  CHECK(error_of([&] { make_checkpoint_plan(*mlp, request); }).find("no blocks") != std::string::npos);
  rule.modules = {"nothing.here"};
  CHECK(error_of([&] { make_checkpoint_plan(*resnet, rule); }).find("matches no module") != std::string::npos);
  request.modules = {"layer1.*"};
  CHECK(error_of([&] { make_checkpoint_plan(*resnet, request); }).find("not both") != std::string::npos);
}

TEST_CASE("checkpoint with exact saves: gradients and batch-norm statistics bit-identical, less kept after forward") {
  const Run plain = one_step("resnet20", "exact");
  for (const char* spec : {"checkpoint:segments=3", "checkpoint:segments=9", "checkpoint"}) {
    CAPTURE(spec);
    const Run ck = one_step("resnet20", spec);
    check_identical(ck, plain);
    CHECK(ck.step.activation_bytes < plain.step.activation_bytes);
    CHECK(ck.step.recomputed_segments > 0);
    CHECK(ck.step.recompute_seconds > 0);
  }
  const Run by_rule = one_step("resnet20", "exact", 16, {"layer2.*=checkpoint"});
  check_identical(by_rule, plain);
  CHECK(by_rule.step.recomputed_segments == 3);  // layer2.0, .1 and .2, each its own segment
  CHECK(by_rule.step.activation_bytes < plain.step.activation_bytes);
  CHECK(plain.step.recomputed_segments == 0);
}

TEST_CASE("checkpoint redraws the forward's drop-path masks: ViT gradients bit-identical with exact saves") {
  const Run plain = one_step("vit_tiny_cifar", "exact", 8);
  const Run ck = one_step("vit_tiny_cifar", "checkpoint:segments=4", 8);
  check_identical(ck, plain);
  CHECK(ck.step.recomputed_segments == 3);
}

TEST_CASE("checkpoint + DIVISION: packed segment inputs, deterministic, gradients near the exact ones") {
  const Run exact = one_step("resnet20", "exact", 32);
  const Run division = one_step("resnet20", "division:B=8,Q=2", 32);
  const Run both = one_step("resnet20", "checkpoint:segments=3+division:B=8,Q=2", 32);
  const Run again = one_step("resnet20", "checkpoint:segments=3+division:B=8,Q=2", 32);
  check_identical(both, again);
  CHECK(both.step.activation_bytes < division.step.activation_bytes);
  const double e_division = relative_error(division.grads, exact.grads);
  const double e_both = relative_error(both.grads, exact.grads);
  MESSAGE("relative gradient error vs exact: division " << e_division << ", checkpoint+division " << e_both);
  // The recompute starts from a packed input, so its error adds to DIVISION's; it must stay a descent
  // direction's worth of signal (an all-zero gradient scores 1).
  CHECK(e_both > 0);
  CHECK(e_both < 1);
}

TEST_CASE("checkpoint: a block output used outside its segment is refused, naming the consuming op") {
  Reuse model;
  PolicySet set = parse_policy_set("checkpoint:segments=2");  // blocks 0 and 1 form the checkpointed segment
  const CheckpointPlan plan = make_checkpoint_plan(model, set.checkpoint());
  REQUIRE(plan.segment_of.size() == 2);
  PhiloxStream rng(1, 1);
  Variable x(Tensor::randn({2, 6}, rng));
  TapeClearGuard clear;
  ActivationCacheScope scope(set);
  CheckpointScope checkpoints(plan);
  const std::string e = error_of([&] { model(x); });
  CHECK(e.find("add") != std::string::npos);
  CHECK(e.find("inside a checkpointed segment") != std::string::npos);
}

TEST_CASE("checkpoint: the grad-ready hook reports a checkpointed block's parameters after their gradient is final") {
  seed_init(2);
  auto model = make_model({"resnet20", 1, 10, 8});
  PolicySet set = parse_policy_set("checkpoint:segments=3");
  const CheckpointPlan plan = make_checkpoint_plan(*model, set.checkpoint());
  PhiloxStream rng(2, 1);
  Tensor x = Tensor::randn({2, 1, 8, 8}, rng);
  Tensor labels = Tensor::zeros({2}, DType::I64);
  std::vector<std::pair<VariableImpl*, Tensor>> at_hook;
  Tape::current().set_grad_ready_hook([&](VariableImpl& leaf) { at_hook.emplace_back(&leaf, leaf.grad.clone()); });
  {
    ActivationCacheScope scope(set);
    CheckpointScope checkpoints(plan);
    Variable loss = cross_entropy((*model)(Variable(x)), labels);
    backward(loss);
  }
  Tape::current().set_grad_ready_hook(nullptr);
  const auto params = model->parameters();
  CHECK(at_hook.size() == params.size());
  for (const auto& p : params) {
    const auto it = std::find_if(at_hook.begin(), at_hook.end(), [&](const auto& h) { return h.first == p.impl().get(); });
    REQUIRE(it != at_hook.end());
    CHECK(bit_identical(it->second, p.grad()));
  }
}

TEST_CASE("swap: bit-identical gradients, no device bytes kept for the offered saves, all of them on the host") {
  const Run plain = one_step("resnet20", "exact");
  const int64_t host_before = memory_stats()[MemTag::Offloaded].current;
  for (int ahead : {0, 2}) {
    CAPTURE(ahead);
    auto policy = std::make_shared<SwapPolicy>(ahead);
    const PolicySet set(policy);
    const Run swapped = one_step("resnet20", "", 16, {}, &set);
    check_identical(swapped, plain);
    CHECK(swapped.step.offloaded_bytes == plain.step.saved.raw);  // every offered save went to the host
    CHECK(swapped.step.saved.packed == 0);                        // and none stayed on the device
    // The measure counts the input batch whatever keeps it (docs/measures.md): 4 images of 1x16x16 f32.
    const int64_t input_batch = 4 * 16 * 16 * 4;
    CHECK(swapped.step.activation_bytes == plain.step.activation_bytes - plain.step.saved.packed + input_batch);
    const SwapPolicy::Traffic t = policy->traffic();
    CHECK(t.bytes_out == plain.step.saved.raw);
    CHECK(t.bytes_back == t.bytes_out);
    if (ahead == 0) CHECK(t.prefetched == 0);
    if (ahead > 0) CHECK(t.prefetched > 0);
    CHECK(memory_stats()[MemTag::Offloaded].current == host_before);  // freed with the step
  }
  CHECK(parse_policy("swap")->name() == "swap:P=2");
  // F: MiB of copies out in flight on a GPU before pack waits (64 by default, 0 for none); the name
  // shows it when it is not the default, so a results row says which SWAP ran.
  CHECK(parse_policy("swap:P=2,F=64")->name() == "swap:P=2");
  CHECK(parse_policy("swap:F=16")->name() == "swap:P=2,F=16");
  CHECK(parse_policy("swap:P=1,F=0")->name() == "swap:P=1,F=0");
  CHECK(error_of([] { parse_policy("swap:F=-1"); }).find("needs a whole number of at most 9 digits, got '-1'") != std::string::npos);
  CHECK(error_of([] { parse_policy("division:B=2147483648"); }).find("at most 9 digits, got '2147483648'") != std::string::npos);
  CHECK(error_of([] { parse_policy("swap:P=x"); }).find("bad policy") != std::string::npos);
  CHECK(error_of([] { parse_policy("swap:Q=2"); }).find("unknown parameter") != std::string::npos);
}

TEST_CASE("swap under bf16: the 16-bit copy leaves, half the bytes, and the gradients are exact@bf16's") {
  if (!actlab::testing::have_bf16_kernels()) return;
  PrecisionScope bf16(Precision::BF16);
  const Run plain = one_step("resnet20", "exact");
  auto policy = std::make_shared<SwapPolicy>(2);
  const PolicySet set(policy);
  const Run swapped = one_step("resnet20", "", 16, {}, &set);
  check_identical(swapped, plain);  // it offloaded f32 copies and ended 56 of 116 gradients elsewhere
  CHECK(swapped.step.offloaded_bytes * 2 == swapped.step.saved.raw);
  CHECK(policy->traffic().bytes_out * 2 == swapped.step.saved.raw);
  CHECK(policy->traffic().bytes_back == policy->traffic().bytes_out);
}

TEST_CASE("swap: a strided view (transpose, slice) comes back with its own values, as under exact") {
  // The policy API takes any tensor for a lossless policy (compress/policy.h); swap copies bytes, so it must
  // read a view through its strides. Library callers hand it views; the tape makes lossy saves contiguous.
  const SwapPolicy policy(2);
  const SaveInfo info{"linear", "input", true, "fc"};
  const Tensor x = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  for (const Tensor& view : {x.permute({1, 0}), x.slice(1, 1, 3)}) {
    CAPTURE(view.str());
    REQUIRE_FALSE(view.is_contiguous());
    const auto packed = policy.pack(view, info, {0, 0});
    CHECK(bit_identical(policy.unpack(*packed, info), view.contiguous()));
    // Under bf16 the 16-bit copy leaves: the view's values rounded (these small integers exactly).
    PrecisionScope bf16(Precision::BF16);
    const auto half = policy.pack(view, info, {0, 1});
    CHECK(bit_identical(policy.unpack(*half, info), view.contiguous()));
    CHECK(policy.unpack_bf16(*half, info).dtype() == DType::BF16);
  }
}

TEST_CASE("swap: a caller that numbers no steps (the Python adapter) keeps one step's order, not every pack's") {
  const SwapPolicy policy(2);
  const SaveInfo info{"python", "input", true, ""};
  const Tensor x = Tensor::full({2, 3, 4, 4}, 1.5f);
  for (int round = 0; round < 5; ++round) {
    CAPTURE(round);
    std::vector<std::unique_ptr<Packed>> packs;
    for (uint64_t k = 0; k < 6; ++k) packs.push_back(policy.pack(x, info, {0, k}));  // step 0 every time
    CHECK(policy.ordered_saves() == 6);  // this round's packs only: the earlier rounds' were all freed
    for (size_t k = packs.size(); k-- > 0;) {  // backward: the newest first, each prefetching older ones
      CHECK(bit_identical(policy.unpack(*packs[k], info), x));
      packs[k].reset();
    }
  }
  // While an earlier pack is alive, the order keeps it (it may still be prefetched).
  const auto kept = policy.pack(x, info, {0, 0});
  const auto next = policy.pack(x, info, {0, 1});
  CHECK(policy.ordered_saves() == 2);
  const SwapPolicy::Traffic t = policy.traffic();
  CHECK(t.bytes_back == 5 * 6 * static_cast<int64_t>(x.nbytes()));
  CHECK(t.prefetched > 0);
}
