// Tracking allocator: statistics per device and tag, the CPU raw backend, and the tag scope.
#include "actlab/core/allocator.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <sys/mman.h>

namespace actlab {
namespace {

// The CPU backend keeps freed blocks of 64 KiB and more in a free-block pool, by size class, and hands
// them out again, because touching fresh pages is expensive (measured here: ~3.7 ms per MiB of first touch against
// 0.05 ms per MiB of rewriting warm memory; glibc returns large freed blocks to the kernel, so every
// step would fault its activations in again). Size classes are m·2^k with m in [8, 16): at most 12.5%
// rounding. Blocks of 2 MiB and more are 2 MiB-aligned and advised as transparent huge pages.
// Small requests go straight to malloc, whose bins already recycle them cheaply.
// posix_memalign rather than std::aligned_alloc: C11 wants aligned_alloc's size to be a multiple of
// the alignment, which the 2 MiB-aligned size classes (e.g. 7 MiB) are not; glibc lets it pass,
// AddressSanitizer stops the process (found by scripts/test-sanitize.sh).
void* aligned_block(size_t alignment, size_t bytes) {
  void* p = nullptr;
  return ::posix_memalign(&p, alignment, bytes) == 0 ? p : nullptr;
}

class CpuRawAllocator final : public RawAllocator {
 public:
  static constexpr size_t kCacheMin = 64 * 1024;
  static constexpr size_t kHuge = 2 * 1024 * 1024;

  static size_t size_class(size_t bytes) {
    if (bytes < kCacheMin) return (bytes + 63) / 64 * 64;
    int k = 63 - __builtin_clzll(bytes);  // 2^k <= bytes < 2^(k+1)
    const size_t step = size_t{1} << (k - 3);
    return (bytes + step - 1) / step * step;
  }

  void* raw_allocate(size_t bytes, int) override {
    const size_t cls = size_class(bytes);
    if (cls < kCacheMin) return aligned_block(64, cls);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        pooled_ -= cls;
        return p;
      }
    }
    void* p = aligned_block(cls >= kHuge ? kHuge : 64, cls);
    if (p == nullptr) {
      empty_cache(0);
      p = aligned_block(cls >= kHuge ? kHuge : 64, cls);
    }
    if (p == nullptr) return nullptr;
#ifdef MADV_HUGEPAGE
    if (cls >= kHuge) ::madvise(p, cls, MADV_HUGEPAGE);
#endif
    std::lock_guard<std::mutex> lock(mutex_);
    held_ += cls;
    return p;
  }

  void raw_free(void* ptr, size_t bytes, int) override {
    const size_t cls = size_class(bytes);
    if (cls < kCacheMin) {
      std::free(ptr);
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    free_[cls].push_back(ptr);
    pooled_ += cls;
  }

  // Bytes taken from the system for pool-sized blocks (live + pooled) plus nothing for small ones:
  // the tracking layer adds live small bytes itself, so report -1 and let it add the pool.
  int64_t reserved_bytes(int) const override { return -1; }
  int64_t pooled_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int64_t>(pooled_);
  }

  void empty_cache(int) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& entry : free_) {
      for (void* p : entry.second) std::free(p);
      held_ -= entry.first * entry.second.size();
    }
    free_.clear();
    pooled_ = 0;
  }

 private:
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_;
  size_t pooled_ = 0;
  size_t held_ = 0;
};

struct DeviceState {
  MemoryStats stats;
  int64_t limit = 0;
};

struct Registry {
  std::mutex mutex;
  std::map<std::pair<int, int>, DeviceState> devices;  // (type, index)
  RawAllocator* backends[2] = {nullptr, nullptr};
  RawAllocator* offload = nullptr;                 // register_offload_allocator
  std::unordered_map<void*, RawAllocator*> offload_live;  // its blocks, each freed by its own backend
  CpuRawAllocator cpu;
  Registry() { backends[0] = &cpu; }

  DeviceState& state(Device d) {
    auto& s = devices[{static_cast<int>(d.type), d.index}];
    s.stats.device = d;
    return s;
  }
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: tensors may be freed during static teardown
  return *r;
}

thread_local MemTag t_current_tag = MemTag::Other;

// Reserved = what the backend holds from the system: its own figure (CUDA), or live bytes plus the
// CPU free-block pool.
void update_reserved(DeviceState& s, RawAllocator* backend, Device device) {
  const int64_t reserved = backend->reserved_bytes(device.index);
  if (reserved >= 0) {
    s.stats.reserved = reserved;
  } else {
    const auto* cpu = dynamic_cast<const CpuRawAllocator*>(backend);
    s.stats.reserved = s.stats.total.current + (cpu ? cpu->pooled_bytes() : 0);
  }
  if (s.stats.reserved > s.stats.reserved_peak) s.stats.reserved_peak = s.stats.reserved;
}

