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
#endif
