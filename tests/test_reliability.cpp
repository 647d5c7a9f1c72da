// Reliability guards of the trainer (train/guards.h, train/trainer.cpp): memory per tag returns to
// its baseline over 1,000 compressed training steps and --check-memory catches a leak or a growing
// peak; non-finite values are located (layer, parameter) and, in a real run, stop with the last
// good state saved (bit-identical to a run stopped just before) or are skipped, up to a limit.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "actlab/autograd/functions.h"
#include "actlab/compress/policy.h"
#include "actlab/core/ops.h"
#include "actlab/layers/layers.h"
#include "actlab/layers/optim/sgd.h"
#include "tests/error_of.h"
#include "tests/temp_dir.h"
#include "actlab/train/checkpoint.h"
#include "actlab/train/guards.h"
#include "actlab/train/trainer.h"

using namespace actlab;
using actlab::testing::error_of;
using actlab::testing::TempDir;

namespace {

// (N,1,8,8) -> 10 classes: two convs with batch norm, a max-pool and a classifier; every saved
// tensor kind (policy-packed conv/BN inputs, ReLU masks, pool indices).
std::shared_ptr<Sequential> tiny_convnet() {
  auto m = std::make_shared<Sequential>();
  m->add("conv1", std::make_shared<Conv2d>(1, 4, 3, 1, 1));
  m->add("bn1", std::make_shared<BatchNorm2d>(4));
  m->add("relu1", std::make_shared<ReLU>());
  m->add("pool", std::make_shared<MaxPool2d>(2, 2));
  m->add("conv2", std::make_shared<Conv2d>(4, 8, 3, 1, 1));
  m->add("bn2", std::make_shared<BatchNorm2d>(8));
  m->add("relu2", std::make_shared<ReLU>());
  m->add("gap", std::make_shared<GlobalAvgPool>());
  m->add("fc", std::make_shared<Linear>(8, 10));
  return m;
}

struct TinyBatch {
  Tensor images, labels;
};
TinyBatch tiny_batch(uint64_t seed, int64_t n = 8) {
  PhiloxStream rng(seed, 1);
  TinyBatch b{Tensor::randn({n, 1, 8, 8}, rng), Tensor::empty({n}, DType::I64)};
  for (int64_t i = 0; i < n; ++i) b.labels.data<int64_t>()[i] = (i * 7 + static_cast<int64_t>(seed)) % 10;
  return b;
}

void sgd_step(Module& model, Sgd& opt, const TinyBatch& b, const PolicySet& policies) {
  Variable loss;
  {
    ActivationCacheScope scope(policies);
    MemTagScope tag(MemTag::Activation);
    loss = cross_entropy(model(Variable(b.images)), b.labels);
  }
  opt.zero_grad();
  {
    MemTagScope tag(MemTag::Activation);
    backward(loss);
  }
  opt.step();
}

// One OpenMP thread for the tiny ops below: on a busy 2-core machine every fork/join of a second
// thread can wait a scheduler slice (measured: 16 s instead of 0.5 s for the 1,000 steps).
struct SingleThread {
  int previous = omp_get_max_threads();
  SingleThread() { omp_set_num_threads(1); }
  ~SingleThread() { omp_set_num_threads(previous); }
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TrainConfig small_run(const std::string& model, int64_t epochs) {
  TrainConfig c;
  c.model = model;
  c.dataset = "synthetic";
  c.synthetic_size = 128;
  c.batch_size = 32;  // 4 steps per epoch
  c.epochs = epochs;
  c.lr = 0.05;
  c.threads = 1;
  c.seed = 11;
  c.quiet = true;
  return c;
}

}  // namespace

TEST_CASE("memory: 1,000 DIVISION training steps return every tag to its baseline, the peak stays flat") {
  const SingleThread one_thread;
  const int64_t live_at_start = memory_stats().total.current;
  {
    seed_init(5);
    auto model = tiny_convnet();
    Sgd opt(model->parameters(), SgdOptions{0.02f, 0.9f, 0.f, 5e-4f, false});
    const PolicySet policies(parse_policy("division:B=2,Q=2"));
    const TinyBatch batches[3] = {tiny_batch(1), tiny_batch(2), tiny_batch(3)};
    std::array<int64_t, kNumMemTags> baseline{}, warmup_peak{};
    int64_t live_mismatches = 0, peak_growths = 0;
    for (int step = 0; step < 1000; ++step) {
      reset_peak();
      sgd_step(*model, opt, batches[step % 3], policies);
      const MemoryStats s = memory_stats();
      for (int t = 0; t < kNumMemTags; ++t) {
        if (step == 0) baseline[t] = s.by_tag[t].current;
        if (step < 3) warmup_peak[t] = std::max(warmup_peak[t], s.by_tag[t].peak);
        if (s.by_tag[t].current != baseline[t] && live_mismatches++ < 5)
          FAIL_CHECK("step ", step, ": ", mem_tag_name(static_cast<MemTag>(t)), " live ", s.by_tag[t].current,
                     " != baseline ", baseline[t]);
        if (step >= 3 && s.by_tag[t].peak > warmup_peak[t] && peak_growths++ < 5)
          FAIL_CHECK("step ", step, ": ", mem_tag_name(static_cast<MemTag>(t)), " peak ", s.by_tag[t].peak,
                     " > ", warmup_peak[t], " of the first 3 steps");
      }
    }
    CHECK(live_mismatches == 0);
    CHECK(peak_growths == 0);
    CHECK(baseline[static_cast<int>(MemTag::OptimState)] > 0);  // momentum exists: the steps really ran
    CHECK(warmup_peak[static_cast<int>(MemTag::ActivationPacked)] > 0);  // and really packed
  }
  CHECK(memory_stats().total.current == live_at_start);
}

TEST_CASE("memory check: a leak names the step and tag, a growing peak too, a clean run passes") {
  const SingleThread one_thread;
  const int64_t live_at_start = memory_stats().total.current;
  {
    seed_init(6);
    auto model = tiny_convnet();
    Sgd opt(model->parameters(), SgdOptions{});
    const PolicySet policies(parse_policy("quant:Q=4"));
    const TinyBatch batch = tiny_batch(4);
    MemoryCheck clean(Device::cpu(), 2), leaky(Device::cpu(), 2), peaky(Device::cpu(), 2);
    Buffer leak;
    std::string leak_error, peak_error;
    for (int step = 1; step <= 6; ++step) {
      for (MemoryCheck* check : {&clean, &leaky, &peaky}) check->start_step();
      sgd_step(*model, opt, batch, policies);
      const std::string where = "step " + std::to_string(step);
      CHECK_NOTHROW(clean.end_step(where));
      if (step == 4) leak = Buffer(4096, MemTag::Workspace);  // kept past the step
      if (step == 5) Buffer burst(1 << 20, MemTag::Activation);  // freed, but raises the peak
      const std::string e1 = error_of([&] { leaky.end_step(where); });
      const std::string e2 = error_of([&] { peaky.end_step(where); });
      if (leak_error.empty()) leak_error = e1;
      if (peak_error.empty() && !contains(e2, "workspace")) peak_error = e2;
      if (step == 4) leak = Buffer();  // peaky must see the burst, not the leak
    }
    CHECK(contains(leak_error, "after step 4 live workspace bytes are "));
    CHECK(contains(leak_error, "(+4096 bytes)"));
    CHECK(contains(peak_error, "in step 5 the activation peak"));
    CHECK(contains(clean.verdict(), "memory check: live bytes back to"));
    CHECK(clean.steps_checked() == 6);
  }
  CHECK(memory_stats().total.current == live_at_start);
}

TEST_CASE("non-finite values: the first bad layer output, the input batch and bad gradients are named") {
  const SingleThread one_thread;
  seed_init(7);
  auto model = tiny_convnet();
  const TinyBatch b = tiny_batch(5);
  CHECK(locate_nonfinite_forward(*model, b.images) == "");
  Tensor bad_input = b.images.clone();
  bad_input.data<float>()[3] = INFINITY;
  CHECK(locate_nonfinite_forward(*model, bad_input) == "in the input batch");
  // A NaN weight in conv2: layers before it stay finite, the report names conv2, not a later layer.
  auto params = model->named_parameters();
  for (auto& p : params)
    if (p.first == "conv2.weight") p.second.data().data<float>()[0] = std::nanf("");
  CHECK(locate_nonfinite_forward(*model, b.images) == "first in layer 'conv2' (Conv2d) output");

  seed_init(7);
  auto fresh = tiny_convnet();
  Sgd opt(fresh->parameters(), SgdOptions{});
  Variable loss = cross_entropy((*fresh)(Variable(b.images)), b.labels);
  opt.zero_grad();
  backward(loss);
  CHECK(nonfinite_gradients(*fresh).empty());
  for (auto& p : fresh->named_parameters())
    if (p.first == "bn2.weight") p.second.grad().data<float>()[1] = -INFINITY;
  CHECK(nonfinite_gradients(*fresh) == std::vector<std::string>{"bn2.weight"});
  CHECK(all_finite(Tensor::zeros({0})));
  CHECK_FALSE(all_finite(Tensor::full({70000}, std::nanf(""))));  // the parallel path
  // The list form the gradient check uses: one flag per tensor, undefined and empty ones finite.
  const std::vector<bool> flags = ops::all_finite_each(
      {Tensor::zeros({3}), Tensor(), Tensor::full({5}, INFINITY), Tensor::zeros({0}), Tensor::full({2}, std::nanf(""))});
  CHECK(flags == std::vector<bool>{true, true, false, true, false});
  CHECK(ops::all_finite_each({}).empty());
}

TEST_CASE("on-nonfinite=stop: an injected NaN stops the run with the last good state saved") {
  TempDir stopped("nan_stop"), reference("nan_ref");
  TrainConfig c = small_run("resnet20", 2);
  c.save_dir = stopped.str();
  c.inject_nan_step = 3;
  const std::string e = error_of([&] { train(c); });
  CHECK(contains(e, "non-finite loss (nan) at epoch 1 step 3 (global step 3), in the input batch"));
  CHECK(contains(e, "the last good state is in " + stopped.file("last.safetensors")));
  // The same run asked to stop after 2 steps saves the same bytes: the bad forward's batch-norm
  // update was undone and nothing of the bad step reached the weights or the momentum.
  TrainConfig r = small_run("resnet20", 2);
  r.save_dir = reference.str();
  r.stop_after_steps = 2;
  REQUIRE(train(r).interrupted);
  const SafetensorsFile a = read_safetensors(stopped.file("last.safetensors"));
  const SafetensorsFile b = read_safetensors(reference.file("last.safetensors"));
  CHECK(checkpoint_state(a).global_step == 2);
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    CAPTURE(a.tensors[i].first);
    CHECK(std::memcmp(a.tensors[i].second.raw_data(), b.tensors[i].second.raw_data(), a.tensors[i].second.nbytes()) == 0);
  }

