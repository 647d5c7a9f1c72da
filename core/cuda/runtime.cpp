// CUDA implementation of core/cuda/runtime.h: device discovery through the runtime API and the
// one-time installation of the caching device allocator. Host code only (compiled by the C++ compiler).
// Tested in tests/test_cuda.cpp ("cuda runtime: ...").
#include "actlab/core/cuda/runtime.h"

#include <cuda_runtime_api.h>

#include <mutex>

#include "actlab/core/cuda/allocator.h"
#include "actlab/core/cuda/check.h"
#include "actlab/core/error.h"

namespace actlab {
namespace {

struct DeviceDiscovery {
  int count = 0;
  std::string why_none;  // filled when count == 0: the runtime's reason, for cuda_init's error
};

const DeviceDiscovery& discovery() {
  static const DeviceDiscovery found = [] {
    DeviceDiscovery d;
    const cudaError_t status = cudaGetDeviceCount(&d.count);
    if (status != cudaSuccess) {
      // No driver (cudaErrorInsufficientDriver) or no GPU (cudaErrorNoDevice) is an answer, not an
      // error: the process keeps running on the CPU. Clear the runtime's last-error slot.
      (void)cudaGetLastError();
      d.count = 0;
      d.why_none = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
    } else if (d.count == 0) {
      d.why_none = "the CUDA runtime reports 0 devices";
    }
    return d;
  }();
  return found;
}

}  // namespace

int cuda_device_count() { return discovery().count; }

bool cuda_available() { return cuda_device_count() > 0; }

std::string cuda_device_name(int device) {
  const int count = cuda_device_count();
  ACTLAB_CHECK(device >= 0 && device < count, "cuda:", device, " does not exist: ", count,
               " CUDA device(s) visible", count == 0 ? " (" + discovery().why_none + ")" : std::string());
  cudaDeviceProp prop{};
  ACTLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return std::string(prop.name);
}

void cuda_init() {
  ACTLAB_CHECK(cuda_available(), "CUDA requested but no device is usable (", discovery().why_none, ")");
  static std::once_flag once;
  std::call_once(once, [] { cuda::install_caching_allocator(); });
}

}  // namespace actlab
