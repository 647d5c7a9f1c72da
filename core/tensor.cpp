// Tensor and Storage implementation: factories, views, copies, simple in-place arithmetic.
#include "actlab/core/tensor.h"

#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "actlab/core/cpu/kernels.h"
#include "actlab/core/dispatch.h"
#if defined(ACTLAB_WITH_CUDA)
#include "actlab/core/cuda/fill.h"
#include "actlab/core/cuda/kernels.h"
#endif

namespace actlab {
namespace {
std::atomic<uint64_t> g_storage_ids{1};

// Calls f(linear_index_in_logical_order, element_offset) for every element of a strided view.
template <typename F>
void for_each_offset(const Shape& shape, const Shape& strides, int64_t offset, F f) {
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  const int64_t d = static_cast<int64_t>(shape.size());
  std::vector<int64_t> idx(d, 0);
  int64_t off = offset;
  for (int64_t i = 0; i < n; ++i) {
    f(i, off);
    for (int64_t k = d - 1; k >= 0; --k) {
      if (++idx[k] < shape[k]) { off += strides[k]; break; }
      off -= strides[k] * (shape[k] - 1);
      idx[k] = 0;
    }
  }
}
}  // namespace

int64_t shape_numel(const Shape& s) {
  // A shape with a zero extent holds nothing, whatever the others are (and whatever their order: the
  // product of the extents before the zero must not be refused as an overflow).
  for (int64_t v : s)
    if (v == 0) return 0;
  int64_t n = 1;
  // A size from a flag (a batch, an image size, a data set's length) can make the product wrap, and a
  // wrapped count allocates a small buffer that kernels then write past: refuse it here, for every caller.
  for (int64_t v : s)
    ACTLAB_CHECK(!__builtin_mul_overflow(n, v, &n), "tensor of shape ", shape_str(s),
                 " has more elements than a 64-bit count holds");
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << ")";
  return os.str();
}

Shape channels_last_strides(const Shape& nchw) {
  ACTLAB_CHECK(nchw.size() == 4, "channels_last_strides: a 4-D (N, C, H, W) shape, got ", shape_str(nchw));
  const int64_t C = nchw[1], H = nchw[2], W = nchw[3];
  return {H * W * C, 1, W * C, C};
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

// ---------------------------------------------------------------- Storage
Storage::Storage(size_t bytes, Device device, MemTag tag)
    : bytes_(bytes), device_(device), tag_(tag), id_(g_storage_ids.fetch_add(1)) {
  data_ = tracked_allocate(device, bytes, tag);
}
Storage::Storage(void* borrowed, size_t bytes, std::shared_ptr<void> owner)
    : owner_(std::move(owner)), data_(borrowed), bytes_(bytes), device_(Device::cpu()), tag_(MemTag::Other),
      id_(g_storage_ids.fetch_add(1)) {
  ACTLAB_CHECK(owner_ != nullptr, "borrowed storage needs an owner that keeps its memory alive");
}

Storage::~Storage() {
  if (!owner_) tracked_free(device_, data_, bytes_, tag_);
}

void Storage::own_copy(Device device, MemTag tag) {
  void* fresh = tracked_allocate(device, bytes_, tag);
  copy_bytes(fresh, device, data_, device_, bytes_);
  owner_.reset();
  data_ = fresh;
  device_ = device;
  tag_ = tag;
  bump_version();
}

void Storage::retag(MemTag tag) {
  if (owner_) {
    own_copy(device_, tag);
    return;
  }
  if (tag == tag_ || data_ == nullptr) { tag_ = tag; return; }
  // Move the bytes from one tag's books to the other's: account a fresh allocation, free the old one.
  void* fresh = tracked_allocate(device_, bytes_, tag);
  copy_bytes(fresh, device_, data_, device_, bytes_);
  tracked_free(device_, data_, bytes_, tag_);
  data_ = fresh;
  tag_ = tag;
}

void Storage::move_to(Device device) {
  if (device == device_) return;
  if (owner_) {
    own_copy(device, tag_);
    return;
  }
  void* fresh = tracked_allocate(device, bytes_, tag_);
  copy_bytes(fresh, device, data_, device_, bytes_);
  tracked_free(device_, data_, bytes_, tag_);
  data_ = fresh;
  device_ = device;
  bump_version();
}

// ---------------------------------------------------------------- factories
Tensor Tensor::borrow(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner) {
  for (int64_t v : shape) ACTLAB_CHECK(v >= 0, "negative size in shape ", shape_str(shape));
  Tensor t;
  t.storage_ = std::make_shared<Storage>(data, static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype),
                                         std::move(owner));
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::empty_tagged(const Shape& shape, MemTag tag, DType dtype, Device device) {
  for (int64_t v : shape) ACTLAB_CHECK(v >= 0, "negative size in shape ", shape_str(shape));
  Tensor t;
  int64_t bytes = 0;
  ACTLAB_CHECK(!__builtin_mul_overflow(shape_numel(shape), static_cast<int64_t>(dtype_size(dtype)), &bytes),
               "tensor of shape ", shape_str(shape), " has more bytes than a 64-bit size holds");
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(bytes), device, tag);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::empty_channels_last(const Shape& nchw, DType dtype, Device device) {
  ACTLAB_CHECK(nchw.size() == 4, "empty_channels_last: a 4-D (N, C, H, W) shape, got ", shape_str(nchw));
  return empty({nchw[0], nchw[2], nchw[3], nchw[1]}, dtype, device).permute({0, 3, 1, 2});
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  return empty_tagged(shape, current_mem_tag(), dtype, device);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device.is_cpu()) {
    if (t.nbytes()) std::memset(t.raw_data(), 0, t.nbytes());
  } else {
    std::vector<uint8_t> host(t.nbytes(), 0);
    copy_bytes(t.raw_data(), device, host.data(), Device::cpu(), t.nbytes());
  }
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape) {
  ACTLAB_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
               " values for shape ", shape_str(shape));
  Tensor t = empty(shape);
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(float));
  return t;
}

