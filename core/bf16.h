// bfloat16 conversions (round to nearest even; NaN stays NaN), shared by CPU and CUDA code.
// Tested in tests/test_core.cpp.
#pragma once
#include <cstdint>
#include <cstring>

#include "actlab/core/hostdevice.h"

namespace actlab {

ACTLAB_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

ACTLAB_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

ACTLAB_HD uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0) return static_cast<uint16_t>((u >> 16) | 0x40);
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

ACTLAB_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// f rounded to the nearest bf16 value, returned as float.
ACTLAB_HD float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace actlab
