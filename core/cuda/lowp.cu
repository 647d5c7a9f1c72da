// core/cuda/lowp.h: the rounding and widening kernels of the 16-bit GEMM and convolution operands.
#include "actlab/core/cuda/lowp.h"

#include <cuda_fp16.h>

#include "actlab/core/bf16.h"
#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/kernels.h"
#include "actlab/core/cuda/launch.h"

namespace actlab::cuda {
namespace {

__global__ void to_f16_kernel(uint16_t* y, const float* x, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) y[i] = __half_as_ushort(__float2half_rn(x[i]));
}
__global__ void from_f16_kernel(float* y, const uint16_t* x, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) y[i] = __half2float(__ushort_as_half(x[i]));
}

void check_low(Precision p) {
  ACTLAB_CHECK(p == Precision::BF16 || p == Precision::F16, "16-bit GPU operands: ", precision_name(p),
               " is not a 16-bit precision");
}

}  // namespace

LowCopy::LowCopy(const float* x, int64_t n, Precision p, int device, cudaStream_t stream)
    : buffer_(static_cast<size_t>(n) * 2, MemTag::Workspace, Device::cuda(device)) {
  check_low(p);
  if (n == 0) return;
  auto* y = static_cast<uint16_t*>(buffer_.data());
  if (p == Precision::BF16) {
    to_bf16(y, x, n, stream);  // token.cu: core/bf16.h's rounding, the CPU's bits
    return;
  }
  to_f16_kernel<<<grid_blocks(n), kBlockThreads, 0, stream>>>(y, x, n);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

LowOut::LowOut(int64_t n, Precision p, int device)
    : buffer_(static_cast<size_t>(n) * 2, MemTag::Workspace, Device::cuda(device)), n_(n), precision_(p) {
  check_low(p);
}

void LowOut::widen(float* y, cudaStream_t stream) const {
  if (n_ == 0) return;
  const auto* x = static_cast<const uint16_t*>(buffer_.data());
  if (precision_ == Precision::BF16) {
    from_bf16(y, x, n_, stream);
    return;
  }
  from_f16_kernel<<<grid_blocks(n_), kBlockThreads, 0, stream>>>(y, x, n_);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

cudaDataType_t blas_type(Precision p) {
  check_low(p);
  return p == Precision::BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

}  // namespace actlab::cuda
