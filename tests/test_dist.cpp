// Data-parallel training (dist/, train/distributed.h): the distributed sampler, bucket assignment, the
// tape's grad-ready hook, the reducer's averaging and overlap with a one-process communicator, and,
// through mpirun and the real actlab-train, 2 ranks against 1, resume, world-size and NaN agreement.
// The kill-a-rank case is tests/cli/dist_fault.sh. Without mpirun or an MPI build the mpirun cases
// skip visibly (tests/prerequisite.h).
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <map>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include "actlab/autograd/functions.h"
#include "actlab/autograd/saved_tensor.h"
#include "actlab/compress/policy.h"
#include "actlab/autograd/tape.h"
#include "actlab/data/dataloader.h"
#include "actlab/data/dataset.h"
#include "actlab/dist/communicator.h"
#include "actlab/dist/reducer.h"
#include "actlab/dist/scale_model.h"
#include "actlab/dist/sync_batch_norm.h"
#include "actlab/io/safetensors.h"
#include "actlab/models/registry.h"
#include "tests/error_of.h"
#include "tests/prerequisite.h"
#include "tests/reducer_step.h"
#include "tests/run_command.h"
#include "tests/temp_dir.h"

using namespace actlab;
namespace fs = std::filesystem;

namespace {

Variable param(const Shape& shape, uint64_t seed) {
  PhiloxStream rng(seed, 0);
  return Variable(Tensor::randn(shape, rng), true);
}

// A stand-in for W identical ranks: every sum multiplies by W (the sum of W equal copies), and each
// asynchronous start records how many nodes were still on the tape, i.e. whether backward was still running.
class EchoCommunicator : public LocalCommunicator {
 public:
  explicit EchoCommunicator(int world) : world_(world) {}
  int world_size() const override { return world_; }
  std::unique_ptr<CollectiveWork> allreduce_sum_async(Tensor t) override {
    tape_left_at_start.push_back(Tape::current().size());
    t.mul_(static_cast<float>(world_));
    return LocalCommunicator::allreduce_sum_async(t);
  }
  void allreduce(std::vector<double>& values, ReduceOp op) override {
    if (op == ReduceOp::Sum)
      for (double& v : values) v *= world_;
  }
  std::vector<size_t> tape_left_at_start;
 private:
  int world_;
};

using Output = testing::CommandOutput;
Output run(const std::string& command) { return testing::run_command(command); }
std::string train_bin() { return testing::app_bin("actlab-train"); }

bool have_mpirun() {
  const bool ok = mpi_built() && run("command -v mpirun").rc == 0;
  return testing::have_prerequisite(ok, "mpirun (openmpi-bin) and a build with MPI (libopenmpi-dev; scripts/setup.sh)");
}

// mpirun for a 2-core test machine, as root where CI runs: --oversubscribe lets 2 ranks share fewer
// cores, passive OpenMP waits keep them from spinning against each other.
std::string mpirun(int ranks) {
  return "OMP_WAIT_POLICY=passive mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) + " ";
}

// A quick run on synthetic data; the MLP (no batch norm, no dropout) by default: a rank's gradient is
// the mean over its part of the global batch, so 2 ranks of b must match 1 rank of 2b.
std::string tiny_run(const std::string& extra, const std::string& model = "mlp") {
  return " --model " + model + " --dataset synthetic --synthetic-size 512 --threads 1 --test-limit 64 --quiet "
         "--no-augment --dist-timeout 60 " + extra;
}

using Weights = std::map<std::string, std::vector<float>>;

// The f32 tensors of a safetensors export, by name.
Weights weights(const std::string& path) {
  Weights w;
  for (const auto& t : read_safetensors(path).tensors)
    if (t.second.dtype() == DType::F32) w[t.first] = t.second.to_vector();
  return w;
}

// The weights a --distributed run launched by `launch` (mpirun(N)) exports to dir/name.
Weights trained_weights(const fs::path& dir, const std::string& launch, const std::string& args,
                        const std::string& name) {
  const std::string path = (dir / name).string();
  const Output o = run(launch + train_bin() + " --distributed" + args + " --export-weights " + path);
  REQUIRE_MESSAGE(o.rc == 0, o.text);
  return weights(path);
}

// The largest |a - b| over every value of two exports of the same model.
float max_abs_diff(const Weights& a, const Weights& b) {
  REQUIRE(a.size() == b.size());
  float d = 0;
  for (const auto& kv : a) {
    const std::vector<float>& y = b.at(kv.first);
    REQUIRE(kv.second.size() == y.size());
    for (size_t i = 0; i < y.size(); ++i) d = std::max(d, std::abs(kv.second[i] - y[i]));
  }
  return d;
}

}  // namespace

