// Tests of the CUDA backend's foundation: runtime discovery, the check macros, the caching allocator
// (policy on any machine; cudaMalloc behaviour on a GPU), pinned host-to-device staging, the per-device
// context and the fill kernel. GPU cases print "SKIPPED: no CUDA device: ..." and return when no device is
// present; the cases that need CUDA headers are compiled only in CUDA builds. Run: actlab_tests -tc='cuda*'.
// The op and codec parity suites are tests/test_cuda_ops.cpp and tests/test_cuda_codec.cpp.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "actlab/core/allocator.h"
#include "actlab/core/cuda/allocator.h"
#include "actlab/core/cuda/runtime.h"
#include "actlab/core/tensor.h"
#include "tests/error_of.h"

#if defined(ACTLAB_WITH_CUDA)
#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/context.h"
#include "actlab/core/cuda/fill.h"
#endif

using namespace actlab;
using actlab::testing::error_of;

namespace {

// True when a GPU is present (and actlab's CUDA backend is initialised); otherwise says so in the
// test output, so a skipped case is visible rather than a silent pass.
bool gpu_or_skip(const char* what) {
  if (!cuda_available()) {
    MESSAGE("SKIPPED: no CUDA device: " << std::string(what));
    return false;
  }
  cuda_init();
  return true;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

constexpr size_t kMiB = size_t(1) << 20;

}  // namespace

// ------------------------------------------------------------------ always run

// One case whose only job is to say, in every test log, whether the GPU suites below really ran.
TEST_CASE("cuda: device present") {
  if (!cuda_available()) {
#if defined(ACTLAB_WITH_CUDA)
    MESSAGE("SKIPPED: no CUDA device (a CUDA build: every GPU case of this binary only reports its skip)");
#else
    MESSAGE("SKIPPED: no CUDA device (actlab was built without CUDA)");
#endif
    return;
  }
  cuda_init();
  MESSAGE("CUDA device 0: " << cuda_device_name(0) << " (" << cuda_device_count() << " visible)");
  CHECK(cuda_device_count() >= 1);
}

TEST_CASE("cuda runtime: availability is consistent and asking never crashes") {
  const int count = cuda_device_count();
  CHECK(count >= 0);
  CHECK(cuda_available() == (count > 0));
  CHECK_THROWS_AS(cuda_device_name(count), Error);  // one past the last device
  CHECK_THROWS_AS(cuda_device_name(-1), Error);
#if !defined(ACTLAB_WITH_CUDA)
  CHECK_FALSE(cuda_available());
#endif
  if (count == 0) {
    const std::string why = error_of([] { cuda_init(); });
    CHECK(contains(why, "CUDA requested but"));
    CHECK_FALSE(has_raw_allocator(DeviceType::CUDA));  // cuda_init failed, so nothing registered
    CHECK_THROWS_AS(Tensor::empty({4}, DType::F32, Device::cuda()), Error);
    MESSAGE("no CUDA device: the device-name and allocator-registration checks do not apply");
    return;
  }
  cuda_init();
  cuda_init();  // idempotent
  CHECK(has_raw_allocator(DeviceType::CUDA));
  CHECK_FALSE(cuda_device_name(0).empty());
  MESSAGE("cuda:0 is " << cuda_device_name(0));
}

TEST_CASE("cuda allocator: block sizes round to 512 B up to 1 MiB and to 2 MiB above") {
  using cuda::round_block_size;
  CHECK(round_block_size(1) == 512);
  CHECK(round_block_size(512) == 512);
  CHECK(round_block_size(513) == 1024);
  CHECK(round_block_size(kMiB - 1) == kMiB);
  CHECK(round_block_size(kMiB) == kMiB);
  CHECK(round_block_size(kMiB + 1) == 2 * kMiB);
  CHECK(round_block_size(5 * kMiB / 2) == 4 * kMiB);
  CHECK(round_block_size(SIZE_MAX - 10) == 0);  // overflow: reported, not wrapped to a tiny block
  // Reuse bound: at most twice the block, and small requests never take large blocks.
  CHECK(cuda::max_reuse_size(1024) == 2048);
  CHECK(cuda::max_reuse_size(kMiB) == kMiB);
  CHECK(cuda::max_reuse_size(4 * kMiB) == 8 * kMiB);
}

TEST_CASE("cuda allocator: block cache gives the best fit on the freeing stream only") {
  cuda::BlockCache cache;
  int s1 = 0, s2 = 0;  // stand-ins for two streams: only their addresses matter
  char a[1], b[1], c[1], d[1];
  cache.put(&s1, {a, 1024});
  cache.put(&s1, {b, 4096});
  cache.put(&s2, {c, 2048});
  CHECK(cache.cached_bytes() == 1024 + 4096 + 2048);

  // Smallest block that is big enough, on the same stream (c on s2 would fit better but is elsewhere).
  auto got = cache.take(&s1, 2048, 8192);
  CHECK(got.ptr == b);
  CHECK(got.size == 4096);
  CHECK(cache.take(&s1, 2048, 8192).ptr == nullptr);  // b is gone, a is too small
  got = cache.take(&s1, 512, 1024);
  CHECK(got.ptr == a);
  // A block above the caller's bound stays cached.
  cache.put(&s1, {d, 65536});
  CHECK(cache.take(&s1, 1024, 2048).ptr == nullptr);
  CHECK(cache.take(&s2, 2048, 2048).ptr == c);
  CHECK(cache.take(&s2, 1, 1).ptr == nullptr);
  CHECK(cache.cached_bytes() == 65536);

  const auto all = cache.take_all();
  REQUIRE(all.size() == 1);
  CHECK(all[0].ptr == d);
  CHECK(cache.cached_bytes() == 0);
  CHECK(cache.take(&s1, 1, SIZE_MAX).ptr == nullptr);
}

#if defined(ACTLAB_WITH_CUDA)
TEST_CASE("cuda check macros: a failing status throws Error with the call text and library message") {
  int calls = 0;
  auto fake_cuda_malloc = [&] { ++calls; return cudaErrorMemoryAllocation; };
  const std::string cuda_msg = error_of([&] { ACTLAB_CUDA_CHECK(fake_cuda_malloc()); });
  CHECK(calls == 1);  // the call is evaluated exactly once
  CHECK(contains(cuda_msg, "fake_cuda_malloc()"));
  CHECK(contains(cuda_msg, "cudaErrorMemoryAllocation"));
  CHECK(contains(cuda_msg, cudaGetErrorString(cudaErrorMemoryAllocation)));
  CHECK(contains(cuda_msg, "test_cuda.cpp:"));
  CHECK_NOTHROW(ACTLAB_CUDA_CHECK(cudaSuccess));

  auto fake_gemm = [] { return CUBLAS_STATUS_EXECUTION_FAILED; };
  const std::string blas_msg = error_of([&] { ACTLAB_CUBLAS_CHECK(fake_gemm()); });
  CHECK(contains(blas_msg, "fake_gemm()"));
  CHECK(contains(blas_msg, "CUBLAS_STATUS_EXECUTION_FAILED"));
  CHECK(contains(blas_msg, "test_cuda.cpp:"));
  CHECK_NOTHROW(ACTLAB_CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS));

#if defined(ACTLAB_WITH_CUDNN)
  auto fake_conv = [] { return CUDNN_STATUS_BAD_PARAM; };
  const std::string dnn_msg = error_of([&] { ACTLAB_CUDNN_CHECK(fake_conv()); });
  CHECK(contains(dnn_msg, "fake_conv()"));
  CHECK(contains(dnn_msg, cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM)));
  CHECK(contains(dnn_msg, "test_cuda.cpp:"));
  CHECK_NOTHROW(ACTLAB_CUDNN_CHECK(CUDNN_STATUS_SUCCESS));
