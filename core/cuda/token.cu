// CUDA kernels of the transformer ops: GELU and LayerNorm over the last dimension, twins of
// core/cpu/kernels_token.cpp around the same ACTLAB_HD arithmetic (core/token_math.h).
// Contracts in core/cuda/kernels.h; tested in tests/test_cuda_ops.cpp ("cuda ops: GELU and LayerNorm").
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
__global__ void layernorm_kernel(float* y, float* mean, float* rstd, const float* x, const float* gamma,
                                 const float* beta, int64_t rows, int64_t d, float eps) {
  for (int64_t r = global_thread(); r < rows; r += grid_threads())
    token_math::layernorm_row(y, mean, rstd, x, gamma, beta, r, d, eps);
}

__global__ void layernorm_dx_kernel(float* dx, const float* dy, const float* x, const float* gamma, const float* mean,
                                    const float* rstd, int64_t rows, int64_t d) {
  for (int64_t r = global_thread(); r < rows; r += grid_threads())
    token_math::layernorm_row_backward(dx, dy, x, gamma, mean, rstd, r, d);
}

// One thread per column, rows in order: the CPU's summation order.
__global__ void layernorm_dparams_kernel(float* dgamma, float* dbeta, const float* dy, const float* x,
                                         const float* mean, const float* rstd, int64_t rows, int64_t d) {
  for (int64_t j = global_thread(); j < d; j += grid_threads())
    token_math::layernorm_column_grads(dgamma, dbeta, dy, x, mean, rstd, j, rows, d);
}

}  // namespace

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

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* gamma, const float* beta,
                       int64_t rows, int64_t d, float eps, cudaStream_t cuda_stream) {
  if (rows == 0) return;
  layernorm_kernel<<<grid_blocks(rows), kBlockThreads, 0, cuda_stream>>>(y, mean, rstd, x, gamma, beta, rows, d, eps);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x, const float* gamma,
                        const float* mean, const float* rstd, int64_t rows, int64_t d, cudaStream_t cuda_stream) {
  if (rows == 0) return;
  layernorm_dx_kernel<<<grid_blocks(rows), kBlockThreads, 0, cuda_stream>>>(dx, dy, x, gamma, mean, rstd, rows, d);
  ACTLAB_CUDA_CHECK_LAUNCH();
  layernorm_dparams_kernel<<<grid_blocks(d), kBlockThreads, 0, cuda_stream>>>(dgamma, dbeta, dy, x, mean, rstd, rows, d);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

}  // namespace actlab::cuda
