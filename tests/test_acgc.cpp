// acgc (compress/acgc.h): parsing, the width the bound gives, bytes = the closed form at the chosen
// width, the nodes' sensitivity reports, a short training run, and run-to-run determinism.
#include <doctest/doctest.h>

#include <cmath>

#include "actlab/autograd/functions.h"
#include "actlab/autograd/saved_tensor.h"
#include "actlab/compress/acgc.h"
#include "actlab/layers/optim/sgd.h"
#include "actlab/models/registry.h"
#include "checked_training.h"

using namespace actlab;

namespace {
Tensor random_map(const Shape& shape, uint64_t seed, float scale = 1.f) {
  PhiloxStream rng(seed, 7);
  return Tensor::randn(shape, rng, 0.f, scale);
}

std::shared_ptr<const AcgcPolicy> make_acgc(const std::string& spec) {
  auto p = std::dynamic_pointer_cast<const AcgcPolicy>(parse_policy(spec));
  REQUIRE(p != nullptr);
  return p;
}

int bits_of(const AcgcPolicy& p, const std::string& key) {
  for (const auto& l : p.layer_bits())
    if (l.key == key) return l.bits;
  return 0;
}
}  // namespace

TEST_CASE("acgc: parses with defaults, round-trips its name, rejects bad parameters in one line") {
  CHECK(parse_policy("acgc")->name() == "acgc:E=0,I=100,G=256");
  CHECK(parse_policy("acgc:E=8,I=10")->name() == "acgc:E=8,I=10,G=256");
  CHECK(parse_policy("acgc:G=64,E=2")->name() == "acgc:E=2,I=100,G=64");
  CHECK(parse_policy(parse_policy("acgc:E=3,I=7,G=5")->name())->name() == "acgc:E=3,I=7,G=5");
  for (const char* bad : {"acgc:E=61", "acgc:I=0", "acgc:G=0", "acgc:Q=2", "acgc:E=", "acgc:E=-1", "acgc:E=1,E=2",
                          "acgc:", "acgc:B=8", "acgc:E=1.5"}) {
    CAPTURE(bad);
    try {
      parse_policy(bad);
      FAIL("accepted");
    } catch (const Error& e) {
      const std::string message = e.what();
      CHECK(message.find("acgc:E=0,I=100,G=256") != std::string::npos);
      CHECK(message.find('\n') == std::string::npos);
    }
  }
  CHECK(policy_forms().find("acgc:E=0,I=100,G=256") != std::string::npos);
}

TEST_CASE("acgc: the width is the smallest of {2,4,8} whose rounding error fits the budget") {
  // error G·R/4 against budget·(2^b − 1)²: 9, 225, 65025 budgets.
  CHECK(acgc_width(1.0, 4, 1.0) == 2);        // error 1: 1 bit would fit, but 2 is the narrowest
  CHECK(acgc_width(8.0, 4, 1.0) == 2);        // error 8 <= 9
  CHECK(acgc_width(10.0, 4, 1.0) == 4);       // error 10 > 9
  CHECK(acgc_width(224.0, 4, 1.0) == 4);
  CHECK(acgc_width(226.0, 4, 1.0) == 8);
  CHECK(acgc_width(1e12, 4, 1.0) == 8);       // beyond the codec: its widest
  CHECK(acgc_width(0.0, 4, 1.0) == AcgcPolicy::kMinBits);        // a constant tensor
  CHECK(acgc_width(1.0, 4, INFINITY) == AcgcPolicy::kMinBits);   // no sensitivity: nothing to protect
  CHECK(acgc_width(NAN, 4, 1.0) == 8);
  CHECK(acgc_width(1.0, 4, NAN) == 8);
  CHECK(acgc_width(1.0, 4, 0.0) == 8);
}

