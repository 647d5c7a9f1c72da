// CPU kernels of the transformer ops: GELU (erf and tanh forms), LayerNorm and softmax over the last
// dimension (the _ref loops: the spec, and what minimal builds run; kernels_token_dnnl.cpp has the fast
// paths), the row-wise broadcasts of position embeddings and drop-path, OpenMP over elements, rows or columns around the shared arithmetic of core/token_math.h. Contracts in
// core/cpu/kernels.h; tested in tests/test_token_ops.cpp against double-precision formulas and by
// gradcheck through autograd.
#include "actlab/core/cpu/kernels.h"
#include "actlab/core/token_math.h"

namespace actlab::cpu {

void gelu_forward_ref(float* y, const float* x, int64_t n, bool tanh_approx) {
#pragma omp parallel for if (n > 32768)
  for (int64_t i = 0; i < n; ++i) y[i] = token_math::gelu(x[i], tanh_approx);
}

void gelu_backward_ref(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approx) {
#pragma omp parallel for if (n > 32768)
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * token_math::gelu_grad(x[i], tanh_approx);
}

void layernorm_forward_ref(float* y, float* xhat, float* mean, float* rstd, const float* x, const float* gamma,
                       const float* beta, int64_t rows, int64_t d, float eps) {
#pragma omp parallel for if (rows * d > 32768)
  for (int64_t r = 0; r < rows; ++r) token_math::layernorm_row(y, xhat, mean, rstd, x, gamma, beta, r, d, eps);
}

void layernorm_backward_ref(float* dx, float* dgamma, float* dbeta, const float* dy, const float* xhat,
                            const float* gamma, const float* rstd, int64_t rows, int64_t d) {
#pragma omp parallel for if (rows * d > 32768)
  for (int64_t r = 0; r < rows; ++r) token_math::layernorm_row_backward(dx, dy, xhat, gamma, rstd, r, d);
#pragma omp parallel for if (rows * d > 32768)
  for (int64_t j = 0; j < d; ++j) token_math::layernorm_column_grads(dgamma, dbeta, dy, xhat, j, rows, d);
}

// The same sums as the _ref loop, in the same order (token_math's row chunks, in double), so the
// same bits: only the loops are interchanged. The _ref column loop walks one column down all rows, a
// stride of d floats per read; here a thread takes a chunk of columns and streams the rows across it.
void layernorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* xhat, const float* gamma,
                        const float* rstd, int64_t rows, int64_t d) {
#pragma omp parallel for if (rows * d > 32768)
  for (int64_t r = 0; r < rows; ++r) token_math::layernorm_row_backward(dx, dy, xhat, gamma, rstd, r, d);
  constexpr int64_t kChunk = 32;
  const int64_t chunks = (d + kChunk - 1) / kChunk;
#pragma omp parallel for if (rows * d > 32768)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t j0 = c * kChunk, w = j0 + kChunk < d ? kChunk : d - j0;
    double a[kChunk] = {}, b[kChunk] = {};
    for (int64_t r0 = 0; r0 < rows; r0 += token_math::kColumnChunk) {
      const int64_t r1 = token_math::column_chunk_end(r0, rows);
      double ca[kChunk] = {}, cb[kChunk] = {};  // one row chunk's sums, added in chunk order as token_math does
      for (int64_t r = r0; r < r1; ++r) {
        const float* g = dy + r * d + j0;
        const float* h = xhat + r * d + j0;
        for (int64_t k = 0; k < w; ++k) {
          ca[k] += static_cast<double>(g[k]) * h[k];
          cb[k] += g[k];
        }
      }
      for (int64_t k = 0; k < w; ++k) {
        a[k] += ca[k];
        b[k] += cb[k];
      }
    }
    for (int64_t k = 0; k < w; ++k) {
      dgamma[j0 + k] = static_cast<float>(a[k]);
      dbeta[j0 + k] = static_cast<float>(b[k]);
    }
  }
}

void softmax_forward_ref(float* y, const float* x, int64_t rows, int64_t d, float scale) {
#pragma omp parallel for if (rows * d > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) token_math::softmax_row(y, x, r, d, scale);
}

void softmax_backward_ref(float* dx, const float* dy, const float* y, int64_t rows, int64_t d, float scale) {
#pragma omp parallel for if (rows * d > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) token_math::softmax_row_backward(dx, dy, y, r, d, scale);
}

void scale_rows(float* y, const float* x, const float* s, int64_t rows, int64_t d) {
#pragma omp parallel for if (rows * d > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < d; ++j) y[r * d + j] = x[r * d + j] * s[r];
}

void add_to_rows(float* y, const float* x, const float* p, int64_t rows, int64_t d) {
#pragma omp parallel for if (rows * d > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < d; ++j) y[r * d + j] = x[r * d + j] + p[j];
}

void column_sums(float* out, const float* x, int64_t rows, int64_t d) {
  // Chunks of columns per thread, rows inner: contiguous reads that vectorize, and each column's sum in
  // token_math::column_sum's order (row chunks in order, rows in order within a chunk), the CUDA kernel's.
  // 32 columns (two 64-byte lines of a row) per chunk: enough chunks for every thread at a transformer's
  // widths (192 columns made one 256-wide chunk, so one thread summed the whole bias gradient).
  constexpr int64_t kChunk = 32;
  const int64_t chunks = (d + kChunk - 1) / kChunk;
#pragma omp parallel for if (rows * d > kParallelGrain)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t j0 = c * kChunk, w = j0 + kChunk < d ? kChunk : d - j0;
    float acc[kChunk] = {};  // local sums: out may alias x for all the compiler knows, so it would not vectorize
    for (int64_t r0 = 0; r0 < rows; r0 += token_math::kColumnChunk) {
      const int64_t r1 = token_math::column_chunk_end(r0, rows);
      float part[kChunk] = {};
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t k = 0; k < w; ++k) part[k] += x[r * d + j0 + k];
      for (int64_t k = 0; k < w; ++k) acc[k] += part[k];
    }
    for (int64_t k = 0; k < w; ++k) out[j0 + k] = acc[k];
  }
}

void gather_rows(float* out, const float* table, const int64_t* index, int64_t n, int64_t d) {
#pragma omp parallel for if (n * d > kParallelGrain)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) out[i * d + j] = table[index[i] * d + j];
}

void scatter_add_rows(float* grad, const float* dy, const int64_t* index, int64_t n, int64_t rows, int64_t d) {
  for (int64_t k = 0; k < rows * d; ++k) grad[k] = 0.f;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) grad[index[i] * d + j] += dy[i * d + j];
}

}  // namespace actlab::cpu
