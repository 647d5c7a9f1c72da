// The first CUDA kernel (proves the toolchain end to end): fill a float array with one value.
// CPU twin: Tensor::fill_ (core/tensor.cpp). Tested in tests/test_cuda.cpp ("cuda fill: ...").
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace actlab::cuda {

// dst[i] = value for i in [0, n) (assign). dst: n f32 on the device that owns `stream`, which must be
// the current device. Asynchronous: queued on `stream`; n == 0 queues nothing. Throws Error for n < 0
// or a failed launch.
void fill(float* dst, float value, int64_t n, cudaStream_t cuda_stream);

}  // namespace actlab::cuda