#endif
}

TEST_CASE("cuda check macros: a library's allocation failure is OutOfMemory (exit 3), other failures are not") {
  const auto is_oom = [](auto&& f) {
    try {
      f();
    } catch (const OutOfMemory& e) {
      CHECK(contains(e.what(), "out of memory"));
      CHECK(contains(e.what(), "test_cuda.cpp:"));
      return true;
    } catch (const Error&) {
      return false;
    }
    FAIL("no exception");
    return false;
  };
  CHECK(is_oom([] { ACTLAB_CUDA_CHECK(cudaErrorMemoryAllocation); }));
  CHECK_FALSE(is_oom([] { ACTLAB_CUDA_CHECK(cudaErrorInvalidValue); }));
  CHECK(is_oom([] { ACTLAB_CUBLAS_CHECK(CUBLAS_STATUS_ALLOC_FAILED); }));
  CHECK_FALSE(is_oom([] { ACTLAB_CUBLAS_CHECK(CUBLAS_STATUS_EXECUTION_FAILED); }));
#if defined(ACTLAB_WITH_CUDNN)
  CHECK(is_oom([] { ACTLAB_CUDNN_CHECK(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED); }));
  CHECK(is_oom([] { ACTLAB_CUDNN_CHECK(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED); }));
  CHECK_FALSE(is_oom([] { ACTLAB_CUDNN_CHECK(CUDNN_STATUS_BAD_PARAM); }));
#endif
}
#else
TEST_CASE("cuda check macros: not compiled in a CPU-only build") {
  MESSAGE("SKIPPED: no CUDA device (actlab built without CUDA): the CUDA/cuBLAS/cuDNN check-macro tests");
}
#endif

