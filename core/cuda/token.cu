// CUDA kernels of the transformer ops: GELU, LayerNorm and softmax over the last dimension, the row-wise
// broadcasts, the strided copy and the bf16 conversions, twins of
// core/cpu/kernels_token.cpp around the same ACTLAB_HD arithmetic (core/token_math.h).
// Contracts in core/cuda/kernels.h; tested in tests/test_cuda_ops.cpp ("cuda ops: GELU and LayerNorm").
#include "actlab/core/bf16.h"
#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/kernels.h"
#include "actlab/core/cuda/launch.h"
#include "actlab/core/token_math.h"

namespace actlab::cuda {
namespace {

__global__ void gelu_kernel(float* y, const float* x, int64_t n, bool tanh_approx) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) y[i] = token_math::gelu(x[i], tanh_approx);
}

__global__ void gelu_backward_kernel(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approx) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) dx[i] = dy[i] * token_math::gelu_grad(x[i], tanh_approx);
}

// One thread per row: rows are the model width long (a few hundred), and there are many of them.
__global__ void layernorm_kernel(float* y, float* xhat, float* mean, float* rstd, const float* x, const float* gamma,
                                 const float* beta, int64_t rows, int64_t d, float eps) {
  for (int64_t r = global_thread(); r < rows; r += grid_threads())
    token_math::layernorm_row(y, xhat, mean, rstd, x, gamma, beta, r, d, eps);
}

__global__ void layernorm_dx_kernel(float* dx, const float* dy, const float* xhat, const float* gamma,
                                    const float* rstd, int64_t rows, int64_t d) {
  for (int64_t r = global_thread(); r < rows; r += grid_threads())
    token_math::layernorm_row_backward(dx, dy, xhat, gamma, rstd, r, d);
}

// One thread per column, rows in order: the CPU's summation order.
__global__ void layernorm_dparams_kernel(float* dgamma, float* dbeta, const float* dy, const float* xhat, int64_t rows,
                                         int64_t d) {
  for (int64_t j = global_thread(); j < d; j += grid_threads())
    token_math::layernorm_column_grads(dgamma, dbeta, dy, xhat, j, rows, d);
}

// One thread per row, as LayerNorm: softmax rows are the token count long.
__global__ void softmax_kernel(float* y, const float* x, int64_t rows, int64_t d, float scale) {
  for (int64_t r = global_thread(); r < rows; r += grid_threads()) token_math::softmax_row(y, x, r, d, scale);
}

__global__ void softmax_backward_kernel(float* dx, const float* dy, const float* y, int64_t rows, int64_t d,
                                        float scale) {
  for (int64_t r = global_thread(); r < rows; r += grid_threads())
    token_math::softmax_row_backward(dx, dy, y, r, d, scale);
}

__global__ void scale_rows_kernel(float* y, const float* x, const float* s, int64_t rows, int64_t d) {
  for (int64_t i = global_thread(); i < rows * d; i += grid_threads()) y[i] = x[i] * s[i / d];
}

__global__ void add_to_rows_kernel(float* y, const float* x, const float* p, int64_t rows, int64_t d) {
  for (int64_t i = global_thread(); i < rows * d; i += grid_threads()) y[i] = x[i] + p[i % d];
}

// One thread per column, rows in order in f32: the CPU's summation order.
__global__ void column_sums_kernel(float* out, const float* x, int64_t rows, int64_t d) {
  for (int64_t j = global_thread(); j < d; j += grid_threads()) {
    float acc = 0.f;
    for (int64_t r = 0; r < rows; ++r) acc += x[r * d + j];
    out[j] = acc;
  }
}

template <typename T>
__global__ void strided_copy_kernel(T* dst, const T* src, cpu::StridedCopy c, int64_t numel) {
  for (int64_t i = global_thread(); i < numel; i += grid_threads())
    dst[token_math::strided_offset(i, c.shape, c.dst_strides, c.ndim)] =
        src[token_math::strided_offset(i, c.shape, c.src_strides, c.ndim)];
}

template <bool kBf16>
__global__ void narrow_kernel(uint16_t* y, const float* x, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) y[i] = kBf16 ? float_to_bf16(x[i]) : float_to_f16(x[i]);
}
template <bool kBf16>
__global__ void widen_kernel(float* y, const uint16_t* x, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) y[i] = kBf16 ? bf16_to_float(x[i]) : f16_to_float(x[i]);
}

void check_16bit(DType type) {
  ACTLAB_CHECK(type == DType::BF16 || type == DType::F16, "16-bit conversion to ", dtype_name(type));
}

__global__ void gather_rows_kernel(float* out, const float* table, const int64_t* index, int64_t n, int64_t d) {
  for (int64_t k = global_thread(); k < n * d; k += grid_threads()) out[k] = table[index[k / d] * d + k % d];
}

// One thread per table element, indices in order: the CPU's summation order, no atomics.
__global__ void scatter_add_rows_kernel(float* grad, const float* dy, const int64_t* index, int64_t n, int64_t rows,
                                        int64_t d) {
  for (int64_t k = global_thread(); k < rows * d; k += grid_threads()) {
    const int64_t r = k / d, j = k % d;
    float acc = 0.f;
    for (int64_t i = 0; i < n; ++i)
      if (index[i] == r) acc += dy[i * d + j];
    grad[k] = acc;
  }
}

}  // namespace

