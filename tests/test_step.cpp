// train/step.h: run_step's hooks (a refused loss skips backward and the update, a refused gradient the
// update alone), its saves report, and the activation measure's rules (the caller's data-loader
// batches never count; the same step measures the same bytes every time).
#include <doctest/doctest.h>

#include <cmath>

#include "actlab/autograd/saved_tensor.h"
#include "actlab/autograd/tape.h"
#include "actlab/core/philox.h"
#include "actlab/layers/optim/sgd.h"
#include "actlab/models/registry.h"
#include "actlab/train/memtable.h"
#include "actlab/train/paper_reference.h"
#include "actlab/train/step.h"

using namespace actlab;

namespace {

struct Fixture {
  std::shared_ptr<Module> model;
  std::unique_ptr<Sgd> opt;
  Tensor x, y;
  explicit Fixture(const std::string& name = "resnet20") {
    seed_init(3);
    set_pack_seed(3);
    model = make_model({name, 1, 10, 16});
    opt = std::make_unique<Sgd>(model->parameters(), SgdOptions{0.1f, 0.9f, 0.f, 5e-4f, false});
    PhiloxStream rng(3, 1);
    MemTagScope tag(MemTag::Data);
    x = Tensor::randn({8, 1, 16, 16}, rng);
    y = Tensor::empty({8}, DType::I64);
    for (int64_t i = 0; i < 8; ++i) y.data<int64_t>()[i] = i % 10;
  }
  Tensor first_weight() const { return model->parameters().front().data().clone(); }
};

bool same(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) return false;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (a.data<float>()[i] != b.data<float>()[i]) return false;
  return true;
}

}  // namespace

TEST_CASE("run_step: a full step updates the weights and reports loss, accuracy and the measure") {
  Fixture f;
  const PolicySet exact;
  const Tensor w0 = f.first_weight();
  const StepResult r = run_step(*f.model, f.opt.get(), exact, f.x, f.y);
  CHECK(r.backward_done);
  CHECK(r.updated);
  CHECK(std::isfinite(r.loss));
  CHECK(r.correct >= 0);
  CHECK(r.correct <= 8);
  CHECK_FALSE(same(w0, f.first_weight()));
  CHECK(r.activation_bytes > static_cast<int64_t>(f.x.nbytes()));  // the input plus what the layers keep
  CHECK(r.total_after_forward > r.total_before);
  CHECK(Tape::current().size() == 0);
}

TEST_CASE("run_step: a step that throws leaves nothing on the tape") {
  Fixture f;
  const PolicySet exact;
  Tensor bad = f.y.clone();
  bad.data<int64_t>()[0] = 99;  // a label past the 10 classes: cross_entropy throws after the forward
  CHECK_THROWS_AS(run_step(*f.model, f.opt.get(), exact, f.x, bad), Error);
  CHECK(Tape::current().size() == 0);
  // A step that succeeds ends exactly one pack step (its stochastic rounding and acgc's measuring
  // interval count steps by it).
  const uint64_t before = pack_step();
  run_step(*f.model, f.opt.get(), exact, f.x, f.y);
  CHECK(pack_step() == before + 1);
  // So does one whose backward throws part way (a weight written in place after the forward saved it):
  // backward clears the tape and ends the step, and run_step's own clear on error does not end another.
  StepOptions o;
  o.after_forward = [&](float) {
    f.model->parameters().front().data().mul_(2.f);
    return true;
  };
  const uint64_t at = pack_step();
  CHECK_THROWS_WITH_AS(run_step(*f.model, f.opt.get(), exact, f.x, f.y, o), doctest::Contains("modified in place"), Error);
  CHECK(Tape::current().size() == 0);
  CHECK(pack_step() == at + 1);
}

