// core/cuda/lowp.h: the 16-bit copies of GEMM and convolution operands (the kernels are token.cu's).
#include "actlab/core/cuda/lowp.h"

#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/kernels.h"

namespace actlab::cuda {
namespace {

// The tensor type of p's 16-bit format.
DType half_type(Precision p) {
  ACTLAB_CHECK(p == Precision::BF16 || p == Precision::F16, "16-bit GPU operands: ", precision_name(p),
               " is not a 16-bit precision");
  return p == Precision::BF16 ? DType::BF16 : DType::F16;
}

}  // namespace

LowCopy::LowCopy(const float* x, int64_t n, Precision p, int device, cudaStream_t stream)
    : buffer_(static_cast<size_t>(n) * 2, MemTag::Workspace, Device::cuda(device)) {
  narrow_16(static_cast<uint16_t*>(buffer_.data()), x, n, half_type(p), stream);  // token.cu: the CPU's bits
}

LowOut::LowOut(int64_t n, Precision p, int device)
    : buffer_(static_cast<size_t>(n) * 2, MemTag::Workspace, Device::cuda(device)), n_(n), precision_(p) {
  half_type(p);  // the check
}

void LowOut::widen(float* y, cudaStream_t stream) const {
  widen_16(y, static_cast<const uint16_t*>(buffer_.data()), n_, half_type(precision_), stream);
}

cudaDataType_t blas_type(Precision p) { return half_type(p) == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F; }

}  // namespace actlab::cuda