  TrainConfig g = small_run("resnet20", 1);
  g.inject_nan_step = 2;
  g.inject_nan_into = "grad";
  const std::string eg = error_of([&] { train(g); });
  CHECK(contains(eg, "non-finite gradient at epoch 1 step 2 (global step 2), first in layer 'fc' (parameter fc.bias;"));
  CHECK(contains(eg, "nothing saved (no --save-dir)"));
}

TEST_CASE("on-nonfinite=skip-step: a bad step is dropped and counted, ten in a row stop the run") {
  TrainConfig c = small_run("mlp", 3);
  c.on_nonfinite = "skip-step";
  c.inject_nan_step = 2;
  const TrainSummary s = train(c);
  CHECK(s.skipped_steps == 1);
  CHECK(s.steps == 12);
  CHECK(std::isfinite(s.final_test_loss));
  c.inject_nan_count = 100;
  const std::string e = error_of([&] { train(c); });
  CHECK(contains(e, "at epoch 3 step 3 (global step 11)"));
  CHECK(contains(e, "(10 non-finite steps in a row)"));
  c.on_nonfinite = "retry";
  CHECK(contains(error_of([&] { train(c); }), "--on-nonfinite must be stop or skip-step, got 'retry'"));
}

TEST_CASE("check_memory: a real DIVISION run reports live bytes back to baseline and a stable peak") {
  TrainConfig c = small_run("resnet20", 2);
  c.policy = "division:B=4,Q=2";
  c.check_memory = true;
  const TrainSummary s = train(c);
  CHECK(contains(s.memory_check, "memory check: live bytes back to "));
  CHECK(contains(s.memory_check, "after every step, peak stable (8 steps;"));
  CHECK(s.epochs.size() == 2);
  CHECK(s.epochs[0].peak_bytes > 0);
}
