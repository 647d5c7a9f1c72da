// The caching CUDA device allocator: the RawAllocator behind every tracked allocation on cuda:i.
// Owns every cudaMalloc/cudaFree in actlab. Freed blocks stay cached per device and stream (policy in
// core/cuda/allocator.h); reserved_bytes counts live + cached blocks. Also owns the pinned staging buffers
// of host-to-device copies and the pinned host blocks of offloaded saves. Tested in tests/test_cuda.cpp.
#include "actlab/core/cuda/allocator.h"

#include <cuda_runtime_api.h>

#include <array>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "actlab/core/allocator.h"
#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/context.h"

namespace actlab::cuda {
namespace {

struct LiveBlock {
  size_t size = 0;               // the block's size (>= the bytes asked for)
  cudaStream_t stream = nullptr;  // where it was handed out, and so where it is cached when freed
};

struct DevicePool {
  BlockCache cache;
  std::unordered_map<void*, LiveBlock> live;
  int64_t reserved = 0;  // bytes held from cudaMalloc: live + cached blocks
};

// Host-to-device copies from pageable memory go through two pinned buffers per device, used in turn: the
// caller's bytes are copied into a free buffer, the DMA is queued on the device's stream and the call
// returns at once (the source may be freed or reused immediately: its bytes are already in the buffer).
// A buffer is reused only after the event recorded behind its last DMA has completed, so an upload
// overlaps the host's next work (e.g. assembling the next batch). Pinned memory is host memory, so it is
// not counted in the device's statistics. Copies above kMaxStagedBytes go straight from pageable memory.
class PinnedStaging {
 public:
  static constexpr size_t kMaxStagedBytes = size_t(64) << 20;

  // Queues dst (device) <- src (pageable host), bytes <= kMaxStagedBytes, on `stream` of `device`.
  void upload(void* dst, const void* src, size_t bytes, int device, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceSlots& d = slots_[device];
    Slot& slot = d.slot[d.next];
    d.next ^= 1;
    DeviceGuard guard(device);
    if (slot.done == nullptr) ACTLAB_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
    if (slot.pending) ACTLAB_CUDA_CHECK(cudaEventSynchronize(slot.done));  // its last DMA has read it
    slot.pending = false;
    if (slot.size < bytes) {
      if (slot.host != nullptr) ACTLAB_CUDA_CHECK(cudaFreeHost(slot.host));
      slot.host = nullptr;
      slot.size = 0;
      const size_t size = (bytes + kGranule - 1) / kGranule * kGranule;
      ACTLAB_CUDA_CHECK(cudaHostAlloc(&slot.host, size, cudaHostAllocDefault));
      slot.size = size;
    }
    std::memcpy(slot.host, src, bytes);
    ACTLAB_CUDA_CHECK(cudaMemcpyAsync(dst, slot.host, bytes, cudaMemcpyHostToDevice, stream));
    ACTLAB_CUDA_CHECK(cudaEventRecord(slot.done, stream));
    slot.pending = true;
  }

 private:
  static constexpr size_t kGranule = size_t(1) << 20;  // buffers grow in whole MiB
  struct Slot {
    void* host = nullptr;
    size_t size = 0;
    cudaEvent_t done = nullptr;  // recorded after the last DMA that read `host`
    bool pending = false;
  };
  struct DeviceSlots {
    std::array<Slot, 2> slot;
    int next = 0;
  };
  std::mutex mutex_;
  std::unordered_map<int, DeviceSlots> slots_;
};

class CachingAllocator final : public RawAllocator {
 public:
  // Returns nullptr only when the device is out of memory (the tracking layer then throws
  // OutOfMemory with its stats table). Any other CUDA failure (e.g. a sticky fault left by an
  // earlier kernel) throws Error: reporting it as out-of-memory would send the user the wrong way.
  void* raw_allocate(size_t bytes, int device) override {
    const size_t size = round_block_size(bytes);
    if (size == 0) return nullptr;
    cudaStream_t stream = current_stream(device);  // outside the lock: may create the context
    std::lock_guard<std::mutex> lock(mutex_);
    DevicePool& pool = pools_[device];
    BlockCache::Block block = pool.cache.take(stream, size, max_reuse_size(size));
    if (block.ptr == nullptr) block = malloc_block(pool, device, size);
    // Short of memory: a cached block too big for the waste bound still beats failing.
    if (block.ptr == nullptr) block = pool.cache.take(stream, size, SIZE_MAX);
    if (block.ptr == nullptr) {
      release_cached(pool, device);  // cached blocks of every size and stream go back to CUDA
      block = malloc_block(pool, device, size);
    }
    if (block.ptr == nullptr) return nullptr;
    pool.live.emplace(block.ptr, LiveBlock{block.size, stream});
    return block.ptr;
  }

  // Caches the block on the stream it was handed out on; later work on that stream is ordered after
  // every use queued before this free, so the block may be reused at once.
  void raw_free(void* ptr, size_t bytes, int device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    DevicePool& pool = pools_[device];
    auto it = pool.live.find(ptr);
    ACTLAB_CHECK(it != pool.live.end(), "cuda:", device, ": freeing ", ptr, " (", bytes,
                 " bytes), which the CUDA allocator did not hand out or was already freed");
    pool.cache.put(it->second.stream, {ptr, it->second.size});
    pool.live.erase(it);
  }