void bump(TagStats& s, int64_t bytes) {
  s.current += bytes;
  s.allocated += bytes;
  s.alloc_count += 1;
  if (s.current > s.peak) s.peak = s.current;
}
void drop(TagStats& s, int64_t bytes) {
  s.current -= bytes;
  s.freed += bytes;
  s.free_count += 1;
}

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%10.2f", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

}  // namespace

const char* mem_tag_name(MemTag t) {
  switch (t) {
    case MemTag::Param: return "param";
    case MemTag::Grad: return "grad";
    case MemTag::OptimState: return "optim_state";
    case MemTag::Activation: return "activation";
    case MemTag::ActivationPacked: return "activation_packed";
    case MemTag::Workspace: return "workspace";
    case MemTag::Data: return "data";
    case MemTag::Offloaded: return "offloaded";
    case MemTag::Other: return "other";
  }
  return "?";
}

std::string MemoryStats::table() const {
  std::string out = "memory on " + device.str() + " (MiB)\n";
  out += "  tag                    current       peak  allocated      freed     allocs\n";
  auto row = [&](const char* name, const TagStats& s) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "  %-18s %s %s %s %s %10lld\n", name, mib(s.current).c_str(),
                  mib(s.peak).c_str(), mib(s.allocated).c_str(), mib(s.freed).c_str(),
                  static_cast<long long>(s.alloc_count));
    out += buf;
  };
  for (int i = 0; i < kNumMemTags; ++i) row(mem_tag_name(static_cast<MemTag>(i)), by_tag[i]);
  row("total", total);
  char buf[128];
  std::snprintf(buf, sizeof buf, "  reserved %s MiB (peak %s MiB), out-of-memory events %lld\n",
                mib(reserved).c_str(), mib(reserved_peak).c_str(), static_cast<long long>(oom_count));
  out += buf;
  return out;
}

void RawAllocator::copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                              size_t bytes) {
  ACTLAB_CHECK(dst_device.is_cpu() && src_device.is_cpu(), "copy from ", src_device.str(), " to ",
               dst_device.str(), " needs the CUDA backend");
  if (bytes) std::memcpy(dst, src, bytes);
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  const Device owner = dst_device.is_cuda() ? dst_device : src_device;
  auto& r = registry();
  RawAllocator* backend = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    backend = r.backends[static_cast<int>(owner.type)];
  }
  ACTLAB_CHECK(backend != nullptr, "no backend for device ", owner.str(), " (actlab built without CUDA?)");
  backend->copy_bytes(dst, dst_device, src, src_device, bytes);
}

void register_raw_allocator(DeviceType type, RawAllocator* allocator) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.backends[static_cast<int>(type)] = allocator;
}

RawAllocator* register_offload_allocator(RawAllocator* allocator) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  RawAllocator* previous = r.offload;
  r.offload = allocator;
  return previous;
}

bool has_raw_allocator(DeviceType type) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.backends[static_cast<int>(type)] != nullptr;
}

namespace {
// What to try when an allocation of `tag` does not fit: the data set is held whole (its size is the image
// size and the number of images, not the batch's); weights, their gradients and the optimizer's state are
// the model's size; SWAP's host copies are the saves'; the rest grows with the batch.
const char* out_of_memory_advice(MemTag tag) {
  switch (tag) {
    case MemTag::Data:
      return "these are the images held in memory, the whole data set whatever --train-limit takes of it: try "
             "smaller ones (actlab-train: --image-size, or --stream for an image folder; actlab-memtable: a smaller "
             "--batches or --image-size)";
    case MemTag::Param:
    case MemTag::Grad:
    case MemTag::OptimState:
      return "the model's weights, gradients and optimizer state do not depend on the batch: try a larger "
             "memory limit (actlab-train: --memory-limit) or a smaller model";
    case MemTag::Offloaded: return "these are swap's host copies of the saves: try a smaller batch or a larger limit";
    // A kernel's or the codec's scratch: a compressing policy would not shrink it (the codec's grows with
    // the largest plane it packs), and a library caller has no --policy to change.
    case MemTag::Workspace:
      return "this is scratch space for one operation, which grows with the tensor (the codec's with its largest "
             "plane): try smaller inputs or a larger limit";
    case MemTag::ActivationPacked:
      return "these are the policy's packed saves: try a smaller batch or a policy that keeps fewer bits";
    default: return "try a smaller batch or a compressing --policy such as division:B=8,Q=2";
  }
}
}  // namespace

