// CPU GEMM: gemm() forwards to oneDNN's dnnl_sgemm (it detects AVX-512 at run time; the Debian
// OpenBLAS 0.3.21 picks a slow kernel on Zen 5 unless an environment variable forces it). The argument
// checks and gemm_ref() are in gemm_ref.cpp. Tested in tests/test_cpu_conv.cpp.
#include "actlab/core/cpu/gemm.h"

#include <oneapi/dnnl/dnnl.h>

#include "actlab/core/error.h"

namespace actlab::cpu {
namespace {

// C = beta * C, with beta == 0 meaning "overwrite" (BLAS semantics: NaNs in C do not survive).
void scale_c(int64_t M, int64_t N, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc) {
  check_gemm_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.f) {  // dnnl_sgemm's handling of K == 0 is not documented
    scale_c(M, N, beta, C, ldc);
    return;
  }
  const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha,
                                          A, lda, B, ldb, beta, C, ldc);
  ACTLAB_CHECK(status == dnnl_success, "dnnl_sgemm failed with status ", static_cast<int>(status),
               " for M=", M, " N=", N, " K=", K, " trans_a=", trans_a, " trans_b=", trans_b,
               " lda=", lda, " ldb=", ldb, " ldc=", ldc);
}

}  // namespace actlab::cpu