TEST_CASE("dist: the shards of an epoch are disjoint, equal in size, and together cover the permutation (or all of it)") {
  InMemoryImageDataset data = make_synthetic_dataset(103, 1, 4, 4, 3, 7);
  DataLoader full(data, 5, true, 11, true);
  const std::vector<int64_t> order = full.epoch_order(2);
  for (int64_t world : {1, 2, 3, 4}) {
    std::set<int64_t> seen;
    for (int64_t rank = 0; rank < world; ++rank) {
      const std::vector<int64_t> shard = shard_order(order, rank, world);
      CHECK(static_cast<int64_t>(shard.size()) == 103 / world);
      for (int64_t i : shard) CHECK_MESSAGE(seen.insert(i).second, "index ", i, " in two shards");
    }
    // What is left out is the permutation's tail, fewer than `world` samples.
    const std::set<int64_t> head(order.begin(), order.begin() + (103 / world) * world);
    CHECK(seen == head);
    // Keeping the tail (evaluation): the shards partition the whole order.
    std::multiset<int64_t> every;
    for (int64_t rank = 0; rank < world; ++rank)
      for (int64_t i : shard_order(order, rank, world, true)) every.insert(i);
    CHECK(every == std::multiset<int64_t>(order.begin(), order.end()));
  }
  CHECK_THROWS_WITH_AS(shard_order(order, 2, 2), doctest::Contains("rank < world"), Error);
}

TEST_CASE("dist: a sharded loader's batch k on every rank together is batch k of one loader with the global batch") {
  InMemoryImageDataset data = make_synthetic_dataset(64, 1, 4, 4, 10, 3);
  DataLoader global(data, 8, true, 5, true);
  DataLoader rank0(data, 4, true, 5, true), rank1(data, 4, true, 5, true);
  rank0.shard(0, 2);
  rank1.shard(1, 2);
  CHECK(rank0.num_batches() == global.num_batches());
  for (DataLoader* l : {&global, &rank0, &rank1}) l->start_epoch(1);
  Batch g, a, b;
  while (global.next(g)) {
    REQUIRE(rank0.next(a));
    REQUIRE(rank1.next(b));
    // Strided shards: global sample 2i is rank 0's i-th, 2i+1 rank 1's.
    const auto gi = g.images.to_vector(), ai = a.images.to_vector(), bi = b.images.to_vector();
    const size_t image = gi.size() / 8;
    for (size_t i = 0; i < 4; ++i) {
      CHECK(std::equal(ai.begin() + i * image, ai.begin() + (i + 1) * image, gi.begin() + 2 * i * image));
      CHECK(std::equal(bi.begin() + i * image, bi.begin() + (i + 1) * image, gi.begin() + (2 * i + 1) * image));
    }
  }
  CHECK_FALSE(rank0.next(a));
  CHECK_THROWS_WITH_AS(DataLoader(data, 40, true, 5, true).shard(0, 2), doctest::Contains("fewer than the batch size"),
                       Error);
  // Evaluation keeps the tail: a split of 3 over 4 ranks leaves rank 3 nothing, and it yields no batch
  // instead of refusing the job.
  InMemoryImageDataset three = make_synthetic_dataset(3, 1, 4, 4, 10, 3);
  int64_t seen = 0;
  for (int64_t rank = 0; rank < 4; ++rank) {
    DataLoader eval(three, 2, false, 5, false);
    eval.shard(rank, 4);
    CHECK(eval.num_batches() == (rank < 3 ? 1 : 0));
    eval.start_epoch(0);
    for (Batch b; eval.next(b);) seen += b.labels.size(0);
  }
  CHECK(seen == 3);
}

TEST_CASE("dist: buckets take parameters last to first, close at the cap, and hold every parameter once") {
  // Bytes per parameter, registration order.
  const std::vector<int64_t> bytes = {400, 100, 100, 300, 50, 1000, 20};
  const auto buckets = assign_buckets(bytes, 500);
  const std::vector<std::vector<size_t>> expected = {{6}, {5}, {4, 3, 2}, {1, 0}};
  CHECK(buckets == expected);  // 1000 > cap alone; 50+300+100 = 450, +100 would pass 500
  std::vector<size_t> all;
  for (const auto& b : buckets) all.insert(all.end(), b.begin(), b.end());
  std::sort(all.begin(), all.end());
  std::vector<size_t> every(bytes.size());
  std::iota(every.begin(), every.end(), size_t{0});
  CHECK(all == every);
  CHECK(assign_buckets(bytes, int64_t{1} << 30).size() == 1);
  CHECK(assign_buckets(bytes, 1).size() == bytes.size());
  CHECK(assign_buckets({}, 10).empty());
  CHECK_THROWS_AS(assign_buckets(bytes, 0), Error);
}

