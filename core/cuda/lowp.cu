// core/cuda/lowp.h: the 16-bit copies of GEMM and convolution operands (the kernels are token.cu's).
#include "actlab/core/cuda/lowp.h"

#include "actlab/core/bf16.h"
#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/kernels.h"
#include "actlab/core/cuda/launch.h"

namespace actlab::cuda {
namespace {

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
  to_f16(y, x, n, stream);  // token.cu: core/bf16.h's float_to_f16, the CPU's bits
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
  from_f16(y, x, n_, stream);
}

cudaDataType_t blas_type(Precision p) {
  check_low(p);
  return p == Precision::BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

}  // namespace actlab::cuda
