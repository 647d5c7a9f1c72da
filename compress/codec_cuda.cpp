// CPU-only builds: the GPU codec of compress/codec_cuda.h does not exist, and saying so is all it does
// (no tensor can live on a GPU in such a build, so the policies never get here). Empty in CUDA builds,
// where compress/codec_cuda.cu implements the header. Tested in tests/test_cuda_codec.cpp.
#ifndef ACTLAB_WITH_CUDA

#include "compress/codec_cuda.h"

#include "core/error.h"

namespace actlab::cuda {
namespace {
[[noreturn]] void no_cuda() { ACTLAB_FAIL("the CUDA activation codec needs a build with CUDA (-DACTLAB_CUDA=ON)"); }
}  // namespace

void plane_pack(uint16_t*, uint8_t*, uint16_t*, uint16_t*, float*, const float*, const PlaneGeometry&, bool, uint64_t,
                uint64_t, int) {
  no_cuda();
}
void plane_unpack(float*, const uint16_t*, const uint8_t*, const uint16_t*, const uint16_t*, const PlaneGeometry&,
                  int) {
  no_cuda();
}
void group_pack(uint8_t*, uint16_t*, uint16_t*, const float*, const GroupGeometry&, uint64_t, uint64_t, int) {
  no_cuda();
}
void group_unpack(float*, const uint8_t*, const uint16_t*, const uint16_t*, const GroupGeometry&, int) { no_cuda(); }

}  // namespace actlab::cuda

#endif  // ACTLAB_WITH_CUDA
