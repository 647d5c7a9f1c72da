// The executable spec of gemm.h (gemm_ref: triple loop, double accumulation), the argument checks
// every gemm() implementation runs first, and the per-matrix batched loop over whichever gemm() is built.
// No oneDNN here, so the minimal GPU-check build (core/cpu/minimal/gemm_minimal.cpp) shares all of it with
// the full build. Tested in tests/test_cpu_conv.cpp.
#include "actlab/core/cpu/gemm.h"

#include <omp.h>

#include "actlab/core/error.h"

namespace actlab::cpu {

void check_gemm_args(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                     int64_t ldb, int64_t ldc) {
  ACTLAB_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M=", M, " N=", N, " K=", K);
  const int64_t a_cols = trans_a ? M : K;
  const int64_t b_cols = trans_b ? K : N;
  ACTLAB_CHECK(lda >= (a_cols > 1 ? a_cols : 1), "gemm: lda ", lda, " < ", a_cols,
               " (trans_a=", trans_a, ", M=", M, ", K=", K, ")");
  ACTLAB_CHECK(ldb >= (b_cols > 1 ? b_cols : 1), "gemm: ldb ", ldb, " < ", b_cols,
               " (trans_b=", trans_b, ", K=", K, ", N=", N, ")");
  ACTLAB_CHECK(ldc >= (N > 1 ? N : 1), "gemm: ldc ", ldc, " < N=", N);
}

void gemm_ref(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
              int64_t ldc) {
  check_gemm_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const float a = trans_a ? A[k * lda + i] : A[i * lda + k];
        const float b = trans_b ? B[j * ldb + k] : B[k * ldb + j];
        acc += static_cast<double>(a) * b;
      }
      float& c = C[i * ldc + j];
      c = static_cast<float>(alpha * acc + (beta == 0.f ? 0.0 : static_cast<double>(beta) * c));
    }
  }
}

namespace {

// The leading dimension of a packed row-major matrix with `cols` columns (gemm's contract wants >= 1 even
// when a size is 0).
int64_t packed_ld(int64_t cols) { return cols > 1 ? cols : 1; }

}  // namespace

void gemm_batched_per_matrix(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K,
                             const float* A, const float* B, float* C) {
  const int64_t lda = packed_ld(trans_a ? M : K), ldb = packed_ld(trans_b ? K : N), ldc = packed_ld(N);
  // Attention's products are small (tokens × head width) and many (batch × heads): one per thread beats
  // threading each. oneDNN's sgemm runs on the calling thread inside a parallel region.
  if (batch >= omp_get_max_threads()) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < batch; ++i)
      gemm(trans_a, trans_b, M, N, K, 1.f, A + i * M * K, lda, B + i * K * N, ldb, 0.f, C + i * M * N, ldc);
  } else {
    for (int64_t i = 0; i < batch; ++i)
      gemm(trans_a, trans_b, M, N, K, 1.f, A + i * M * K, lda, B + i * K * N, ldb, 0.f, C + i * M * N, ldc);
  }
}

void gemm_batched_ref(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, const float* A,
                      const float* B, float* C) {
  const int64_t lda = packed_ld(trans_a ? M : K), ldb = packed_ld(trans_b ? K : N), ldc = packed_ld(N);
  for (int64_t i = 0; i < batch; ++i)
    gemm_ref(trans_a, trans_b, M, N, K, 1.f, A + i * M * K, lda, B + i * K * N, ldb, 0.f, C + i * M * N, ldc);
}

}  // namespace actlab::cpu