TEST_CASE("run_step: after_forward false ends the step before backward, before_update false skips the update") {
  Fixture f;
  const PolicySet exact;
  const Tensor w0 = f.first_weight();
  StepOptions no_loss;
  float seen = -1;
  no_loss.after_forward = [&](float loss) { seen = loss; return false; };
  const int64_t live = memory_stats().total.current;
  StepResult r = run_step(*f.model, f.opt.get(), exact, f.x, f.y, no_loss);
  CHECK(seen == r.loss);
  CHECK_FALSE(r.backward_done);
  CHECK_FALSE(r.updated);
  CHECK(same(w0, f.first_weight()));
  CHECK(Tape::current().size() == 0);
  CHECK(memory_stats().total.current == live);  // nothing the forward kept is left

  StepOptions no_update;
  no_update.before_update = [] { return false; };
  r = run_step(*f.model, f.opt.get(), exact, f.x, f.y, no_update);
  CHECK(r.backward_done);
  CHECK_FALSE(r.updated);
  CHECK(same(w0, f.first_weight()));
  CHECK(f.model->parameters().front().grad().defined());  // the gradient is there for the guard to read

  r = run_step(*f.model, nullptr, exact, f.x, f.y);  // no optimizer: gradients only
  CHECK(r.backward_done);
  CHECK_FALSE(r.updated);
  CHECK(same(w0, f.first_weight()));
}

TEST_CASE("run_step: the measure ignores the caller's data batches, and a repeated step measures the same") {
  Fixture f;
  const PolicySet division(parse_policy("division:B=4,Q=2"));
  const int64_t first = run_step(*f.model, f.opt.get(), division, f.x, f.y).activation_bytes;
  Tensor prefetched;
  {
    MemTagScope tag(MemTag::Data);  // as the data loader's next batch would be
    prefetched = Tensor::empty({64, 1, 16, 16});
  }
  const int64_t second = run_step(*f.model, f.opt.get(), division, f.x, f.y).activation_bytes;
  CHECK(second == first);
  const PolicySet exact;
  const int64_t exact_bytes = run_step(*f.model, f.opt.get(), exact, f.x, f.y).activation_bytes;
  CHECK(exact_bytes > 2 * first);  // DIVISION keeps far less
}

TEST_CASE("run_step: record_saves reports every save, totals its lossy ones and restores the recording state") {
  Fixture f;
  const PolicySet division(parse_policy("division:B=4,Q=2"));
  CacheStats::global().set_enabled(false);
  StepOptions so;
  so.record_saves = true;
  const StepResult r = run_step(*f.model, f.opt.get(), division, f.x, f.y, so);
  CHECK_FALSE(CacheStats::global().enabled());
  REQUIRE_FALSE(r.saves.empty());
  SavedBytes lossy;
  int64_t exact_saves = 0;
  for (const auto& e : r.saves) {
    if (e.lossy) {
      lossy.raw += e.bytes_raw;
      lossy.packed += e.bytes_packed;
      lossy.expected += e.bytes_expected;
    } else {
      ++exact_saves;  // ReLU masks, cross-entropy probabilities
    }
  }
  CHECK(exact_saves > 0);
  CHECK(r.saved.raw == lossy.raw);
  CHECK(r.saved.packed == lossy.packed);
  CHECK(r.saved.expected == lossy.expected);
  CHECK(r.saved.packed < r.saved.raw / 8);
  CacheStats::global().set_enabled(true);
  const StepResult quiet = run_step(*f.model, f.opt.get(), division, f.x, f.y);
  CHECK(quiet.saves.empty());
  CHECK(quiet.saved.raw == 0);
}

