// ACTLAB_HD marks per-element functions compiled for both the CPU and (under nvcc) the GPU, so one
// body of arithmetic serves both backends and CPU tests cover what the GPU runs.
#pragma once
#if defined(__CUDACC__)
#define ACTLAB_HD __host__ __device__ __forceinline__
#else
#define ACTLAB_HD inline
#endif