// ------------------------------------------------------------------ need a GPU

TEST_CASE("cuda allocator: tracked stats on cuda:0 (current, reserved, empty_cache)") {
  if (!gpu_or_skip("tracked allocation stats on cuda:0")) return;
  const Device gpu = Device::cuda(0);
  const MemoryStats base = memory_stats(gpu);

  void* p = tracked_allocate(gpu, kMiB, MemTag::Activation);
  REQUIRE(p != nullptr);
  MemoryStats s = memory_stats(gpu);
  CHECK(s.total.current == base.total.current + int64_t(kMiB));
  CHECK(s[MemTag::Activation].current == base[MemTag::Activation].current + int64_t(kMiB));
  CHECK(s.reserved >= s.total.current);

  tracked_free(gpu, p, kMiB, MemTag::Activation);
  const MemoryStats cached = memory_stats(gpu);
  CHECK(cached.total.current == base.total.current);
  CHECK(cached.reserved >= cached.total.current + int64_t(kMiB));  // the block stays cached

  empty_cache(gpu);
  const MemoryStats emptied = memory_stats(gpu);
  CHECK(emptied.reserved <= cached.reserved - int64_t(kMiB));
  CHECK(emptied.reserved >= emptied.total.current);
  if (emptied.total.current == 0) CHECK(emptied.reserved == 0);
}

TEST_CASE("cuda allocator: a freed block is reused for the same size - large requests round to 2 MiB") {
  if (!gpu_or_skip("block reuse on cuda:0")) return;
  const Device gpu = Device::cuda(0);
  const int64_t live = memory_stats(gpu).total.current;
  empty_cache(gpu);  // no other cached block of the same size may come first

  void* first = tracked_allocate(gpu, 3000, MemTag::Other);
  tracked_free(gpu, first, 3000, MemTag::Other);
  void* second = tracked_allocate(gpu, 3000, MemTag::Other);
  CHECK(second == first);
  tracked_free(gpu, second, 3000, MemTag::Other);

  empty_cache(gpu);  // so the next request must come from cudaMalloc
  const int64_t reserved_before = memory_stats(gpu).reserved;
  void* large = tracked_allocate(gpu, 5 * kMiB / 2, MemTag::Other);
  CHECK(memory_stats(gpu).reserved == reserved_before + int64_t(4 * kMiB));
  tracked_free(gpu, large, 5 * kMiB / 2, MemTag::Other);
  // A small request must not take the cached 4 MiB block.
  void* small = tracked_allocate(gpu, 4096, MemTag::Other);
  CHECK(small != large);
  tracked_free(gpu, small, 4096, MemTag::Other);
  empty_cache(gpu);
  CHECK(memory_stats(gpu).total.current == live);
}

