// The tracking allocator: every byte of tensor memory on every device goes through it, tagged.
// Owns per-device, per-tag statistics (current, peak, allocated, freed, counts, OOMs), the tag scope,
// the raw backends (CPU here; the CUDA caching allocator registers itself from core/cuda/).
// Tested in tests/test_core.cpp (tags, peaks, limits) and tests/test_train.cpp (--memory-limit).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "actlab/core/device.h"
#include "actlab/core/error.h"

namespace actlab {

// Offloaded: what a swap policy (compress/swap.h) moved off the device for backward — host memory, and on
// a CPU run a pool tagged apart, so device and host bytes are reported separately on every build.
enum class MemTag : uint8_t {
  Param, Grad, OptimState, Activation, ActivationPacked, Workspace, Data, Offloaded, Other
};
constexpr int kNumMemTags = 9;
const char* mem_tag_name(MemTag t);  // "param", "grad", ... (lower case, for tables and CSV)

struct TagStats {
  int64_t current = 0;      // live bytes now
  int64_t peak = 0;         // max of current since the last reset_peak
  int64_t allocated = 0;    // total bytes ever allocated
  int64_t freed = 0;        // total bytes ever freed
  int64_t alloc_count = 0;
  int64_t free_count = 0;
};

struct MemoryStats {
  Device device;
  TagStats total;                               // all tags together (peak is the joint peak)
  std::array<TagStats, kNumMemTags> by_tag{};
  int64_t reserved = 0;       // bytes held from the system (CUDA caching allocator; = current on CPU)
  int64_t reserved_peak = 0;
  int64_t oom_count = 0;

  const TagStats& operator[](MemTag t) const { return by_tag[static_cast<int>(t)]; }
  std::string table() const;  // human-readable multi-line table, MiB
};

// A raw memory backend for one device type. raw_allocate returns nullptr on failure (never throws).
class RawAllocator {
 public:
  virtual ~RawAllocator() = default;
  virtual void* raw_allocate(size_t bytes, int device_index) = 0;
  virtual void raw_free(void* ptr, size_t bytes, int device_index) = 0;
  virtual int64_t reserved_bytes(int /*device_index*/) const { return -1; }  // -1: same as current
  virtual void empty_cache(int /*device_index*/) {}
  // Copies bytes between this device and the host (or within the device); dst/src on the devices given.
  virtual void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
};
// Copies bytes between any two devices through the backends (CPU<->CPU is a memcpy).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// Installs the backend for a device type (the CUDA allocator does this when it is compiled in).
void register_raw_allocator(DeviceType type, RawAllocator* allocator);
bool has_raw_allocator(DeviceType type);
// Installs the backend of host memory under MemTag::Offloaded (SWAP's host copies of device saves):
// the CUDA build registers a cached pinned-memory one at cuda_init, so the copies to and from it can run
// asynchronously (core/cuda/transfer.h). The bytes are counted on the CPU under Offloaded as before; a
// block is freed by the backend that allocated it, so registering while such blocks live is safe.
// nullptr goes back to the CPU backend. Returns the backend registered before.
RawAllocator* register_offload_allocator(RawAllocator* allocator);

// Allocates `bytes` (64-byte aligned on CPU) on `device` under `tag`. Throws OutOfMemory.
// bytes == 0 returns nullptr and records nothing.
void* tracked_allocate(Device device, size_t bytes, MemTag tag);
void tracked_free(Device device, void* ptr, size_t bytes, MemTag tag);

MemoryStats memory_stats(Device device = Device::cpu());
void reset_peak(Device device = Device::cpu());   // peak := current, for total and every tag
// Returns the device's free-block pool to the system (the CUDA caching allocator's blocks, the CPU
// pool's); PyTorch's name for the same verb.
void empty_cache(Device device);
// A soft limit on live bytes for a device (0 = none): allocations past it throw OutOfMemory.
// Lets tests and users rehearse an out-of-memory condition on any machine.
void set_memory_limit(Device device, int64_t bytes);
int64_t memory_limit(Device device);  // the limit in force (0 = none)

// The tag used by allocations that do not name one. Set by scope, per thread.
MemTag current_mem_tag();
class MemTagScope {
 public:
  explicit MemTagScope(MemTag tag);
  ~MemTagScope();
  MemTagScope(const MemTagScope&) = delete;
  MemTagScope& operator=(const MemTagScope&) = delete;
 private:
  MemTag previous_;
};

// Move-only scratch buffer through the tracking allocator (kernels' workspaces, im2col, reorders).
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, MemTag tag = MemTag::Workspace, Device device = Device::cpu());
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T> T* as() const { return static_cast<T*>(ptr_); }
  size_t size() const { return bytes_; }
  void reset();
 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  MemTag tag_ = MemTag::Workspace;
  Device device_;
};

}  // namespace actlab
