// The caching CUDA device allocator's policy, kept CUDA-free so it is tested on any machine:
// block-size rounding, the reuse bound, and BlockCache (freed blocks by stream, best fit by size).
// The allocator itself (cudaMalloc/cudaFree, the RawAllocator for DeviceType::CUDA) is in
// core/cuda/allocator.cu. Tested in tests/test_cuda.cpp ("cuda allocator: ...").
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace actlab::cuda {

constexpr size_t kSmallBlockLimit = size_t(1) << 20;  // requests up to 1 MiB are "small"
constexpr size_t kSmallGranule = 512;                 // small blocks: multiples of 512 B
constexpr size_t kLargeGranule = size_t(2) << 20;     // large blocks: multiples of 2 MiB

// The block size taken from cudaMalloc for a request of `bytes` (> 0). Coarse sizes make freed
// blocks fit later requests of nearby sizes. Returns 0 when rounding would overflow (caller: OOM).
inline size_t round_block_size(size_t bytes) {
  const size_t granule = bytes <= kSmallBlockLimit ? kSmallGranule : kLargeGranule;
  if (bytes > SIZE_MAX - granule) return 0;
  return (bytes + granule - 1) / granule * granule;
}

// The largest cached block a request rounded to `block_size` may take. Blocks are never split, so
// taking a bigger block wastes its tail: allow at most 2x, and never give a large block to a small
// request (a 512 B tensor must not pin a 64 MiB block).
inline size_t max_reuse_size(size_t block_size) {
  return block_size <= kSmallBlockLimit ? std::min(2 * block_size, kSmallBlockLimit) : 2 * block_size;
}

// Freed device blocks of one device, grouped by the stream they were freed on, then by size.
// A block is handed out again only on its own stream: work queued on that stream before the free
// runs before any later use, so reuse needs no event. Streams are opaque keys here. Not thread-safe
// (the allocator holds its lock around every call).
class BlockCache {
 public:
  struct Block {
    void* ptr = nullptr;
    size_t size = 0;
  };

  void put(const void* stream, Block block) {
    by_stream_[stream].emplace(block.size, block.ptr);
    cached_bytes_ += block.size;
  }

  // Removes and returns the smallest cached block on `stream` with min_size <= size <= max_size,
  // or an empty Block (ptr == nullptr) when none fits.
  Block take(const void* stream, size_t min_size, size_t max_size) {
    auto pool = by_stream_.find(stream);
    if (pool == by_stream_.end()) return {};
    auto it = pool->second.lower_bound(min_size);
    if (it == pool->second.end() || it->first > max_size) return {};
    const Block block{it->second, it->first};
    pool->second.erase(it);
    cached_bytes_ -= block.size;
    return block;
  }

  // Removes every cached block (all streams) and returns them for the caller to cudaFree.
  std::vector<Block> take_all() {
    std::vector<Block> blocks;
    for (auto& [stream, pool] : by_stream_)
      for (auto& [size, ptr] : pool) blocks.push_back({ptr, size});
    by_stream_.clear();
    cached_bytes_ = 0;
    return blocks;
  }

  size_t cached_bytes() const { return cached_bytes_; }

 private:
  std::map<const void*, std::multimap<size_t, void*>> by_stream_;  // stream -> (size -> ptr)
  size_t cached_bytes_ = 0;
};

// Registers the caching allocator as the raw backend of DeviceType::CUDA and the pinned host allocator as
// the offload backend (CUDA builds only; called once by actlab::cuda_init(), which checks that a device
// exists first).
void install_caching_allocator();

}  // namespace actlab::cuda
