// The one device switch of actlab, and its one answer for "built without CUDA". Every call into a
// cuda:: kernel goes through these macros (core/ops.cpp, core/tensor.cpp, compress/policies.cpp), so a
// CPU-only build compiles no such call at all and needs no stub kernels: the CUDA branch becomes the
// Error below, which no CPU-only run reaches (no tensor can live on a GPU there). The device queries of
// core/cuda/runtime.h are not calls into CUDA and answer "no device" instead (core/cuda_stub.cpp).
//
// ACTLAB_CUDA_ONLY(statements): the statements in CUDA builds, an Error otherwise.
// ACTLAB_DISPATCH(dev, cuda_call, cpu_call): cuda_call when dev is a GPU, with `gpu` in scope (the op's
// cuda::DeviceScope: the device made current, and gpu.ctx(), gpu.stream(), gpu.device()), else cpu_call.
// Arguments of a cuda:: call: outputs, inputs, sizes and options, then where it runs (the CudaContext,
// or the device and its stream) last.
#pragma once
#include "actlab/core/error.h"

#if defined(ACTLAB_WITH_CUDA)
#include "actlab/core/cuda/context.h"
#define ACTLAB_CUDA_ONLY(...) __VA_ARGS__
#else
#define ACTLAB_CUDA_ONLY(...) ACTLAB_FAIL("a tensor on a CUDA device in a build without CUDA")
#endif

#define ACTLAB_DISPATCH(dev, cuda_call, cpu_call)                        \
  do {                                                                   \
    if ((dev).is_cuda()) {                                               \
      ACTLAB_CUDA_ONLY(cuda::DeviceScope gpu((dev).index); (cuda_call)); \
    } else {                                                             \
      cpu_call;                                                          \
    }                                                                    \
  } while (0)
