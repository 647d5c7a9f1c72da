// Fully-connected layers and batched matrix products on the GPU: cuBLAS GEMMs for the products plus small
// kernels for the bias and its gradient. Row-major contracts identical to the CPU path of core/ops.cpp (linear_*). Implemented in
// core/cuda/blas.cu; called only from core/ops.cpp. Tested in tests/test_cuda_ops.cpp.
#pragma once
#include <cstdint>

#include "actlab/core/cuda/context.h"
#include "actlab/core/precision.h"

namespace actlab::cuda {

// All pointers: device memory of ctx's device, row-major contiguous fp32; outputs assigned, never aliasing
// inputs; asynchronous on ctx.stream(). TF32 follows math_options().allow_tf32 (core/cuda/conv.h). With
// p = BF16 or F16 the two operands are rounded to that format first and the product accumulates in fp32
// on tensor cores (cublasGemmStridedBatchedEx, core/cuda/lowp.h); outputs stay fp32.

// y (N,M) = x (N,D) · w (M,D)ᵀ + b (M); b may be nullptr.
void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t N, int64_t D,
                    int64_t M, CudaContext& ctx, Precision p = Precision::F32);
// dx (N,D) = dy (N,M) · w (M,D).
void linear_backward_data(float* dx, const float* dy, const float* w, int64_t N, int64_t M,
                          int64_t D, CudaContext& ctx, Precision p = Precision::F32);
// dw (M,D) = dy (N,M)ᵀ · x (N,D); db (M) = Σ_n dy[n, :] (rows added in order) unless db is nullptr.
void linear_backward_weight(float* dw, float* db, const float* dy, const float* x, int64_t N,
                            int64_t M, int64_t D, CudaContext& ctx, Precision p = Precision::F32);

// c (batch, M, N) = op(a)·op(b) per batch, the contract of cpu::gemm_batched (core/cpu/gemm.h): a (batch, M, K)
// or (batch, K, M) when trans_a, b (batch, K, N) or (batch, N, K) when trans_b.
void batched_matmul(float* c, const float* a, const float* b, int64_t batch, int64_t M, int64_t N, int64_t K,
                    bool trans_a, bool trans_b, CudaContext& ctx, Precision p = Precision::F32);

}  // namespace actlab::cuda
