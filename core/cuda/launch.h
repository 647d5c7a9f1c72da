// Launch geometry shared by the .cu files of core/cuda/ and core/cuda/codec.cu: grid sizes for
// grid-stride loops and the block-wide reduction helpers. Included only by CUDA translation units.
// Exercised by every kernel test in tests/test_cuda_ops.cpp and tests/test_cuda_codec.cpp.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "actlab/core/error.h"

namespace actlab::cuda {

constexpr int kBlockThreads = 256;         // threads per block of the element-wise kernels
constexpr int64_t kMaxGridBlocks = 65536;  // more blocks than any GPU runs at once; threads loop beyond

// Blocks for a grid-stride loop over `work` items with `threads` per block (at least 1 block).
inline int grid_blocks(int64_t work, int threads = kBlockThreads) {
  ACTLAB_CHECK(work >= 0, "negative work size ", work);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((work + threads - 1) / threads, kMaxGridBlocks)));
}

// Index of the calling thread in a 1-D grid and the grid's thread count, as 64-bit values.
__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }
// The same for warps (blockDim.x a multiple of 32): the calling warp's index in the grid and the grid's
// warp count, for grid-stride loops that give each warp one row.
__device__ __forceinline__ int64_t global_warp() { return global_thread() >> 5; }
__device__ __forceinline__ int64_t grid_warps() { return grid_threads() >> 5; }

// 64-bit min / max for device code (std::min is host-only without --expt-relaxed-constexpr).
__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Sum of v over the warp (every lane gets it). All 32 lanes must call it.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); the result is valid in thread 0.
// `scratch` holds 32 values of T in shared memory. Every thread of the block must call it.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  v = threadIdx.x < warps ? scratch[threadIdx.x] : T(0);
  if (warp == 0) v = warp_sum(v);
  __syncthreads();  // scratch may be reused by the caller's next reduction
  return v;
}

}  // namespace actlab::cuda
