// Optimizers and schedules: Sgd and AdamW against hand-written PyTorch-semantics loops; schedule shapes.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>

#include "actlab/layers/optim/adamw.h"
#include "actlab/layers/optim/schedule.h"
#include "actlab/layers/optim/sgd.h"
#include "tests/error_of.h"

using namespace actlab;

TEST_CASE("Sgd follows torch.optim.SGD over several steps, skipping parameters without gradients") {
  for (bool nesterov : {false, true}) {
    Variable w(Tensor::from_vector({1.f, -2.f, 0.5f}, {3}), true);
    Variable unused(Tensor::from_vector({4.f}, {1}), true);
    Sgd opt({w, unused}, {0.1f, 0.9f, 0.f, 0.01f, nesterov});
    std::vector<double> ref = {1.0, -2.0, 0.5}, buf(3, 0.0);
    for (int step = 0; step < 4; ++step) {
      std::vector<float> g = {0.3f * (step + 1), -0.2f, 0.05f * step};
      w.impl()->grad = Tensor::from_vector(g, {3});
      w.impl()->grad_stale = false;
      opt.step();
      for (int i = 0; i < 3; ++i) {
        double gi = g[i] + 0.01 * ref[i];
        buf[i] = step == 0 ? gi : 0.9 * buf[i] + gi;
        gi = nesterov ? gi + 0.9 * buf[i] : buf[i];
        ref[i] -= 0.1 * gi;
      }
    }
    const auto got = w.data().to_vector();
    for (int i = 0; i < 3; ++i) CHECK(got[i] == doctest::Approx(ref[i]).epsilon(1e-5));
    CHECK(unused.data().to_vector()[0] == 4.f);
    CHECK(opt.momentum_buffers()[0].storage()->tag() == MemTag::OptimState);
  }
  CHECK_THROWS_AS(Sgd({}, {-1.f, 0.9f, 0.f, 0.f, false}), Error);
  CHECK_THROWS_AS(Sgd({}, {0.1f, 0.f, 0.f, 0.f, true}), Error);
}

// torch.optim.AdamW's update written out in double, one parameter element at a time.
struct AdamwRef {
  double w, m = 0, v = 0;
  int64_t t = 0;
  void step(double g, double lr, double b1, double b2, double eps, double wd) {
    ++t;
    w *= 1 - lr * wd;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double bc1 = 1 - std::pow(b1, double(t)), bc2 = 1 - std::pow(b2, double(t));
    w -= lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + eps);
  }
};

TEST_CASE("an optimizer refuses an undefined parameter and one listed twice") {
  const Variable w(Tensor::zeros({2}), true);
  CHECK_THROWS_WITH_AS(Sgd({w, Variable()}, SgdOptions{}), doctest::Contains("parameter 1 is an undefined Variable"), Error);
  CHECK_THROWS_WITH_AS(AdamW({w, w}, AdamwOptions{}), doctest::Contains("parameter 1 is listed twice"), Error);
  // A schedule's rate is checked as the constructor's is.
  Sgd sgd({w}, SgdOptions{});
  CHECK_THROWS_WITH_AS(sgd.set_lr(-1.f), doctest::Contains("learning rate must be >= 0"), Error);
  AdamW adamw({w}, AdamwOptions{});
  CHECK_THROWS_WITH_AS(adamw.set_lr(NAN), doctest::Contains("learning rate must be >= 0"), Error);
  CHECK_THROWS_WITH_AS(adamw.set_lr(INFINITY), doctest::Contains("AdamW: learning rate must be >= 0 and finite"), Error);
  CHECK_THROWS_WITH_AS(Sgd({w}, SgdOptions{INFINITY}), doctest::Contains("SGD: learning rate"), Error);
  CHECK(adamw.lr() == AdamwOptions{}.lr);  // a refused rate changes nothing
}

