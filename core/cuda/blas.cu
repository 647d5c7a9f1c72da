// cuBLAS-backed linear layers (core/cuda/blas.h). cuBLAS is column-major: a row-major (R,C) matrix is the
// column-major (C,R) matrix, i.e. its transpose, so every row-major product A·B is computed as the
// column-major Bᵀ·Aᵀ with the operands swapped. Tested in tests/test_cuda_ops.cpp.
#include <climits>

#include "actlab/core/cuda/blas.h"
#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/conv.h"
#include "actlab/core/cuda/cublas.h"
#include "actlab/core/cuda/kernels.h"
#include "actlab/core/cuda/launch.h"
#include "actlab/core/cuda/lowp.h"

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
  ACTLAB_CUBLAS_CHECK(cublas().set_math_mode(h, mode));
  return h;
}

const float kOne = 1.f, kZero = 0.f;

// The column-major product C (m×n, fp32) = op(A)·op(B), `batch` times with the given strides (elements;
// `strided` false: one plain product), in fp32 (SGEMM) or, under bf16/fp16, on 16-bit copies of A (a_elems values) and B (b_elems) with fp32
// accumulation and an fp32 C (cublasGemmStridedBatchedEx, tensor cores).
void gemm(cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k, const float* a, int lda,
          int64_t stride_a, int64_t a_elems, const float* b, int ldb, int64_t stride_b, int64_t b_elems, float* c,
          int ldc, int64_t stride_c, int batch, bool strided, Precision p, CudaContext& ctx) {
  if (p == Precision::F32) {
    if (!strided) {
      ACTLAB_CUBLAS_CHECK(cublas().sgemm(blas(ctx), op_a, op_b, m, n, k, &kOne, a, lda, b, ldb, &kZero, c, ldc));
    } else {
      ACTLAB_CUBLAS_CHECK(cublas().sgemm_strided_batched(blas(ctx), op_a, op_b, m, n, k, &kOne, a, lda, stride_a, b,
                                                         ldb, stride_b, &kZero, c, ldc, stride_c, batch));
    }
    return;
  }
  const LowCopy a16(a, a_elems, p, ctx.device(), ctx.stream()), b16(b, b_elems, p, ctx.device(), ctx.stream());
  const cudaDataType_t t = blas_type(p);
  ACTLAB_CUBLAS_CHECK(cublas().gemm_strided_batched_ex(blas(ctx), op_a, op_b, m, n, k, &kOne, a16.data(), t, lda,
                                                           stride_a, b16.data(), t, ldb, stride_b, &kZero, c, CUDA_R_32F,
                                                           ldc, stride_c, batch, CUBLAS_COMPUTE_32F,
                                                           CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t N, int64_t D,
                    int64_t M, CudaContext& ctx, Precision p) {
  // Column-major: yᵀ (M×N) = (w as D×M)ᵀ · (x as D×N).
  gemm(CUBLAS_OP_T, CUBLAS_OP_N, blas_int(M, "M"), blas_int(N, "N"), blas_int(D, "D"), w, blas_int(D, "D"), 0, M * D,
       x, blas_int(D, "D"), 0, N * D, y, blas_int(M, "M"), 0, 1, false, p, ctx);
  if (b != nullptr && N * M > 0) {
    add_row_bias<<<grid_blocks(N * M), kBlockThreads, 0, ctx.stream()>>>(y, b, N, M);
    ACTLAB_CUDA_CHECK_LAUNCH();
  }
}

void linear_backward_data(float* dx, const float* dy, const float* w, int64_t N, int64_t M,
                          int64_t D, CudaContext& ctx, Precision p) {
  // Column-major: dxᵀ (D×N) = (w as D×M) · (dy as M×N).
  gemm(CUBLAS_OP_N, CUBLAS_OP_N, blas_int(D, "D"), blas_int(N, "N"), blas_int(M, "M"), w, blas_int(D, "D"), 0, M * D,
       dy, blas_int(M, "M"), 0, N * M, dx, blas_int(D, "D"), 0, 1, false, p, ctx);
}

void linear_backward_weight(float* dw, float* db, const float* dy, const float* x, int64_t N,
                            int64_t M, int64_t D, CudaContext& ctx, Precision p) {
  // Column-major: dwᵀ (D×M) = (x as D×N) · (dy as M×N)ᵀ.
  gemm(CUBLAS_OP_N, CUBLAS_OP_T, blas_int(D, "D"), blas_int(M, "M"), blas_int(N, "N"), x, blas_int(D, "D"), 0, N * D,
       dy, blas_int(M, "M"), 0, N * M, dw, blas_int(D, "D"), 0, 1, false, p, ctx);
  if (db != nullptr && M > 0) {
    column_sums(db, dy, N, M, ctx.stream());  // token.cu: token_math's column order, the CPU's bits; fp32 dy
  }
}

void batched_matmul(float* c, const float* a, const float* b, int64_t batch, int64_t M, int64_t N, int64_t K,
                    bool trans_a, bool trans_b, CudaContext& ctx, Precision p) {
  if (batch == 0 || M == 0 || N == 0) return;
  // Column-major: cᵀ (N×M) = op(b)ᵀ · op(a)ᵀ, each row-major operand read as its column-major transpose.
  const int lda = blas_int(trans_a ? M : K, "lda"), ldb = blas_int(trans_b ? K : N, "ldb");
  gemm(trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, blas_int(N, "N"), blas_int(M, "M"),
       blas_int(K, "K"), b, ldb, K * N, batch * K * N, a, lda, M * K, batch * M * K, c, blas_int(N, "N"), M * N,
       blas_int(batch, "batch"), true, p, ctx);
}

}  // namespace actlab::cuda