void gather_rows(float* out, const float* table, const int64_t* index, int64_t n, int64_t d, cudaStream_t cuda_stream) {
  if (n * d == 0) return;
  gather_rows_kernel<<<grid_blocks(n * d), kBlockThreads, 0, cuda_stream>>>(out, table, index, n, d);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void scatter_add_rows(float* grad, const float* dy, const int64_t* index, int64_t n, int64_t rows, int64_t d,
                      cudaStream_t cuda_stream) {
  if (rows * d == 0) return;
  scatter_add_rows_kernel<<<grid_blocks(rows * d), kBlockThreads, 0, cuda_stream>>>(grad, dy, index, n, rows, d);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void softmax_forward(float* y, const float* x, int64_t rows, int64_t d, float scale, cudaStream_t cuda_stream) {
  if (rows == 0) return;
  softmax_kernel<<<grid_blocks(rows), kBlockThreads, 0, cuda_stream>>>(y, x, rows, d, scale);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void softmax_backward(float* dx, const float* dy, const float* y, int64_t rows, int64_t d, float scale,
                      cudaStream_t cuda_stream) {
  if (rows == 0) return;
  softmax_backward_kernel<<<grid_blocks(rows), kBlockThreads, 0, cuda_stream>>>(dx, dy, y, rows, d, scale);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void scale_rows(float* y, const float* x, const float* s, int64_t rows, int64_t d, cudaStream_t cuda_stream) {
  if (rows * d == 0) return;
  scale_rows_kernel<<<grid_blocks(rows * d), kBlockThreads, 0, cuda_stream>>>(y, x, s, rows, d);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void add_to_rows(float* y, const float* x, const float* p, int64_t rows, int64_t d, cudaStream_t cuda_stream) {
  if (rows * d == 0) return;
  add_to_rows_kernel<<<grid_blocks(rows * d), kBlockThreads, 0, cuda_stream>>>(y, x, p, rows, d);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void column_sums(float* out, const float* x, int64_t rows, int64_t d, cudaStream_t cuda_stream) {
  if (d == 0) return;
  column_sums_kernel<<<grid_blocks(d), kBlockThreads, 0, cuda_stream>>>(out, x, rows, d);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void narrow_16(uint16_t* y, const float* x, int64_t n, DType type, cudaStream_t cuda_stream) {
  check_16bit(type);
  if (n == 0) return;
  if (type == DType::BF16) narrow_kernel<true><<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, x, n);
  else narrow_kernel<false><<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, x, n);
  ACTLAB_CUDA_CHECK_LAUNCH();
}
void widen_16(float* y, const uint16_t* x, int64_t n, DType type, cudaStream_t cuda_stream) {
  check_16bit(type);
  if (n == 0) return;
  if (type == DType::BF16) widen_kernel<true><<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, x, n);
  else widen_kernel<false><<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, x, n);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void strided_copy(void* dst, const void* src, const cpu::StridedCopy& c, cudaStream_t cuda_stream) {
  int64_t numel = 1;
  for (int k = 0; k < c.ndim; ++k) numel *= c.shape[k];
  if (numel == 0) return;
  const int blocks = grid_blocks(numel);
  switch (c.elem_bytes) {
    case 1: strided_copy_kernel<<<blocks, kBlockThreads, 0, cuda_stream>>>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), c, numel); break;
    case 2: strided_copy_kernel<<<blocks, kBlockThreads, 0, cuda_stream>>>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), c, numel); break;
    case 4: strided_copy_kernel<<<blocks, kBlockThreads, 0, cuda_stream>>>(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), c, numel); break;
    default: strided_copy_kernel<<<blocks, kBlockThreads, 0, cuda_stream>>>(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(src), c, numel); break;
  }
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void gelu_forward(float* y, const float* x, int64_t n, bool tanh_approx, cudaStream_t cuda_stream) {
  if (n == 0) return;
  gelu_kernel<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, x, n, tanh_approx);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approx, cudaStream_t cuda_stream) {
  if (n == 0) return;
  gelu_backward_kernel<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(dx, dy, x, n, tanh_approx);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void layernorm_forward(float* y, float* xhat, float* mean, float* rstd, const float* x, const float* gamma,
                       const float* beta, int64_t rows, int64_t d, float eps, cudaStream_t cuda_stream) {
  if (rows == 0) return;
  layernorm_kernel<<<grid_blocks(rows), kBlockThreads, 0, cuda_stream>>>(y, xhat, mean, rstd, x, gamma, beta, rows, d,
                                                                        eps);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* xhat, const float* gamma,
                        const float* rstd, int64_t rows, int64_t d, cudaStream_t cuda_stream) {
  if (rows == 0) return;
  layernorm_dx_kernel<<<grid_blocks(rows), kBlockThreads, 0, cuda_stream>>>(dx, dy, xhat, gamma, rstd, rows, d);
  ACTLAB_CUDA_CHECK_LAUNCH();
  layernorm_dparams_kernel<<<grid_blocks(d), kBlockThreads, 0, cuda_stream>>>(dgamma, dbeta, dy, xhat, rows, d);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

}  // namespace actlab::cuda
