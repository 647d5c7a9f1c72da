// The 16-bit operands of the GPU's convolutions and GEMMs under --precision bf16|fp16 (core/precision.h):
// fp32 inputs rounded once into workspace buffers (core/bf16.h's float_to_bf16 / float_to_f16, to nearest
// even), and 16-bit outputs widened back to fp32. The tensors between ops stay fp32, as on the
// CPU. Included only by CUDA translation units (core/cuda/conv.cpp, core/cuda/blas.cu); implemented in
// core/cuda/lowp.cu. Tested through tests/test_cuda_ops.cpp ("cuda ops: bf16 and fp16 ...").
#pragma once
#include <cuda_runtime_api.h>
#include <library_types.h>

#include <cstdint>

#include "actlab/core/allocator.h"
#include "actlab/core/precision.h"

namespace actlab::cuda {

// n fp32 values of device memory rounded to p (BF16 or F16) in a MemTag::Workspace buffer on `device`,
// queued on `stream` (the buffer is freed in stream order, so it may go as soon as the consumer is queued).
class LowCopy {
 public:
  LowCopy(const float* x, int64_t n, Precision p, int device, cudaStream_t stream);
  const void* data() const { return buffer_.data(); }
 private:
  Buffer buffer_;
};

// Room for n 16-bit outputs in p's format; widen() writes them to y as fp32.
class LowOut {
 public:
  LowOut(int64_t n, Precision p, int device);
  void* data() { return buffer_.data(); }
  void widen(float* y, cudaStream_t stream) const;
 private:
  Buffer buffer_;
  int64_t n_;
  Precision precision_;
};

// cuBLAS's name of p's 16-bit format (CUDA_R_16BF, CUDA_R_16F).
cudaDataType_t blas_type(Precision p);

}  // namespace actlab::cuda