TEST_CASE("acgc: a layer with a larger gradient sensitivity gets more bits, bytes = closed form at its width") {
  const auto policy = make_acgc("acgc:E=0,I=4,G=256");
  const Shape shape{8, 4, 8, 8};
  const Tensor x = random_map(shape, 3);
  const SaveInfo a{"conv2d", "input", true, "a"}, b{"conv2d", "input", true, "b"};
  // pergroup's closed form at width q: N·ceil(D/G)·(ceil(G·q/8) + 4), D = 256.
  const auto closed = [](int q) { return static_cast<size_t>(8 * 1 * (256 * q / 8 + 4)); };
  const auto pack_both = [&](uint64_t step) {
    for (const SaveInfo* info : {&a, &b}) {
      const auto packed = policy->pack(x, *info, {5, step, step});
      const int q = bits_of(*policy, info->module_path + "/conv2d/input");
      CAPTURE(q);
      CHECK((q == 2 || q == 4 || q == 8));
      CHECK(packed->nbytes() == closed(q));
      CHECK(policy->layer_expected_bytes(shape, *info) == packed->nbytes());
      CHECK(policy->bytes_at(shape, q) == packed->nbytes());
      // Inside the codec's bound: within one stored step of x.
      const auto* groups = dynamic_cast<const PackedGroups*>(packed.get());
      REQUIRE(groups != nullptr);
      CHECK(groups->geometry().bits == q);
      const std::vector<float> got = policy->unpack(*packed, *info).to_vector(), want = x.to_vector();
      for (size_t i = 0; i < got.size(); ++i) {
        const float step_of = bf16_to_float(groups->steps()[i / 256]);
        if (!(std::fabs(got[i] - want[i]) <= step_of * 1.0001f)) FAIL_CHECK("element ", i, " off by more than a step");
      }
    }
  };
  pack_both(0);  // no measurement yet: the initial width
  CHECK(bits_of(*policy, "a/conv2d/input") == AcgcPolicy::kInitialBits);
  CHECK(policy->wants_gradient_sensitivity(a));
  GroupGeometry g;
  REQUIRE(PerGroupPolicy(256, 8).group_view(shape, g));
  double range_norm_sum = 0;
  for (const double r : sample_range_norms(x, g)) range_norm_sum += r;
  const double error = 256 * range_norm_sum / 4;  // the codec's squared error at 1 bit
  // Budgets error/5 (needs (2^b − 1)² >= 5: 2 bits) and error/1000 (needs >= 1000: 8 bits), with E = 0.
  policy->observe_gradient_sensitivity(a, {5.0, error});
  policy->observe_gradient_sensitivity(b, {1000.0, error});
  pack_both(1);
  CHECK(bits_of(*policy, "a/conv2d/input") == 2);
  CHECK(bits_of(*policy, "b/conv2d/input") == 8);
  CHECK(!policy->wants_gradient_sensitivity(a));  // step 1 is not a multiple of I = 4
  policy->observe_gradient_sensitivity(a, {1e9, 1.0});  // not asked for: ignored
  pack_both(2);
  CHECK(bits_of(*policy, "a/conv2d/input") == 2);
  // A wider range needs more bits for the same budget (AC-GC's scale term).
  policy->pack(random_map(shape, 3, 16.f), a, {5, 3, 3});
  CHECK(bits_of(*policy, "a/conv2d/input") == 8);
  pack_both(4);  // a measuring step again; two consumers' reports add up (pack once)
  CHECK(policy->wants_gradient_sensitivity(a));
  policy->observe_gradient_sensitivity(a, {100.0, error});
  policy->observe_gradient_sensitivity(a, {100.0, error});
  pack_both(5);  // history: (5, error), (200, 2·error): budget 3·error/205 → needs >= 68.3: 4 bits
  CHECK(bits_of(*policy, "a/conv2d/input") == 4);
  const double mean_bits = (4.0 + 8.0) / 2;
  CHECK(policy->average_bits() == doctest::Approx(mean_bits));
  const std::vector<AcgcPolicy::WidthChange> changes = policy->width_changes();
  REQUIRE(changes.size() >= 4);
  CHECK(changes.front().step == 0);
  CHECK(changes.front().bits == 8);
  CHECK(changes.back().step == 5);
  CHECK(changes.back().bits == 4);
}

TEST_CASE("acgc: nodes report their sensitivity when asked, ResNet-20 trains, two runs choose the same widths") {
  PhiloxStream rng(21);
  const Tensor x = Tensor::randn({16, 1, 16, 16}, rng);
  Tensor labels = Tensor::empty({16}, DType::I64);
  for (int64_t i = 0; i < 16; ++i) labels.data<int64_t>()[i] = (7 * i + 3) % 10;
  struct Run {
    std::vector<AcgcPolicy::WidthChange> changes;
    std::vector<double> losses;
    std::vector<double> average_bits;
  };
  const auto train = [&](const std::string& spec) {
    seed_init(0);
    set_pack_seed(0);
    set_pack_step(0);
    auto model = make_model({"resnet20", 1, 10, 16});
    Sgd opt(model->parameters(), {0.05f, 0.9f, 0.f, 0.f, false});
    const auto policy = make_acgc(spec);
    const PolicySet set(policy);
    Run run;
    run.losses = actlab::testing::train_checked(*model, opt, set, x, labels, 20, true,
                                                [&] { run.average_bits.push_back(policy->average_bits()); });
    // Every conv and batch-norm input was measured (the stem's input too), and every width is a codec width.
    const std::vector<AcgcPolicy::LayerBits> layers = policy->layer_bits();
    CHECK(layers.size() >= 19 + 19);
    for (const auto& l : layers) {
      CAPTURE(l.key);
      CHECK((l.bits == 2 || l.bits == 4 || l.bits == 8));
      if (l.key.find("/conv2d/") != std::string::npos || l.key.find("/batchnorm2d/") != std::string::npos)
        CHECK(l.measurements >= 1);
    }
    run.changes = policy->width_changes();
    return run;
  };
  const Run first = train("acgc:E=0,I=5");
  MESSAGE("acgc:E=0,I=5 on ResNet-20: loss ", first.losses.front(), " -> ", first.losses.back(), ", average bits ",
          first.average_bits.front(), " (step 0) -> ", first.average_bits.back(), ", ", first.changes.size(),
          " width changes");
  double tail = 0;
  for (int s = 15; s < 20; ++s) tail += first.losses[static_cast<size_t>(s)] / 5;
  CHECK(tail < 0.3 * first.losses.front());
  CHECK(first.average_bits.front() == doctest::Approx(AcgcPolicy::kInitialBits));  // before any measurement
  CHECK(first.average_bits.back() < AcgcPolicy::kInitialBits);                       // the bound chose narrower

  const Run second = train("acgc:E=0,I=5");
  CHECK(second.losses == first.losses);
  CHECK(second.average_bits == first.average_bits);
  REQUIRE(second.changes.size() == first.changes.size());
  for (size_t i = 0; i < first.changes.size(); ++i) {
    CHECK(second.changes[i].step == first.changes[i].step);
    CHECK(second.changes[i].key == first.changes[i].key);
    CHECK(second.changes[i].bits == first.changes[i].bits);
  }

  // A tighter budget (E = 8: e = 2^-8) never chooses narrower widths on average.
  const Run tight = train("acgc:E=8,I=5");
  CHECK(tight.average_bits.back() >= first.average_bits.back());
}
