// Per-device CUDA state every GPU op uses: the stream, the cuBLAS and cuDNN handles bound to it and a
// growable workspace tracked under MemTag::Workspace; plus DeviceGuard (RAII cudaSetDevice).
// Implemented in core/cuda/context.cu. Tested in tests/test_cuda.cpp ("cuda context: ...").
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#if defined(ACTLAB_WITH_CUDNN)
#include <cudnn.h>
#endif

#include <memory>
#include <type_traits>

#include "actlab/core/allocator.h"

namespace actlab::cuda {

// Makes `device` the calling thread's current device for the scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = -1;
};

// One device's streams, library handles and workspace. All of actlab's compute on the device is queued
// on stream(), so ops are ordered without events. copy_stream() carries only the copies that are to
// overlap compute (core/cuda/transfer.h), ordered against stream() by events. Both streams are
// non-blocking: they do NOT synchronize with the legacy default stream, so nothing in actlab may
// use stream 0 (other copies go through the caching allocator's copy_bytes, on stream()).
// Not for concurrent use from several threads (the workspace is shared).
class CudaContext {
 public:
  explicit CudaContext(int device);  // makes the streams and handles; the workspace starts empty
  ~CudaContext();                    // waits for the streams, then releases in reverse order
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_.get(); }
  cudaStream_t copy_stream() const { return copy_stream_.get(); }
  cublasHandle_t cublas() const { return cublas_.get(); }  // bound to stream()
  // cublas() with its own tracked workspace installed (MemTag::Workspace, kBlasWorkspaceBytes, allocated
  // on the first call), so cuBLAS never allocates device memory behind the tracker. GEMM callers use this.
  cublasHandle_t blas();
#if defined(ACTLAB_WITH_CUDNN)
  cudnnHandle_t cudnn() const { return cudnn_.get(); }     // bound to stream()
#endif

  // Scratch memory of at least `bytes` on this device (nullptr for 0 before any growth). Grows to
  // exactly `bytes` when too small and never shrinks; contents are undefined and valid only until the
  // next workspace() call. Reuse across ops is safe because they all run in order on stream().
  void* workspace(size_t bytes);
  size_t workspace_size() const { return workspace_.size(); }
  void release_workspace() { workspace_.reset(); }  // back to the allocator's cache

  void synchronize() const;  // blocks until all work queued on stream() has finished

 private:
  struct StreamDeleter { void operator()(std::remove_pointer_t<cudaStream_t>* s) const; };
  struct CublasDeleter { void operator()(std::remove_pointer_t<cublasHandle_t>* h) const; };
#if defined(ACTLAB_WITH_CUDNN)
  struct CudnnDeleter { void operator()(std::remove_pointer_t<cudnnHandle_t>* h) const; };
#endif

  // What cuBLAS recommends on Hopper (and what PyTorch gives it there): 32 MiB.
  static constexpr size_t kBlasWorkspaceBytes = size_t(32) << 20;

  int device_;
  // Declaration order is release order reversed: workspace first, then handles, then the stream.
  std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter> stream_;
  std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter> copy_stream_;
  std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, CublasDeleter> cublas_;
#if defined(ACTLAB_WITH_CUDNN)
  std::unique_ptr<std::remove_pointer_t<cudnnHandle_t>, CudnnDeleter> cudnn_;
#endif
  Buffer workspace_;
  Buffer blas_workspace_;  // separate from workspace_: cuBLAS keeps the pointer across calls
};

// The context of cuda:`device`, created on first use (calls actlab::cuda_init()). Throws Error when
// the device does not exist. Contexts live until process exit.
CudaContext& cuda_context(int device);

// cuda_context(device).stream(): the stream all of actlab's work on `device` is queued on.
cudaStream_t current_stream(int device);

// What one op on cuda:`device` needs for its duration: the device's context (created on first use) and
// the device made current (kernels launch on the current device). Opened by every CUDA branch of
// core/ops.cpp and compress/policies.cpp.
class DeviceScope {
 public:
  explicit DeviceScope(int device) : ctx_(cuda_context(device)), guard_(device) {}
  CudaContext& ctx() const { return ctx_; }
  cudaStream_t stream() const { return ctx_.stream(); }
  int device() const { return ctx_.device(); }

 private:
  CudaContext& ctx_;  // first: cuda_context() says clearly when the device does not exist
  DeviceGuard guard_;
};

}  // namespace actlab::cuda
