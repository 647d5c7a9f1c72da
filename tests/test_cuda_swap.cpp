// SWAP on a GPU (compress/swap.h) and what it is built on: the offload backend of host memory
// (core/allocator.h, register_offload_allocator: pinned blocks in CUDA builds) and copies on the copy
// stream (core/cuda/transfer.h). The allocator and fence cases run everywhere; the GPU cases print
// "SKIPPED: no CUDA device" and return without one. Training under swap on a GPU: tests/test_cuda_train.cpp. Run: actlab_tests -tc='*offload*,*copy_async*,cuda swap*'.
#include <doctest/doctest.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "tests/error_of.h"
#include "tests/test_cuda_util.h"
#include "actlab/compress/swap.h"
#include "actlab/core/cuda/transfer.h"

using namespace actlab;
using namespace actlab::testing;

namespace {

// A host backend that counts what it hands out and takes back.
class CountingHost final : public RawAllocator {
 public:
  void* raw_allocate(size_t bytes, int) override {
    ++allocations;
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  void raw_free(void* ptr, size_t, int) override {
    ++frees;
    std::free(ptr);
  }
  int allocations = 0, frees = 0;
};

// Puts the offload backend that was registered before back, whatever the case did.
struct RestoreOffload {
  RawAllocator* previous;
  ~RestoreOffload() { register_offload_allocator(previous); }
};

}  // namespace

TEST_CASE("allocator: host memory under Offloaded comes from the offload backend and goes back to the one that gave it") {
  CountingHost counting;
  RestoreOffload restore{register_offload_allocator(&counting)};
  const int64_t before = memory_stats()[MemTag::Offloaded].current;
  {
    Tensor away = Tensor::empty_tagged({1000}, MemTag::Offloaded);
    const Tensor kept = Tensor::empty_tagged({1000}, MemTag::Activation);  // other tags: the CPU backend
    CHECK(counting.allocations == 1);
    CHECK(memory_stats()[MemTag::Offloaded].current == before + 4000);  // still counted on the CPU
    // Another backend registered while the block lives: the block still goes back to its own.
    register_offload_allocator(nullptr);
    away = Tensor();
    CHECK(counting.frees == 1);
    const Tensor plain = Tensor::empty_tagged({10}, MemTag::Offloaded);  // nullptr: the CPU backend again
    CHECK(counting.allocations == 1);
  }
  CHECK(counting.frees == 1);
  CHECK(memory_stats()[MemTag::Offloaded].current == before);
}

TEST_CASE("copy_async: an empty fence is done, and a copy that does not cross to a GPU is refused") {
  const CopyFence none;
  CHECK(none.empty());
  CHECK(none.done());
  CHECK_NOTHROW(none.wait());
  CHECK_NOTHROW(none.order_compute());
  float a[4] = {1, 2, 3, 4}, b[4] = {};
  CHECK(!error_of([&] { copy_async(b, Device::cpu(), a, Device::cpu(), sizeof a); }).empty());
}

TEST_CASE("cuda swap: GPU saves go out on the copy stream into pinned memory and come back bit for bit") {
  if (!gpu_or_skip("swap on cuda:0")) return;
  {  // cuda_init registered the pinned backend
    RawAllocator* pinned = register_offload_allocator(nullptr);
    register_offload_allocator(pinned);
    CHECK(pinned != nullptr);
  }
  const SaveInfo info{"conv2d", "input", true, "layer"};
  for (const int ahead : {0, 2}) {
    CAPTURE(ahead);
    SwapPolicy policy(ahead);
    const int64_t host_before = memory_stats()[MemTag::Offloaded].current;
    std::vector<Tensor> xs;
    std::vector<std::unique_ptr<Packed>> packs;
    for (uint64_t k = 0; k < 6; ++k) {
      xs.push_back(uniform({4, 8, 16, 16}, 40 + k).to(gpu()));
      packs.push_back(policy.pack(xs.back(), info, {1, (7u << 24) | k, 7}));
    }
    CHECK(memory_stats()[MemTag::Offloaded].current == host_before + 6 * 4 * 8 * 16 * 16 * 4);
    for (size_t k = packs.size(); k-- > 0;) {  // backward's order: the last save first
      const Tensor back = policy.unpack(*packs[k], info);
      CHECK(back.device() == gpu());
      check_same_bytes(xs[k], back, "save " + std::to_string(k));
      packs[k].reset();
    }
    const SwapPolicy::Traffic t = policy.traffic();
    CHECK(t.bytes_out == 6 * 4 * 8 * 16 * 16 * 4);
    CHECK(t.bytes_back == t.bytes_out);
    CHECK(t.prefetched + t.fetched_on_demand == 6);
    if (ahead == 0) CHECK(t.prefetched == 0);
    if (ahead > 0) CHECK(t.prefetched == 5);  // all but the first unpacked, which nothing came before
    CHECK(memory_stats()[MemTag::Offloaded].current == host_before);
  }
}

TEST_CASE("cuda swap: with the bound F, pack waits for older copies out, so released saves leave the device") {
  if (!gpu_or_skip("swap's in-flight bound on cuda:0")) return;
  const SaveInfo info{"conv2d", "input", true, "layer"};
  // Saves of 4 MiB against F = 1 MiB: every pack first waits for the earlier copies out, so once forward
  // drops its saves the device holds at most the newest (without a bound, any number of them).
  SwapPolicy policy(2, 1);
  CHECK(policy.name() == "swap:P=2,F=1");
  const int64_t before = memory_stats(gpu())[MemTag::Activation].current;
  std::vector<Tensor> originals;
  std::vector<std::unique_ptr<Packed>> packs;
  for (uint64_t k = 0; k < 5; ++k) {
    originals.push_back(uniform({16, 16, 64, 64}, 60 + k));
    Tensor x = Tensor::empty_tagged(originals.back().shape(), MemTag::Activation, DType::F32, gpu());
    x.copy_(originals.back().to(gpu()));
    packs.push_back(policy.pack(x, info, {1, (9u << 24) | k, 9}));
    x = Tensor();
    CHECK(memory_stats(gpu())[MemTag::Activation].current - before <= 16 * 16 * 64 * 64 * 4);
  }
  for (size_t k = packs.size(); k-- > 0;) {
    const Tensor back = policy.unpack(*packs[k], info);
    check_same_bytes(originals[k], back, "save " + std::to_string(k));
  }
  const SwapPolicy::Traffic t = policy.traffic();
  CHECK(t.bytes_out == 5 * 16 * 16 * 64 * 64 * 4);
  CHECK(t.bytes_back == t.bytes_out);
}
