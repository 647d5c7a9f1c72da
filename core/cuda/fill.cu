// CUDA fill kernel (see core/cuda/fill.h). Tested in tests/test_cuda.cpp ("cuda fill: ...").
#include "actlab/core/cuda/fill.h"

#include <algorithm>

#include "actlab/core/cuda/check.h"

namespace actlab::cuda {
namespace {

// Grid-stride loop: any n (64-bit) works with a capped grid; consecutive threads write consecutive
// floats, so stores coalesce.
__global__ void fill_kernel(float* dst, float value, int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = value;
}

}  // namespace

void fill(float* dst, float value, int64_t n, cudaStream_t cuda_stream) {
  ACTLAB_CHECK(n >= 0, "cuda::fill: negative element count ", n);
  if (n == 0) return;
  constexpr int kThreads = 256;
  constexpr int64_t kMaxBlocks = 1 << 16;  // enough to fill any GPU; beyond it threads loop
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
  fill_kernel<<<blocks, kThreads, 0, cuda_stream>>>(dst, value, n);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

}  // namespace actlab::cuda
