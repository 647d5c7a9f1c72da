// The x86 intrinsics header for the kernel files with hand-vectorized paths (codec.cpp, kernels_copy.cpp).
// Those paths are compiled with a target attribute each and chosen at run time from the CPU's features, so the
// build itself stays portable. ACTLAB_X86_INTRINSICS says the header was included.
#pragma once

#if defined(__GNUC__) && defined(__x86_64__)
#define ACTLAB_X86_INTRINSICS 1
// GCC 12's AVX-512 intrinsics start from `__m512i y = y;` (_mm512_undefined_epi32), which -Wuninitialized and
// -Wmaybe-uninitialized report at the header's lines once inlined; the suppression covers those lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC-only warning: clang's -Wall reports an unknown group
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

// Each hand-vectorized function carries its instruction set; the callers test the CPU's features first.
#define ACTLAB_AVX512 __attribute__((target("avx512f")))
#define ACTLAB_AVX512BW __attribute__((target("avx512f,avx512bw")))

namespace actlab::cpu {
// The CPU's features, read once per process. __builtin_cpu_init first: these initializers may run before
// libgcc's own CPU-detection constructor.
inline const bool cpu_has_avx512f = (__builtin_cpu_init(), __builtin_cpu_supports("avx512f"));
inline const bool cpu_has_avx512bw = cpu_has_avx512f && __builtin_cpu_supports("avx512bw");
inline const bool cpu_has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");

// float_to_bf16 (core/bf16.h) on 16 lanes: the same integer rounding, NaN kept NaN. The bf16 conversions
// (kernels_copy.cpp) and the codec's bf16 LFC and decode (codec.cpp) share it.
ACTLAB_AVX512 inline __m256i narrow_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}
}  // namespace actlab::cpu
#endif
