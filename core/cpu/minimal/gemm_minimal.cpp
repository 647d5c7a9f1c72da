// The CPU GEMM of a minimal build (ACTLAB_GPU_CHECK: no oneDNN on the machine): gemm.h's contract as
// gemm_ref (gemm_ref.cpp: double accumulation) on the rows of C in parallel. Only the CMake option compiles
// this file; it replaces core/cpu/gemm.cpp. The CPU reference of the CUDA parity suites.
#include "actlab/core/cpu/gemm.h"
#include "actlab/core/error.h"

namespace actlab::cpu {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  check_gemm_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0) {  // A may be null: no row pointers into it
    gemm_ref(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // Row i of op(A) is row i of A, or column i of a transposed A: a 1×K product per row of C.
#pragma omp parallel for schedule(static) if (M * N * K > 65536)
  for (int64_t i = 0; i < M; ++i)
    gemm_ref(trans_a, trans_b, 1, N, K, alpha, trans_a ? A + i : A + i * lda, lda, B, ldb, beta, C + i * ldc, ldc);
}

// check_precision_supported refuses bf16 in a minimal build; this is the kernel's own guard.
void gemm_batched_bf16(bool, bool, int64_t, int64_t, int64_t, int64_t, const float*, const float*, float*) {
  ACTLAB_FAIL("gemm_batched_bf16: a minimal build has no bf16 matmul (no oneDNN)");
}

void gemm_bf16_bits(bool, bool, int64_t, int64_t, int64_t, const uint16_t*, const uint16_t*, float*) {
  ACTLAB_FAIL("gemm_bf16_bits: a minimal build has no bf16 matmul (no oneDNN)");
}

// No oneDNN matmul primitive here: the per-matrix loop (gemm_ref.cpp) over the gemm above.
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, const float* A,
                  const float* B, float* C) {
  gemm_batched_per_matrix(trans_a, trans_b, batch, M, N, K, A, B, C);
}

}  // namespace actlab::cpu