void* tracked_allocate(Device device, size_t bytes, MemTag tag) {
  if (bytes == 0) return nullptr;
  auto& r = registry();
  RawAllocator* backend = nullptr;
  RawAllocator* offload = nullptr;  // set: the bytes come from the offload backend instead
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    backend = r.backends[static_cast<int>(device.type)];
    ACTLAB_CHECK(backend != nullptr, "no allocator for device ", device.str(),
                 " (was actlab built with CUDA, and is a GPU present?)");
    if (device.is_cpu() && tag == MemTag::Offloaded && r.offload != nullptr) offload = r.offload;
    DeviceState& s = r.state(device);
    if (s.limit > 0 && s.stats.total.current + static_cast<int64_t>(bytes) > s.limit) {
      s.stats.oom_count += 1;
      const std::string table = s.stats.table();
      throw OutOfMemory("out of memory on " + device.str() + ": asked for " + std::to_string(bytes) +
                        " bytes (" + mem_tag_name(tag) + ") over the limit of " + std::to_string(s.limit) +
                        " bytes; " + out_of_memory_advice(tag) + "\n" + table);
    }
  }
  void* ptr = (offload != nullptr ? offload : backend)->raw_allocate(bytes, device.index);
  std::lock_guard<std::mutex> lock(r.mutex);
  if (offload != nullptr && ptr != nullptr) r.offload_live.emplace(ptr, offload);
  DeviceState& s = r.state(device);
  if (ptr == nullptr) {
    s.stats.oom_count += 1;
    throw OutOfMemory("out of memory on " + device.str() + ": could not allocate " + std::to_string(bytes) +
                      " bytes (" + mem_tag_name(tag) +
                      "); " + out_of_memory_advice(tag) + "\n" + s.stats.table());
  }
  bump(s.stats.total, static_cast<int64_t>(bytes));
  bump(s.stats.by_tag[static_cast<int>(tag)], static_cast<int64_t>(bytes));
  update_reserved(s, backend, device);
  return ptr;
}

void tracked_free(Device device, void* ptr, size_t bytes, MemTag tag) {
  if (ptr == nullptr) return;
  auto& r = registry();
  RawAllocator* backend = nullptr;
  RawAllocator* owner = nullptr;  // the backend the block came from
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    backend = r.backends[static_cast<int>(device.type)];
    owner = backend;
    if (tag == MemTag::Offloaded) {
      const auto it = r.offload_live.find(ptr);
      if (it != r.offload_live.end()) {
        owner = it->second;
        r.offload_live.erase(it);
      }
    }
    DeviceState& s = r.state(device);
    drop(s.stats.total, static_cast<int64_t>(bytes));
    drop(s.stats.by_tag[static_cast<int>(tag)], static_cast<int64_t>(bytes));
  }
  owner->raw_free(ptr, bytes, device.index);
  std::lock_guard<std::mutex> lock(r.mutex);
  update_reserved(r.state(device), backend, device);
}

MemoryStats memory_stats(Device device) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.state(device).stats;
}

void reset_peak(Device device) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  MemoryStats& s = r.state(device).stats;
  s.total.peak = s.total.current;
  for (auto& t : s.by_tag) t.peak = t.current;
  s.reserved_peak = s.reserved;
}

void empty_cache(Device device) {
  auto& r = registry();
  RawAllocator* backend = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    backend = r.backends[static_cast<int>(device.type)];
  }
  if (backend) backend->empty_cache(device.index);
  std::lock_guard<std::mutex> lock(r.mutex);
  if (backend) update_reserved(r.state(device), backend, device);
}

void set_memory_limit(Device device, int64_t bytes) {
  ACTLAB_CHECK(bytes >= 0, "memory limit must be >= 0 bytes (0: none), got ", bytes);
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.state(device).limit = bytes;
}

int64_t memory_limit(Device device) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.state(device).limit;
}

MemTag current_mem_tag() { return t_current_tag; }

MemTagScope::MemTagScope(MemTag tag) : previous_(t_current_tag) { t_current_tag = tag; }
MemTagScope::~MemTagScope() { t_current_tag = previous_; }

Buffer::Buffer(size_t bytes, MemTag tag, Device device) : bytes_(bytes), tag_(tag), device_(device) {
  ptr_ = tracked_allocate(device, bytes, tag);
}
Buffer::~Buffer() { reset(); }
Buffer::Buffer(Buffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_), tag_(o.tag_), device_(o.device_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}
Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    tag_ = o.tag_;
    device_ = o.device_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}
void Buffer::reset() {
  if (ptr_) tracked_free(device_, ptr_, bytes_, tag_);
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace actlab
