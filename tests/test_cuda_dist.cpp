// One NCCL rank on cuda:0, bootstrapped without MPI (a LocalCommunicator as the control channel): the
// part of the GPU data-parallel path a single GPU host without MPI can check. The communicator's setup
// and teardown, the asynchronous all-reduce on NCCL's own stream ordered after the compute stream and
// waited for, and the reducer's buckets on device gradients. Two or more GPU ranks need mpirun and GPUs
// (docs/distributed.md). Without a GPU, or in a CUDA build without NCCL, the case prints SKIPPED and returns.
#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include "actlab/autograd/tape.h"
#include "actlab/dist/communicator.h"
#include "actlab/dist/reducer.h"
#include "actlab/models/registry.h"
#include "tests/reducer_step.h"
#include "tests/test_cuda_util.h"

using namespace actlab;
using namespace actlab::testing;

TEST_CASE("cuda dist: one NCCL rank sums in place on its stream, and the reducer's step on cuda:0 keeps the plain gradients") {
  if (!gpu_or_skip("NCCL on one rank")) return;
  if (!nccl_built()) {
    MESSAGE("SKIPPED: missing prerequisite: NCCL (this CUDA build has none)");
    return;
  }
  const std::unique_ptr<Communicator> comm = make_nccl_communicator(std::make_unique<LocalCommunicator>(), 0, 60.0);
  CHECK(comm->backend() == "nccl");
  CHECK(comm->world_size() == 1);
  CHECK(comm->rank() == 0);

  // The sum over one rank is the tensor itself; the value written just before on the compute stream is
  // what NCCL reads (its stream waits for the compute stream).
  Tensor t = uniform({4099}, 4).to(gpu());
  const std::vector<float> want = t.to_vector();
  t.mul_(2.f);
  auto work = comm->allreduce_sum_async(t);
  work->wait();
  const std::vector<float> got = t.to_vector();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == 2.f * want[i]);
  CHECK(work->seconds() >= 0);

  // The reducer over NCCL with buckets smaller than a weight matrix (several all-reduces per backward):
  // the gradients equal those of a step without it, bit for bit (one rank: a sum of one, a divide by 1).
  seed_init(5);
  auto model = make_model({"mlp", 1, 10, 8});
  model->to(gpu());
  const Tensor x = uniform({16, 1, 8, 8}, 6).to(gpu());
  Tensor labels = Tensor::empty({16}, DType::I64);
  for (int64_t i = 0; i < 16; ++i) labels.data<int64_t>()[i] = i % 10;
  const Tensor y = labels.to(gpu());
  const auto step = [&](GradReducer* reducer) { return reduced_grads(*model, x, y, reducer); };
  const auto plain = step(nullptr);
  GradReducer reducer(model->parameters(), *comm, 1024);
  REQUIRE(reducer.buckets().size() >= 2);
  CHECK(step(&reducer) == plain);
  CHECK(step(&reducer) == plain);  // the buckets hold the gradients from the second step on
  CHECK(reducer.stats().steps == 2);
  CHECK(Tape::current().size() == 0);
}