TEST_CASE("dist: tapered buckets halve towards the end of backward and leave at most the tail for after it") {
  // ResNet-18's shape in miniature: most bytes in the last-registered (first-reduced) parameters.
  const std::vector<int64_t> bytes = {10, 40, 60, 200, 300, 600, 1600, 2};
  int64_t total = 0;
  for (int64_t b : bytes) total += b;
  const auto plain = assign_buckets(bytes, 2500);
  const auto tapered = assign_buckets(bytes, 2500, 100);
  auto bucket_bytes = [&](const std::vector<size_t>& b) {
    int64_t n = 0;
    for (size_t i : b) n += bytes[i];
    return n;
  };
  // Without a taper the last bucket holds everything after the first 2202 bytes: 610 of 2812.
  REQUIRE(plain.size() == 2);
  CHECK(bucket_bytes(plain.back()) == 610);
  // With it, each bucket takes at most half of what is still to come (or the tail), so the sizes fall
  // and the bucket that starts after backward is within the tail.
  int64_t rest = total;
  for (const auto& b : tapered) {
    const int64_t cap = std::min<int64_t>(2500, std::max<int64_t>(100, rest / 2));
    CHECK_MESSAGE((bucket_bytes(b) <= cap || b.size() == 1), "bucket of ", bucket_bytes(b), " over its cap ", cap);
    rest -= bucket_bytes(b);
  }
  CHECK(rest == 0);
  CHECK(bucket_bytes(tapered.back()) <= 100);
  CHECK(tapered.size() > plain.size());
  CHECK(tapered.size() <= 8);  // about log2(total / tail) + total / cap, not total / tail
  std::vector<size_t> order;
  for (const auto& b : tapered) order.insert(order.end(), b.begin(), b.end());
  std::vector<size_t> backward(bytes.size());
  std::iota(backward.rbegin(), backward.rend(), size_t{0});
  CHECK(order == backward);  // still last to first, each parameter once
  // A tail at or above the cap, or 0, changes nothing.
  CHECK(assign_buckets(bytes, 2500, 2500) == plain);
  CHECK(assign_buckets(bytes, 2500, 0) == plain);
  CHECK_THROWS_AS(assign_buckets(bytes, 2500, -1), Error);
}

TEST_CASE("scale model: a ring all-reduce costs 2(N-1)/N of the bytes over the link plus 2(N-1) latencies") {
  const RingLink link{1e9, 1e-5};
  CHECK(ring_allreduce_seconds(1e9, 1, link) == 0.0);
  CHECK(ring_allreduce_seconds(1e9, 2, link) == doctest::Approx(1.0 + 2e-5));
  CHECK(ring_allreduce_seconds(1e9, 8, link) == doctest::Approx(14.0 / 8.0 + 14e-5));
  // Towards 2·bytes/bandwidth as the ring grows, while the latency term grows with it.
  CHECK(ring_allreduce_seconds(1e9, 512, link) == doctest::Approx(2.0 * 511 / 512 + 1022e-5));
  CHECK(ring_allreduce_seconds(0, 64, link) == doctest::Approx(126e-5));
  CHECK_THROWS_AS(ring_allreduce_seconds(1e6, 0, link), Error);
  CHECK_THROWS_AS(ring_allreduce_seconds(1e6, 2, RingLink{0, 0}), Error);
}

TEST_CASE("scale model: all-reduces start when backward has made their gradients and only the tail shows") {
  // Four layers in registration order; backward reaches the last first. 1 MiB parameters.
  const int64_t mib = int64_t{1} << 20;
  StepInputs in;
  in.compute_s = 0.3;  // forward 0.1 s, backward 0.2 s
  std::vector<ParamCost> params = {{4 * mib, 1.0}, {4 * mib, 0.75}, {4 * mib, 0.5}, {4 * mib, 0.25}};
  in.bucket_cap_bytes = 4 * mib;
  in.bucket_tail_bytes = 0;
  const RingLink link{static_cast<double>(mib) * 100, 0};  // 100 MiB/s: a 4 MiB bucket costs 40 ms on 2 ranks
  const StepPrediction two = predict_step(params, in, 2, link);
  CHECK(two.buckets == 4);
  CHECK(two.comm_s == doctest::Approx(4 * 0.04));
  // Buckets ready at 0.15, 0.2, 0.25 and 0.3 s, each reduced in 40 ms: only the last one is left after
  // backward ends at 0.3 s.
  CHECK(two.exposed_s == doctest::Approx(0.04));
  CHECK(two.step_s() == doctest::Approx(0.34));
  CHECK(two.hidden_fraction() == doctest::Approx(0.75));
  // One rank: nothing to communicate.
  const StepPrediction one = predict_step(params, in, 1, link);
  CHECK(one.step_s() == doctest::Approx(0.3));
  CHECK(one.efficiency() == doctest::Approx(1.0));
  // One bucket of everything starts at the end of backward: nothing hidden.
  in.bucket_cap_bytes = 64 * mib;
  const StepPrediction fixed = predict_step(params, in, 2, link);
  CHECK(fixed.buckets == 1);
  CHECK(fixed.exposed_s == doctest::Approx(0.16));
  CHECK(fixed.hidden_fraction() == doctest::Approx(0.0));
  // The same cap with a 1 MiB tail: the tail buckets are small, so less is left after backward.
  in.bucket_tail_bytes = mib;
  const StepPrediction tapered = predict_step(params, in, 2, link);
  CHECK(tapered.buckets > 1);
  CHECK(tapered.exposed_s < fixed.exposed_s);
  // A slower link: the all-reduces queue up behind each other and more is exposed; more compute per
  // step (a larger batch) hides more of the same bytes.
  const StepPrediction slow = predict_step(params, in, 2, RingLink{static_cast<double>(mib) * 20, 0});
  CHECK(slow.exposed_s > tapered.exposed_s);
  in.compute_s = 3.0;
  CHECK(predict_step(params, in, 2, RingLink{static_cast<double>(mib) * 20, 0}).efficiency() > slow.efficiency());
  params[1].ready = 1.5;
  CHECK_THROWS_AS(predict_step(params, in, 2, link), Error);
}

