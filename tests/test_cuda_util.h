// Helpers of the CPU-vs-CUDA parity suites (tests/test_cuda_ops.cpp, tests/test_cuda_codec.cpp): the
// visible skip when no GPU is present, random tensors, and comparisons that report the worst element.
// CUDA-free: the suites compile in CPU-only builds and skip at run time there.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "actlab/core/allocator.h"
#include "actlab/core/cuda/runtime.h"
#include "actlab/core/tensor.h"

namespace actlab::testing {

// True when a GPU is present (and actlab's CUDA backend is initialised). Otherwise prints
// "SKIPPED: no CUDA device: <what>" so the skip shows in the test output (CTest reports such cases as
// skipped when the project sets SKIP_REGULAR_EXPRESSION, see docs/cuda.md) and the case returns.
inline bool gpu_or_skip(const char* what) {
  if (!cuda_available()) {
    MESSAGE("SKIPPED: no CUDA device: " << std::string(what));
    return false;
  }
  cuda_init();
  return true;
}

inline Device gpu() { return Device::cuda(0); }

// Uniform [lo, hi) f32 on the CPU, reproducible from `seed`.
inline Tensor uniform(const Shape& shape, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  PhiloxStream rng(seed, 11);
  return Tensor::rand(shape, rng, lo, hi);
}

// The first element where |got - want| > tol·max|want| (plus a tiny absolute floor) fails the check, with
// the index and both values; `what` names the quantity. Both tensors may live on any device.
inline void check_close(const Tensor& want, const Tensor& got, double tol, const std::string& what) {
  REQUIRE_MESSAGE(want.shape() == got.shape(), what, ": shape ", shape_str(got.shape()), " vs ",
                  shape_str(want.shape()));
  const std::vector<float> a = want.to_vector(), b = got.to_vector();
  double scale = 0;
  for (float v : a) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  const double bound = tol * scale + 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (!(diff <= bound)) {
      FAIL_CHECK(what << "[" << i << "]: cuda " << b[i] << " vs cpu " << a[i] << " (bound " << bound << ")");
      return;
    }
  }
}

// Byte-for-byte equality of two tensors' contents (any dtype, any devices).
inline void check_same_bytes(const Tensor& want, const Tensor& got, const std::string& what) {
  REQUIRE_MESSAGE(want.shape() == got.shape(), what, ": shape ", shape_str(got.shape()), " vs ",
                  shape_str(want.shape()));
  REQUIRE(want.dtype() == got.dtype());
  const Tensor a = want.to(Device::cpu()).contiguous(), b = got.to(Device::cpu()).contiguous();
  const auto* pa = static_cast<const unsigned char*>(a.raw_data());
  const auto* pb = static_cast<const unsigned char*>(b.raw_data());
  for (size_t i = 0; i < a.nbytes(); ++i) {
    if (pa[i] != pb[i]) {
      FAIL_CHECK(what << ": byte " << i << " of " << a.nbytes() << " differs: cuda " << int(pb[i]) << " vs cpu "
                      << int(pa[i]));
      return;
    }
  }
}

// Live bytes on the CPU and on cuda:0 return to where the case started. On the GPU the context's scratch
// (MemTag::Workspace: the cuDNN workspace, which only grows, and cuBLAS's, made on the first GEMM) is
// persistent by design and left out.
struct LiveBytesOnBoth {
  static int64_t cuda_live() {
    const MemoryStats s = memory_stats(Device::cuda(0));
    return s.total.current - s[MemTag::Workspace].current;
  }
  int64_t cpu = memory_stats(Device::cpu()).total.current;
  int64_t cuda = cuda_live();
  void check() const {
    CHECK(memory_stats(Device::cpu()).total.current == cpu);
    CHECK(cuda_live() == cuda);
  }
};

}  // namespace actlab::testing