TEST_CASE("measure_step_memory: the memory table's cell is one run_step, kept bytes equal the closed form") {
  const int64_t live = memory_stats().total.current;
  StepMemoryConfig c;
  c.model = "resnet20";
  c.batch = 8;
  c.in_channels = 1;
  c.image_size = 16;
  c.policy = "exact";
  const StepMemoryResult exact = measure_step_memory(c);
  c.policy = "division:B=4,Q=2";
  const StepMemoryResult division = measure_step_memory(c);
  CHECK(memory_stats().total.current == live);  // everything it allocated is gone
  for (const StepMemoryResult* r : {&exact, &division}) {
    CHECK(r->activation_bytes > 0);
    CHECK(r->total_bytes > r->activation_bytes + r->model_only_bytes / 2);  // weights, gradients, momentum
    CHECK(r->peak_bytes >= r->activation_bytes);
    CHECK(r->saved_packed_bytes == r->saved_expected_bytes);
  }
  CHECK(exact.saved_packed_bytes == exact.saved_raw_bytes);
  CHECK(division.saved_raw_bytes == exact.saved_raw_bytes);  // the same tensors were offered
  CHECK(division.activation_bytes * 3 < exact.activation_bytes);
  CHECK(division.model_only_bytes == exact.model_only_bytes);
  // The by-kind view adds up to the totals: lossy kinds to the policy's figures.
  for (const StepMemoryResult* r : {&exact, &division}) {
    int64_t raw = 0, packed = 0;
    bool conv_inputs = false, masks = false;
    for (const SaveKindBytes& k : r->by_kind) {
      if (k.lossy) raw += k.raw, packed += k.packed;
      conv_inputs = conv_inputs || (k.op == "conv2d.input" && k.lossy);
      masks = masks || (k.op == "add_relu.mask" && !k.lossy && k.packed == k.raw);
    }
    CHECK(raw == r->saved_raw_bytes);
    CHECK(packed == r->saved_packed_bytes);
    CHECK(conv_inputs);
    CHECK(masks);
  }
  // The same step through run_step directly measures the same activation bytes.
  seed_init(c.seed);
  set_pack_seed(c.seed);
  auto model = make_model({c.model, c.in_channels, c.num_classes, c.image_size});
  Sgd opt(model->parameters(), {0.01f, 0.9f, 0.f, 5e-4f, false});
  Tensor x, y;
  random_batch(c, &x, &y);
  const PolicySet set(parse_policy(c.policy));
  CHECK(run_step(*model, &opt, set, x, y).activation_bytes == division.activation_bytes);
}

TEST_CASE("paper reference: Table 1(a) cells and the paper's name for each policy string") {
  const PaperMemory* normal = paper_table_1a("Normal", "resnet50_imagenet", 64);
  REQUIRE(normal != nullptr);
  CHECK(normal->activation_gb == doctest::Approx(5.14));
  CHECK(paper_table_1a("DIVISION", "wrn50_2_imagenet", 128)->total_gb == doctest::Approx(2.12));
  CHECK(paper_table_1a("Normal", "resnet50_imagenet", 512)->total_gb < 0);  // OOM in the paper
  CHECK(paper_table_1a("DIVISION", "resnet18", 64) == nullptr);
  // Fig. 7's throughput: a cell, an OOM, a missing one.
  CHECK(paper_throughput("DIVISION", "resnet50_imagenet", 256) == doctest::Approx(380.72));
  CHECK(paper_throughput("Normal", "wrn50_2_imagenet", 64) == doctest::Approx(286.89));
  CHECK(paper_throughput("Normal", "resnet50_imagenet", 512) < 0);
  CHECK(std::isnan(paper_throughput("SWAP", "resnet50_imagenet", 256)));
  CHECK(std::isnan(paper_throughput("DIVISION", "resnet50_imagenet", 32)));
  CHECK(paper_method_name("exact") == "Normal");
  CHECK(paper_method_name("division:B=8,Q=2") == "DIVISION");
  CHECK(paper_method_name("checkpoint:segments=4") == "Checkpoint");
  CHECK(paper_method_name("checkpoint+division:B=8,Q=2") == "Checkpoint+DIVISION");
  CHECK(paper_method_name("quant:Q=2") == "quant:Q=2");
}
