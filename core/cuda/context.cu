// CudaContext (stream, cuBLAS/cuDNN handles, workspace per device), DeviceGuard and the registry of
// contexts. Tested in tests/test_cuda.cpp ("cuda context: ...").
#include "actlab/core/cuda/context.h"

#include <mutex>
#include <vector>

#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/cublas.h"
#include "actlab/core/cuda/runtime.h"

namespace actlab::cuda {

DeviceGuard::DeviceGuard(int device) : device_(device) {
  ACTLAB_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device_) ACTLAB_CUDA_CHECK(cudaSetDevice(device_));
}

DeviceGuard::~DeviceGuard() {
  // A destructor must not throw; restoring a device that was valid a moment ago cannot fail in practice.
  if (previous_ != device_) (void)cudaSetDevice(previous_);
}

// Deleters ignore errors: they run in destructors, and at worst a handle leaks.
void CudaContext::StreamDeleter::operator()(std::remove_pointer_t<cudaStream_t>* s) const {
  (void)cudaStreamDestroy(s);
}
void CudaContext::CublasDeleter::operator()(std::remove_pointer_t<cublasHandle_t>* h) const {
  (void)cuda::cublas().destroy(h);
}
#if defined(ACTLAB_WITH_CUDNN)
void CudaContext::CudnnDeleter::operator()(std::remove_pointer_t<cudnnHandle_t>* h) const {
  (void)cudnnDestroy(h);
}
#endif

CudaContext::CudaContext(int device) : device_(device) {
  // Streams and handles belong to the device current at creation. Each resource is owned as soon as it
  // exists, so a failure half-way releases what was made.
  DeviceGuard guard(device);
  cudaStream_t stream = nullptr;
  ACTLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_.reset(stream);
  cudaStream_t copies = nullptr;
  ACTLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&copies, cudaStreamNonBlocking));
  copy_stream_.reset(copies);

  cublasHandle_t blas = nullptr;
  ACTLAB_CUBLAS_CHECK(cuda::cublas().create(&blas));
  cublas_.reset(blas);
  ACTLAB_CUBLAS_CHECK(cuda::cublas().set_stream(blas, stream));

#if defined(ACTLAB_WITH_CUDNN)
  cudnnHandle_t dnn = nullptr;
  ACTLAB_CUDNN_CHECK(cudnnCreate(&dnn));
  cudnn_.reset(dnn);
  ACTLAB_CUDNN_CHECK(cudnnSetStream(dnn, stream));
#endif
}

CudaContext::~CudaContext() {
  // Queued kernels may still use the workspace or the handles: let them finish before members go.
  if (copy_stream_) (void)cudaStreamSynchronize(copy_stream_.get());
  if (stream_) (void)cudaStreamSynchronize(stream_.get());
}

void* CudaContext::workspace(size_t bytes) {
  if (bytes > workspace_.size()) {
    // Free first, then allocate: the old block goes back to the cache on this stream (queued users
    // finish first, in stream order) and may even be reused, and the peak never counts both.
    workspace_.reset();
    workspace_ = Buffer(bytes, MemTag::Workspace, Device::cuda(device_));
  }
  return workspace_.data();
}

cublasHandle_t CudaContext::blas() {
  if (blas_workspace_.size() == 0) {
    // Not in the constructor: allocating on this device needs this context (the allocator asks for the
    // stream), which is still being built there.
    blas_workspace_ = Buffer(kBlasWorkspaceBytes, MemTag::Workspace, Device::cuda(device_));
    ACTLAB_CUBLAS_CHECK(cuda::cublas().set_workspace(cublas_.get(), blas_workspace_.data(), blas_workspace_.size()));
  }
  return cublas_.get();
}

void CudaContext::synchronize() const { ACTLAB_CUDA_CHECK(cudaStreamSynchronize(stream_.get())); }

CudaContext& cuda_context(int device) {
  cuda_init();  // throws, saying why, when there is no usable device
  const int count = cuda_device_count();
  ACTLAB_CHECK(device >= 0 && device < count, "cuda:", device, " does not exist: ", count,
               " CUDA device(s) visible");
  // NOTE: never destroyed. Tensors freed during static teardown still reach the allocator, and
  // destroying handles after the CUDA runtime has unloaded crashes; the OS reclaims everything.
  static std::mutex* mutex = new std::mutex();
  static auto* contexts = new std::vector<std::unique_ptr<CudaContext>>(static_cast<size_t>(count));
  std::lock_guard<std::mutex> lock(*mutex);
  auto& slot = (*contexts)[static_cast<size_t>(device)];
  if (!slot) slot = std::make_unique<CudaContext>(device);
  return *slot;
}

cudaStream_t current_stream(int device) { return cuda_context(device).stream(); }

}  // namespace actlab::cuda
