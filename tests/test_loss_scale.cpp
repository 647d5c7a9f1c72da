// Loss scaling (layers/optim/loss_scale.h) and its use by the trainer: the forms --loss-scale takes, the
// dynamic protocol (skip and halve on overflow, double after N good steps), that power-of-two scaling
// leaves an fp32 run's weights bit for bit unchanged, that an injected overflow is absorbed, and that a
// resumed run carries the dynamic scale on.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "actlab/io/safetensors.h"
#include "actlab/layers/optim/loss_scale.h"
#include "actlab/train/checkpoint.h"
#include "actlab/train/config.h"
#include "actlab/train/trainer.h"
#include "error_of.h"
#include "temp_dir.h"

using namespace actlab;
using actlab::testing::error_of;

namespace {

TrainConfig tiny_run(const std::string& loss_scale) {
  TrainConfig c;
  c.dataset = "synthetic";
  c.synthetic_size = 256;
  c.batch_size = 32;  // 8 steps per epoch
  c.epochs = 2;
  c.threads = 1;
  c.seed = 5;
  c.quiet = true;
  c.loss_scale = loss_scale;
  return c;
}

// Number of tensors (weights, buffers, momentum) whose bytes differ between two checkpoints.
int differing_tensors(const std::string& a_path, const std::string& b_path) {
  const SafetensorsFile a = read_safetensors(a_path), b = read_safetensors(b_path);
  REQUIRE(a.tensors.size() == b.tensors.size());
  int differing = 0;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const Tensor& x = a.tensors[i].second;
    const Tensor& y = b.tensors[i].second;
    REQUIRE(a.tensors[i].first == b.tensors[i].first);
    REQUIRE(x.nbytes() == y.nbytes());
    differing += std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0 ? 0 : 1;
  }
  return differing;
}

}  // namespace

TEST_CASE("loss scale: the forms, their names, and one clear error for the rest") {
  CHECK(parse_loss_scale("none").mode == LossScaleOptions::Mode::None);
  const LossScaleOptions d = parse_loss_scale("dynamic");
  CHECK(d.mode == LossScaleOptions::Mode::Dynamic);
  CHECK(d.init == 65536);
  CHECK(d.interval == 2000);
  const LossScaleOptions e = parse_loss_scale("dynamic:init=1024,interval=7");
  CHECK(e.init == 1024);
  CHECK(e.interval == 7);
  CHECK(loss_scale_name(e) == "dynamic:init=1024,interval=7");
  CHECK(parse_loss_scale(loss_scale_name(e)).interval == 7);
  const LossScaleOptions s = parse_loss_scale("0.5");
  CHECK(s.mode == LossScaleOptions::Mode::Static);
  CHECK(s.init == 0.5);
  CHECK(loss_scale_name(s) == "0.5");
  CHECK(error_of([] { parse_loss_scale("1000"); }).find("power of two") != std::string::npos);
  CHECK(error_of([] { parse_loss_scale("dynamic:init=3"); }).find("power of two") != std::string::npos);
  CHECK(error_of([] { parse_loss_scale("dynamic:interval=0"); }).find("interval") != std::string::npos);
  CHECK(error_of([] { parse_loss_scale("dynamic:growth=2"); }).find("unknown key 'growth'") != std::string::npos);
  CHECK(error_of([] { parse_loss_scale("dynamic:init=65536,init=2"); }).find("'init' is given twice") !=
        std::string::npos);
  CHECK(error_of([] { parse_loss_scale("dynamic:"); }).find("nothing after") != std::string::npos);
  CHECK(error_of([] { parse_loss_scale("auto-ish"); }).find("is not one of") != std::string::npos);
  CHECK(error_of([] { parse_loss_scale("0x1p70"); }).find("is not one of") != std::string::npos);
  CHECK(error_of([] { parse_loss_scale("1e30"); }).find("power of two") != std::string::npos);
  TrainConfig c;
  c.loss_scale = "3";
  CHECK(error_of([&] { validate(c); }).find("--loss-scale") != std::string::npos);
}

TEST_CASE("loss scale: dynamic halves on overflow, doubles after the interval, stops halving at its floor") {
  LossScaleOptions o = parse_loss_scale("dynamic:init=8,interval=3");
  LossScaler s(o);
  CHECK(s.scale() == 8);
  CHECK(s.update(false));
  CHECK(s.update(false));
  CHECK(s.scale() == 8);
  CHECK(s.update(false));  // the third good step in a row
  CHECK(s.scale() == 16);
  CHECK(s.good_steps() == 0);
  CHECK(s.update(false));
  CHECK(s.absorbs_overflow());
  CHECK_FALSE(s.update(true));  // skipped, halved, the count starts again
  CHECK(s.scale() == 8);
  CHECK(s.good_steps() == 0);
  CHECK(s.overflow_skips() == 1);
  for (int i = 0; i < 3; ++i) CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 1);  // the floor: an overflow there is a non-finite gradient, not the scale's
  CHECK_FALSE(s.absorbs_overflow());
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 1);
  CHECK(s.overflow_skips() == 4);

  LossScaler fixed(parse_loss_scale("256"));
  CHECK(fixed.enabled());
  CHECK_FALSE(fixed.absorbs_overflow());
  for (int i = 0; i < 5000; ++i) fixed.update(false);
  CHECK(fixed.scale() == 256);
  LossScaler off(parse_loss_scale("none"));
  CHECK_FALSE(off.enabled());
  CHECK(off.scale() == 1);
  CHECK(error_of([&] { s.restore(3, 0); }).find("power of two") != std::string::npos);
}

