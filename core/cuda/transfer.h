// Copies that overlap compute, CUDA-free to include: between a CUDA device and pinned host memory (the
// MemTag::Offloaded blocks, core/allocator.h), queued on the device's copy stream
// (CudaContext::copy_stream) behind everything queued so far on its compute stream, so the call returns
// at once and the copy runs while later kernels do. A CopyFence says when one is done: the compute stream
// can be made to wait for it (no host stall) or the host can. What SWAP's GPU path is built on
// (compress/swap.h). Implemented in core/cuda/transfer.cpp; in a CPU-only build (core/cuda_stub.cpp)
// copy_async refuses, as no CUDA tensor exists there. Tested in tests/test_cuda_swap.cpp.
#pragma once
#include <cstddef>
#include <memory>

#include "actlab/core/device.h"

namespace actlab {

class CopyFence {
 public:
  CopyFence() = default;   // empty: nothing to wait for
  bool empty() const { return event_ == nullptr; }
  bool done() const;        // polls without blocking; true when empty
  void wait() const;        // the host blocks until the copy has finished
  // Work queued on the device's compute stream from now on starts after the copy has finished.
  void order_compute() const;

 private:
  friend CopyFence copy_async(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
  std::shared_ptr<void> event_;  // a cudaEvent_t recorded on the copy stream behind the copy
  int device_ = -1;
};

// dst <- src, `bytes` bytes: exactly one side on a CUDA device, the other host memory that stays valid
// and untouched by the host until the fence is done (pinned: MemTag::Offloaded). The copy starts after
// the work queued on the device's compute stream so far (the kernels writing src, the last users of dst's
// block); the device memory must stay allocated until the fence is done. Throws Error on a pair of
// devices it does not copy between.
CopyFence copy_async(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

}  // namespace actlab