TEST_CASE("cuda tensor: host -> device -> device -> host round trip is exact") {
  if (!gpu_or_skip("the tensor round trip through cuda:0")) return;
  const int64_t live = memory_stats(Device::cuda(0)).total.current;
  {
    std::vector<float> values(1000);
    for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i) - 7.f;
    const Tensor host = Tensor::from_vector(values, {10, 100});
    const Tensor on_gpu = host.to(Device::cuda(0));
    CHECK(on_gpu.device() == Device::cuda(0));
    CHECK(on_gpu.shape() == host.shape());
    const Tensor copy = on_gpu.clone();  // device -> device
    CHECK(copy.raw_data() != on_gpu.raw_data());
    const Tensor back = copy.to(Device::cpu());
    CHECK(back.device() == Device::cpu());
    CHECK(back.to_vector() == values);
  }
  CHECK(memory_stats(Device::cuda(0)).total.current == live);
}

TEST_CASE("cuda tensor: staged host-to-device copies own their bytes and stay in order") {
  if (!gpu_or_skip("pinned staging of host-to-device copies")) return;
  const int64_t live = memory_stats(Device::cuda(0)).total.current;
  {
    std::vector<float> values(4096);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
    Tensor host = Tensor::from_vector(values, {4096});
    // Several uploads back to back (more than the two staging buffers), each followed at once by a host
    // write: every device copy must hold the bytes of its own moment.
    std::vector<Tensor> uploads;
    for (int k = 0; k < 5; ++k) {
      uploads.push_back(host.to(Device::cuda(0)));
      host.data<float>()[k] = -1.f - static_cast<float>(k);
    }
    for (int k = 0; k < 5; ++k) {
      const std::vector<float> got = uploads[k].to_vector();
      for (int j = 0; j < 5; ++j) REQUIRE(got[j] == (j < k ? -1.f - static_cast<float>(j) : static_cast<float>(j)));
      CHECK(got[4095] == 4095.f);
    }
    // Above the staging limit the copy goes straight from pageable memory.
    const int64_t big = (int64_t(64) << 20) / 4 + 1000;
    Tensor large = Tensor::empty({big});
    for (int64_t i = 0; i < big; i += 4099) large.data<float>()[i] = static_cast<float>(i % 977);
    const std::vector<float> back = large.to(Device::cuda(0)).to_vector();
    for (int64_t i = 0; i < big; i += 4099) REQUIRE(back[i] == static_cast<float>(i % 977));
  }
  CHECK(memory_stats(Device::cuda(0)).total.current == live);
}

TEST_CASE("cuda allocator: exceeding a limit or the device throws OutOfMemory with the stats table") {
  if (!gpu_or_skip("out-of-memory on cuda:0")) return;
  const Device gpu = Device::cuda(0);
  const MemoryStats base = memory_stats(gpu);

  set_memory_limit(gpu, base.total.current + int64_t(kMiB));
  std::string msg;
  try {
    Tensor t = Tensor::empty({int64_t(kMiB)}, DType::F32, gpu);  // 4 MiB
  } catch (const OutOfMemory& e) {
    msg = e.what();
  }
  set_memory_limit(gpu, 0);
  CHECK(contains(msg, "out of memory on cuda:0"));
  CHECK(contains(msg, "memory on cuda:0 (MiB)"));  // the table's heading
  CHECK(contains(msg, "reserved"));

  // A request no GPU can hold: cudaMalloc fails, the cache is released, the retry fails, nullptr.
  msg.clear();
  try {
    tracked_allocate(gpu, size_t(1) << 50, MemTag::Activation);  // 1 PiB
  } catch (const OutOfMemory& e) {
    msg = e.what();
  }
  CHECK(contains(msg, "could not allocate"));
  CHECK(contains(msg, "memory on cuda:0 (MiB)"));
  const MemoryStats after = memory_stats(gpu);
  CHECK(after.oom_count == base.oom_count + 2);
  CHECK(after.total.current == base.total.current);
#if defined(ACTLAB_WITH_CUDA)
  // The failed cudaMalloc must not linger as the runtime's last error (the next launch check reads it).
  CHECK(cudaGetLastError() == cudaSuccess);
#endif
}