  int64_t reserved_bytes(int device) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pools_.find(device);
    return it == pools_.end() ? 0 : it->second.reserved;
  }

  void empty_cache(int device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cached(pools_[device], device);
  }

  // Host<->device and device<->device (same device) copies, all on the device's actlab stream (it is
  // non-blocking, so a copy on the legacy default stream would not wait for the kernels that wrote src).
  //   host -> device: staged through pinned memory and asynchronous (see PinnedStaging); later work on
  //     the stream sees the bytes, and any host read of them goes through a synchronizing copy.
  //   device -> host: synchronous, returns once the bytes have landed.
  //   device -> device: asynchronous, ordered by the stream like a kernel.
  void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                  size_t bytes) override {
    if (bytes == 0) return;
    const Device gpu = dst_device.is_cuda() ? dst_device : src_device;
    ACTLAB_CHECK(!(dst_device.is_cuda() && src_device.is_cuda()) || dst_device == src_device, "copy from ",
                 src_device.str(), " to ", dst_device.str(), ": copies between two GPUs are not supported yet");
    cudaStream_t stream = current_stream(gpu.index);
    if (src_device.is_cpu() && bytes <= PinnedStaging::kMaxStagedBytes) {
      staging_.upload(dst, src, bytes, gpu.index, stream);
      return;
    }
    cudaMemcpyKind kind = cudaMemcpyDeviceToDevice;
    if (src_device.is_cpu()) kind = cudaMemcpyHostToDevice;
    if (dst_device.is_cpu()) kind = cudaMemcpyDeviceToHost;
    DeviceGuard guard(gpu.index);
    ACTLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
    if (kind != cudaMemcpyDeviceToDevice) ACTLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

 private:
  // cudaMalloc of exactly `size` bytes; an empty Block when the device is out of memory.
  BlockCache::Block malloc_block(DevicePool& pool, int device, size_t size) {
    DeviceGuard guard(device);
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, size);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: clear it so the next launch check does not see it
      return {};
    }
    ACTLAB_CUDA_CHECK(status);
    pool.reserved += static_cast<int64_t>(size);
    return {ptr, size};
  }

  // Returns every cached block of the device to CUDA. Synchronizes the device first, so no queued
  // kernel can still be using a block being freed (cudaFree also synchronizes, but say it here).
  void release_cached(DevicePool& pool, int device) {
    std::vector<BlockCache::Block> blocks = pool.cache.take_all();
    if (blocks.empty()) return;
    DeviceGuard guard(device);
    ACTLAB_CUDA_CHECK(cudaDeviceSynchronize());
    for (const BlockCache::Block& block : blocks) {
      pool.reserved -= static_cast<int64_t>(block.size);
      ACTLAB_CUDA_CHECK(cudaFree(block.ptr));
    }
  }

  mutable std::mutex mutex_;
  std::unordered_map<int, DevicePool> pools_;  // by device index
  PinnedStaging staging_;
};

// Pinned host memory for MemTag::Offloaded (SWAP's host copies; core/allocator.h,
// register_offload_allocator), so their copies can run on the copy stream while kernels run
// (core/cuda/transfer.h). cudaHostAlloc pins pages and is slow, so freed blocks are cached by size
// (BlockCache under one key, the same rounding and reuse bound as device blocks) and a step that
// offloads the same shapes as the last one allocates nothing. Reuse needs no event: every copy that
// reads or writes these blocks runs on one copy stream per device, in the order it was queued.
class PinnedHostAllocator final : public RawAllocator {
 public:
  void* raw_allocate(size_t bytes, int) override {
    const size_t size = round_block_size(bytes);
    if (size == 0) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    BlockCache::Block block = cache_.take(nullptr, size, max_reuse_size(size));
    if (block.ptr == nullptr) {
      void* ptr = nullptr;
      if (cudaHostAlloc(&ptr, size, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();  // host memory exhausted: not sticky; the tracker reports OutOfMemory
        return nullptr;
      }
      block = {ptr, size};
    }
    live_.emplace(block.ptr, block.size);
    return block.ptr;
  }

  void raw_free(void* ptr, size_t bytes, int) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    ACTLAB_CHECK(it != live_.end(), "pinned host memory: freeing ", ptr, " (", bytes,
                 " bytes), which the pinned allocator did not hand out or was already freed");
    cache_.put(nullptr, {ptr, it->second});
    live_.erase(it);
  }

 private:
  std::mutex mutex_;
  BlockCache cache_;
  std::unordered_map<void*, size_t> live_;  // block -> its size
};

}  // namespace

void install_caching_allocator() {
  // NOTE: never destroyed, like the tracking registry: tensors may be freed during static teardown.
  static CachingAllocator* allocator = new CachingAllocator();
  static PinnedHostAllocator* pinned = new PinnedHostAllocator();
  register_raw_allocator(DeviceType::CUDA, allocator);
  register_offload_allocator(pinned);
}

}  // namespace actlab::cuda
