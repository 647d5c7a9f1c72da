// cuBLAS-backed linear layers (core/cuda/blas.h). cuBLAS is column-major: a row-major (R,C) matrix is the
// column-major (C,R) matrix, i.e. its transpose, so every row-major product A·B is computed as the
// column-major Bᵀ·Aᵀ with the operands swapped. Tested in tests/test_cuda_ops.cpp.
#include <climits>

#include "actlab/core/cuda/blas.h"
#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/conv.h"
#include "actlab/core/cuda/kernels.h"
#include "actlab/core/cuda/launch.h"

namespace actlab::cuda {
namespace {

// y[n, m] += b[m].
__global__ void add_row_bias(float* y, const float* b, int64_t N, int64_t M) {
  for (int64_t i = global_thread(); i < N * M; i += grid_threads()) y[i] += b[i % M];
}

int blas_int(int64_t v, const char* what) {
  ACTLAB_CHECK(v >= 0 && v <= INT_MAX, "linear on CUDA: ", what, " ", v, " does not fit cuBLAS's int sizes");
  return static_cast<int>(v);
}

// The handle with the current math mode: TF32 tensor cores only when allowed.
cublasHandle_t blas(CudaContext& ctx) {
  cublasHandle_t h = ctx.blas();
  const cublasMath_t mode = math_options().allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
  ACTLAB_CUBLAS_CHECK(cublasSetMathMode(h, mode));
  return h;
}

const float kOne = 1.f, kZero = 0.f;

}  // namespace

void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t N, int64_t D,
                    int64_t M, CudaContext& ctx) {
  // Column-major: yᵀ (M×N) = (w as D×M)ᵀ · (x as D×N).
  ACTLAB_CUBLAS_CHECK(cublasSgemm(blas(ctx), CUBLAS_OP_T, CUBLAS_OP_N, blas_int(M, "M"), blas_int(N, "N"),
                                  blas_int(D, "D"), &kOne, w, blas_int(D, "D"), x, blas_int(D, "D"), &kZero, y,
                                  blas_int(M, "M")));
  if (b != nullptr && N * M > 0) {
    add_row_bias<<<grid_blocks(N * M), kBlockThreads, 0, ctx.stream()>>>(y, b, N, M);
    ACTLAB_CUDA_CHECK_LAUNCH();
  }
}

void linear_backward_data(float* dx, const float* dy, const float* w, int64_t N, int64_t M,
                          int64_t D, CudaContext& ctx) {
  // Column-major: dxᵀ (D×N) = (w as D×M) · (dy as M×N).
  ACTLAB_CUBLAS_CHECK(cublasSgemm(blas(ctx), CUBLAS_OP_N, CUBLAS_OP_N, blas_int(D, "D"), blas_int(N, "N"),
                                  blas_int(M, "M"), &kOne, w, blas_int(D, "D"), dy, blas_int(M, "M"), &kZero, dx,
                                  blas_int(D, "D")));
}

void linear_backward_weight(float* dw, float* db, const float* dy, const float* x, int64_t N,
                            int64_t M, int64_t D, CudaContext& ctx) {
  // Column-major: dwᵀ (D×M) = (x as D×N) · (dy as M×N)ᵀ.
  ACTLAB_CUBLAS_CHECK(cublasSgemm(blas(ctx), CUBLAS_OP_N, CUBLAS_OP_T, blas_int(D, "D"), blas_int(M, "M"),
                                  blas_int(N, "N"), &kOne, x, blas_int(D, "D"), dy, blas_int(M, "M"), &kZero, dw,
                                  blas_int(D, "D")));
  if (db != nullptr && M > 0) {
    column_sums(db, dy, N, M, ctx.stream());  // token.cu: rows in order, the CPU's bits
  }
}

void batched_matmul(float* c, const float* a, const float* b, int64_t batch, int64_t M, int64_t N, int64_t K,
                    bool trans_a, bool trans_b, CudaContext& ctx) {
  if (batch == 0 || M == 0 || N == 0) return;
  // Column-major: cᵀ (N×M) = op(b)ᵀ · op(a)ᵀ, each row-major operand read as its column-major transpose.
  const int lda = blas_int(trans_a ? M : K, "lda"), ldb = blas_int(trans_b ? K : N, "ldb");
  ACTLAB_CUBLAS_CHECK(cublasSgemmStridedBatched(
      blas(ctx), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, blas_int(N, "N"),
      blas_int(M, "M"), blas_int(K, "K"), &kOne, b, ldb, K * N, a, lda, M * K, &kZero, c, blas_int(N, "N"), M * N,
      blas_int(batch, "batch")));
}

}  // namespace actlab::cuda
