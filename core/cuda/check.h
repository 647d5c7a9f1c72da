// Call-checking macros for the CUDA runtime, cuBLAS and cuDNN: a failing status becomes an
// actlab::Error naming the library's error (name + description), the call text, file and line; an
// allocation failure (cudaErrorMemoryAllocation, CUBLAS_STATUS_ALLOC_FAILED, cuDNN 9's
// CUDNN_STATUS_INTERNAL_ERROR_{DEVICE,HOST}_ALLOCATION_FAILED: a library's own workspace or handle did not fit) is an OutOfMemory, like the allocator's, so the apps
// report it as out of memory (exit 3) rather than as a plain failure.
// Included only by code built with the CUDA backend (core/cuda/, the dispatch point in core/ops.cpp).
// Tested in tests/test_cuda.cpp ("cuda check macros"), which runs without a GPU.
#pragma once
#include <cuda_runtime_api.h>
#if defined(ACTLAB_WITH_CUDNN)
#include <cudnn.h>
#endif

#include <string>

#include "actlab/core/cuda/cublas.h"
#include "actlab/core/error.h"

namespace actlab::cuda::detail {

// Each helper throws only when `status` is a failure; `call` is the stringified call. Message:
// "CUDA error cudaErrorMemoryAllocation (out of memory) in `cudaMalloc(&p, n)` [allocator.cu:42]".
inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  // A failed runtime call also records itself as the thread's "last error"; clear it so that a later
  // cudaGetLastError() after a kernel launch does not report this stale failure (sticky errors stay).
  (void)cudaGetLastError();
  const std::string msg = std::string("CUDA error ") + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
                          ") in `" + call + "`";
  if (status == cudaErrorMemoryAllocation) ::actlab::detail::throw_out_of_memory(file, line, msg);
  ::actlab::detail::throw_error(file, line, msg);
}

inline void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const std::string msg = "cuBLAS error " + cublas_status_text(status) + " in `" + call + "`";
  if (status == CUBLAS_STATUS_ALLOC_FAILED) ::actlab::detail::throw_out_of_memory(file, line, msg);
  ::actlab::detail::throw_error(file, line, msg);
}

#if defined(ACTLAB_WITH_CUDNN)
inline void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  // cudnnGetErrorString gives the status name; the last-error string (cuDNN 9) says what was wrong.
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  std::string msg = std::string("cuDNN error ") + cudnnGetErrorString(status) + " (status " +
                    std::to_string(static_cast<int>(status)) + ") in `" + call + "`";
  for (char& c : detail)
    if (c == '\n' || c == '\r') c = ' ';  // one line: the apps print the first line as the error
  if (detail[0] != '\0') msg += std::string(": ") + detail;
  if (status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED ||
      status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED)
    ::actlab::detail::throw_out_of_memory(file, line, msg);
  ::actlab::detail::throw_error(file, line, msg);
}
#endif

}  // namespace actlab::cuda::detail

// ACTLAB_CUDA_CHECK(cudaMemcpy(...)); evaluates the call once; throws actlab::Error on failure.
#define ACTLAB_CUDA_CHECK(call) ::actlab::cuda::detail::check_cuda((call), #call, __FILE__, __LINE__)
#define ACTLAB_CUBLAS_CHECK(call) ::actlab::cuda::detail::check_cublas((call), #call, __FILE__, __LINE__)
#if defined(ACTLAB_WITH_CUDNN)
#define ACTLAB_CUDNN_CHECK(call) ::actlab::cuda::detail::check_cudnn((call), #call, __FILE__, __LINE__)
#endif
// After a kernel launch: reports a bad launch configuration at once (not at the next sync).
#define ACTLAB_CUDA_CHECK_LAUNCH() ACTLAB_CUDA_CHECK(cudaGetLastError())