TEST_CASE("dist: the tape reports each leaf once, after its last gradient contribution") {
  Variable w1 = param({4, 3}, 1), w2 = param({2, 4}, 2), x = Variable(Tensor::full({5, 3}, 0.5f));
  // w1 is used twice (two contributions); the hook must fire after the second.
  Variable h = relu(add(linear(x, w1, Variable()), linear(x, w1, Variable())));
  Variable y = linear(h, w2, Variable());
  std::vector<const VariableImpl*> order;
  std::vector<bool> had_grad;
  size_t nodes_left_at_w1 = 0;
  Tape::current().set_grad_ready_hook([&](VariableImpl& leaf) {
    order.push_back(&leaf);
    had_grad.push_back(!leaf.grad_stale);
    if (&leaf == w1.impl().get()) nodes_left_at_w1 = Tape::current().size();
  });
  backward(y, Tensor::full({5, 2}, 1.f));
  Tape::current().set_grad_ready_hook(nullptr);
  REQUIRE(order.size() == 2);
  CHECK(order[0] == w2.impl().get());  // the layer nearest the loss first
  CHECK(order[1] == w1.impl().get());
  CHECK(had_grad == std::vector<bool>{true, true});
  CHECK(nodes_left_at_w1 == 0);  // both linear nodes on w1 had run (the first-recorded runs last)
  // Without a hook nothing is reported.
  backward(linear(x, w1, Variable()), Tensor::full({5, 4}, 1.f));
  CHECK(order.size() == 2);
}

TEST_CASE("dist: the reducer averages over ranks, starts buckets during backward, and leaves gradients exact") {
  auto model = make_model({"mlp", 1, 10, 8});
  InMemoryImageDataset data = make_synthetic_dataset(16, 1, 8, 8, 10, 1);
  DataLoader loader(data, 16, false, 0, true);
  loader.start_epoch(0);
  Batch batch;
  REQUIRE(loader.next(batch));
  auto step = [&](GradReducer* reducer) { return testing::reduced_grads(*model, batch.images, batch.labels, reducer); };
  const auto plain = step(nullptr);
  EchoCommunicator two_ranks(2);
  // A cap smaller than any weight matrix: one bucket per parameter (or close), several per backward.
  GradReducer reducer(model->parameters(), two_ranks, 1024);
  REQUIRE(reducer.buckets().size() >= 2);
  const auto averaged = step(&reducer);
  CHECK(averaged == plain);  // (g + g) / 2 == g exactly
  REQUIRE(two_ranks.tape_left_at_start.size() == reducer.buckets().size());
  CHECK_MESSAGE(two_ranks.tape_left_at_start.front() > 0, "the first bucket started only after backward");
  CHECK(reducer.stats().steps == 1);
  CHECK(reducer.stats().buckets == static_cast<int64_t>(reducer.buckets().size()));
  CHECK(Tape::current().size() == 0);
}