#if defined(ACTLAB_WITH_CUDA)

TEST_CASE("cuda fill: every element of an odd-sized array is written") {
  if (!gpu_or_skip("the fill kernel")) return;
  const int64_t live = memory_stats(Device::cuda(0)).total.current;
  {
    const int64_t n = 100003;  // not a multiple of the block size: the tail must be written too
    Tensor t = Tensor::zeros({n}, DType::F32, Device::cuda(0));
    cuda::CudaContext& ctx = cuda::cuda_context(0);
    cuda::fill(t.data<float>(), 2.5f, n, ctx.stream());
    cuda::fill(t.data<float>(), -1.f, 0, ctx.stream());  // n == 0: nothing
    const std::vector<float> got = t.to_vector();        // copies on ctx.stream(): after the kernel
    int64_t wrong = 0;
    for (float v : got) wrong += v != 2.5f;
    CHECK(wrong == 0);
    CHECK_THROWS_AS(cuda::fill(t.data<float>(), 0.f, -1, ctx.stream()), Error);
  }
  CHECK(memory_stats(Device::cuda(0)).total.current == live);
}

TEST_CASE("cuda cublas: the library opens without a GPU and names a status in its own words") {
  // cublas() throws, naming the library, when it cannot open it or find a function of the table; that
  // nothing opens it at start-up is tests/cli/startup_libraries.sh.
  CHECK_NOTHROW(cuda::cublas());
  const std::string text = cuda::cublas_status_text(CUBLAS_STATUS_NOT_INITIALIZED);
  CHECK(text.rfind("CUBLAS_STATUS_NOT_INITIALIZED (", 0) == 0);
  CHECK(text.size() > std::strlen("CUBLAS_STATUS_NOT_INITIALIZED ()"));
  CHECK(text.back() == ')');
}

TEST_CASE("cuda context: handles are bound to the stream - the workspace grows and is tagged") {
  if (!gpu_or_skip("the cuda:0 context")) return;
  cuda::CudaContext& ctx = cuda::cuda_context(0);
  CHECK(&ctx == &cuda::cuda_context(0));
  CHECK(ctx.stream() == cuda::current_stream(0));
  CHECK(ctx.stream() != nullptr);  // never the legacy default stream
  cudaStream_t bound = nullptr;
  ACTLAB_CUBLAS_CHECK(cuda::cublas().get_stream(ctx.cublas(), &bound));
  CHECK(bound == ctx.stream());
#if defined(ACTLAB_WITH_CUDNN)
  bound = nullptr;
  ACTLAB_CUDNN_CHECK(cudnnGetStream(ctx.cudnn(), &bound));
  CHECK(bound == ctx.stream());
#endif
  CHECK_THROWS_AS(cuda::cuda_context(cuda_device_count()), Error);

  ctx.release_workspace();
  const Device gpu = Device::cuda(0);
  const int64_t ws_base = memory_stats(gpu)[MemTag::Workspace].current;
  void* small = ctx.workspace(1000);
  CHECK(small != nullptr);
  CHECK(memory_stats(gpu)[MemTag::Workspace].current == ws_base + 1000);
  CHECK(ctx.workspace(500) == small);  // never shrinks
  CHECK(ctx.workspace(3 * kMiB) != nullptr);
  CHECK(ctx.workspace_size() == 3 * kMiB);
  CHECK(memory_stats(gpu)[MemTag::Workspace].current == ws_base + int64_t(3 * kMiB));  // old one freed
  ctx.release_workspace();
  CHECK(memory_stats(gpu)[MemTag::Workspace].current == ws_base);
  ctx.synchronize();
}
#else
TEST_CASE("cuda fill and context: not compiled in a CPU-only build") {
  MESSAGE("SKIPPED: no CUDA device (actlab built without CUDA): the fill-kernel and context tests");
}
#endif
