// CUDA implementation of core/cuda/transfer.h: copies on the device's copy stream, ordered against its
// compute stream by events. Host code only (compiled by the C++ compiler). Tested in
// tests/test_cuda_swap.cpp.
#include "actlab/core/cuda/transfer.h"

#include <cuda_runtime_api.h>

#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/context.h"

namespace actlab {
namespace {

cudaEvent_t as_event(const std::shared_ptr<void>& e) { return static_cast<cudaEvent_t>(e.get()); }

// An event recorded on `stream`. Destroying it early is allowed: CUDA releases it once it completes.
std::shared_ptr<void> record_event(cudaStream_t stream) {
  cudaEvent_t event = nullptr;
  ACTLAB_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  std::shared_ptr<void> owned(event, [](void* e) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(e)); });
  ACTLAB_CUDA_CHECK(cudaEventRecord(event, stream));
  return owned;
}

}  // namespace

bool CopyFence::done() const {
  if (empty()) return true;
  cuda::DeviceGuard guard(device_);
  const cudaError_t status = cudaEventQuery(as_event(event_));
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: the copy is still running
    return false;
  }
  ACTLAB_CUDA_CHECK(status);
  return true;
}

void CopyFence::wait() const {
  if (empty()) return;
  cuda::DeviceGuard guard(device_);
  ACTLAB_CUDA_CHECK(cudaEventSynchronize(as_event(event_)));
}

void CopyFence::order_compute() const {
  if (empty()) return;
  cuda::DeviceScope scope(device_);
  ACTLAB_CUDA_CHECK(cudaStreamWaitEvent(scope.stream(), as_event(event_), 0));
}

CopyFence copy_async(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  ACTLAB_CHECK(dst_device.is_cuda() != src_device.is_cuda(), "copy_async: copies between a CUDA device and "
               "the host only, got ", src_device.str(), " to ", dst_device.str());
  const Device gpu = dst_device.is_cuda() ? dst_device : src_device;
  cuda::DeviceScope scope(gpu.index);
  CopyFence fence;
  fence.device_ = gpu.index;
  const cudaStream_t copies = scope.ctx().copy_stream();
  // Behind the compute stream's queued work: the kernels writing src, the last users of dst's block.
  const std::shared_ptr<void> ready = record_event(scope.stream());
  ACTLAB_CUDA_CHECK(cudaStreamWaitEvent(copies, as_event(ready), 0));
  if (bytes > 0) {
    const cudaMemcpyKind kind = dst_device.is_cuda() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    ACTLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, copies));
  }
  fence.event_ = record_event(copies);
  return fence;
}

}  // namespace actlab