TEST_CASE("AdamW follows torch.optim.AdamW: decoupled decay, bias correction, a count per parameter") {
  const float lr = 0.01f, b1 = 0.8f, b2 = 0.95f, eps = 1e-6f, wd = 0.1f;
  Variable w(Tensor::from_vector({1.f, -2.f, 0.5f, 3e-4f}, {4}), true);
  Variable late(Tensor::from_vector({4.f, -1.f}, {2}), true);  // gets its first gradient at step 3
  AdamW opt({w, late}, {lr, b1, b2, eps, wd});
  std::vector<AdamwRef> ref = {{1.0}, {-2.0}, {0.5}, {3e-4}}, ref_late = {{4.0}, {-1.0}};
  for (int step = 0; step < 6; ++step) {
    // Gradients of both signs and very different sizes, one exactly 0 (its moments stay 0: the update
    // is then decay alone).
    const std::vector<float> g = {0.3f * (step + 1), -0.02f, step % 2 ? 5.f : -5.f, 0.f};
    w.impl()->grad = Tensor::from_vector(g, {4});
    w.impl()->grad_stale = false;
    for (int i = 0; i < 4; ++i) ref[i].step(g[i], lr, b1, b2, eps, wd);
    if (step >= 2) {
      const std::vector<float> gl = {1.f, -0.5f * step};
      late.impl()->grad = Tensor::from_vector(gl, {2});
      late.impl()->grad_stale = false;
      for (int i = 0; i < 2; ++i) ref_late[i].step(gl[i], lr, b1, b2, eps, wd);
    }
    opt.step();
    const auto got = w.data().to_vector(), got_late = late.data().to_vector();
    for (int i = 0; i < 4; ++i) CHECK(got[i] == doctest::Approx(ref[i].w).epsilon(1e-5));
    for (int i = 0; i < 2; ++i) CHECK(got_late[i] == doctest::Approx(ref_late[i].w).epsilon(1e-5));
    const auto m = opt.state_slots()[0].buffers->at(0).to_vector(), v = opt.state_slots()[1].buffers->at(0).to_vector();
    for (int i = 0; i < 4; ++i) {
      CHECK(m[i] == doctest::Approx(ref[i].m).epsilon(1e-5));
      CHECK(v[i] == doctest::Approx(ref[i].v).epsilon(1e-5));
    }
    CHECK(!opt.state_slots()[0].buffers->at(1).defined() == (step < 2));
  }
  // The first step of a parameter moves each weight by about lr whatever the gradient's size (m/sqrt(v)
  // is ±1 after bias correction): the late parameter's first step is the check that it counts from 1.
  CHECK(opt.updates() == std::vector<int64_t>{6, 4});
  CHECK(opt.counters() == "6 4");
  CHECK(opt.state_slots()[0].buffers->at(0).storage()->tag() == MemTag::OptimState);
  CHECK(opt.steps() == 6);

  // Counters round-trip, and malformed ones are refused without changing anything.
  AdamW other({w, late}, {});
  other.set_counters("6 4");
  CHECK(other.updates() == std::vector<int64_t>{6, 4});
  for (const char* bad : {"6", "6 4 1", "6 x", "-1 4", "6  4", "6 4 "}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(other.set_counters(bad), Error);
  }
  CHECK(other.updates() == std::vector<int64_t>{6, 4});
  CHECK_THROWS_AS(Sgd({w}, {}).set_counters("1"), Error);
  CHECK_THROWS_AS(AdamW({}, {-1.f, 0.9f, 0.999f, 1e-8f, 0.f}), Error);
  CHECK_THROWS_AS(AdamW({}, {1e-3f, 1.f, 0.999f, 1e-8f, 0.f}), Error);
  CHECK_THROWS_AS(AdamW({}, {1e-3f, 0.9f, -0.1f, 1e-8f, 0.f}), Error);
  CHECK_THROWS_AS(AdamW({}, {1e-3f, 0.9f, 0.999f, 0.f, 0.f}), Error);
}

