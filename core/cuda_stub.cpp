// CPU-only implementation of core/cuda/runtime.h: no CUDA device ever exists. Compiled in every
// build (core/*.cpp) but empty when the CUDA backend is built (core/cuda/runtime.cpp takes over).
// Tested in tests/test_cuda.cpp ("cuda runtime: ...").
#ifndef ACTLAB_WITH_CUDA

#include "actlab/core/cuda/runtime.h"

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

}  // namespace actlab

#endif  // ACTLAB_WITH_CUDA
