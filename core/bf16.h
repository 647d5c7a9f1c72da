// bfloat16 and fp16 conversions (round to nearest even; NaN stays NaN), shared by CPU and CUDA code.
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

// Written as one select rather than an early return for NaN, so that loops over it vectorize.
ACTLAB_HD uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  const bool nan = (u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0;
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? (u >> 16) | 0x40u : rounded);
}

ACTLAB_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// f rounded to the nearest bf16 value, returned as float.
ACTLAB_HD float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// IEEE binary16 (fp16, --precision fp16 on a GPU): round to nearest even, overflow to ±inf, subnormals kept,
// NaN stays NaN (quiet). The same bits as CUDA's __float2half_rn, written out so that CPU and GPU share them.
ACTLAB_HD uint16_t float_to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u | (a > 0x7F800000u ? 0x200u | ((a >> 13) & 0x3FFu) : 0u));
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: rounds past 65504
  if (a < 0x38800000u) {                                               // below 2^-14: a subnormal or zero
    if (a < 0x33000000u) return static_cast<uint16_t>(sign);           // below 2^-25: rounds to zero
    const uint32_t shift = 126u - (a >> 23), m = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t r = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = (a - 0x38000000u) >> 13;  // exponent rebiased 127 -> 15, 10 mantissa bits
  const uint32_t rest = a & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) ++r;  // a carry moves into the exponent, as it should
  return static_cast<uint16_t>(sign | r);
}

ACTLAB_HD float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m·2^-24, exact
    return bits_float(float_bits(v) | sign);
  }
  if (e == 31) return bits_float(sign | 0x7F800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace actlab
