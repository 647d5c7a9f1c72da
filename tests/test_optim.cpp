// Optimizer and schedules: Sgd against a hand-written PyTorch-semantics loop; schedule shapes.
#include <doctest/doctest.h>

#include <cmath>

#include "actlab/layers/optim/schedule.h"
#include "actlab/layers/optim/sgd.h"

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
