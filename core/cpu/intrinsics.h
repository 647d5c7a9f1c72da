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
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
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
}  // namespace actlab::cpu
#endif
