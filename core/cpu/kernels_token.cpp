// CPU kernels of the transformer ops: GELU (erf and tanh forms) and LayerNorm over the last dimension,
// OpenMP over elements, rows or columns around the shared arithmetic of core/token_math.h. Contracts in
// core/cpu/kernels.h; tested in tests/test_token_ops.cpp against double-precision formulas and by
// gradcheck through autograd.
#include "actlab/core/cpu/kernels.h"
#include "actlab/core/token_math.h"

namespace actlab::cpu {

void gelu_forward(float* y, const float* x, int64_t n, bool tanh_approx) {
#pragma omp parallel for if (n > 32768)
  for (int64_t i = 0; i < n; ++i) y[i] = token_math::gelu(x[i], tanh_approx);
}

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approx) {
#pragma omp parallel for if (n > 32768)
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * token_math::gelu_grad(x[i], tanh_approx);
}

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* gamma, const float* beta,
                       int64_t rows, int64_t d, float eps) {
#pragma omp parallel for if (rows * d > 32768)
  for (int64_t r = 0; r < rows; ++r) token_math::layernorm_row(y, mean, rstd, x, gamma, beta, r, d, eps);
}

void layernorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x, const float* gamma,
                        const float* mean, const float* rstd, int64_t rows, int64_t d) {
#pragma omp parallel for if (rows * d > 32768)
  for (int64_t r = 0; r < rows; ++r) token_math::layernorm_row_backward(dx, dy, x, gamma, mean, rstd, r, d);
#pragma omp parallel for if (rows * d > 32768)
  for (int64_t j = 0; j < d; ++j) token_math::layernorm_column_grads(dgamma, dbeta, dy, x, mean, rstd, j, rows, d);
}

}  // namespace actlab::cpu