Tensor Tensor::randn(const Shape& shape, PhiloxStream& rng, float mean, float std) {
  Tensor t = empty(shape);
  float* p = t.data<float>();
  const int64_t n = t.numel();
  const uint64_t first = rng.reserve(static_cast<uint64_t>(2 * ((n + 1) / 2)));
  // Box-Muller on pairs of draws; each pair depends only on its index, so any loop order agrees.
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; i += 2) {
    double z0, z1;
    philox_normal_pair(rng.seed(), rng.stream(), first + i, z0, z1);
    p[i] = mean + std * static_cast<float>(z0);
    if (i + 1 < n) p[i + 1] = mean + std * static_cast<float>(z1);
  }
  return t;
}

Tensor Tensor::rand(const Shape& shape, PhiloxStream& rng, float lo, float hi) {
  Tensor t = empty(shape);
  float* p = t.data<float>();
  const int64_t n = t.numel();
  const uint64_t first = rng.reserve(static_cast<uint64_t>(n));
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) p[i] = lo + (hi - lo) * philox_uniform(rng.seed(), rng.stream(), first + i);
  return t;
}

// ---------------------------------------------------------------- properties
int64_t Tensor::size(int64_t d) const {
  const int64_t nd = dim();
  const int64_t i = d < 0 ? d + nd : d;
  ACTLAB_CHECK(i >= 0 && i < nd, "dim ", d, " out of range for ", str(), " (", nd, " dims: ", -nd, " .. ", nd - 1, ")");
  return shape_[i];
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

bool Tensor::is_channels_last() const { return dim() == 4 && strides_ == channels_last_strides(shape_); }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

std::string Tensor::str() const {
  if (!defined()) return "undefined";
  return std::string(dtype_name(dtype_)) + shape_str(shape_);
}

void* Tensor::raw_data() const {
  ACTLAB_CHECK(defined(), "use of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

// ---------------------------------------------------------------- views
Tensor Tensor::view(const Shape& shape) const {
  ACTLAB_CHECK(is_contiguous(), "view of a non-contiguous tensor ", str(), "; use reshape");
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      ACTLAB_CHECK(infer < 0, "view: more than one -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      // Two negative extents multiply to a positive count: each must be checked on its own.
      ACTLAB_CHECK(s[i] >= 0, "view: negative size ", s[i], " in ", shape_str(shape), " (only -1, inferred, may be)");
      known *= s[i];
    }
  }
  if (infer >= 0) {
    ACTLAB_CHECK(known > 0 && numel() % known == 0, "view: cannot infer ", shape_str(shape), " from ", str());
    s[infer] = numel() / known;
  }
  ACTLAB_CHECK(shape_numel(s) == numel(), "view: ", shape_str(shape), " does not match ", str());
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  return is_contiguous() ? view(shape) : contiguous().view(shape);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  if (d < 0) d += dim();
  ACTLAB_CHECK(d >= 0 && d < dim(), "slice: dim ", d, " out of range for ", str());
  ACTLAB_CHECK(step >= 1, "slice: step must be >= 1, got ", step);
  end = std::min(end, shape_[d]);
  ACTLAB_CHECK(start >= 0 && start <= end, "slice: bad range [", start, ",", end, ") for ", str());
  Tensor t = *this;
  t.offset_ += start * strides_[d];
  t.shape_[d] = (end - start + step - 1) / step;
  t.strides_[d] *= step;
  return t;
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  if (d < 0) d += dim();
  ACTLAB_CHECK(d >= 0 && d < dim() && index >= 0 && index < shape_[d], "select: index ", index,
               " of dim ", d, " out of range for ", str());
  Tensor t = *this;
  t.offset_ += index * strides_[d];
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::permute(const std::vector<int64_t>& order) const {
  ACTLAB_CHECK(static_cast<int64_t>(order.size()) == dim(), "permute: order of ", order.size(),
               " dims for ", str());
  Tensor t = *this;
  std::vector<bool> used(dim(), false);
  for (int64_t i = 0; i < dim(); ++i) {
    const int64_t o = order[i];
    ACTLAB_CHECK(o >= 0 && o < dim() && !used[o], "permute: bad order for ", str());
    used[o] = true;
    t.shape_[i] = shape_[o];
    t.strides_[i] = strides_[o];
  }
  return t;
}

Tensor Tensor::flatten(int64_t start_dim) const {
  ACTLAB_CHECK(start_dim >= 0 && start_dim < std::max<int64_t>(dim(), 1), "flatten: bad start dim ", start_dim);
  Shape s(shape_.begin(), shape_.begin() + start_dim);
  int64_t rest = 1;
  for (int64_t i = start_dim; i < dim(); ++i) rest *= shape_[i];
  s.push_back(rest);
  return reshape(s);
}

// ---------------------------------------------------------------- copies
Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::channels_last() const {
  ACTLAB_CHECK(dim() == 4, "channels_last: a 4-D (N, C, H, W) tensor, got ", str());
  if (is_channels_last()) return *this;
  Tensor t = empty_channels_last(shape_, dtype_, device());
  t.copy_(*this);
  return t;
}

Tensor Tensor::dense() const { return is_channels_last() ? *this : contiguous(); }

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  const Tensor src = contiguous();
  Tensor t = empty(shape_, dtype_, device);
  copy_bytes(t.raw_data(), device, src.raw_data(), src.device(), src.nbytes());
  return t;
}

std::vector<float> Tensor::to_vector() const {
  const Tensor c = device().is_cpu() ? contiguous() : to(Device::cpu());
  const float* p = c.data<float>();
  return std::vector<float>(p, p + c.numel());
}

// ---------------------------------------------------------------- in-place
namespace {
// The CPU branch of Tensor::fill_: any dtype, any strides.
void fill_host(Tensor& t, float value) {
  const int64_t n = t.numel();
  if (t.dtype() == DType::F32 && t.is_contiguous()) {
    float* p = t.data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = value;
    return;
  }
  char* base = static_cast<char*>(t.storage()->data());
  const size_t es = dtype_size(t.dtype());
  const DType dtype = t.dtype();
  // A float converts to an integer type only inside its range (anything else is undefined behaviour).
  const double lo = dtype == DType::U8 ? 0.0 : dtype == DType::I32 ? -2147483648.0 : -9223372036854775808.0;
  const double hi = dtype == DType::U8 ? 256.0 : dtype == DType::I32 ? 2147483648.0 : 9223372036854775808.0;
  ACTLAB_CHECK(dtype == DType::F32 || (value >= lo && value < hi), "fill_: ", value, " does not fit ",
               dtype_name(dtype), " (it must lie in [", lo, ", ", hi, "))");
  for_each_offset(t.shape(), t.strides(), t.offset(), [&](int64_t, int64_t off) {
    char* dst = base + off * static_cast<int64_t>(es);
    switch (dtype) {
      case DType::F32: *reinterpret_cast<float*>(dst) = value; break;
      case DType::U8: *reinterpret_cast<uint8_t*>(dst) = static_cast<uint8_t>(value); break;
      case DType::I32: *reinterpret_cast<int32_t*>(dst) = static_cast<int32_t>(value); break;
      case DType::I64: *reinterpret_cast<int64_t*>(dst) = static_cast<int64_t>(value); break;
      default: ACTLAB_FAIL("fill_ not supported for ", dtype_name(dtype));
    }
  });
}

// The strided copy that writes every element of dst from a source of dst's shape laid out with
// src_strides (nullptr: all zero, one element read for every position); `op` names the caller in errors.
cpu::StridedCopy strided_copy_plan(const char* op, const Tensor& dst, const int64_t* src_strides) {
  ACTLAB_CHECK(dst.dim() <= 8, op, ": at most 8 dims between layouts, got ", dst.str());
  cpu::StridedCopy c;
  c.ndim = static_cast<int>(dst.dim());
  c.elem_bytes = static_cast<int>(dtype_size(dst.dtype()));
  for (int k = 0; k < c.ndim; ++k) {
    c.shape[k] = dst.shape()[k];
    c.dst_strides[k] = dst.strides()[k];
    c.src_strides[k] = src_strides != nullptr ? src_strides[k] : 0;
  }
  return c;
}

// The GPU kernels of the in-place methods take contiguous f32 tensors.
void require_gpu_f32(const char* op, const Tensor& t) {
  ACTLAB_CHECK(!t.device().is_cuda() || (t.dtype() == DType::F32 && t.is_contiguous()), op,
               " on a GPU needs a contiguous f32 tensor, got ", t.str());
}
}  // namespace

Tensor& Tensor::fill_(float value) {
  if (device().is_cuda() && !is_contiguous() && dtype() == DType::F32) {
    // A strided view on a GPU (a slice of a split's gradient): one element holds the value and a strided
    // copy from it with source strides 0 writes it everywhere, with no temporary of the view's size.
    Tensor one = Tensor::empty({1}, DType::F32, device());
    one.fill_(value);
    const cpu::StridedCopy c = strided_copy_plan("fill_", *this, nullptr);
    void* dst = raw_data();
    const void* from = one.raw_data();
    ACTLAB_DISPATCH(device(), cuda::strided_copy(dst, from, c, gpu.stream()), cpu::strided_copy(dst, from, c));
    storage_->bump_version();
    return *this;
  }
  require_gpu_f32("fill_", *this);
  ACTLAB_DISPATCH(device(), cuda::fill(data<float>(), value, numel(), gpu.stream()), fill_host(*this, value));
  storage_->bump_version();
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  ACTLAB_CHECK(src.shape_ == shape_, "copy_: shape ", src.str(), " into ", str());
  ACTLAB_CHECK(src.dtype_ == dtype_, "copy_: dtype ", dtype_name(src.dtype_), " into ", dtype_name(dtype_));
  const bool f32_cpu = dtype_ == DType::F32 && device().is_cpu() && src.device().is_cpu();
  const bool same_dense = strides_ == src.strides_ && (is_contiguous() || is_channels_last());
  if ((is_contiguous() && src.is_contiguous()) || same_dense) {
    copy_bytes(raw_data(), device(), src.raw_data(), src.device(), nbytes());
  } else if (f32_cpu && is_contiguous() && src.is_channels_last()) {
    // The two transposes between (N, C, H, W) and channels-last (bf16 runs' activations) in 16 x 16 blocks:
    // the strided copy below moves one element at a time.
    cpu::channels_last_to_nchw(data<float>(), src.data<float>(), shape_[0], shape_[1], shape_[2] * shape_[3]);
  } else if (f32_cpu && is_channels_last() && src.is_contiguous()) {
    cpu::nchw_to_channels_last(data<float>(), src.data<float>(), shape_[0], shape_[1], shape_[2] * shape_[3]);
  } else {
    ACTLAB_CHECK(device() == src.device(), "strided copy_ across devices is not supported (", src.str(), " on ",
                 src.device().str(), " into one on ", device().str(), ")");
    const cpu::StridedCopy c = strided_copy_plan("copy_", *this, src.strides_.data());
    void* dst = raw_data();
    const void* from = src.raw_data();
    ACTLAB_DISPATCH(device(), cuda::strided_copy(dst, from, c, gpu.stream()), cpu::strided_copy(dst, from, c));
  }
  storage_->bump_version();
  return *this;
}

Tensor& Tensor::add_(const Tensor& other, float alpha) {
  ACTLAB_CHECK(other.shape_ == shape_, "add_: shape ", other.str(), " vs ", str());
  ACTLAB_CHECK(other.device() == device(), "add_: a tensor on ", other.device().str(), " into one on ", device().str());
  // Element by element in memory order: both contiguous, or both channels-last (a bf16 run's activations).
  const bool same_dense =
      (is_contiguous() && other.is_contiguous()) || (is_channels_last() && other.is_channels_last());
  ACTLAB_CHECK(same_dense && dtype_ == DType::F32 && other.dtype_ == DType::F32,
               "add_ needs f32 tensors both contiguous or both channels-last, got ", str(), " and ", other.str());
  float* p = data<float>();
  const float* q = other.data<float>();
  const int64_t n = numel();
  // _Pragma, not #pragma: a directive cannot stand inside a macro's argument.
  ACTLAB_DISPATCH(device(), cuda::axpy(p, q, alpha, n, gpu.stream()), {
    _Pragma("omp parallel for if (n > 32768)") for (int64_t i = 0; i < n; ++i) p[i] += alpha * q[i];
  });
  storage_->bump_version();
  return *this;
}

Tensor& Tensor::mul_(float value) {
  ACTLAB_CHECK(is_contiguous() && dtype_ == DType::F32, "mul_ needs a contiguous f32 tensor, got ", str());
  float* p = data<float>();
  const int64_t n = numel();
  ACTLAB_DISPATCH(device(), cuda::scale(p, value, n, gpu.stream()), {
    _Pragma("omp parallel for if (n > 32768)") for (int64_t i = 0; i < n; ++i) p[i] *= value;
  });
  storage_->bump_version();
  return *this;
}

float Tensor::item() const {
  ACTLAB_CHECK(numel() == 1, "item() of ", str());
  return to_vector()[0];
}

float Tensor::at(std::initializer_list<int64_t> index) const {
  ACTLAB_CHECK(static_cast<int64_t>(index.size()) == dim(), "at: ", index.size(), " indices for ", str());
  int64_t off = offset_;
  int64_t k = 0;
  for (int64_t i : index) {
    ACTLAB_CHECK(i >= 0 && i < shape_[k], "at: index ", i, " out of range in dim ", k, " of ", str());
    off += i * strides_[k++];
  }
  ACTLAB_CHECK(dtype_ == DType::F32 && device().is_cpu(), "at() needs a CPU f32 tensor");
  return static_cast<const float*>(storage_->data())[off];
}

}  // namespace actlab
