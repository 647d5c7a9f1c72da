// CPU-only implementation of core/cuda/runtime.h and core/cuda/transfer.h: no CUDA device ever exists.
// Compiled in every build (core/*.cpp) but empty when the CUDA backend is built (core/cuda/runtime.cpp
// and core/cuda/transfer.cpp take over).
// Tested in tests/test_cuda.cpp ("cuda runtime: ...").
#ifndef ACTLAB_WITH_CUDA

#include "actlab/core/cuda/runtime.h"
#include "actlab/core/cuda/transfer.h"

#include "actlab/core/error.h"

namespace actlab {

int cuda_device_count() { return 0; }

bool cuda_available() { return false; }

std::string cuda_device_name(int device) {
  ACTLAB_FAIL("cuda:", device, " does not exist: actlab was built without CUDA (configure with -DACTLAB_CUDA=ON)");
}

void cuda_init() {
  ACTLAB_FAIL("CUDA requested but actlab was built without CUDA (configure with -DACTLAB_CUDA=ON)");
}

// No copy is ever queued without CUDA, so every fence is empty.
bool CopyFence::done() const { return true; }
void CopyFence::wait() const {}
void CopyFence::order_compute() const {}

CopyFence copy_async(void*, Device dst_device, const void*, Device src_device, size_t) {
  ACTLAB_FAIL("copy_async from ", src_device.str(), " to ", dst_device.str(),
              ": actlab was built without CUDA (configure with -DACTLAB_CUDA=ON)");
}

}  // namespace actlab

#endif  // ACTLAB_WITH_CUDA