TEST_CASE("dist: after a step the gradients live in the buckets, backward writes them there, a replaced one is copied in, and a seed of 1/N averages") {
  auto model = make_model({"mlp", 1, 10, 8});
  InMemoryImageDataset data = make_synthetic_dataset(32, 1, 8, 8, 10, 2);
  DataLoader loader(data, 16, false, 0, true);
  loader.start_epoch(0);
  std::vector<Batch> batches(2);
  REQUIRE(loader.next(batches[0]));
  REQUIRE(loader.next(batches[1]));
  std::vector<Variable> params = model->parameters();
  auto step = [&](const Batch& batch, GradReducer* reducer) {
    for (auto& p : params) p.zero_grad();
    Variable loss = cross_entropy((*model)(Variable(batch.images)), batch.labels);
    if (reducer) reducer->begin_backward();
    const float seed = reducer ? static_cast<float>(reducer->seed_factor()) : 1.0f;
    backward(loss, seed == 1.0f ? Tensor() : Tensor::full(loss.shape(), seed));
    if (reducer) reducer->finish();
    std::vector<std::vector<float>> grads;
    for (auto& p : params) grads.push_back(p.grad().to_vector());
    return grads;
  };
  const auto plain0 = step(batches[0], nullptr);
  const auto plain1 = step(batches[1], nullptr);
  EchoCommunicator two_ranks(2);
  GradReducer reducer(params, two_ranks, int64_t{1} << 30);  // one bucket for the whole MLP
  REQUIRE(reducer.buckets().size() == 1);
  CHECK(step(batches[0], &reducer) == plain0);
  // One flat buffer: the gradients lie back to back in the bucket's order (parameters last to first).
  const std::vector<size_t>& order = reducer.buckets().front();
  for (size_t k = 0; k + 1 < order.size(); ++k) {
    const Tensor a = params[order[k]].grad(), b = params[order[k + 1]].grad();
    CHECK(static_cast<const char*>(a.raw_data()) + a.nbytes() == static_cast<const char*>(b.raw_data()));
  }
  std::vector<const void*> where;
  for (auto& p : params) where.push_back(p.grad().raw_data());
  CHECK(step(batches[1], &reducer) == plain1);
  for (size_t i = 0; i < params.size(); ++i) CHECK(params[i].grad().raw_data() == where[i]);  // written in place
  // A gradient tensor replaced behind the reducer's back (here dropped, so backward allocates a new one)
  // is copied into its slot and is a view of the bucket again afterwards.
  params.front().clear_grad();
  CHECK(step(batches[0], &reducer) == plain0);
  CHECK(params.front().grad().raw_data() == where.front());

  // Averaging through the seed (the training loop's way): backward starts from 1/2, finish divides nothing.
  GradReducer seeded(params, two_ranks, int64_t{1} << 30, 0, Averaging::ThroughSeed);
  REQUIRE(seeded.seed_factor() == 0.5);
  CHECK(step(batches[1], &seeded) == plain1);  // (g / 2 + g / 2) == g exactly
  CHECK(reducer.seed_factor() == 1.0);
}

TEST_CASE("dist: 2 ranks with batch b end with the weights of 1 rank with batch 2b (MLP, through mpirun)") {
  if (!have_mpirun()) return;
  testing::TempDir dir("dist_equal");
  const std::string one = (dir.path() / "one.safetensors").string(), two = (dir.path() / "two.safetensors").string();
  const std::string json_one = (dir.path() / "one.json").string(), json_two = (dir.path() / "two.json").string();
  const Output a = run(train_bin() + tiny_run("--epochs 2 --steps-per-epoch 6 --batch-size 32 --test-limit 67 "
                                              "--summary-json " + json_one + " --export-weights " + one));
  REQUIRE_MESSAGE(a.rc == 0, a.text);
  const Output b = run(mpirun(2) + train_bin() + " --distributed" +
                       tiny_run("--epochs 2 --steps-per-epoch 6 --batch-size 16 --bucket-mib 0.5 --test-limit 67 "
                                "--summary-json " + json_two + " --export-weights " + two));
  REQUIRE_MESSAGE(b.rc == 0, b.text);
  // Different summation orders only: far below what 12 SGD steps move the weights.
  CHECK(max_abs_diff(weights(one), weights(two)) < 1e-5f);
  // The test split (67 images: an odd count, so one rank evaluates one more) is evaluated in shards and
  // summed: the same loss and accuracy.
  auto number = [](const std::string& path, const std::string& key) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    const size_t at = s.find("\"" + key + "\": ");
    REQUIRE_MESSAGE(at != std::string::npos, key, " not in ", path);
    return std::stod(s.substr(at + key.size() + 4));
  };
  CHECK(number(json_one, "final_test_acc") == number(json_two, "final_test_acc"));
  CHECK(number(json_one, "final_test_loss") == doctest::Approx(number(json_two, "final_test_loss")).epsilon(1e-5));
  // The communication thread's CPU time is measured (the all-reduces copy and sum on the host), and one
  // thread cannot spend more CPU than the wall time of its own jobs; one rank has no all-reduce at all.
  CHECK(number(json_two, "comm_cpu_s") > 0);
  CHECK(number(json_two, "comm_cpu_s") <= number(json_two, "comm_s") + 1e-3);
  CHECK(number(json_one, "comm_cpu_s") == 0);
}