TEST_CASE("set_decays: an excluded parameter takes no weight decay in SGD and AdamW, the others the full decay") {
  // With a zero gradient the only change is the decay: w·(1 − lr·wd) (AdamW), w − lr·wd·w (SGD, no momentum).
  for (const bool adamw : {false, true}) {
    CAPTURE(adamw);
    Variable decayed(Tensor::from_vector({2.f}, {1}), true), kept(Tensor::from_vector({2.f}, {1}), true);
    std::unique_ptr<Optimizer> opt;
    if (adamw) opt = std::make_unique<AdamW>(std::vector<Variable>{decayed, kept}, AdamwOptions{0.1f, 0.9f, 0.999f, 1e-8f, 0.5f});
    else opt = std::make_unique<Sgd>(std::vector<Variable>{decayed, kept}, SgdOptions{0.1f, 0.f, 0.f, 0.5f, false});
    opt->set_decays({true, false});
    for (Variable* v : {&decayed, &kept}) {
      v->impl()->grad = Tensor::from_vector({0.f}, {1});
      v->impl()->grad_stale = false;
    }
    opt->step();
    CHECK(decayed.data().to_vector()[0] == doctest::Approx(2.f * (1.f - 0.1f * 0.5f)));
    CHECK(kept.data().to_vector()[0] == 2.f);
    CHECK_THROWS_AS(opt->set_decays({true}), Error);
  }
  // The recipe's set on a transformer's names: weights decay; biases, norms and the embeddings do not.
  auto p = [](std::vector<int64_t> shape) { return Variable(Tensor::zeros(shape), true); };
  const std::vector<std::pair<std::string, Variable>> named = {
      {"cls_token", p({1, 1, 4})}, {"pos_embed", p({1, 5, 4})}, {"patch_embed.proj.weight", p({4, 1, 2, 2})},
      {"patch_embed.proj.bias", p({4})}, {"blocks.0.norm1.weight", p({4})}, {"blocks.0.attn.qkv.weight", p({12, 4})},
      {"features.1.0.attn.relative_position_bias_table", p({169, 3})}, {"head.weight", p({10, 4})},
      {"encoder.pos_embed", p({1, 5, 4})}, {"blocks.0.mlp.fc1.weight", p({8, 4})}};
  CHECK(decays_but_norms_biases_embeddings(named) ==
        std::vector<bool>{false, false, true, false, false, true, false, true, false, true});
}

TEST_CASE("schedules: cosine reaches zero, warm-up is linear, step decays") {
  LrSchedule s;
  s.kind = LrSchedule::Kind::Cosine;
  s.base_lr = 0.1f;
  s.total_steps = 100;
  CHECK(s.lr_at(0) == doctest::Approx(0.1));
  CHECK(s.lr_at(50) == doctest::Approx(0.05));
  CHECK(s.lr_at(100) == doctest::Approx(0.0));
  for (int i = 1; i <= 100; ++i) CHECK(s.lr_at(i) <= s.lr_at(i - 1));
  s.warmup_steps = 10;
  CHECK(s.lr_at(0) == doctest::Approx(0.01));
  CHECK(s.lr_at(9) == doctest::Approx(0.1));
  CHECK(s.lr_at(10) == doctest::Approx(0.1));
  LrSchedule st;
  st.kind = LrSchedule::Kind::Step;
  st.base_lr = 1.f;
  st.step_size = 5;
  st.gamma = 0.1f;
  CHECK(st.lr_at(4) == doctest::Approx(1.0));
  CHECK(st.lr_at(5) == doctest::Approx(0.1));
  CHECK(st.lr_at(12) == doctest::Approx(0.01));
  CHECK_THROWS_AS(LrSchedule::parse_kind("linear"), Error);
}

TEST_CASE("optimizer names: each optimizer's kind is in the one list, with its title, and others are refused") {
  Variable w(Tensor::from_vector({1.f}, {1}), true);
  const Sgd sgd({w}, {0.1f, 0.9f, 0.f, 0.f, false});
  const AdamW adamw({w}, {1e-3f, 0.9f, 0.999f, 1e-8f, 0.f});
  CHECK(optimizer_names() == std::vector<std::string>{sgd.kind(), adamw.kind()});
  CHECK(std::string(optimizer_title(sgd.kind())) == "SGD");
  CHECK(std::string(optimizer_title(adamw.kind())) == "AdamW");
  for (const std::string& name : optimizer_names()) CHECK_NOTHROW(check_optimizer_name(name));
  const std::string refused = testing::error_of([] { check_optimizer_name("adam"); });
  CHECK_MESSAGE(refused.find("unknown optimizer 'adam' (sgd or adamw)") != std::string::npos, refused);
  CHECK_THROWS_AS(optimizer_title("Adamw"), Error);
}
