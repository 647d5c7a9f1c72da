// Shape, Storage and Tensor: the n-dimensional array every layer works on.
// A Tensor is a shared Storage (one tracked allocation, tagged) plus shape, strides, offset and dtype.
// NOTE: copying a Tensor is shallow (both share the storage); use clone() for a deep copy.
// Tested in tests/test_core.cpp.
#pragma once
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "actlab/core/allocator.h"
#include "actlab/core/device.h"
#include "actlab/core/error.h"
#include "actlab/core/philox.h"

namespace actlab {

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);   // "(64,3,32,32)"
Shape contiguous_strides(const Shape& s);
// The strides of a 4-D (N, C, H, W) shape laid out channels-last, (N, H, W, C) in memory: those of
// Tensor::empty_channels_last, the layout a bf16 convolution's keep may take (compress/exact.h).
Shape channels_last_strides(const Shape& nchw);

// One allocation. The version counter is bumped by in-place writes (fill_, copy_, add_, ...), so a
// cached pack of this storage can tell it is stale. id() is unique for the life of the process.
class Storage {
 public:
  Storage(size_t bytes, Device device, MemTag tag);
  // Host memory actlab does not own (a NumPy array's buffer, for the Python module's zero-copy pack):
  // not counted by the allocator and never freed here; `owner` keeps it alive while this storage lives.
  // retag and move_to copy it into owned, tracked memory first.
  Storage(void* borrowed, size_t bytes, std::shared_ptr<void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return bytes_; }
  Device device() const { return device_; }
  MemTag tag() const { return tag_; }
  uint64_t id() const { return id_; }
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }
  // Re-tags the bytes (e.g. a fresh tensor that becomes a parameter). Moves the accounting.
  void retag(MemTag tag);
  // Moves the bytes to `device` in place (same tag, new allocation there, old one freed), so every tensor
  // sharing this storage now lives on `device`: how Module::to moves parameters and buffers that layers
  // also hold by value. Bumps the version. A no-op when already there.
  void move_to(Device device);
  bool borrowed() const { return owner_ != nullptr; }
 private:
  void own_copy(Device device, MemTag tag);  // borrowed -> owned, tracked bytes
  std::shared_ptr<void> owner_;              // set for borrowed memory only
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  MemTag tag_;
  uint64_t id_;
  std::atomic<uint64_t> version_{0};
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor: defined() is false

  // ---- factories (memory tag: the current MemTagScope unless given)
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor empty_tagged(const Shape& shape, MemTag tag, DType dtype = DType::F32,
                             Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  // An (N, C, H, W) tensor laid out channels-last (is_channels_last(): (N, H, W, C) in memory, permuted).
  static Tensor empty_channels_last(const Shape& nchw, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, float value, DType dtype = DType::F32);
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape);
  // A contiguous CPU tensor over `data`, which `owner` keeps alive (Storage's borrowed form).
  static Tensor borrow(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner);
  // Normal(mean, std) / Uniform[lo, hi) from a Philox stream (advances it by numel draws).
  static Tensor randn(const Shape& shape, PhiloxStream& rng, float mean = 0.f, float std = 1.f);
  static Tensor rand(const Shape& shape, PhiloxStream& rng, float lo = 0.f, float hi = 1.f);

  // ---- properties
  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;   // negative d counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  int64_t offset() const { return offset_; }
  DType dtype() const { return dtype_; }
  Device device() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  // 4-D with channels_last_strides (exactly: a contiguous tensor of C = 1 or H·W = 1 is not one).
  bool is_channels_last() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  std::string str() const;  // "f32(64,3,32,32)"

  // Raw element pointer (checks dtype). Element (i0,i1,..) is at data<T>()[sum(i_k*stride_k)].
  template <typename T> T* data() const {
    ACTLAB_CHECK(dtype_of<T>() == dtype_, "tensor is ", dtype_name(dtype_), ", asked for ",
                 dtype_name(dtype_of<T>()));
    return reinterpret_cast<T*>(raw_data());
  }
  void* raw_data() const;

  // ---- views (share storage)
  Tensor view(const Shape& shape) const;    // contiguous only; one dim may be -1
  Tensor reshape(const Shape& shape) const; // view if contiguous, else a contiguous copy
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;  // drops the dim
  Tensor permute(const std::vector<int64_t>& order) const;
  Tensor flatten(int64_t start_dim = 1) const;

  // ---- copies
  Tensor contiguous() const;  // itself if already contiguous
  // A 4-D tensor channels-last (is_channels_last()): itself if it is, else a copy in that layout (where a
  // contiguous gradient meets a channels-last activation: autograd/functions_*.cpp).
  Tensor channels_last() const;
  // Itself if contiguous or channels-last (the two layouts element-wise ops and batch norm take as they are),
  // else a contiguous copy.
  Tensor dense() const;
  Tensor clone() const;       // deep, contiguous, same tag as the current scope
  Tensor to(Device device) const;
  std::vector<float> to_vector() const;  // f32 only, logical order

  // ---- in-place (bump the storage version); on a GPU: contiguous f32 only, queued on its stream
  Tensor& fill_(float value);
  Tensor& zero_() { return fill_(0.f); }
  Tensor& copy_(const Tensor& src);          // same shape; any strides
  Tensor& add_(const Tensor& other, float alpha = 1.f);  // same shape, contiguous f32
  Tensor& mul_(float value);

  float item() const;  // one-element f32 tensor
  float at(std::initializer_list<int64_t> index) const;  // f32 element, for tests

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;
  DType dtype_ = DType::F32;
};

}  // namespace actlab
