// The CUDA backend's CUDA-free front door: device discovery and initialisation. Safe to include from
// any file; implemented by core/cuda/runtime.cpp in CUDA builds and by core/cuda_stub.cpp (no device,
// ever) in CPU-only builds, so callers never need #ifdef ACTLAB_WITH_CUDA.
// Tested in tests/test_cuda.cpp.
#pragma once
#include <string>

namespace actlab {

// Number of usable CUDA devices: 0 in a CPU-only build, without a driver, or without a GPU.
// Never throws; the answer is fixed at the first call (CUDA_VISIBLE_DEVICES is read once by CUDA).
int cuda_device_count();
// cuda_device_count() > 0.
bool cuda_available();
// The device's marketing name ("NVIDIA H200"). Throws Error when `device` is not a visible device.
std::string cuda_device_name(int device);
// Makes Device::cuda(i) usable: installs the caching device allocator as the CUDA raw backend
// (so has_raw_allocator(DeviceType::CUDA) becomes true). Idempotent and thread-safe. Throws Error,
// saying why, when no device is usable (CPU-only build, no driver, no GPU). Apps call it for
// --device cuda; cuda_context() calls it too.
void cuda_init();

}  // namespace actlab