TEST_CASE("loss scale: unscale divides every gradient exactly and skips undefined ones") {
  Variable a(Tensor::from_vector({1.5f, -3.0f, 1e-30f, 7e30f}, {4}), true);
  Variable b(Tensor::from_vector({2.0f}, {1}), true);  // no gradient
  a.impl()->grad = Tensor::from_vector({1.5f * 1024, -3.0f * 1024, 1e-30f * 1024, 7e30f * 1024}, {4});
  a.impl()->grad_stale = false;  // as a backward leaves it
  LossScaler s(parse_loss_scale("1024"));
  s.unscale({a, b});
  const float* g = a.grad().data<float>();
  CHECK(g[0] == 1.5f);
  CHECK(g[1] == -3.0f);
  CHECK(g[2] == 1e-30f);
  CHECK(g[3] == 7e30f);
  CHECK_FALSE(b.grad().defined());
}

TEST_CASE("loss scale: an fp32 run with a dynamic or static scale ends with the unscaled run's weights, bit for bit") {
  testing::TempDir dir("loss_scale");
  TrainConfig plain = tiny_run("none");
  plain.save_dir = dir.file("none");
  const TrainSummary s0 = train(plain);
  for (const std::string form : {"dynamic:interval=5", "4096"}) {
    CAPTURE(form);
    TrainConfig scaled = tiny_run(form);
    scaled.save_dir = dir.file(form.substr(0, 4));
    const TrainSummary s1 = train(scaled);
    CHECK(s1.overflow_skips == 0);
    CHECK(s1.final_test_acc == s0.final_test_acc);
    CHECK(differing_tensors(dir.file("none/last.safetensors"), scaled.save_dir + "/last.safetensors") == 0);
  }
  CHECK(s0.loss_scale == 1);
}

TEST_CASE("loss scale: an overflowing step is skipped and halves the scale, and without a scaler the run stops") {
  TrainConfig c = tiny_run("dynamic:interval=4");
  c.inject_nan_step = 3;  // global step 3's last gradient holds a NaN: what an fp16 overflow looks like
  c.inject_nan_into = "grad";
  const TrainSummary s = train(c);
  CHECK(s.overflow_skips == 1);
  CHECK(s.skipped_steps == 0);  // the scaler's skip, not the non-finite guard's
  // 65536 halved at step 3, then 13 good steps: doubled after steps 7, 11 and 15.
  CHECK(s.loss_scale == 65536.0 / 2 * 8);
  CHECK(s.steps == 16);
  CHECK(std::isfinite(s.epochs.back().train_loss));
  // At the floor (init=1) the same NaN is the run's non-finite gradient, which stops it.
  TrainConfig floor = c;
  floor.loss_scale = "dynamic:init=1";
  CHECK(error_of([&] { train(floor); }).find("non-finite gradient at epoch 1 step 3") != std::string::npos);
  TrainConfig none = c;
  none.loss_scale = "none";
  CHECK(error_of([&] { train(none); }).find("non-finite gradient") != std::string::npos);
}

TEST_CASE("loss scale: a resumed dynamic run carries the scale and its good-step count on, bit-identical") {
  testing::TempDir dir("loss_scale_resume");
  TrainConfig base = tiny_run("dynamic:init=256,interval=3");
  base.epochs = 3;
  base.inject_nan_step = 2;
  base.inject_nan_into = "grad";
  base.save_dir = dir.file("full");
  const TrainSummary full = train(base);
  TrainConfig first = base;
  first.save_dir = dir.file("part");
  first.stop_after_steps = 10;  // inside epoch 2, between two doublings
  const TrainSummary s1 = train(first);
  REQUIRE(s1.interrupted);
  const TrainState st = checkpoint_state(read_safetensors(dir.file("part/last.safetensors")));
  // 256 halved at step 2, then 8 good steps: doubled after steps 5 and 8, 2 steps towards the next.
  CHECK(st.loss_scale == 128 * 4);
  CHECK(st.loss_scale_good_steps == 2);
  TrainConfig second = base;
  second.save_dir = dir.file("part");
  second.resume = dir.file("part/last.safetensors");
  const TrainSummary s2 = train(second);
  CHECK(s2.loss_scale == full.loss_scale);
  CHECK(differing_tensors(dir.file("full/last.safetensors"), dir.file("part/last.safetensors")) == 0);
}
