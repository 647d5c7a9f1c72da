// Copies between tensor layouts (core/cpu/kernels.h, StridedCopy): the fast loop Tensor::copy_ runs and
// the one-element-at-a-time reference it is tested against (tests/test_token_ops.cpp).
#include <cstring>

#include "actlab/core/bf16.h"
#include "actlab/core/cpu/kernels.h"
#include "actlab/core/token_math.h"

namespace actlab::cpu {
namespace {

template <typename T>
void copy_rows(T* dst, const T* src, const StridedCopy& c) {
  const int last = c.ndim - 1;
  const int64_t n = c.shape[last], ds = c.dst_strides[last], ss = c.src_strides[last];
  int64_t rows = 1;
  for (int k = 0; k < last; ++k) rows *= c.shape[k];
#pragma omp parallel for if (rows * n > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    T* d = dst + token_math::strided_offset(r, c.shape, c.dst_strides, last);
    const T* s = src + token_math::strided_offset(r, c.shape, c.src_strides, last);
    if (ds == 1 && ss == 1) {
      std::memcpy(d, s, static_cast<size_t>(n) * sizeof(T));
    } else {
      for (int64_t j = 0; j < n; ++j) d[j * ds] = s[j * ss];
    }
  }
}

}  // namespace

void strided_copy(void* dst, const void* src, const StridedCopy& c) {
  if (c.ndim == 0) {
    std::memcpy(dst, src, static_cast<size_t>(c.elem_bytes));
    return;
  }
  for (int k = 0; k < c.ndim; ++k)
    if (c.shape[k] == 0) return;
  switch (c.elem_bytes) {
    case 1: copy_rows(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), c); break;
    case 2: copy_rows(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), c); break;
    case 4: copy_rows(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), c); break;
    default: copy_rows(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(src), c); break;
  }
}

StridedCopy coalesce_dims(const StridedCopy& c) {
  StridedCopy out;
  out.elem_bytes = c.elem_bytes;
  for (int k = 0; k < c.ndim; ++k) {
    if (c.shape[k] == 1) continue;
    const int m = out.ndim - 1;  // the last dim kept so far: merge dim k into it when both layouts allow
    if (m >= 0 && out.dst_strides[m] == c.dst_strides[k] * c.shape[k] &&
        out.src_strides[m] == c.src_strides[k] * c.shape[k]) {
      out.shape[m] *= c.shape[k];
      out.dst_strides[m] = c.dst_strides[k];
      out.src_strides[m] = c.src_strides[k];
      continue;
    }
    out.shape[out.ndim] = c.shape[k];
    out.dst_strides[out.ndim] = c.dst_strides[k];
    out.src_strides[out.ndim] = c.src_strides[k];
    ++out.ndim;
  }
  return out;
}

void strided_copy_ref(void* dst, const void* src, const StridedCopy& c) {
  int64_t numel = 1;
  for (int k = 0; k < c.ndim; ++k) numel *= c.shape[k];
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  for (int64_t i = 0; i < numel; ++i) {
    std::memcpy(d + token_math::strided_offset(i, c.shape, c.dst_strides, c.ndim) * c.elem_bytes,
                s + token_math::strided_offset(i, c.shape, c.src_strides, c.ndim) * c.elem_bytes,
                static_cast<size_t>(c.elem_bytes));
  }
}

// The bf16 conversions' loops are compiled for AVX-512 and AVX2 as well (ACTLAB_CPU_CLONES; integer
// operations only, so every clone gives the same bits). Compiled for the baseline alone, the narrowing
// to 16 bits was a chain of SSE2 unpacks: to_bf16 ran at a third of memcpy's rate and took 12.5 % of a
// bf16 MobileNetV2 step on an Intel Xeon (model 207), more than its bf16 convolutions saved.
ACTLAB_CPU_CLONES void to_bf16_serial(uint16_t* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_bf16(x[i]);
}
ACTLAB_CPU_CLONES void from_bf16_serial(float* y, const uint16_t* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_float(x[i]);
}

void to_bf16(uint16_t* y, const float* x, int64_t n) {
  parallel_elements(n, [=](int64_t i0, int64_t i1) { to_bf16_serial(y + i0, x + i0, i1 - i0); });
}

void from_bf16(float* y, const uint16_t* x, int64_t n) {
  parallel_elements(n, [=](int64_t i0, int64_t i1) { from_bf16_serial(y + i0, x + i0, i1 - i0); });
}

void to_f16(uint16_t* y, const float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_f16(x[i]);
}

void from_f16(float* y, const uint16_t* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) y[i] = f16_to_float(x[i]);
}

}  // namespace actlab::cpu