TEST_CASE("dist: a 2-rank run stopped mid-epoch and resumed on 2 ranks ends bit-identical, and 1 rank is refused") {
  if (!have_mpirun()) return;
  testing::TempDir dir("dist_resume");
  const std::string base = tiny_run("--epochs 2 --steps-per-epoch 5 --batch-size 16 --lr 0.05");
  const std::string straight = (dir.path() / "straight.safetensors").string();
  const std::string resumed = (dir.path() / "resumed.safetensors").string();
  const std::string ck = (dir.path() / "ck").string();
  const Output a = run(mpirun(2) + train_bin() + " --distributed" + base + " --export-weights " + straight);
  REQUIRE_MESSAGE(a.rc == 0, a.text);
  // Stopped after 7 of 10 steps (mid-epoch 2), as on SIGINT, by the test hook: the checkpoint in ck/.
  const Output b = run("ACTLAB_STOP_AFTER_STEPS=7 " + mpirun(2) + train_bin() + " --distributed" + base +
                       " --save-dir " + ck);
  const std::string last = ck + "/last.safetensors";
  REQUIRE_MESSAGE(fs::exists(last), b.text);
  CHECK(read_safetensors(last).metadata_value("world_size") == "2");
  CHECK(read_safetensors(last).metadata_value("global_step") == "7");
  // The command it prints launches as many ranks as wrote the checkpoint (one rank would be refused).
  CHECK_MESSAGE(b.text.find("resume with: mpirun -np 2 actlab-train --distributed --resume " + last) != std::string::npos,
                b.text);
  const Output c = run(mpirun(2) + train_bin() + " --distributed --resume " + last + " --export-weights " +
                       resumed);
  REQUIRE_MESSAGE(c.rc == 0, c.text);
  const SafetensorsFile x = read_safetensors(straight), y = read_safetensors(resumed);
  REQUIRE(x.tensors.size() == y.tensors.size());
  for (size_t i = 0; i < x.tensors.size(); ++i) {
    const Tensor& p = x.tensors[i].second;
    const Tensor& q = y.tensors[i].second;
    REQUIRE(p.nbytes() == q.nbytes());
    CHECK_MESSAGE(std::memcmp(p.raw_data(), q.raw_data(), p.nbytes()) == 0, x.tensors[i].first, " differs");
  }
  // The same checkpoint on one rank: refused with one line naming both world sizes.
  const Output d = run(train_bin() + " --resume " + last + " --distributed=false");
  CHECK(d.rc != 0);
  CHECK_MESSAGE(d.text.find("trained on 2 ranks, this run has 1") != std::string::npos, d.text);
}

TEST_CASE("dist: a NaN loss on one rank skips or stops the step on every rank together") {
  if (!have_mpirun()) return;
  testing::TempDir dir("dist_nan");
  const std::string base = train_bin() + " --distributed" + tiny_run("--epochs 1 --steps-per-epoch 6 --batch-size 16");
  // MPMD launch: only rank 1 gets the NaN at step 3.
  auto launch = [&](const std::string& args) {
    return run("OMP_WAIT_POLICY=passive mpirun --allow-run-as-root --oversubscribe -np 1 " + base + args +
               " : -np 1 -x ACTLAB_INJECT_NAN_STEP=3 " + base + args);
  };
  const std::string summary = (dir.path() / "s.json").string();
  const Output skip = launch(" --on-nonfinite skip-step --summary-json " + summary);
  REQUIRE_MESSAGE(skip.rc == 0, skip.text);
  CHECK_MESSAGE(skip.text.find("non-finite loss on rank 1") != std::string::npos, skip.text);
  std::ifstream in(summary);
  std::stringstream json;
  json << in.rdbuf();
  CHECK_MESSAGE(json.str().find("\"skipped_steps\": 1") != std::string::npos, json.str());
  const Output stop = launch(" --on-nonfinite stop --save-dir " + (dir.path() / "ck").string());
  CHECK(stop.rc != 0);
  CHECK_MESSAGE(stop.text.find("non-finite loss on rank 1 at epoch 1 step 3") != std::string::npos, stop.text);
  CHECK(fs::exists(dir.path() / "ck" / "last.safetensors"));
}

TEST_CASE("dist: NCCL is bootstrapped over MPI, or over a local channel for one rank only") {
  // Refused before any CUDA call, so this runs on any machine. A build without NCCL refuses every control.
  const std::string two = testing::error_of([] { make_nccl_communicator(std::make_unique<EchoCommunicator>(2), 0, 5); });
  if (!nccl_built()) {
    CHECK_MESSAGE(!two.empty(), "a build without NCCL made a communicator");
    return;
  }
  CHECK_MESSAGE(two.find("bootstrapped over an MPI communicator (or, for one rank, a local one)") != std::string::npos,
                two);
  CHECK(testing::error_of([] { make_nccl_communicator(nullptr, 0, 5); }).find("bootstrapped") != std::string::npos);
}

