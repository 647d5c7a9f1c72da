// CPU single-precision GEMM: the tuned path (oneDNN's dnnl_sgemm, chosen by measurement over the
// Debian OpenBLAS, see bench/RESULTS_conv.md), its batched form for attention, and naive reference loops
// used as the spec. Tested in tests/test_cpu_conv.cpp; timed in bench/bench_conv.cpp (gemm) and
// bench/bench_token.cpp (gemm_batched).
#pragma once
#include <cstdint>

namespace actlab::cpu {

// C(M,N) = alpha * op(A) * op(B) + beta * C, row-major, same contract as cblas_sgemm(RowMajor, ...).
// op(A) is (M,K): A is (M,K) with lda >= K, or (K,M) with lda >= M when trans_a.
// op(B) is (K,N): B is (K,N) with ldb >= N, or (N,K) with ldb >= K when trans_b.
// C is (M,N) with ldc >= N and must not alias A or B. beta == 0 overwrites C (NaNs in C are ignored).
// Threads: OpenMP (omp_set_num_threads). Throws actlab::Error on bad sizes.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
          float* C, int64_t ldc);

// `batch` independent products C_i (M,N) = op(A_i)·op(B_i), alpha 1 and beta 0, the matrices packed one after
// another (A_i = A + i·M·K, B_i = B + i·K·N, C_i = C + i·M·N; op as in gemm). C must not alias A or B; it is
// assigned (NaNs in C are ignored). Threads: OpenMP. gemm_batched runs whichever of the two paths below
// measured faster for the shape (the rule and its figures: gemm.cpp, bench/RESULTS.md "Vision transformers").
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, const float* A,
                  const float* B, float* C);
// One gemm per matrix: threads go to the batch when it has enough matrices (each gemm then on one thread),
// else to each gemm in turn. What a minimal build (no oneDNN) runs for gemm_batched.
void gemm_batched_per_matrix(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K,
                             const float* A, const float* B, float* C);
// oneDNN's matmul primitive over the whole batch at once (a 3-D problem, the transposes as memory strides: no
// copies), one primitive per (batch, M, N, K, trans_a, trans_b) created on first use and kept; its scratchpad
// is a Workspace Buffer freed before return. Safe to call from several threads. Full build only.
void gemm_batched_dnnl(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, const float* A,
                       const float* B, float* C);
// gemm_batched under --precision bf16 (core/precision.h): A and B rounded to bf16 (into Workspace buffers),
// multiplied by oneDNN's bf16 matmul with f32 accumulation, C written in f32. Its spec is gemm_batched_ref on
// the rounded operands (tests/test_cpu_conv.cpp). Full build only (a minimal build refuses bf16).
void gemm_batched_bf16(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, const float* A,
                       const float* B, float* C);
// One product C (M,N) = op(A)·op(B) on operands already in bf16 (bits as core/bf16.h writes them; op and the
// packed layouts as in gemm_batched), by oneDNN's bf16 matmul with f32 accumulation, C assigned in f32. For
// callers that hold their operands in bf16 already (the bf16 convolution's backward weights, conv.cpp). Its
// spec is gemm_ref on the widened operands (tests/test_cpu_conv.cpp). Full build only.
void gemm_bf16_bits(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
                    const uint16_t* B, float* C);
// The executable spec of the three batched forms: gemm_ref per matrix, serial.
void gemm_batched_ref(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, const float* A,
                      const float* B, float* C);

// Throws actlab::Error unless the sizes and leading dimensions fit gemm's contract (every gemm runs it).
void check_gemm_args(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                     int64_t ldc);

// The executable spec: triple loop, double accumulation, single thread. Same contract as gemm.
void gemm_ref(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
              float* C, int64_t ldc);

}  // namespace actlab::cpu