TEST_CASE("dist: --distributed in a build without MPI is one clear error") {
  if (mpi_built()) {
    MESSAGE("this build has MPI: the refusal is dist/mpi_absent.cpp's, checked only in builds without it");
    CHECK_THROWS_AS(make_mpi_communicator(0), Error);  // the timeout is checked before MPI starts
    return;
  }
  const Output o = run(train_bin() + tiny_run("--distributed --epochs 1 --steps-per-epoch 1 --batch-size 16"));
  CHECK(o.rc == 2);
  CHECK_MESSAGE(o.text.find("--distributed needs a build with MPI") != std::string::npos, o.text);
}

TEST_CASE("dist: synchronized batch norm on one rank, and on two ranks holding the same batch, is batch norm") {
  PhiloxStream rng(21, 0);
  // (N,C,H,W) = (4,3,5,5), off-centre so the variance is not trivially 1.
  Tensor xt = Tensor::randn({4, 3, 5, 5}, rng, 0.7f, 2.f);
  Variable gamma(Tensor::randn({3}, rng, 1.f, 0.3f), true), beta(Tensor::randn({3}, rng), true);
  Tensor dy = Tensor::randn({4, 3, 5, 5}, rng);
  struct Result {
    std::vector<float> y, dx, dgamma, dbeta, running_mean, running_var;
  };
  auto run_bn = [&](Communicator* comm) {
    Variable x(xt.clone(), true);
    Tensor rm = Tensor::zeros({3}), rv = Tensor::full({3}, 1.f);
    gamma.zero_grad();
    beta.zero_grad();
    Variable y = comm ? sync_batch_norm(x, gamma, beta, rm, rv, 0.1f, 1e-5f, *comm)
                      : batch_norm(x, gamma, beta, rm, rv, true, 0.1f, 1e-5f);
    Result r{y.data().to_vector(), {}, {}, {}, rm.to_vector(), rv.to_vector()};
    backward(y, dy);
    r.dx = x.grad().to_vector();
    r.dgamma = gamma.grad().to_vector();
    r.dbeta = beta.grad().to_vector();
    return r;
  };
  auto close = [](const std::vector<float>& a, const std::vector<float>& b, const char* what) {
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) CHECK_MESSAGE(a[i] == doctest::Approx(b[i]).epsilon(1e-5), what, "[", i, "]");
  };
  const Result plain = run_bn(nullptr);
  LocalCommunicator one;
  const Result sync1 = run_bn(&one);
  close(sync1.y, plain.y, "y");
  close(sync1.dx, plain.dx, "dx");
  close(sync1.dgamma, plain.dgamma, "dgamma");
  close(sync1.dbeta, plain.dbeta, "dbeta");
  close(sync1.running_mean, plain.running_mean, "running_mean");
  close(sync1.running_var, plain.running_var, "running_var");
  // Two ranks with the same batch: the same mean and variance, twice the count (the unbiased running
  // variance moves), the input gradient unchanged, the parameter gradients this rank's part.
  EchoCommunicator two(2);
  const Result sync2 = run_bn(&two);
  close(sync2.y, plain.y, "y (2 ranks)");
  close(sync2.dx, plain.dx, "dx (2 ranks)");
  close(sync2.dgamma, plain.dgamma, "dgamma (2 ranks)");
  const double m = 100, m2 = 200;  // values per channel: one rank, two
  for (size_t c = 0; c < 3; ++c) {
    const double var = (plain.running_var[c] - 0.9) / 0.1 * (m - 1) / m;  // back out the biased variance
    CHECK(sync2.running_var[c] == doctest::Approx(0.9 + 0.1 * var * m2 / (m2 - 1)).epsilon(1e-5));
  }
}

TEST_CASE("dist: with --sync-bn, 2 ranks of batch b train ResNet-20 as 1 rank of batch 2b, and without it they do not") {
  if (!have_mpirun()) return;
  testing::TempDir dir("dist_syncbn");
  // The reference is the same synchronized arithmetic on one rank (its match with the built-in batch
  // norm is the case above): what is left to differ is only the split of the batch over two ranks.
  const std::string args = tiny_run("--epochs 1 --steps-per-epoch 2 --lr 0.02", "resnet20");
  const Weights one = trained_weights(dir.path(), mpirun(1), args + " --sync-bn --batch-size 32", "one.safetensors");
  const Weights synced = trained_weights(dir.path(), mpirun(2), args + " --sync-bn --batch-size 16", "synced.safetensors");
  const Weights local = trained_weights(dir.path(), mpirun(2), args + " --batch-size 16", "local.safetensors");
  const float synced_diff = max_abs_diff(one, synced), local_diff = max_abs_diff(one, local);
  MESSAGE("largest weight/statistic difference to one rank: sync-bn ", synced_diff, ", per-rank batch norm ", local_diff);
  // Reduction order alone: 1.2e-7 on a Zen 5 (AVX-512), 1.05e-5 on a Zen 3 (AVX2, whose oneDNN kernels sum a
  // batch of 16 and of 32 in different orders); per-rank statistics are more than 400x farther.
  CHECK(synced_diff < 1e-4f);
  CHECK(local_diff > 1e-2f);  // per-rank statistics of 16 images are not those of 32
}

TEST_CASE("dist: a bucket larger than one MPI all-reduce (16 MiB) is summed piece by piece, every piece of it") {
  if (!have_mpirun()) return;
  testing::TempDir dir("dist_big_bucket");
  // ResNet-18's 42.6 MiB of gradients in one 64 MiB bucket: three all-reduce pieces of at most 16 MiB
  // (dist/mpi_communicator.cpp). With --sync-bn, 2 ranks of 16 must match 1 rank of 32; a piece left
  // unsummed would leave its parameters with one rank's gradient, which 2 steps move by far more.
  const std::string args = tiny_run("--epochs 1 --steps-per-epoch 2 --lr 0.02 --sync-bn --bucket-mib 64", "resnet18");
  const Weights one = trained_weights(dir.path(), mpirun(1), args + " --batch-size 32", "one.safetensors");
  const Weights two = trained_weights(dir.path(), mpirun(2), args + " --batch-size 16", "two.safetensors");
  const float max_diff = max_abs_diff(one, two);
  MESSAGE("largest weight/statistic difference, 2 ranks against 1: ", max_diff);
  CHECK(max_diff < 1e-4f);  // reduction order only, as in the ResNet-20 case above
}

namespace {
// A policy that delegates to another and counts how backward reads its packs; `readers` false hides the
// channel reader, so the consumer falls back to unpacking the input whole.
class CountingPolicy final : public ActivationCachePolicy {
 public:
  CountingPolicy(std::shared_ptr<const ActivationCachePolicy> inner, bool readers)
      : inner_(std::move(inner)), readers_(readers) {}
  std::unique_ptr<Packed> pack(const Tensor& x, const SaveInfo& info, const PackContext& ctx) const override {
    return inner_->pack(x, info, ctx);
  }
  Tensor unpack(const Packed& p, const SaveInfo& info) const override {
    ++unpacks;
    return inner_->unpack(p, info);
  }
  std::unique_ptr<ChannelReader> channel_reader(const Packed& p, const SaveInfo& info) const override {
    if (!readers_) return nullptr;
    ++channel_reads;
    return inner_->channel_reader(p, info);
  }
  std::string name() const override { return inner_->name(); }
  mutable int unpacks = 0, channel_reads = 0;

 private:
  size_t closed_form_bytes(const Shape& shape) const override { return inner_->expected_bytes(shape); }
  std::shared_ptr<const ActivationCachePolicy> inner_;
  bool readers_;
};
}  // namespace

TEST_CASE("dist: synchronized batch norm reads a compressed input channel by channel, with the same gradients as whole") {
  PhiloxStream rng(23, 0);
  const Tensor xt = Tensor::randn({4, 8, 16, 16}, rng, 0.3f, 1.5f), dy = Tensor::randn({4, 8, 16, 16}, rng);
  const Tensor g0 = Tensor::randn({8}, rng, 1.f, 0.3f), b0 = Tensor::randn({8}, rng);
  struct Grads {
    std::vector<float> dx, dgamma, dbeta;
  };
  const auto run_with = [&](const std::shared_ptr<const ActivationCachePolicy>& policy) {
    const PolicySet set(policy);
    ActivationCacheScope scope(set);
    end_pack_step();  // a fresh pack count, then the same step and seed: the same rounding draws in both runs
    set_pack_seed(5);
    set_pack_step(3);
    Variable x(xt.clone(), true), gamma(g0.clone(), true), beta(b0.clone(), true);
    Tensor rm = Tensor::zeros({8}), rv = Tensor::full({8}, 1.f);
    EchoCommunicator two(2);  // a second rank with the same batch: the sums all-reduced really matter
    Variable y = sync_batch_norm(x, gamma, beta, rm, rv, 0.1f, 1e-5f, two);
    backward(y, dy);
    end_pack_step();
    return Grads{x.grad().to_vector(), gamma.grad().to_vector(), beta.grad().to_vector()};
  };
  const auto division = parse_policy("division:B=8,Q=2");
  const auto by_channel = std::make_shared<CountingPolicy>(division, true);
  const auto whole = std::make_shared<CountingPolicy>(division, false);
  const Grads a = run_with(by_channel), b = run_with(whole);
  CHECK(by_channel->channel_reads == 1);  // one reader, read twice over (the sums, then dx)
  CHECK(by_channel->unpacks == 0);        // the input was never decoded whole
  CHECK(whole->unpacks == 1);
  CHECK(a.dx == b.dx);
  CHECK(a.dgamma == b.dgamma);
  CHECK(a.dbeta == b.dbeta);
}
