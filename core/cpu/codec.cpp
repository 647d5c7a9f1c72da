// CPU kernels of the activation codec (declared in core/codec.h), OpenMP over planes (groups).
// Planes are processed in batches of ~4096 elements that stay in L1: one Philox pass for the batch (AVX-512
// intrinsics where the CPU has them), then per plane pool → residual → min/max, one vectorized pass over the
// batch's min/step, per plane quantize, and one bit-pack pass; the CNN maps whose up-sampled LFC fits in
// registers (32², 16², 8², 4² with B = 8) instead take two AVX-512 passes per plane from x, around the
// batch's min/step (register_batch_keys/codes) or, on 32², the plane's own (register_plane_pack), and
// planes of run-time extents whose rows start on whole vectors of codes two row-by-row ones
// (row_plane_keys/codes). The common maps run compile-time-sized copies of the per-plane code, so their
// loops unroll into a few full vectors. Unpack writes planes, oneDNN's 16-channel blocks (a 16×16
// transpose of code bytes) or one channel's planes (the register shapes' planes decoded straight from the
// code run on AVX-512 CPUs, one channel's also on AVX2 ones). The arithmetic is codec.h's ACTLAB_HD
// functions, so a CUDA twin reproduces the packed bytes bit for bit. Philox, the quantizer and the blocked
// and channel decodes have AVX2 twins for CPUs without AVX-512 (8 lanes; the register pack has none: a
// one-pass 32² form of it measured no faster there). set_codec_simd caps the level, so the tests check
// the AVX2 and portable paths on an AVX-512 CPU too.
// Tested in tests/test_codec.cpp; bench/bench_compress.cpp.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "actlab/core/codec.h"
#include "actlab/core/allocator.h"
#include "actlab/core/cpu/intrinsics.h"
#include "actlab/core/cpu/kernels.h"

// The batch loops are compiled for AVX-512 and AVX2 as well as the baseline and picked at load time
// (GCC function multi-versioning): Philox and the quantizer are 3x faster on AVX-512 than on SSE2. Only
// IEEE add/sub/mul/div, compares and conversions are used, and FMAs only where the product is exact
// (min + code·step, the uniform's (b + 1/2)/256), so every version produces the same bits.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define ACTLAB_CODEC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ACTLAB_CODEC_CLONES
#endif
#if defined(__GNUC__)
#define ACTLAB_INLINE inline __attribute__((always_inline))  // inlined into each cloned caller
#else
#define ACTLAB_INLINE inline
#endif

namespace actlab {

PlaneGeometry make_plane_geometry(int64_t planes, int64_t height, int64_t width, int64_t block, int bits) {
  ACTLAB_CHECK(planes >= 0 && height >= 1 && width >= 1 && block >= 1, "bad plane geometry: planes ", planes,
               ", plane ", height, "x", width, ", block ", block);
  PlaneGeometry g;
  g.planes = planes;
  g.height = height;
  g.width = width;
  g.block_h = std::min(block, height);
  g.block_w = std::min(block, width);
  g.lfc_h = height / g.block_h;
  g.lfc_w = width / g.block_w;
  g.bits = bits;
  return g;
}

PlaneGeometry make_token_geometry(int64_t samples, int64_t tokens, int64_t features, int64_t block, int bits) {
  PlaneGeometry g = make_plane_geometry(samples, tokens, features, block, bits);
  g.block_w = 1;
  g.lfc_w = features;
  return g;
}

namespace cpu {
namespace {

// Plane loops are worth a thread team only past this many elements.
constexpr int64_t kParallelElems = 1 << 15;

// ---------------------------------------------------------------- building blocks (inlined into clones)
// Philox blocks are computed kLanes at a time as structure-of-arrays: c0..c3[l] is word 0..3 of block l.
constexpr int kLanes = 64;

// Ten philox4x32_10 rounds on blocks [0, m) in place, with philox_mulhilo written out; the compiler
// vectorizes it by widening every lane to 64 bits (vpmullq and repacking shuffles on AVX-512).
ACTLAB_INLINE void philox_rounds(uint32_t* __restrict c0, uint32_t* __restrict c1, uint32_t* __restrict c2,
                                 uint32_t* __restrict c3, int m, uint32_t key0, uint32_t key1) {
  for (int round = 0; round < 10; ++round) {
    for (int l = 0; l < m; ++l) {
      const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0[l];
      const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2[l];
      const uint32_t next0 = static_cast<uint32_t>(p1 >> 32) ^ c1[l] ^ key0;
      const uint32_t next2 = static_cast<uint32_t>(p0 >> 32) ^ c3[l] ^ key1;
      c1[l] = static_cast<uint32_t>(p1), c3[l] = static_cast<uint32_t>(p0), c0[l] = next0, c2[l] = next2;
    }
    key0 += 0x9E3779B9u;
    key1 += 0xBB67AE85u;
  }
}

#ifdef ACTLAB_X86_INTRINSICS
// dst = the 64 codes of `bytes` (one per byte, each < 2^bits) as an LSB-first run of bits-bit fields, for
// Q = 1, 4, 8 (store_codes64 narrows Q = 2 codes its own way): 1-bit codes are the byte mask, 4-bit
// ones merge byte pairs by a multiply-add (c0 + 16·c1).
ACTLAB_AVX512BW ACTLAB_INLINE void store_run64(uint8_t* dst, __m512i bytes, int bits) {
  switch (bits) {
    case 1: {
      const uint64_t mask = _mm512_test_epi8_mask(bytes, bytes);
      std::memcpy(dst, &mask, 8);
      break;
    }
    case 4: {
      const __m512i pairs = _mm512_maddubs_epi16(bytes, _mm512_set1_epi16(0x1001));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi16_epi8(pairs));
      break;
    }
    default: _mm512_storeu_si512(dst, bytes); break;
  }
}
// The high and low 32 bits of each u32 lane of a·m, for m with equal even and odd lanes (a broadcast):
// vpmuludq of the even lanes and of the odd lanes shifted down, then one masked dword shuffle per half
// moves the other lanes' halves into place (vpmulld for the low halves costs two multiplies).
ACTLAB_AVX512 ACTLAB_INLINE void mulhilo_epu32(__m512i& hi, __m512i& lo, __m512i a, __m512i m) {
  const __m512i even = _mm512_mul_epu32(a, m);                         // lane 2k's product in qword k
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);  // lane 2k+1's product in qword k
  hi = _mm512_mask_shuffle_epi32(odd, 0x5555, even, _MM_PERM_DDBB);   // even lanes: dword 2k+1 of `even`
  lo = _mm512_mask_shuffle_epi32(even, 0xAAAA, odd, _MM_PERM_CCAA);   // odd lanes: dword 2k of `odd`
}
// Ten philox4x32_10 rounds on sixteen blocks in registers: lane l of x0..x3 is word 0..3 of block l.
ACTLAB_AVX512 ACTLAB_INLINE void philox_rounds_avx512(__m512i& x0, __m512i& x1, __m512i& x2, __m512i& x3, uint32_t key0,
                                                      uint32_t key1) {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
  for (int round = 0; round < 10; ++round) {
    __m512i hi0, lo0, hi1, lo1;
    mulhilo_epu32(hi0, lo0, x0, m0);
    mulhilo_epu32(hi1, lo1, x2, m1);
    x0 = _mm512_xor_si512(_mm512_xor_si512(hi1, x1), _mm512_set1_epi32(static_cast<int>(key0)));
    x2 = _mm512_xor_si512(_mm512_xor_si512(hi0, x3), _mm512_set1_epi32(static_cast<int>(key1)));
    x1 = lo1, x3 = lo0;
    key0 += 0x9E3779B9u;
    key1 += 0xBB67AE85u;
  }
}
// philox_rounds with AVX-512F intrinsics, 16 blocks per register and the four words in registers for all
// ten rounds (philox_rounds_avx512), then the blocks stored one after another (block l's words 0..3 at
// dst + 16·l) by a 4×16 register transpose instead of word by word. A plain function with a target
// attribute, not a clone, so that the intrinsics compile whatever the caller's clone; called only when the
// CPU has AVX-512F (has_avx512f). Reads the counters of blocks [0, m) rounded up to 16 (those lanes must be
// initialized) and writes exactly m blocks.
ACTLAB_AVX512 void philox_blocks_avx512(uint8_t* dst, const uint32_t* c0, const uint32_t* c1, const uint32_t* c2,
                                        const uint32_t* c3, int m, uint32_t k0, uint32_t k1) {
  for (int v = 0; v < m; v += 16) {
    __m512i x0 = _mm512_loadu_si512(c0 + v), x1 = _mm512_loadu_si512(c1 + v);
    __m512i x2 = _mm512_loadu_si512(c2 + v), x3 = _mm512_loadu_si512(c3 + v);
    philox_rounds_avx512(x0, x1, x2, x3, k0, k1);
    // Within each 128-bit lane j: u_i holds block 4j + i's words 0..3 after two interleaves; then a 4×4
    // transpose of 128-bit lanes puts blocks 4k..4k+3 into output vector k.
    const __m512i t0 = _mm512_unpacklo_epi32(x0, x1), t1 = _mm512_unpackhi_epi32(x0, x1);
    const __m512i t2 = _mm512_unpacklo_epi32(x2, x3), t3 = _mm512_unpackhi_epi32(x2, x3);
    const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
    const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
    const __m512i a01 = _mm512_shuffle_i32x4(u0, u1, 0x44), a23 = _mm512_shuffle_i32x4(u2, u3, 0x44);
    const __m512i b01 = _mm512_shuffle_i32x4(u0, u1, 0xEE), b23 = _mm512_shuffle_i32x4(u2, u3, 0xEE);
    __m512i out[4] = {_mm512_shuffle_i32x4(a01, a23, 0x88), _mm512_shuffle_i32x4(a01, a23, 0xDD),
                      _mm512_shuffle_i32x4(b01, b23, 0x88), _mm512_shuffle_i32x4(b01, b23, 0xDD)};
    uint8_t* d = dst + 16 * v;
    if (m - v >= 16) {
      for (int k = 0; k < 4; ++k) _mm512_storeu_si512(d + 64 * k, out[k]);
    } else {
      std::memcpy(d, out, static_cast<size_t>(m - v) * 16);
    }
  }
}
// The constants of stochastic_code for one plane or group, broadcast, and the codes of 16 values (see
// quantize_avx512 for why they are the scalar function's).
struct QuantizerAvx512 {
  __m512 min, scale, zero, levels, cell, half_cell;
  __m512i one;
  ACTLAB_AVX512 QuantizerAvx512(float min_value, float scale_value, int level_count)
      : min(_mm512_set1_ps(min_value)), scale(_mm512_set1_ps(scale_value)), zero(_mm512_setzero_ps()),
        levels(_mm512_set1_ps(static_cast<float>(level_count))), cell(_mm512_set1_ps(1.0f / 256.0f)),
        half_cell(_mm512_set1_ps(0.5f / 256.0f)), one(_mm512_set1_epi32(1)) {}
  // Each lane its own plane's constants (the channels-last pack: sixteen planes, one per lane).
  ACTLAB_AVX512 QuantizerAvx512(__m512 min_lanes, __m512 scale_lanes, int level_count)
      : min(min_lanes), scale(scale_lanes), zero(_mm512_setzero_ps()),
        levels(_mm512_set1_ps(static_cast<float>(level_count))), cell(_mm512_set1_ps(1.0f / 256.0f)),
        half_cell(_mm512_set1_ps(0.5f / 256.0f)), one(_mm512_set1_epi32(1)) {}
  // The codes (one per u32 lane) of 16 values r with their 8-bit uniforms u[0..16). uniform8's
  // (bits + 1/2)·2^-8 is one FMA, bits·2^-8 + 2^-9: exact, as the multiply-add it replaces.
  ACTLAB_AVX512 ACTLAB_INLINE __m512i codes(__m512 r, const uint8_t* u) const {
    return codes(r, _mm_loadu_si128(reinterpret_cast<const __m128i*>(u)));
  }
  // The same with the 16 uniforms' bytes in a register.
  ACTLAB_AVX512 ACTLAB_INLINE __m512i codes(__m512 r, __m128i u) const { return codes(r, _mm512_cvtepu8_epi32(u)); }
  // The same with the uniforms' 8-bit values in the u32 lanes.
  ACTLAB_AVX512 ACTLAB_INLINE __m512i codes(__m512 r, __m512i bits) const {
    __m512 t = _mm512_mul_ps(_mm512_sub_ps(r, min), scale);
    t = _mm512_min_ps(_mm512_max_ps(t, zero), levels);
    const __m512i lower = _mm512_cvttps_epi32(t);
    const __m512 frac = _mm512_sub_ps(t, _mm512_cvtepi32_ps(lower));
    const __m512 uniform = _mm512_fmadd_ps(_mm512_cvtepi32_ps(bits), cell, half_cell);
    return _mm512_mask_add_epi32(lower, _mm512_cmp_ps_mask(uniform, frac, _CMP_LT_OQ), lower, one);
  }
};
// quant_params of sixteen ranges at once, one per lane, from the order keys of their min and max: the bf16 bits
// of the stored min and step (in the low halves of the u32 lanes), and the quantizer's f32 min and
// quant_scale(step). The scalar function's IEEE operations and selects, lane by lane, so the same bits
// (tests/test_codec.cpp compares them on edge ranges). Why: the lane pack called the scalar function sixteen
// times a group, and GCC left that loop scalar (its disassembly: two vdivss and compare-and-branch per range),
// about a tenth of the pack's samples in a MobileNetV2 step; the lane pack of 8² planes ran 1.14× and of 4² planes
// 1.36× faster without it (bench/RESULTS_compress.md, "The lane kernels ask for the next group").
struct QuantParams16 {
  __m512i min_bits, step_bits;
  __m512 min, scale;
};
// float_order_key's map on each lane's bits, i ^ ((i >> 31) & 0x7FFFFFFF). It is its own inverse, so on keys it
// gives float_from_order_key's bits.
ACTLAB_AVX512BW ACTLAB_INLINE __m512i order_key_lanes(__m512i i) {
  return _mm512_xor_si512(i, _mm512_and_si512(_mm512_srai_epi32(i, 31), _mm512_set1_epi32(0x7FFFFFFF)));
}
ACTLAB_AVX512BW ACTLAB_INLINE __m512 bf16_lanes_to_float(__m512i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
}
// float_to_bf16 of the f32 bits u, lane by lane (narrow_bf16's rounding, widened back to the u32 lanes).
ACTLAB_AVX512BW ACTLAB_INLINE __m512i float_to_bf16_lanes(__m512i u) {
  return _mm512_cvtepu16_epi32(narrow_bf16(_mm512_castsi512_ps(u)));
}
// bf16_round_down (kUp false) or bf16_round_up (kUp true) of the f32 bits u, lane by lane.
template <bool kUp>
ACTLAB_AVX512BW ACTLAB_INLINE __m512i bf16_round_lanes(__m512i u) {
  const __m512i exponent = _mm512_set1_epi32(0x7F800000);
  const __m512i truncated = _mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  const __mmask16 special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, exponent), exponent);
  const __mmask16 negative = _mm512_cmplt_epi32_mask(u, _mm512_setzero_si512());
  const __mmask16 away = _mm512_cmpneq_epi32_mask(truncated, u) & (kUp ? static_cast<__mmask16>(~negative) : negative);
  const __m512i high = _mm512_srli_epi32(truncated, 16);
  const __m512i rounded = _mm512_and_si512(_mm512_mask_add_epi32(high, away, high, _mm512_set1_epi32(1)),
                                           _mm512_set1_epi32(0xFFFF));
  return _mm512_mask_mov_epi32(rounded, special, float_to_bf16_lanes(u));
}
ACTLAB_AVX512BW ACTLAB_INLINE QuantParams16 quant_params16(__m512i lo_keys, __m512i hi_keys, int bits) {
  const __m512i lo = order_key_lanes(lo_keys), hi = order_key_lanes(hi_keys);  // float_from_order_key's bits
  QuantParams16 q;
  q.min_bits = bf16_round_lanes<false>(lo);
  q.min = bf16_lanes_to_float(q.min_bits);
  const __m512 range = _mm512_sub_ps(_mm512_castsi512_ps(hi), q.min);
  const __m512 levels = _mm512_set1_ps(static_cast<float>(quant_levels(bits)));
  __m512i step = bf16_round_lanes<true>(_mm512_castps_si512(_mm512_div_ps(range, levels)));
  const __mmask16 short_of_range =
      _mm512_cmp_ps_mask(_mm512_mul_ps(bf16_lanes_to_float(step), levels), range, _CMP_LT_OQ);
  step = _mm512_and_si512(_mm512_mask_add_epi32(step, short_of_range, step, _mm512_set1_epi32(1)),
                          _mm512_set1_epi32(0xFFFF));
  const __mmask16 keep = _mm512_cmp_ps_mask(bf16_lanes_to_float(step), _mm512_setzero_ps(), _CMP_GT_OQ) |
                         _mm512_cmp_ps_mask(range, range, _CMP_UNORD_Q);
  step = _mm512_mask_mov_epi32(_mm512_set1_epi32(float_to_bf16(1.f)), keep, step);
  const __mmask16 tiny = _mm512_cmp_ps_mask(bf16_lanes_to_float(step), _mm512_set1_ps(0x1p-126f), _CMP_LT_OQ);
  q.step_bits = _mm512_mask_mov_epi32(step, tiny, _mm512_set1_epi32(0x0080));
  q.scale = _mm512_div_ps(_mm512_set1_ps(1.f), bf16_lanes_to_float(q.step_bits));
  return q;
}
// quant_params_from_keys's sixteen ranges: quant_params16 on keys in memory, its bits stored.
ACTLAB_AVX512BW void quant_params16_store(uint16_t* mins, uint16_t* steps, const int32_t* lo_keys,
                                          const int32_t* hi_keys, int bits) {
  const QuantParams16 q = quant_params16(_mm512_loadu_si512(lo_keys), _mm512_loadu_si512(hi_keys), bits);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(mins), _mm512_cvtepi32_epi16(q.min_bits));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(steps), _mm512_cvtepi32_epi16(q.step_bits));
}
// quantize_plane's loop (c[e] = stochastic_code(r[e], min, scale, uniform8(u[e]), levels)) for whole
// vectors of 16, with the same IEEE operations in the same order: vmaxps(t, 0) is `t > 0 ? t : 0` (NaN
// → 0) and vminps(t, L) is `t < L ? t : L` exactly, so the codes are the scalar function's. Returns the
// number of elements done (a multiple of 16); the caller finishes the tail.
ACTLAB_AVX512 int64_t quantize_avx512(uint8_t* c, const float* r, const uint8_t* u, int64_t n, float min, float scale,
                                      int levels) {
  const QuantizerAvx512 quantizer(min, scale, levels);
  int64_t e = 0;
  for (; e + 16 <= n; e += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(c + e), _mm512_cvtepi32_epi8(quantizer.codes(_mm512_loadu_ps(r + e), u + e)));
  return e;
}

// ---------------------------------------------------------------- AVX2 twins (CPUs without AVX-512)
// The same routines with 8 lanes for AVX2 CPUs (Zen 2/3, Haswell to Alder Lake), where GCC's own
// vectorization of the portable loops left the pack at a third of its AVX-512 speed. Called only when the
// CPU has AVX2 and FMA and no AVX-512 path is taken first (has_avx2); the same IEEE operations in the same
// order as the scalar functions, so the bytes are the same (tests/test_codec.cpp runs every level).
#define ACTLAB_AVX2 __attribute__((target("avx2,fma")))
// mulhilo_epu32 on 8 lanes: vpmuludq of the even lanes and of the odd ones shifted down, then blends.
ACTLAB_AVX2 ACTLAB_INLINE void mulhilo_epu32_avx2(__m256i& hi, __m256i& lo, __m256i a, __m256i m) {
  const __m256i even = _mm256_mul_epu32(a, m), odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}
// philox_blocks_avx512 with 8 blocks per register (reads the counters of blocks [0, m) rounded up to 8).
ACTLAB_AVX2 void philox_blocks_avx2(uint8_t* dst, const uint32_t* c0, const uint32_t* c1, const uint32_t* c2,
                                    const uint32_t* c3, int m, uint32_t k0, uint32_t k1) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  for (int v = 0; v < m; v += 8) {
    __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c0 + v));
    __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c1 + v));
    __m256i x2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c2 + v));
    __m256i x3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c3 + v));
    uint32_t key0 = k0, key1 = k1;
    for (int round = 0; round < 10; ++round) {
      __m256i hi0, lo0, hi1, lo1;
      mulhilo_epu32_avx2(hi0, lo0, x0, m0);
      mulhilo_epu32_avx2(hi1, lo1, x2, m1);
      x0 = _mm256_xor_si256(_mm256_xor_si256(hi1, x1), _mm256_set1_epi32(static_cast<int>(key0)));
      x2 = _mm256_xor_si256(_mm256_xor_si256(hi0, x3), _mm256_set1_epi32(static_cast<int>(key1)));
      x1 = lo1, x3 = lo0;
      key0 += 0x9E3779B9u;
      key1 += 0xBB67AE85u;
    }
    // Within each 128-bit lane j: u_i holds block 4j + i's words 0..3 after two interleaves; then the
    // lanes are paired so that output vector k holds blocks 2k, 2k + 1.
    const __m256i t0 = _mm256_unpacklo_epi32(x0, x1), t1 = _mm256_unpackhi_epi32(x0, x1);
    const __m256i t2 = _mm256_unpacklo_epi32(x2, x3), t3 = _mm256_unpackhi_epi32(x2, x3);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    const __m256i out[4] = {_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u2, u3, 0x20),
                            _mm256_permute2x128_si256(u0, u1, 0x31), _mm256_permute2x128_si256(u2, u3, 0x31)};
    uint8_t* d = dst + 16 * v;
    if (m - v >= 8) {
      for (int k = 0; k < 4; ++k) _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + 32 * k), out[k]);
    } else {
      std::memcpy(d, out, static_cast<size_t>(m - v) * 16);
    }
  }
}
// QuantizerAvx512 on 8 lanes. A true compare is all ones (−1), so lower − mask adds the round-up.
struct QuantizerAvx2 {
  __m256 min, scale, zero, levels, cell, half_cell;
  ACTLAB_AVX2 QuantizerAvx2(float min_value, float scale_value, int level_count)
      : min(_mm256_set1_ps(min_value)), scale(_mm256_set1_ps(scale_value)), zero(_mm256_setzero_ps()),
        levels(_mm256_set1_ps(static_cast<float>(level_count))), cell(_mm256_set1_ps(1.0f / 256.0f)),
        half_cell(_mm256_set1_ps(0.5f / 256.0f)) {}
  // The codes (one per u32 lane) of 8 values r with their 8-bit uniforms u[0..8).
  ACTLAB_AVX2 ACTLAB_INLINE __m256i codes(__m256 r, const uint8_t* u) const {
    __m256 t = _mm256_mul_ps(_mm256_sub_ps(r, min), scale);
    t = _mm256_min_ps(_mm256_max_ps(t, zero), levels);
    const __m256i lower = _mm256_cvttps_epi32(t);
    const __m256 frac = _mm256_sub_ps(t, _mm256_cvtepi32_ps(lower));
    const __m256i bits = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(u)));
    const __m256 uniform = _mm256_fmadd_ps(_mm256_cvtepi32_ps(bits), cell, half_cell);
    return _mm256_sub_epi32(lower, _mm256_castps_si256(_mm256_cmp_ps(uniform, frac, _CMP_LT_OQ)));
  }
  // The codes of 32 values r[0..32) as 32 bytes in element order: two saturating packs interleave the four
  // vectors' 4-lane halves, one dword permutation puts them back in order.
  ACTLAB_AVX2 ACTLAB_INLINE __m256i code_bytes32(const __m256 r[4], const uint8_t* u) const {
    const __m256i c01 = _mm256_packus_epi32(codes(r[0], u), codes(r[1], u + 8));
    const __m256i c23 = _mm256_packus_epi32(codes(r[2], u + 16), codes(r[3], u + 24));
    return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(c01, c23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  }
};
// quantize_avx512 on 8 lanes, 32 values per step (then 8); returns the number of elements done.
ACTLAB_AVX2 int64_t quantize_avx2(uint8_t* c, const float* r, const uint8_t* u, int64_t n, float min, float scale,
                                  int levels) {
  const QuantizerAvx2 quantizer(min, scale, levels);
  int64_t e = 0;
  for (; e + 32 <= n; e += 32) {
    const __m256 v[4] = {_mm256_loadu_ps(r + e), _mm256_loadu_ps(r + e + 8), _mm256_loadu_ps(r + e + 16),
                         _mm256_loadu_ps(r + e + 24)};
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + e), quantizer.code_bytes32(v, u + e));
  }
  for (; e + 8 <= n; e += 8) {  // one vector: the low byte of each lane gathered, in lane order
    const __m256i b = _mm256_shuffle_epi8(quantizer.codes(_mm256_loadu_ps(r + e), u + e),
                                          _mm256_set1_epi32(0x0C080400));
    const uint32_t lo = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128(b)));
    const uint32_t hi = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(b, 1)));
    const uint64_t both = lo | static_cast<uint64_t>(hi) << 32;
    std::memcpy(c + e, &both, 8);
  }
  return e;
}

// What the kernels test before taking a hand-written path: the CPU's features, narrowed by set_codec_simd.
// has_avx2 is set only when no AVX-512 path runs, so each call site tests the wider one first.
bool has_avx512f = cpu_has_avx512f;
bool has_avx512bw = cpu_has_avx512bw;
bool has_avx2 = cpu_has_avx2 && !cpu_has_avx512bw;
#else
int64_t quantize_avx512(uint8_t*, const float*, const uint8_t*, int64_t, float, float, int) { return 0; }
void philox_blocks_avx512(uint8_t*, const uint32_t*, const uint32_t*, const uint32_t*, const uint32_t*, int, uint32_t,
                          uint32_t) {}
int64_t quantize_avx2(uint8_t*, const float*, const uint8_t*, int64_t, float, float, int) { return 0; }
void philox_blocks_avx2(uint8_t*, const uint32_t*, const uint32_t*, const uint32_t*, const uint32_t*, int, uint32_t,
                        uint32_t) {}
constexpr bool cpu_has_avx512f = false;
constexpr bool cpu_has_avx512bw = false;
constexpr bool cpu_has_avx2 = false;
bool has_avx512f = false;
bool has_avx512bw = false;
bool has_avx2 = false;
#endif

// Asks for the cache lines of v[0..n) ahead of use. The pack asks for the next batch's input while its
// Philox pass runs (fill_bits8's `ahead`), which reads no input (it writes only the L1 scratch of uniforms),
// so the input arrives meanwhile: the first read of a freshly produced activation is otherwise a stall the
// hardware prefetcher only starts on the pool pass. Issued one line per Philox block, spread over the pass,
// into L2 rather than L1: the first version, one burst of a whole plane's lines into L1 ahead of the pass,
// stalled on the burst and evicted the pass's own L1 scratch on an Intel Xeon with AMX, where it packed
// slower than no prefetch at all (bench/RESULTS_compress.md, "Prefetch into L2"). A pack without codes (lfc)
// has no Philox pass to spread over: it asks in one burst, into L2 as well.
ACTLAB_INLINE void prefetch_floats(const float* v, int64_t n) {
#if defined(__GNUC__)
  const char* bytes = reinterpret_cast<const char*>(v);
  for (int64_t at = 0; at < n * 4; at += 64) __builtin_prefetch(bytes + at, 0, 2);  // to L2 (prefetcht1)
#else
  (void)v, (void)n;
#endif
}

// u[i] = philox_bits8(seed, stream, base + i) for i < n, computing each Philox block once for its sixteen
// consecutive indices. Whole blocks run kLanes at a time (philox_blocks_avx512 / _avx2 / philox_rounds), so each Philox round is a few
// full-width vector ops (twice the speed of letting the compiler vectorize philox4x32_10 per block); the
// round is core/philox.h's, and tests/test_codec.cpp checks the result against philox_bits8. A block's 16
// draws are its four words' bytes in little-endian order, so a whole block is stored as its four words.
// ahead[0..ahead_n): input to prefetch meanwhile (prefetch_floats), chunk by chunk with the blocks.
ACTLAB_INLINE void fill_bits8(uint8_t* u, uint64_t seed, uint64_t stream, uint64_t base, int64_t n,
                              const float* ahead = nullptr, int64_t ahead_n = 0) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "fill_bits8 stores draw k of a word as its byte k");
  if (n <= 0) return prefetch_floats(ahead, ahead_n);
  const uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  const uint32_t s0 = static_cast<uint32_t>(stream), s1 = static_cast<uint32_t>(stream >> 32);
  const uint64_t end = base + static_cast<uint64_t>(n);
  const uint64_t full_begin = (base + 15) >> 4, full_end = end >> 4;
  const int64_t head_share = std::min<int64_t>(ahead_n, static_cast<int64_t>(std::min(full_begin * 16, end) - base));
  prefetch_floats(ahead, head_share);  // the share of a partial first block (base not a multiple of 16)
  for (uint64_t b = full_begin; b < full_end; b += kLanes) {
    const int m = static_cast<int>(std::min<uint64_t>(kLanes, full_end - b));  // blocks in this chunk
    uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
    for (int l = 0; l < (m + 15) / 16 * 16; ++l) {  // whole vectors: philox_blocks_avx512 reads them
      c0[l] = static_cast<uint32_t>(b + l), c1[l] = static_cast<uint32_t>((b + l) >> 32);
      c2[l] = s0, c3[l] = s1;
    }
    uint8_t* dst = u + (b * 16 - base);
    const int64_t at = static_cast<int64_t>(b * 16 - base);  // this chunk's share of `ahead`: a line a block
    if (at < ahead_n) prefetch_floats(ahead + at, std::min<int64_t>(int64_t{16} * m, ahead_n - at));
    if (has_avx512f) {
      philox_blocks_avx512(dst, c0, c1, c2, c3, m, k0, k1);
      continue;
    }
    if (has_avx2) {
      philox_blocks_avx2(dst, c0, c1, c2, c3, m, k0, k1);
      continue;
    }
    philox_rounds(c0, c1, c2, c3, m, k0, k1);
    for (int l = 0; l < m; ++l) {
      const uint32_t words[4] = {c0[l], c1[l], c2[l], c3[l]};
      std::memcpy(dst + 16 * l, words, sizeof(words));
    }
  }
  const auto block_bits = [&](uint64_t blk) {
    return philox4x32_10(Philox4{{static_cast<uint32_t>(blk), static_cast<uint32_t>(blk >> 32), s0, s1}}, k0, k1);
  };
  // The partial head and tail blocks (a block is partial when it sticks out of [base, end)).
  const auto write = [&](uint64_t blk, uint64_t from, uint64_t to) {
    const Philox4 r = block_bits(blk);
    for (uint64_t idx = from; idx < to; ++idx) u[idx - base] = static_cast<uint8_t>(r.v[(idx >> 2) & 3] >> ((idx & 3) * 8));
  };
  const uint64_t head = base >> 4, tail = (end - 1) >> 4;
  if (head < full_begin || head >= full_end) write(head, base, std::min(head * 16 + 16, end));
  if (tail != head && tail >= full_end) write(tail, tail * 16, end);
  const int64_t covered = full_end > full_begin ? static_cast<int64_t>(full_end * 16 - base) : head_share;
  if (covered < ahead_n) prefetch_floats(ahead + covered, ahead_n - covered);  // past the whole blocks
}

// An integer of kBytes bytes (the codes of one run byte, one per byte).
template <int kBytes> struct WordOf;
template <> struct WordOf<2> { using type = uint16_t; };
template <> struct WordOf<4> { using type = uint32_t; };
template <> struct WordOf<8> { using type = uint64_t; };

// codes[0..n) (one code per byte, each <= 2^kBits − 1) → a run of LSB-first kBits-bit fields; n need not
// fill the last byte. The kPerByte codes of one run byte are loaded as one little-endian word and code k
// is shifted from bit 8k down to bit k·kBits (unpack_bits' inverse), which vectorizes on whole words.
template <int kBits>
ACTLAB_INLINE void pack_bits(uint8_t* __restrict run, const uint8_t* __restrict codes, int64_t n) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "pack_bits reads code k from byte k of a word");
  constexpr int kPerByte = 8 / kBits;
  using Word = typename WordOf<kPerByte>::type;
  constexpr Word kMask = (1u << kBits) - 1;
  const int64_t full = n / kPerByte;
  for (int64_t j = 0; j < full; ++j) {
    Word word;
    std::memcpy(&word, codes + j * kPerByte, sizeof(Word));
    Word byte = 0;
    for (int k = 0; k < kPerByte; ++k) byte |= (word >> (k * (8 - kBits))) & static_cast<Word>(kMask << (k * kBits));
    run[j] = static_cast<uint8_t>(byte);
  }
  if (full * kPerByte < n) {
    uint32_t byte = 0;
    for (int64_t e = full * kPerByte; e < n; ++e) byte |= static_cast<uint32_t>(codes[e]) << ((e - full * kPerByte) * kBits);
    run[full] = static_cast<uint8_t>(byte);
  }
}
ACTLAB_INLINE void pack_run(uint8_t* run, const uint8_t* codes, int64_t n, int bits) {
  switch (bits) {
    case 1: pack_bits<1>(run, codes, n); break;
    case 2: pack_bits<2>(run, codes, n); break;
    case 4: pack_bits<4>(run, codes, n); break;
    default: std::memcpy(run, codes, static_cast<size_t>(n)); break;
  }
}

// codes[e] = code e of an LSB-first run, for e < n (one code per byte). Each run byte is spread into one
// kPerByte-byte word (code k in byte k, little-endian) and stored whole: written per byte, GCC vectorized
// the loop into one vpextrb store per code, half of plane_unpack's time.
template <int kBits>
ACTLAB_INLINE void unpack_bits(uint8_t* __restrict codes, const uint8_t* __restrict run, int64_t n) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "unpack_bits stores code k in byte k of a word");
  constexpr int kPerByte = 8 / kBits;
  using Word = typename WordOf<kPerByte>::type;
  constexpr Word kMask = (1u << kBits) - 1;
  const int64_t full = n / kPerByte;
  for (int64_t j = 0; j < full; ++j) {
    const Word byte = run[j];
    Word word = 0;
    for (int k = 0; k < kPerByte; ++k) word |= ((byte >> (k * kBits)) & kMask) << (8 * k);
    std::memcpy(codes + j * kPerByte, &word, sizeof(Word));
  }
  for (int64_t e = full * kPerByte; e < n; ++e) codes[e] = static_cast<uint8_t>(unpack_code(run, e, kBits));
}
ACTLAB_INLINE void unpack_run(uint8_t* codes, const uint8_t* run, int64_t n, int bits) {
  switch (bits) {
    case 1: unpack_bits<1>(codes, run, n); break;
    case 2: unpack_bits<2>(codes, run, n); break;
    case 4: unpack_bits<4>(codes, run, n); break;
    default: std::memcpy(codes, run, static_cast<size_t>(n)); break;
  }
}

// min/max of v[0..n) as float order keys (see float_order_key): integer compares vectorize.
ACTLAB_INLINE void min_max_keys(int32_t& lo, int32_t& hi, const float* __restrict v, int64_t n) {
  int32_t l = INT32_MAX, h = INT32_MIN;
#pragma GCC unroll 1  // a short constant-count loop is otherwise unrolled into scalar code before vectorizing
  for (int64_t e = 0; e < n; ++e) {
    const int32_t k = float_order_key(v[e]);
    l = k < l ? k : l;
    h = k > h ? k : h;
  }
  lo = l, hi = h;
}

// True when an LFC row up-samples to a plane row as it is, column for column (a token map's min(B, T) × 1
// pool): no gather through the column map.
[[maybe_unused]] bool lfc_rows_as_is(const PlaneGeometry& g) { return g.block_w == 1 && g.lfc_w == g.width; }

// The nearest-rule source index of every output row and column, computed once per call (in the object
// when height + width <= 128, e.g. 64×64 maps: a channel read builds one per channel).
class UpsampleMap {
 public:
  explicit UpsampleMap(const PlaneGeometry& g) {
    const size_t n = static_cast<size_t>(g.height + g.width);
    if (n > sizeof(inline_) / sizeof(inline_[0])) heap_.resize(n);
    int32_t* at = heap_.empty() ? inline_ : heap_.data();
    for (int64_t h = 0; h < g.height; ++h) at[h] = static_cast<int32_t>(nearest_source(h, g.lfc_h, g.height));
    for (int64_t w = 0; w < g.width; ++w) at[g.height + w] = static_cast<int32_t>(nearest_source(w, g.lfc_w, g.width));
    row = at, col = at + g.height;
  }
  UpsampleMap(const UpsampleMap&) = delete;  // row and col point into this object
  UpsampleMap& operator=(const UpsampleMap&) = delete;

  const int32_t* row;  // [height]
  const int32_t* col;  // [width]

 private:
  int32_t inline_[128];
  std::vector<int32_t> heap_;
};

// A plane's extents: compile-time for the common maps (kH, kW > 0 with block B = kB; their loops then
// unroll into full vectors without alias checks or remainders), else the geometry's (kH = kW = kB = 0).
template <int kH, int kW, int kB>
struct Extents {
  static constexpr bool kFixed = kH > 0 && kW > 0;
  static constexpr int kBh = kFixed ? (kB < kH ? kB : kH) : 1, kBw = kFixed ? (kB < kW ? kB : kW) : 1;
  // The blocks tile the plane exactly (32², 16², 56² with B = 8): the nearest rule's source index is then
  // the block index, a shift.
  static constexpr bool kTiled = kFixed && kH % kBh == 0 && kW % kBw == 0;
  static constexpr int kLfcElems = kFixed ? (kH / kBh) * (kW / kBw) : 0;  // LFC values per plane (kFixed)
  int64_t h, w, bh, bw, lh, lw;
  explicit Extents(const PlaneGeometry& g)
      : h(kFixed ? kH : g.height), w(kFixed ? kW : g.width), bh(kFixed ? kBh : g.block_h),
        bw(kFixed ? kBw : g.block_w), lh(kFixed ? kH / kBh : g.lfc_h), lw(kFixed ? kW / kBw : g.lfc_w) {}
  int64_t elems() const { return h * w; }
  int64_t lfc_elems() const { return lh * lw; }
};

// Source LFC row of plane row h, and up_row[w] = LFC row i nearest-up-sampled to the plane width (f32).
// Exactly tiled shapes divide by the block size (a compile-time power of two for B = 8) instead of
// nearest_source's integer division per element; the others read the map.
template <int kH, int kW, int kB>
ACTLAB_INLINE int64_t source_row(int64_t h, const Extents<kH, kW, kB>& x, const UpsampleMap& map) {
  if constexpr (Extents<kH, kW, kB>::kTiled) return h / Extents<kH, kW, kB>::kBh;
  (void)x;
  return map.row[h];
}
template <int kH, int kW, int kB>
ACTLAB_INLINE void upsample_row(float* __restrict up_row, const uint16_t* __restrict lfc, int64_t i,
                                const Extents<kH, kW, kB>& x, const UpsampleMap& map) {
  const uint16_t* src = lfc + i * x.lw;
  if constexpr (Extents<kH, kW, kB>::kTiled) {
    for (int64_t w = 0; w < x.w; ++w) up_row[w] = bf16_to_float(src[w / Extents<kH, kW, kB>::kBw]);
  } else {
    if (x.lw == x.w) {  // no pooling across columns (token maps): the map is the identity, no gather
      for (int64_t w = 0; w < x.w; ++w) up_row[w] = bf16_to_float(src[w]);
      return;
    }
    for (int64_t w = 0; w < x.w; ++w) up_row[w] = bf16_to_float(src[map.col[w]]);
  }
}

// lfc[i·lfc_w + j] = bf16 mean of block (i, j) of plane xp, in codec.h's summation order.
// colsum: scratch of lfc_w·block_w floats.
template <int kH, int kW, int kB>
ACTLAB_INLINE void pool_plane(uint16_t* __restrict lfc, float* __restrict colsum, const float* __restrict xp,
                              const PlaneGeometry& g) {
  const Extents<kH, kW, kB> x(g);
  const int64_t lfc_h = x.lh, lfc_w = x.lw;
  const int64_t used_w = lfc_w * x.bw;
  for (int64_t i = 0; i < lfc_h; ++i) {
    const float* top = xp + i * x.bh * x.w;
    for (int64_t c = 0; c < used_w; ++c) colsum[c] = top[c];
    for (int64_t r = 1; r < x.bh; ++r)
      for (int64_t c = 0; c < used_w; ++c) colsum[c] += top[r * x.w + c];
    if (x.bw == 1) {  // blocks one column wide (token maps pool along rows only): a loop that vectorizes
      for (int64_t j = 0; j < lfc_w; ++j) lfc[i * lfc_w + j] = lfc_from_sum(colsum[j], x.bh);
      continue;
    }
    for (int64_t j = 0; j < lfc_w; ++j) {
      float sum = colsum[j * x.bw];
      for (int64_t b = 1; b < x.bw; ++b) sum += colsum[j * x.bw + b];
      lfc[i * lfc_w + j] = lfc_from_sum(sum, x.bh * x.bw);
    }
  }
}

// r = xp − LFC↑ of plane xp (its LFC written to lfc first). up_row: scratch of width floats.
template <int kH, int kW, int kB>
ACTLAB_INLINE void plane_residual(float* __restrict r, uint16_t* __restrict lfc, float* __restrict colsum,
                                  float* __restrict up_row, const float* __restrict xp, const UpsampleMap& map,
                                  const PlaneGeometry& g) {
  const Extents<kH, kW, kB> x(g);
  pool_plane<kH, kW, kB>(lfc, colsum, xp, g);
  if (x.lfc_elems() == 1) {  // one LFC value (8×8, 7×7, 4×4 maps): a flat loop
    const float mean = bf16_to_float(lfc[0]);
    for (int64_t e = 0; e < x.elems(); ++e) r[e] = xp[e] - mean;
    return;
  }
  for (int64_t h = 0; h < x.h; ++h) {
    const int64_t i = source_row(h, x, map);
    if (h == 0 || i != source_row(h - 1, x, map)) upsample_row(up_row, lfc, i, x, map);
    for (int64_t w = 0; w < x.w; ++w) r[h * x.w + w] = xp[h * x.w + w] - up_row[w];
  }
}

// c[e] = the stochastic code of r[e] with uniform u[e], for e < n (a plane's residuals or a group's values).
// On AVX-512 CPUs whole vectors go through quantize_avx512 (the same codes, 4² planes pack 1.5× faster), on
// AVX2 ones through quantize_avx2.
ACTLAB_INLINE void quantize_plane(uint8_t* __restrict c, const float* __restrict r, const uint8_t* __restrict u,
                                  int64_t n, float min, float scale, int levels) {
  const int64_t done = has_avx512f ? quantize_avx512(c, r, u, n, min, scale, levels)
                       : has_avx2  ? quantize_avx2(c, r, u, n, min, scale, levels)
                                   : 0;
#pragma GCC unroll 1
  for (int64_t e = done; e < n; ++e) c[e] = static_cast<uint8_t>(stochastic_code(r[e], min, scale, uniform8(u[e]), levels));
}

// Planes whose LFC blocks tile them exactly and whose up-sampled LFC fits in a few registers (32², 16², 8²,
// 4² with B = 8) pack in two AVX-512 passes per plane (pack_batch_registers): the pool and the order keys
// of the residual's min and max, then the codes, both straight from x and the up-sampled LFC held in
// registers, bit-packed from registers. The residual and the byte codes never go to memory (pack_batch's
// general path writes and re-reads both). Planes under 1024 elements run the passes a batch at a time
// around the batch's vectorized quant_params loop, so their per-plane scalar work is the pool alone; 32²
// planes run both passes per plane in one call with quant_params between them, about 3 % faster there
// (bench/RESULTS_compress.md, "Small planes in registers"). The same IEEE operations in the same order as
// the general path, so the packed bytes are identical (tests/test_codec.cpp compares them).
//
// kVectorRows: rows are whole vectors and an LFC row has at most 16 values, so an up-sampled row is a few
// permuted vectors (upsampled_rows). kOneLfc: the plane pools to one value (8², 4² with B = 8), which is
// one broadcast vector; the plane then needs no whole-vector rows, only a whole number of vectors.
template <int kH, int kW, int kB>
constexpr bool kVectorRows = Extents<kH, kW, kB>::kTiled && kW % 16 == 0 && kW / Extents<kH, kW, kB>::kBw <= 16;
template <int kH, int kW, int kB>
constexpr bool kOneLfc = Extents<kH, kW, kB>::kTiled && kH == Extents<kH, kW, kB>::kBh && kW == Extents<kH, kW, kB>::kBw;
template <int kH, int kW, int kB>
constexpr bool kRegisterLfc = (kVectorRows<kH, kW, kB> || kOneLfc<kH, kW, kB>) && (kH * kW) % 16 == 0;

#ifdef ACTLAB_X86_INTRINSICS
// The order key (float_order_key) of each lane.
ACTLAB_AVX512BW ACTLAB_INLINE __m512i order_keys(__m512 v) { return order_key_lanes(_mm512_castps_si512(v)); }
// up[i·(kW/16) + v] = vector v of LFC row i nearest-up-sampled to the plane width (f32), for kVectorRows
// planes.
template <int kH, int kW, int kB>
ACTLAB_AVX512BW ACTLAB_INLINE void upsampled_rows(__m512* up, const uint16_t* lfc) {
  using X = Extents<kH, kW, kB>;
  constexpr int kVecs = kW / 16, kLh = kH / X::kBh, kLw = kW / X::kBw;
  static_assert(kVectorRows<kH, kW, kB>, "upsampled_rows: rows are not whole vectors");
  __m512i source[kVecs];  // lane l of vector v up-samples LFC column (16v + l) / block width
  for (int v = 0; v < kVecs; ++v) {
    alignas(64) int32_t column[16];
    for (int l = 0; l < 16; ++l) column[l] = (v * 16 + l) / X::kBw;
    source[v] = _mm512_load_si512(column);
  }
  for (int i = 0; i < kLh; ++i) {
    alignas(64) float row[16] = {};
    for (int j = 0; j < kLw; ++j) row[j] = bf16_to_float(lfc[i * kLw + j]);
    for (int v = 0; v < kVecs; ++v) up[i * kVecs + v] = _mm512_permutexvar_ps(source[v], _mm512_load_ps(row));
  }
}
// The codes of 64 consecutive elements (four vectors, one code per u32 lane) as 8·bits bytes of an
// LSB-first run at dst.
ACTLAB_AVX512BW ACTLAB_INLINE void store_codes64(uint8_t* dst, const __m512i (&c)[4], int bits) {
  if (bits == 2) {  // Q = 2, the default: four code vectors narrowed by two in-lane packs
    // Byte 16k + 4m + i of the packs (128-bit lane k) is the code of element 16m + 4k + i, so the
    // multiply-adds merge whole run bytes; the run byte 4m + k then sits at byte 4k + m: one byte shuffle.
    const __m128i order = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i bytes = _mm512_packus_epi16(_mm512_packus_epi32(c[0], c[1]), _mm512_packus_epi32(c[2], c[3]));
    const __m512i pairs = _mm512_maddubs_epi16(bytes, _mm512_set1_epi16(0x0401));
    const __m512i quads = _mm512_madd_epi16(pairs, _mm512_set1_epi32(0x00100001));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm_shuffle_epi8(_mm512_cvtepi32_epi8(quads), order));
    return;
  }
  // The lane index of an insert must be a literal: an unoptimized build does not unroll a loop into one.
  __m512i bytes = _mm512_castsi128_si512(_mm512_cvtepi32_epi8(c[0]));
  bytes = _mm512_inserti32x4(bytes, _mm512_cvtepi32_epi8(c[1]), 1);
  bytes = _mm512_inserti32x4(bytes, _mm512_cvtepi32_epi8(c[2]), 2);
  bytes = _mm512_inserti32x4(bytes, _mm512_cvtepi32_epi8(c[3]), 3);
  store_run64(dst, bytes, bits);
}
// The codes of 16 consecutive elements (one per u32 lane, 0 past the row) as the first `bytes` bytes of an
// LSB-first run at dst (all 2·bits of them for a whole vector): store_codes64's narrowing for one vector.
ACTLAB_AVX512BW ACTLAB_INLINE void store_codes16(uint8_t* dst, __m512i c, int bits, int64_t bytes) {
  alignas(16) uint8_t run[16];
  const __m128i codes = _mm512_cvtepi32_epi8(c);
  switch (bits) {
    case 1: {
      const uint16_t mask = _mm512_test_epi32_mask(c, c);
      std::memcpy(bytes == 2 ? dst : run, &mask, 2);
      break;
    }
    case 2: {  // c0 + 4·c1 per byte pair, then p0 + 16·p1 per pair of pairs: one run byte per u32
      const __m128i quads = _mm_madd_epi16(_mm_maddubs_epi16(codes, _mm_set1_epi16(0x0401)), _mm_set1_epi32(0x00100001));
      const __m128i packed = _mm_packus_epi16(_mm_packus_epi32(quads, quads), quads);
      const uint32_t word = static_cast<uint32_t>(_mm_cvtsi128_si32(packed));
      std::memcpy(bytes == 4 ? dst : run, &word, 4);
      break;
    }
    case 4: {  // c0 + 16·c1 per byte pair
      const __m128i pairs = _mm_maddubs_epi16(codes, _mm_set1_epi16(0x1001));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(bytes == 8 ? dst : run), _mm_packus_epi16(pairs, pairs));
      break;
    }
    default: _mm_storeu_si128(reinterpret_cast<__m128i*>(bytes == 16 ? dst : run), codes); break;
  }
  if (bytes < 2 * bits) std::memcpy(dst, run, static_cast<size_t>(bytes));
}
// The up-sampled LFC of a kRegisterLfc plane in registers: up[i·(kW/16) + v] = vector v of LFC row i
// (kVectorRows), or up[0] = the plane's one LFC value in every lane (kOneLfc).
template <int kH, int kW, int kB>
constexpr int kLfcVectors = kOneLfc<kH, kW, kB> ? 1 : kH / Extents<kH, kW, kB>::kBh * (kW / 16 > 0 ? kW / 16 : 1);
template <int kH, int kW, int kB>
ACTLAB_AVX512BW ACTLAB_INLINE void lfc_vectors(__m512* up, const uint16_t* lfc) {
  if constexpr (kOneLfc<kH, kW, kB>) {
    up[0] = _mm512_set1_ps(bf16_to_float(lfc[0]));
  } else {
    upsampled_rows<kH, kW, kB>(up, lfc);
  }
}
// LFC↑ of plane elements e..e+15 from lfc_vectors' up (e a multiple of 16: within one row for kVectorRows
// planes).
template <int kH, int kW, int kB>
ACTLAB_AVX512BW ACTLAB_INLINE __m512 lfc_at(const __m512* up, int64_t e) {
  if constexpr (kOneLfc<kH, kW, kB>) {
    return up[0];
  } else {
    return up[e / kW / Extents<kH, kW, kB>::kBh * (kW / 16) + e % kW / 16];
  }
}
// x − LFC↑ of plane elements e..e+15.
template <int kH, int kW, int kB>
ACTLAB_AVX512BW ACTLAB_INLINE __m512 register_residual(const float* xp, const __m512* up, int64_t e) {
  return _mm512_sub_ps(_mm512_loadu_ps(xp + e), lfc_at<kH, kW, kB>(up, e));
}
// The order keys of the min and max of plane xp's residual, its LFC↑ in up (lfc_vectors) → lo, hi.
template <int kH, int kW, int kB>
ACTLAB_AVX512BW ACTLAB_INLINE void register_keys(int32_t& lo, int32_t& hi, const __m512* up, const float* xp) {
  __m512i l = _mm512_set1_epi32(INT32_MAX), h = _mm512_set1_epi32(INT32_MIN);
  for (int64_t e = 0; e < kH * kW; e += 16) {
    const __m512i key = order_keys(register_residual<kH, kW, kB>(xp, up, e));
    l = _mm512_min_epi32(l, key), h = _mm512_max_epi32(h, key);
  }
  lo = _mm512_reduce_min_epi32(l), hi = _mm512_reduce_max_epi32(h);
}
// The codes of plane xp's residual (LFC↑ in up) with its uniforms u[0..E) → run (E·bits/8 bytes).
template <int kH, int kW, int kB>
ACTLAB_AVX512BW ACTLAB_INLINE void register_codes(uint8_t* run, const QuantizerAvx512& quantizer, const __m512* up,
                                                  const float* xp, const uint8_t* u, int bits) {
  if constexpr ((kH * kW) % 64 == 0) {
    for (int64_t e0 = 0; e0 < kH * kW; e0 += 64) {
      __m512i c[4];
      for (int k = 0; k < 4; ++k) c[k] = quantizer.codes(register_residual<kH, kW, kB>(xp, up, e0 + 16 * k), u + e0 + 16 * k);
      store_codes64(run + e0 * bits / 8, c, bits);
    }
  } else {
    for (int64_t e = 0; e < kH * kW; e += 16)
      store_codes16(run + e * bits / 8, quantizer.codes(register_residual<kH, kW, kB>(xp, up, e), u + e), bits, 2 * bits);
  }
}
// Planes [0, nb) of a batch at x (E = kH·kW floats each): each plane's LFC pooled → lfc + q·LE, then the
// order keys of its residual's min and max → lo[q], hi[q]. colsum: pool_plane's scratch.
template <int kH, int kW, int kB>
ACTLAB_AVX512BW void register_batch_keys(int32_t* lo, int32_t* hi, uint16_t* lfc, float* colsum, const float* x,
                                         int64_t nb, const PlaneGeometry& g) {
  static_assert(kRegisterLfc<kH, kW, kB>, "register_batch_keys: a shape its loops do not cover");
  constexpr int64_t kE = kH * kW, kLE = Extents<kH, kW, kB>::kLfcElems;
  for (int64_t q = 0; q < nb; ++q) {
    pool_plane<kH, kW, kB>(lfc + q * kLE, colsum, x + q * kE, g);
    __m512 up[kLfcVectors<kH, kW, kB>];
    lfc_vectors<kH, kW, kB>(up, lfc + q * kLE);
    register_keys<kH, kW, kB>(lo[q], hi[q], up, x + q * kE);
  }
}
// The codes of planes [0, nb) with their stored min/step as f32 (min[q], scale[q] = quant_scale(step)) and
// their uniforms u[q·E..) → runs + q·E·bits/8.
template <int kH, int kW, int kB>
ACTLAB_AVX512BW void register_batch_codes(uint8_t* runs, const float* min, const float* scale, const uint16_t* lfc,
                                          const float* x, const uint8_t* u, int64_t nb, int bits) {
  static_assert(kRegisterLfc<kH, kW, kB>, "register_batch_codes: a shape its loops do not cover");
  constexpr int64_t kE = kH * kW, kLE = Extents<kH, kW, kB>::kLfcElems;
  const int levels = quant_levels(bits);
  for (int64_t q = 0; q < nb; ++q) {
    __m512 up[kLfcVectors<kH, kW, kB>];
    lfc_vectors<kH, kW, kB>(up, lfc + q * kLE);
    register_codes<kH, kW, kB>(runs + q * kE * bits / 8, QuantizerAvx512(min[q], scale[q], levels), up, x + q * kE,
                               u + q * kE, bits);
  }
}
// One plane xp in one call, the pool, both passes and its min/step (quant_params) between them: planes of
// 1024+ elements, where this measured about 3 % faster than the batch's calls (32² planes, B = 8), and
// slower on 16² planes (bench/RESULTS_compress.md, "Small planes in registers").
template <int kH, int kW, int kB>
ACTLAB_AVX512BW void register_plane_pack(uint8_t* run, uint16_t* lfc, uint16_t& min_bits, uint16_t& step_bits,
                                         float* colsum, const float* xp, const uint8_t* u, const PlaneGeometry& g) {
  static_assert(kRegisterLfc<kH, kW, kB>, "register_plane_pack: a shape its loops do not cover");
  pool_plane<kH, kW, kB>(lfc, colsum, xp, g);
  __m512 up[kLfcVectors<kH, kW, kB>];
  lfc_vectors<kH, kW, kB>(up, lfc);
  int32_t lo, hi;
  register_keys<kH, kW, kB>(lo, hi, up, xp);
  quant_params(min_bits, step_bits, float_from_order_key(lo), float_from_order_key(hi), g.bits);
  register_codes<kH, kW, kB>(run, QuantizerAvx512(bf16_to_float(min_bits), quant_scale(bf16_to_float(step_bits)),
                                                  quant_levels(g.bits)),
                             up, xp, u, g.bits);
}

// Planes of run-time extents at least one vector wide (token maps, attention operands and softmax maps,
// ranged CNN planes) pack in two AVX-512 passes over x per plane, row by row, around the batch's
// quant_params loop (pack_batch_rows): the order keys of each range's min and max, then its codes, both
// straight from x and the up-sampled LFC row, so the residual never goes to memory (the general path
// writes and re-reads it).
// The codes are bit-packed from registers, 64 at a time when the width allows, else 16, so every row of
// a range must start on a whole vector of codes: W % 16 == 0, or one row per range (50-wide softmax rows
// with R = 1), whose last vector is masked. A 50×50 plane coded as one range stays on the general path,
// which reads it as one flat run (the row routine's per-row tails made its pack 30 % slower). The IEEE
// operations and their order are the general path's, so the bytes are the same (tests/test_codec.cpp).
bool rows_fused(const PlaneGeometry& g) {
  return g.width >= 16 && (g.width % 16 == 0 || g.rows_per_range() == 1);
}
// Lanes [0, n) of a vector (all of them when n >= 16).
ACTLAB_INLINE __mmask16 first_lanes(int64_t n) { return static_cast<__mmask16>(n >= 16 ? 0xFFFF : (1u << n) - 1); }
// 16 bf16 values at p, widened to f32.
ACTLAB_AVX512BW ACTLAB_INLINE __m512 bf16x16(const uint16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
// up[0..W) = LFC row i nearest-up-sampled to the plane width in f32 (upsample_row's values): rows that
// up-sample as they are (token maps) and rows of at most 16 values (one permute per vector) vectorized.
ACTLAB_AVX512BW void upsampled_row(float* up, const uint16_t* lfc, int64_t i, const UpsampleMap& map,
                                   const PlaneGeometry& g) {
  const int64_t W = g.width, lw = g.lfc_w;
  const uint16_t* src = lfc + i * lw;
  if (lfc_rows_as_is(g)) {
    int64_t w = 0;
    for (; w + 16 <= W; w += 16) _mm512_storeu_ps(up + w, bf16x16(src + w));
    for (; w < W; ++w) up[w] = bf16_to_float(src[w]);
  } else if (lw <= 16) {
    alignas(64) float row[16] = {};
    for (int64_t j = 0; j < lw; ++j) row[j] = bf16_to_float(src[j]);
    const __m512 values = _mm512_load_ps(row);
    for (int64_t w = 0; w < W; w += 16) {
      const __mmask16 m = first_lanes(W - w);
      _mm512_mask_storeu_ps(up + w, m, _mm512_permutexvar_ps(_mm512_maskz_loadu_epi32(m, map.col + w), values));
    }
  } else {
    upsample_row(up, lfc, i, Extents<0, 0, 0>(g), map);
  }
}
// The up-sampled LFC row of plane row `row` (nullptr without an LFC), kept in up and rebuilt when its source
// row differs from the previous row's: callers visit a plane's rows in order from row 0.
ACTLAB_AVX512BW ACTLAB_INLINE const float* lfc_row_at(float* up, const uint16_t* lfc, int64_t row,
                                                      const UpsampleMap& map, const PlaneGeometry& g) {
  if (!lfc) return nullptr;
  if (row == 0 || map.row[row] != map.row[row - 1]) upsampled_row(up, lfc, map.row[row], map, g);
  return up;
}
// x_row[w..w+16) − up[w..w+16) (up nullptr: no LFC); the masked form reads the lanes of m only (0 on the
// others) and serves a row's last, partial vector. Whole vectors take plain loads and stores: a first
// version that masked every vector decoded token maps at about half the rate.
ACTLAB_AVX512BW ACTLAB_INLINE __m512 row_residual(const float* x_row, const float* up, int64_t w) {
  const __m512 x = _mm512_loadu_ps(x_row + w);
  return up ? _mm512_sub_ps(x, _mm512_loadu_ps(up + w)) : x;
}
ACTLAB_AVX512BW ACTLAB_INLINE __m512 row_residual(const float* x_row, const float* up, int64_t w, __mmask16 m) {
  const __m512 x = _mm512_maskz_loadu_ps(m, x_row + w);
  return up ? _mm512_sub_ps(x, _mm512_maskz_loadu_ps(m, up + w)) : x;
}
// The uniforms u[0..n), n < 16, zero-extended to 16 bytes (a row's last vector reads no further).
ACTLAB_AVX512BW ACTLAB_INLINE __m128i uniforms_tail(const uint8_t* u, int64_t n) {
  alignas(16) uint8_t tail[16] = {};
  std::memcpy(tail, u, static_cast<size_t>(n));
  return _mm_load_si128(reinterpret_cast<const __m128i*>(tail));
}
// Plane xp (LFC lfc, already pooled; nullptr: none), in two calls around batch_quant_params:
// the order keys of each range's min and max → lo[k], hi[k]; then, with the ranges' stored min/step as f32
// (min[k], scale[k] = quant_scale(step)) and the plane's uniforms u[0..E), the codes of range k → runs +
// k·code_bytes_per_range. up: W floats of scratch.
ACTLAB_AVX512BW void row_plane_keys(int32_t* lo, int32_t* hi, const uint16_t* lfc, float* up, const float* xp,
                                    const UpsampleMap& map, const PlaneGeometry& g) {
  const int64_t W = g.width, H = g.height, rows = g.rows_per_range(), full = W / 16 * 16;
  for (int64_t h0 = 0, k = 0; h0 < H; h0 += rows, ++k) {
    const int64_t h1 = std::min(h0 + rows, H);
    __m512i l = _mm512_set1_epi32(INT32_MAX), h = _mm512_set1_epi32(INT32_MIN);
    for (int64_t row = h0; row < h1; ++row) {
      const float* up_row = lfc_row_at(up, lfc, row, map, g);
      for (int64_t w = 0; w < full; w += 16) {
        const __m512i key = order_keys(row_residual(xp + row * W, up_row, w));
        l = _mm512_min_epi32(l, key), h = _mm512_max_epi32(h, key);
      }
      if (full < W) {
        const __mmask16 m = first_lanes(W - full);
        const __m512i key = order_keys(row_residual(xp + row * W, up_row, full, m));
        l = _mm512_mask_min_epi32(l, m, l, key), h = _mm512_mask_max_epi32(h, m, h, key);
      }
    }
    lo[k] = _mm512_reduce_min_epi32(l), hi[k] = _mm512_reduce_max_epi32(h);
    if (h1 - h0 < rows) lo[k] = std::min(lo[k], float_order_key(0.f)), hi[k] = std::max(hi[k], float_order_key(0.f));
  }
}
ACTLAB_AVX512BW void row_plane_codes(uint8_t* runs, const float* min, const float* scale,
                                     const uint16_t* lfc, float* up, const float* xp, const uint8_t* u,
                                     const UpsampleMap& map, const PlaneGeometry& g) {
  const int64_t W = g.width, H = g.height, rows = g.rows_per_range(), run_bytes = g.code_bytes_per_range();
  const int64_t full = W / 16 * 16;
  for (int64_t h0 = 0, k = 0; h0 < H; h0 += rows, ++k) {
    const int64_t h1 = std::min(h0 + rows, H);
    const QuantizerAvx512 quantizer(min[k], scale[k], quant_levels(g.bits));
    uint8_t* run = runs + k * run_bytes;
    for (int64_t row = h0; row < h1; ++row) {
      const float* up_row = lfc_row_at(up, lfc, row, map, g);
      const float* x_row = xp + row * W;
      const uint8_t* u_row = u + row * W;
      const int64_t at = (row - h0) * W;  // the row's first code in the range's run
      if (W % 64 == 0) {
        for (int64_t w = 0; w < W; w += 64) {
          __m512i c[4];
          for (int j = 0; j < 4; ++j)
            c[j] = quantizer.codes(row_residual(x_row, up_row, w + 16 * j), u_row + w + 16 * j);
          store_codes64(run + (at + w) * g.bits / 8, c, g.bits);
        }
        continue;
      }
      for (int64_t w = 0; w < full; w += 16)
        store_codes16(run + (at + w) * g.bits / 8, quantizer.codes(row_residual(x_row, up_row, w), u_row + w), g.bits,
                      2 * g.bits);
      if (full == W) continue;
      const int64_t n = W - full;
      const __mmask16 m = first_lanes(n);
      const __m512i codes = quantizer.codes(row_residual(x_row, up_row, full, m), uniforms_tail(u_row + full, n));
      const __m512i c = _mm512_maskz_mov_epi32(m, codes);
      store_codes16(run + (at + full) * g.bits / 8, c, g.bits, (n * g.bits + 7) / 8);
    }
    const int64_t used = ((h1 - h0) * W * g.bits + 7) / 8;
    std::memset(run + used, 0, static_cast<size_t>(run_bytes - used));  // a padded range's padding: code 0
  }
}

// kRegisterLfc planes (32², 16², 8², 4² with B = 8), a whole tensor's or one channel's, are dequantized
// straight from their code run: each vector's 16·bits code bits are shifted into lanes, and min + code·step
// (one FMA: the product is exact, codec.h) is added to the up-sampled LFC in registers, as unpack_plane does.
// Against the batch path's byte decode and unpack_plane, a whole tensor's decode ran 1.1–1.6× as fast on a
// Xeon (model 207; bench/RESULTS_compress.md, "Small planes in registers").

// The codes of elements 16v..16v+15 of a bits-bit LSB-first run, one per u32 lane.
ACTLAB_AVX512BW ACTLAB_INLINE __m512i run_codes16(const uint8_t* run, int64_t v, int bits) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  switch (bits) {
    case 1: {
      uint16_t word;
      std::memcpy(&word, run + 2 * v, 2);
      return _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(word), lane), _mm512_set1_epi32(1));
    }
    case 2: {
      uint32_t word;
      std::memcpy(&word, run + 4 * v, 4);
      return _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(word)), _mm512_slli_epi32(lane, 1)),
                              _mm512_set1_epi32(3));
    }
    case 4: {
      uint32_t words[2];
      std::memcpy(words, run + 8 * v, 8);
      const __m512i both = _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(static_cast<int>(words[0])),
                                                   _mm512_set1_epi32(static_cast<int>(words[1])));
      const __m512i shift = _mm512_slli_epi32(_mm512_and_si512(lane, _mm512_set1_epi32(7)), 2);
      return _mm512_and_si512(_mm512_srlv_epi32(both, shift), _mm512_set1_epi32(15));
    }
    default: return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(run + 16 * v)));
  }
}
// op = LFC↑ + dequantized codes of one plane (lfc may be nullptr: the codes alone).
template <int kH, int kW, int kB>
ACTLAB_AVX512BW void unpack_plane_direct(float* op, const uint16_t* lfc, const uint8_t* run, float min, float step,
                                         int bits) {
  static_assert(kRegisterLfc<kH, kW, kB>, "unpack_plane_direct: a shape its loops do not cover");
  __m512 up[kLfcVectors<kH, kW, kB>];
  if (lfc) lfc_vectors<kH, kW, kB>(up, lfc);
  const __m512 vmin = _mm512_set1_ps(min), vstep = _mm512_set1_ps(step);
  for (int64_t v = 0; v < kH * kW / 16; ++v) {
    const __m512 d = _mm512_fmadd_ps(_mm512_cvtepi32_ps(run_codes16(run, v, bits)), vstep, vmin);
    _mm512_storeu_ps(op + 16 * v, lfc ? _mm512_add_ps(lfc_at<kH, kW, kB>(up, 16 * v), d) : d);
  }
}
// min + code·step of the codes of elements 16v..16v+15 of a run.
ACTLAB_AVX512BW ACTLAB_INLINE __m512 dequantize16(const uint8_t* run, int64_t v, int bits, __m512 vmin, __m512 vstep) {
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(run_codes16(run, v, bits)), vstep, vmin);
}
// The decode of a row_plane_codes plane: op = LFC↑ + each range's dequantized codes, straight from the
// runs, as unpack_plane computes it (one FMA for min + code·step: the product is exact). up: W floats of
// scratch.
ACTLAB_AVX512BW void unpack_row_plane(float* op, const uint16_t* lfc, const uint8_t* runs, const uint16_t* mins,
                                      const uint16_t* steps, float* up, const UpsampleMap& map, const PlaneGeometry& g) {
  const int64_t W = g.width, H = g.height, rows = g.rows_per_range(), run_bytes = g.code_bytes_per_range();
  const int64_t full = W / 16 * 16;
  for (int64_t h0 = 0, k = 0; h0 < H; h0 += rows, ++k) {
    const __m512 vmin = _mm512_set1_ps(bf16_to_float(mins[k])), vstep = _mm512_set1_ps(bf16_to_float(steps[k]));
    const uint8_t* run = runs + k * run_bytes;
    for (int64_t h = h0; h < std::min(h0 + rows, H); ++h) {
      float* o = op + h * W;
      const int64_t at = (h - h0) * W;
      if (lfc && full == W && lfc_rows_as_is(g)) {  // token maps: the bf16 LFC row as it is (8 % faster than f32)
        const uint16_t* lfc_row = lfc + map.row[h] * W;
        for (int64_t w = 0; w < W; w += 16) {
          const __m512 d = dequantize16(run, (at + w) / 16, g.bits, vmin, vstep);
          _mm512_storeu_ps(o + w, _mm512_add_ps(bf16x16(lfc_row + w), d));
        }
        continue;
      }
      const float* up_row = lfc_row_at(up, lfc, h, map, g);
      for (int64_t w = 0; w < full; w += 16) {
        const __m512 d = dequantize16(run, (at + w) / 16, g.bits, vmin, vstep);
        _mm512_storeu_ps(o + w, up_row ? _mm512_add_ps(_mm512_loadu_ps(up_row + w), d) : d);
      }
      if (full == W) continue;
      // A row's last, partial vector: its bytes alone (the tensor's last run ends there).
      const int64_t n = W - full;
      const __mmask16 m = first_lanes(n);
      alignas(16) uint8_t tail[16] = {};
      std::memcpy(tail, run + (at + full) * g.bits / 8, static_cast<size_t>((n * g.bits + 7) / 8));
      const __m512 d = dequantize16(tail, 0, g.bits, vmin, vstep);
      _mm512_mask_storeu_ps(o + full, m, up_row ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, up_row + full), d) : d);
    }
  }
}
// AVX2 CPUs: planes whose 8-lane vectors each up-sample one LFC value (one value per plane, or blocks 8
// wide that tile the rows: 32², 16², 8², 4², 56² with B = 8) are dequantized straight from their code run,
// as unpack_plane_direct does with 16 lanes.
template <int kH, int kW, int kB>
constexpr bool kDirectUnpackAvx2 = Extents<kH, kW, kB>::kFixed && (kH * kW) % 8 == 0 &&
                                   (Extents<kH, kW, kB>::kLfcElems == 1 ||
                                    (Extents<kH, kW, kB>::kTiled && Extents<kH, kW, kB>::kBw == 8));
// The codes of elements 8v..8v+7 of a bits-bit LSB-first run, one per u32 lane.
ACTLAB_AVX2 ACTLAB_INLINE __m256i run_codes8(const uint8_t* run, int64_t v, int bits) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  switch (bits) {
    case 1: return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(run[v]), lane), _mm256_set1_epi32(1));
    case 2: {
      uint16_t word;
      std::memcpy(&word, run + 2 * v, 2);
      return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word), _mm256_slli_epi32(lane, 1)), _mm256_set1_epi32(3));
    }
    case 4: {
      uint32_t word;
      std::memcpy(&word, run + 4 * v, 4);
      return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), _mm256_slli_epi32(lane, 2)),
                              _mm256_set1_epi32(15));
    }
    default: return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(run + 8 * v)));
  }
}
template <int kH, int kW, int kB>
ACTLAB_AVX2 void unpack_plane_direct_avx2(float* op, const uint16_t* lfc, const uint8_t* run, float min, float step,
                                          int bits) {
  using X = Extents<kH, kW, kB>;
  static_assert(kDirectUnpackAvx2<kH, kW, kB>, "unpack_plane_direct_avx2: a shape its loops do not cover");
  constexpr int kLw = kW / X::kBw, kLe = X::kLfcElems;
  float up[kLe];  // the plane's LFC values as f32; vector v up-samples one of them
  if (lfc)
    for (int k = 0; k < kLe; ++k) up[k] = bf16_to_float(lfc[k]);
  const __m256 vmin = _mm256_set1_ps(min), vstep = _mm256_set1_ps(step);
  for (int v = 0; v < kH * kW / 8; ++v) {
    const __m256 d = _mm256_fmadd_ps(_mm256_cvtepi32_ps(run_codes8(run, v, bits)), vstep, vmin);
    if (!lfc) {
      _mm256_storeu_ps(op + 8 * v, d);
      continue;
    }
    const int k = kLe == 1 ? 0 : (8 * v / kW) / X::kBh * kLw + (8 * v % kW) / 8;
    _mm256_storeu_ps(op + 8 * v, _mm256_add_ps(_mm256_broadcast_ss(up + k), d));
  }
}
#else
template <int kH, int kW, int kB>
constexpr bool kDirectUnpackAvx2 = false;
template <int kH, int kW, int kB>
void unpack_plane_direct_avx2(float*, const uint16_t*, const uint8_t*, float, float, int) {}
template <int kH, int kW, int kB>
void register_batch_keys(int32_t*, int32_t*, uint16_t*, float*, const float*, int64_t, const PlaneGeometry&) {}
template <int kH, int kW, int kB>
void register_batch_codes(uint8_t*, const float*, const float*, const uint16_t*, const float*, const uint8_t*, int64_t,
                          int) {}
template <int kH, int kW, int kB>
void register_plane_pack(uint8_t*, uint16_t*, uint16_t&, uint16_t&, float*, const float*, const uint8_t*,
                         const PlaneGeometry&) {}
template <int kH, int kW, int kB>
void unpack_plane_direct(float*, const uint16_t*, const uint8_t*, float, float, int) {}
bool rows_fused(const PlaneGeometry&) { return false; }
void row_plane_keys(int32_t*, int32_t*, const uint16_t*, float*, const float*, const UpsampleMap&,
                    const PlaneGeometry&) {}
void row_plane_codes(uint8_t*, const float*, const float*, const uint16_t*, float*, const float*,
                     const uint8_t*, const UpsampleMap&, const PlaneGeometry&) {}
void unpack_row_plane(float*, const uint16_t*, const uint8_t*, const uint16_t*, const uint16_t*, float*,
                      const UpsampleMap&, const PlaneGeometry&) {}
#endif

// ---------------------------------------------------------------- plane pack
// Everything plane_pack needs, so the per-thread worker is one (cloned) call.
struct PlanePackArgs {
  uint16_t* lfc;
  uint8_t* codes;
  uint16_t* mins;
  uint16_t* steps;
  float* residual;
  const float* x;
  const PlaneGeometry* g;
  const UpsampleMap* map;
  bool with_lfc;
  uint64_t seed, stream;
};

// Small planes are processed in batches of consecutive planes of about this many elements: their
// element indices are contiguous, so one Philox pass and (when Q·E is a multiple of 8, so runs are
// contiguous too) one bit-pack/unpack pass serve the whole batch and stay vectorized.
constexpr int64_t kBatchElems = 4096;
int64_t planes_per_batch(const PlaneGeometry& g) { return std::max<int64_t>(1, kBatchElems / g.plane_elems()); }

// Per-thread scratch of plane_pack, carved from one block (each piece 64-byte aligned).
struct PackScratch {
  float* r;          // residuals of a batch, f32 [batch·E]
  uint8_t* bits;     // 8-bit uniforms of a batch [batch·E]
  uint8_t* codes;    // codes of a batch, one per byte [batch·E]
  float* colsum;     // [width]
  float* up_row;     // [width]
  uint16_t* lfc;     // the LFCs of a batch when they are not stored [batch·lfc_elems]
  int32_t* lo;       // min/max keys per range [batch·ranges_per_plane]
  int32_t* hi;
  float* min;        // stored min/step per range, as f32 [batch·ranges_per_plane]
  float* scale;      // quant_scale of the stored step
};
int64_t carve_pack_scratch(PackScratch& s, uint8_t* base, const PlaneGeometry& g) {
  const int64_t n = planes_per_batch(g) * g.plane_elems(), batch = planes_per_batch(g) * g.ranges_per_plane();
  int64_t at = 0;
  const auto take = [&](auto& ptr, int64_t count) {
    ptr = base ? reinterpret_cast<std::remove_reference_t<decltype(ptr)>>(base + at) : nullptr;
    at += (count * static_cast<int64_t>(sizeof(*ptr)) + 63) / 64 * 64;
  };
  take(s.r, n), take(s.bits, n), take(s.codes, n), take(s.colsum, g.width), take(s.up_row, g.width);
  take(s.lfc, planes_per_batch(g) * g.lfc_elems()), take(s.lo, batch), take(s.hi, batch), take(s.min, batch);
  take(s.scale, batch);
  return at;
}

// The order keys of the min and max of a range's `count` values v, with the range's zero padding when
// count < full (the last range of a plane whose height its rows do not divide).
ACTLAB_INLINE void range_min_max(int32_t& lo, int32_t& hi, const float* v, int64_t count, int64_t full) {
  min_max_keys(lo, hi, v, count);
  if (count < full) lo = std::min(lo, float_order_key(0.f)), hi = std::max(hi, float_order_key(0.f));
}

// The bf16 min/step of ranges [0, n) of a batch from their order keys lo/hi (stored at mins/steps), and
// as f32 for the quantizer (min, scale = quant_scale(step)): one loop that vectorizes across ranges (a
// scalar call per range would cost as much as a 192-element range's codes).
ACTLAB_INLINE void batch_quant_params(uint16_t* mins, uint16_t* steps, const PackScratch& s, int64_t n, int bits) {
  for (int64_t j = 0; j < n; ++j) {
    uint16_t min_bits, step_bits;
    quant_params(min_bits, step_bits, float_from_order_key(s.lo[j]), float_from_order_key(s.hi[j]), bits);
    mins[j] = min_bits, steps[j] = step_bits;
    s.min[j] = bf16_to_float(min_bits), s.scale[j] = quant_scale(bf16_to_float(step_bits));
  }
}

// pack_batch for planes of run-time extents whose rows start on whole vectors of codes (rows_fused), codes
// wanted and no f32 residual: per plane the pool and the row routine's range keys, the batch's min/step,
// per plane the row routine's codes.
template <int kH, int kW, int kB>
ACTLAB_INLINE void pack_batch_rows(const PlanePackArgs& a, int64_t p0, int64_t nb, const PackScratch& s) {
  const PlaneGeometry& g = *a.g;
  const int64_t E = g.plane_elems(), LE = g.lfc_elems(), nr = g.ranges_per_plane();
  const auto plane_lfc = [&](int64_t q) -> uint16_t* {
    return a.with_lfc ? (a.lfc ? a.lfc + (p0 + q) * LE : s.lfc + q * LE) : nullptr;
  };
  for (int64_t q = 0; q < nb; ++q) {
    if (a.with_lfc) pool_plane<kH, kW, kB>(plane_lfc(q), s.colsum, a.x + (p0 + q) * E, g);
    row_plane_keys(s.lo + q * nr, s.hi + q * nr, plane_lfc(q), s.up_row, a.x + (p0 + q) * E, *a.map, g);
  }
  batch_quant_params(a.mins + p0 * nr, a.steps + p0 * nr, s, nb * nr, g.bits);
  for (int64_t q = 0; q < nb; ++q)
    row_plane_codes(a.codes + (p0 + q) * g.code_bytes_per_plane(), s.min + q * nr, s.scale + q * nr, plane_lfc(q),
                    s.up_row, a.x + (p0 + q) * E, s.bits + q * E, *a.map, g);
}

// pack_batch for kRegisterLfc planes (see there), with the LFC wanted, codes wanted and no f32 residual: per
// plane the pool and the residual's range keys, the batch's min/step, per plane the codes.
template <int kH, int kW, int kB>
ACTLAB_INLINE void pack_batch_registers(const PlanePackArgs& a, int64_t p0, int64_t nb, const PackScratch& s) {
  const PlaneGeometry& g = *a.g;
  const int64_t E = g.plane_elems();
  uint16_t* lfc = a.lfc ? a.lfc + p0 * g.lfc_elems() : s.lfc;
  if constexpr (kH * kW >= 1024) {
    for (int64_t q = 0; q < nb; ++q)
      register_plane_pack<kH, kW, kB>(a.codes + (p0 + q) * g.code_bytes_per_plane(), lfc + q * g.lfc_elems(),
                                      a.mins[p0 + q], a.steps[p0 + q], s.colsum, a.x + (p0 + q) * E, s.bits + q * E, g);
    return;
  }
  register_batch_keys<kH, kW, kB>(s.lo, s.hi, lfc, s.colsum, a.x + p0 * E, nb, g);
  batch_quant_params(a.mins + p0, a.steps + p0, s, nb, g.bits);
  register_batch_codes<kH, kW, kB>(a.codes + p0 * g.code_bytes_per_plane(), s.min, s.scale, lfc, a.x + p0 * E, s.bits,
                                   nb, g.bits);
}

// Planes [p0, p0 + nb) of one batch: uniforms, residuals, ranges, codes, bit runs. `next` planes follow in
// this thread's range (their input is prefetched). A plane of several ranges (g.range_rows) is coded range
// by range from the residual in scratch, so it costs one pass like a plane of one range.
template <int kH, int kW, int kB>
ACTLAB_INLINE void pack_batch(const PlanePackArgs& a, int64_t p0, int64_t nb, int64_t next, const PackScratch& s) {
  const PlaneGeometry& g = *a.g;
  const Extents<kH, kW, kB> x(g);
  const int64_t E = x.elems(), LE = x.lfc_elems(), code_bytes = g.code_bytes_per_plane();
  const int64_t nr = g.ranges_per_plane(), RE = g.range_elems(), run_bytes = g.code_bytes_per_range();
  const auto range_count = [&](int64_t k) { return std::min(RE, E - k * RE); };
  if (a.codes) {
    fill_bits8(s.bits, a.seed, a.stream, static_cast<uint64_t>(p0 * E), nb * E, a.x + (p0 + nb) * E, next * E);
  } else {
    prefetch_floats(a.x + (p0 + nb) * E, next * E);
  }
  if constexpr (kRegisterLfc<kH, kW, kB>) {
    if (has_avx512bw && a.with_lfc && a.codes && !a.residual) return pack_batch_registers<kH, kW, kB>(a, p0, nb, s);
  }
  if constexpr (!Extents<kH, kW, kB>::kFixed) {
    if (has_avx512bw && a.codes && !a.residual && rows_fused(g)) return pack_batch_rows<kH, kW, kB>(a, p0, nb, s);
  }
  for (int64_t q = 0; q < nb; ++q) {  // pool, residual, range
    const int64_t p = p0 + q;
    const float* xp = a.x + p * E;
    float* r = a.residual ? a.residual + p * E : s.r + q * E;
    if (a.with_lfc && !a.codes && !a.residual) {  // lfc: the pool alone
      pool_plane<kH, kW, kB>(a.lfc ? a.lfc + p * LE : s.lfc, s.colsum, xp, g);
    } else if (a.with_lfc) {
      plane_residual<kH, kW, kB>(r, a.lfc ? a.lfc + p * LE : s.lfc, s.colsum, s.up_row, xp, *a.map, g);
    } else if (a.residual) {
      std::memcpy(r, xp, static_cast<size_t>(E) * 4);
    }
    if (!a.codes) continue;
    const float* v = a.with_lfc || a.residual ? r : xp;
    for (int64_t k = 0; k < nr; ++k) range_min_max(s.lo[q * nr + k], s.hi[q * nr + k], v + k * RE, range_count(k), RE);
  }
  if (!a.codes) return;
  const int bits = g.bits, levels = quant_levels(bits);
  batch_quant_params(a.mins + p0 * nr, a.steps + p0 * nr, s, nb * nr, bits);
  for (int64_t q = 0; q < nb; ++q) {
    const int64_t p = p0 + q;
    const float* r = a.residual ? a.residual + p * E : a.with_lfc ? s.r + q * E : a.x + p * E;
    for (int64_t k = 0; k < nr; ++k) {
      const int64_t at = q * E + k * RE;
      quantize_plane(s.codes + at, r + k * RE, s.bits + at, range_count(k), s.min[q * nr + k], s.scale[q * nr + k],
                     levels);
    }
  }
  if (g.contiguous_codes()) {  // the runs of the batch are contiguous: one pass
    pack_run(a.codes + p0 * code_bytes, s.codes, nb * E, bits);
    return;
  }
  for (int64_t q = 0; q < nb; ++q)
    for (int64_t k = 0; k < nr; ++k) {
      uint8_t* run = a.codes + ((p0 + q) * nr + k) * run_bytes;
      const int64_t count = range_count(k), used = (count * bits + 7) / 8;
      pack_run(run, s.codes + q * E + k * RE, count, bits);
      std::memset(run + used, 0, static_cast<size_t>(run_bytes - used));  // a padded range's padding: code 0
    }
}

template <int kH, int kW, int kB>
ACTLAB_INLINE void pack_range(const PlanePackArgs& a, int64_t first, int64_t last, const PackScratch& s) {
  const int64_t batch = planes_per_batch(*a.g);
  for (int64_t p0 = first; p0 < last; p0 += batch) {
    const int64_t nb = std::min(batch, last - p0);
    pack_batch<kH, kW, kB>(a, p0, nb, std::min(batch, last - p0 - nb), s);
  }
}

// True when a plane_pack/unpack may run the compile-time-sized copy for h×w planes with block b (whose
// register and direct routines code a plane as one range).
bool fixed_shape(const PlaneGeometry& g, int64_t h, int64_t w, int64_t b) {
  return g.height == h && g.width == w && g.block_h == std::min(b, h) && g.block_w == std::min(b, w) &&
         g.ranges_per_plane() == 1;
}

// Calls run.template operator()<H, W, B>() for the first compile-time shape that g has (CIFAR ResNet maps
// 32², 16², 8², 4² and ImageNet ones 56², 28², 14², 7², all with B = 8), else <0, 0, 0>.
template <typename Run>
ACTLAB_INLINE void dispatch_shape(const PlaneGeometry& g, Run&& run) {
  if (fixed_shape(g, 32, 32, 8)) return run.template operator()<32, 32, 8>();
  if (fixed_shape(g, 16, 16, 8)) return run.template operator()<16, 16, 8>();
  if (fixed_shape(g, 8, 8, 8)) return run.template operator()<8, 8, 8>();
  if (fixed_shape(g, 4, 4, 8)) return run.template operator()<4, 4, 8>();
  if (fixed_shape(g, 56, 56, 8)) return run.template operator()<56, 56, 8>();
  if (fixed_shape(g, 28, 28, 8)) return run.template operator()<28, 28, 8>();
  if (fixed_shape(g, 14, 14, 8)) return run.template operator()<14, 14, 8>();
  if (fixed_shape(g, 7, 7, 8)) return run.template operator()<7, 7, 8>();
  run.template operator()<0, 0, 0>();
}

struct PackRange {  // pack_range for the shape dispatch_shape picks
  const PlanePackArgs& a;
  int64_t first, last;
  const PackScratch& s;
  template <int kH, int kW, int kB> ACTLAB_INLINE void operator()() const { pack_range<kH, kW, kB>(a, first, last, s); }
};

ACTLAB_CODEC_CLONES
void pack_planes(const PlanePackArgs& a, int64_t first, int64_t last, uint8_t* scratch) {
  PackScratch s;
  carve_pack_scratch(s, scratch, *a.g);
  dispatch_shape(*a.g, PackRange{a, first, last, s});
}

// ---------------------------------------------------------------- plane unpack
struct PlaneUnpackArgs {
  float* out;
  const uint16_t* lfc;
  const uint8_t* codes;
  const uint16_t* mins;
  const uint16_t* steps;
  const PlaneGeometry* g;
  const UpsampleMap* map;
};
// Per-thread scratch: a batch of codes (u8) and one up-sampled LFC row (f32).
int64_t unpack_scratch_bytes(const PlaneGeometry& g) {
  return (planes_per_batch(g) * g.plane_elems() + 63) / 64 * 64 + g.width * 4;
}

// op = LFC↑ + dequantized codes of one plane (either term absent when its pointer is null), one pass;
// mins/steps: the plane's ranges' (g.ranges_per_plane(); one on the compile-time shapes).
template <int kH, int kW, int kB>
ACTLAB_INLINE void unpack_plane(float* __restrict op, const uint16_t* __restrict lfc, const uint8_t* __restrict codes,
                                const uint16_t* mins, const uint16_t* steps, float* __restrict up_row,
                                const UpsampleMap& map, const PlaneGeometry& g) {
  const Extents<kH, kW, kB> x(g);
  const int64_t rows = Extents<kH, kW, kB>::kFixed ? x.h : g.rows_per_range();
  for (int64_t h0 = 0, k = 0; h0 < x.h; h0 += rows, ++k) {
    const int64_t h1 = std::min(h0 + rows, x.h), n = (h1 - h0) * x.w;
    const float min = codes ? bf16_to_float(mins[k]) : 0.f, step = codes ? bf16_to_float(steps[k]) : 0.f;
    float* o = op + h0 * x.w;
    const uint8_t* c = codes ? codes + h0 * x.w : nullptr;
    if (lfc && x.lfc_elems() == 1) {  // one LFC value
      const float mean = bf16_to_float(lfc[0]);
      if (codes) {
        for (int64_t e = 0; e < n; ++e) o[e] = mean + dequantize(c[e], min, step);
      } else {
        for (int64_t e = 0; e < n; ++e) o[e] = mean;
      }
    } else if (lfc) {
      for (int64_t h = h0; h < h1; ++h, o += x.w) {
        const int64_t i = source_row(h, x, map);
        if (h == 0 || i != source_row(h - 1, x, map)) upsample_row(up_row, lfc, i, x, map);
        if (codes) {
          for (int64_t w = 0; w < x.w; ++w) o[w] = up_row[w] + dequantize(c[w], min, step);
          c += x.w;
        } else {
          std::memcpy(o, up_row, static_cast<size_t>(x.w) * 4);
        }
      }
    } else {
      for (int64_t e = 0; e < n; ++e) o[e] = dequantize(c[e], min, step);
    }
  }
}

template <int kH, int kW, int kB>
ACTLAB_INLINE void unpack_range(const PlaneUnpackArgs& a, int64_t first, int64_t last, uint8_t* scratch) {
  const PlaneGeometry& g = *a.g;
  const int64_t E = g.plane_elems(), LE = g.lfc_elems(), code_bytes = g.code_bytes_per_plane();
  const int64_t nr = g.ranges_per_plane(), RE = g.range_elems(), run_bytes = g.code_bytes_per_range();
  const int64_t batch = planes_per_batch(g);
  const bool contiguous_runs = g.contiguous_codes();
  uint8_t* cbuf = scratch;
  float* up_row = reinterpret_cast<float*>(scratch + (batch * E + 63) / 64 * 64);
  if constexpr (kRegisterLfc<kH, kW, kB>) {
    if (has_avx512bw && a.codes) {
      for (int64_t p = first; p < last; ++p)  // straight from the runs (the register pack's twin)
        unpack_plane_direct<kH, kW, kB>(a.out + p * E, a.lfc ? a.lfc + p * LE : nullptr, a.codes + p * code_bytes,
                                        bf16_to_float(a.mins[p]), bf16_to_float(a.steps[p]), g.bits);
      return;
    }
  }
  if constexpr (!Extents<kH, kW, kB>::kFixed) {
    if (has_avx512bw && a.codes && rows_fused(g)) {
      for (int64_t p = first; p < last; ++p)  // straight from the runs (row_plane_codes' twin)
        unpack_row_plane(a.out + p * E, a.lfc ? a.lfc + p * LE : nullptr, a.codes + p * code_bytes, a.mins + p * nr,
                         a.steps + p * nr, up_row, *a.map, g);
      return;
    }
  }
  for (int64_t p0 = first; p0 < last; p0 += batch) {
    const int64_t nb = std::min(batch, last - p0);
    if (a.codes && contiguous_runs) unpack_run(cbuf, a.codes + p0 * code_bytes, nb * E, g.bits);
    for (int64_t q = 0; q < nb; ++q) {
      const int64_t p = p0 + q;
      if (a.codes && !contiguous_runs)
        for (int64_t k = 0; k < nr; ++k)
          unpack_run(cbuf + q * E + k * RE, a.codes + (p * nr + k) * run_bytes, std::min(RE, E - k * RE), g.bits);
      unpack_plane<kH, kW, kB>(a.out + p * E, a.lfc ? a.lfc + p * LE : nullptr, a.codes ? cbuf + q * E : nullptr,
                               a.codes ? a.mins + p * nr : nullptr, a.codes ? a.steps + p * nr : nullptr, up_row,
                               *a.map, g);
    }
  }
}

struct UnpackRange {  // unpack_range for the shape dispatch_shape picks
  const PlaneUnpackArgs& a;
  int64_t first, last;
  uint8_t* scratch;
  template <int kH, int kW, int kB> ACTLAB_INLINE void operator()() const {
    unpack_range<kH, kW, kB>(a, first, last, scratch);
  }
};

ACTLAB_CODEC_CLONES
void unpack_planes(const PlaneUnpackArgs& a, int64_t first, int64_t last, uint8_t* scratch) {
  dispatch_shape(*a.g, UnpackRange{a, first, last, scratch});
}

// Planes first, first + stride, ... (count of them) into out one after another.
template <int kH, int kW, int kB>
ACTLAB_INLINE void unpack_strided(const PlaneUnpackArgs& a, int64_t first, int64_t count, int64_t stride,
                                  uint8_t* scratch) {
  const PlaneGeometry& g = *a.g;
  const int64_t E = g.plane_elems(), LE = g.lfc_elems(), code_bytes = g.code_bytes_per_plane();
  uint8_t* cbuf = scratch;
  float* up_row = reinterpret_cast<float*>(scratch + (E + 63) / 64 * 64);
  for (int64_t k = 0; k < count; ++k) {
    const int64_t p = first + k * stride;
    if constexpr (kRegisterLfc<kH, kW, kB>) {
      if (has_avx512bw && a.codes) {
        unpack_plane_direct<kH, kW, kB>(a.out + k * E, a.lfc ? a.lfc + p * LE : nullptr, a.codes + p * code_bytes,
                                        bf16_to_float(a.mins[p]), bf16_to_float(a.steps[p]), g.bits);
        continue;
      }
    }
    if constexpr (kDirectUnpackAvx2<kH, kW, kB>) {
      if (has_avx2 && a.codes) {
        unpack_plane_direct_avx2<kH, kW, kB>(a.out + k * E, a.lfc ? a.lfc + p * LE : nullptr, a.codes + p * code_bytes,
                                             bf16_to_float(a.mins[p]), bf16_to_float(a.steps[p]), g.bits);
        continue;
      }
    }
    if (a.codes) unpack_run(cbuf, a.codes + p * code_bytes, E, g.bits);  // one range per plane (the entry checks)
    unpack_plane<kH, kW, kB>(a.out + k * E, a.lfc ? a.lfc + p * LE : nullptr, a.codes ? cbuf : nullptr,
                             a.codes ? a.mins + p : nullptr, a.codes ? a.steps + p : nullptr, up_row, *a.map, g);
  }
}

struct UnpackStrided {  // unpack_strided for the shape dispatch_shape picks
  const PlaneUnpackArgs& a;
  int64_t first, count, stride;
  uint8_t* scratch;
  template <int kH, int kW, int kB> ACTLAB_INLINE void operator()() const {
    unpack_strided<kH, kW, kB>(a, first, count, stride, scratch);
  }
};

ACTLAB_CODEC_CLONES
void unpack_planes_strided(const PlaneUnpackArgs& a, int64_t first, int64_t count, int64_t stride,
                           uint8_t* scratch) {
  dispatch_shape(*a.g, UnpackStrided{a, first, count, stride, scratch});
}

// ---------------------------------------------------------------- channel-blocked unpack
// Sixteen consecutive planes (channels c0..c0+15 of one sample) are written as one channel block:
// out[e·16 + j] = value e of plane j. The codes are bit-unpacked per plane (one code per byte, plane j at
// codes[j·stride]), then each 16×16 tile of code bytes is transposed in registers and dequantized sixteen
// channels at a time, straight into the output. Dequantizing planes first and transposing their f32 values
// moved four times the bytes through an L2-sized scratch (bench/RESULTS_compress.md).
// Per-thread scratch of unpack_blocks16: the block's codes (16 runs of E rounded up to 16 bytes), its LFC
// as f32, channel-minor (lfc_t[i·16 + j] = LFC value i of plane j), and lfc_index[e] = the LFC value
// element e up-samples (row[e / W]·lfc_w + col[e % W]).
int64_t code_stride16(const PlaneGeometry& g) { return (g.plane_elems() + 15) / 16 * 16; }
// narrow: room for one decoded block (E·16 f32) as well, which unpack_blocks16 rounds into its bf16 output.
int64_t block_scratch_bytes(const PlaneGeometry& g, bool narrow = false) {
  return (kChannelBlock * code_stride16(g) + 63) / 64 * 64 + g.lfc_elems() * kChannelBlock * 4 + g.plane_elems() * 4 +
         (narrow ? g.plane_elems() * kChannelBlock * 4 : 0);
}

// out[e·16 + j] for element e and channel j of a block, as unpack_plane computes it: the LFC term alone
// (lfc only), the dequantized code alone (codes only), or LFC + dequantized code, in that order.
ACTLAB_INLINE float block_value(const uint8_t* codes, int64_t stride, const float* lfc_t, const int32_t* lfc_index,
                                const float* min, const float* step, int64_t e, int j) {
  if (!codes) return lfc_t[lfc_index[e] * 16 + j];
  const float d = dequantize(codes[j * stride + e], min[j], step[j]);
  return lfc_t ? lfc_t[lfc_index[e] * 16 + j] + d : d;
}

#ifdef ACTLAB_X86_INTRINSICS
// col[k] byte j = row[j] byte k: four rounds of interleaves (bytes, then 16-, 32- and 64-bit pairs). SSE2
// only, so both the AVX-512 and the AVX2 block routines inline it.
ACTLAB_INLINE void transpose_bytes16(__m128i col[16], const __m128i row[16]) {
  __m128i a[16], b[16], c[16];
  for (int i = 0; i < 8; ++i) {  // a[2i], a[2i+1]: columns 0-7 and 8-15 of rows 2i, 2i+1, in 16-bit pairs
    a[2 * i] = _mm_unpacklo_epi8(row[2 * i], row[2 * i + 1]);
    a[2 * i + 1] = _mm_unpackhi_epi8(row[2 * i], row[2 * i + 1]);
  }
  for (int q = 0; q < 4; ++q) {  // b[4q + m]: columns 4m..4m+3 of rows 4q..4q+3, in 32-bit quads
    b[4 * q] = _mm_unpacklo_epi16(a[4 * q], a[4 * q + 2]);
    b[4 * q + 1] = _mm_unpackhi_epi16(a[4 * q], a[4 * q + 2]);
    b[4 * q + 2] = _mm_unpacklo_epi16(a[4 * q + 1], a[4 * q + 3]);
    b[4 * q + 3] = _mm_unpackhi_epi16(a[4 * q + 1], a[4 * q + 3]);
  }
  for (int o = 0; o < 2; ++o)  // c[8o + t]: columns 2t, 2t+1 of rows 8o..8o+7, in 64-bit octets
    for (int m = 0; m < 4; ++m) {
      c[8 * o + 2 * m] = _mm_unpacklo_epi32(b[8 * o + m], b[8 * o + 4 + m]);
      c[8 * o + 2 * m + 1] = _mm_unpackhi_epi32(b[8 * o + m], b[8 * o + 4 + m]);
    }
  for (int t = 0; t < 8; ++t) {
    col[2 * t] = _mm_unpacklo_epi64(c[t], c[8 + t]);
    col[2 * t + 1] = _mm_unpackhi_epi64(c[t], c[8 + t]);
  }
}
// One channel block, whole tiles of 16 elements in AVX-512 (the tail by block_value). min + code·step as
// one FMA is the same value as dequantize's multiply and add (the product is exact, codec.h), and the LFC
// term is added after it, as in unpack_plane, so the values are bit-identical.
ACTLAB_AVX512 void block_dequantize_avx512(float* out, const uint8_t* codes, int64_t stride, const float* lfc_t,
                                           const int32_t* lfc_index, const float* min, const float* step,
                                           int64_t E) {
  const __m512 vmin = _mm512_loadu_ps(min), vstep = _mm512_loadu_ps(step);
  int64_t e0 = 0;
  for (; codes && e0 + 16 <= E; e0 += 16) {
    __m128i row[16], col[16];
    for (int j = 0; j < 16; ++j) row[j] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + j * stride + e0));
    transpose_bytes16(col, row);
    for (int k = 0; k < 16; ++k) {
      const __m512 code = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(col[k]));
      __m512 v = _mm512_fmadd_ps(code, vstep, vmin);
      if (lfc_t) v = _mm512_add_ps(_mm512_loadu_ps(lfc_t + lfc_index[e0 + k] * 16), v);
      _mm512_storeu_ps(out + (e0 + k) * 16, v);
    }
  }
  for (; !codes && e0 < E; ++e0) _mm512_storeu_ps(out + e0 * 16, _mm512_loadu_ps(lfc_t + lfc_index[e0] * 16));
  for (int64_t e = e0; e < E; ++e)
    for (int j = 0; j < 16; ++j) out[e * 16 + j] = block_value(codes, stride, lfc_t, lfc_index, min, step, e, j);
}
// block_dequantize_avx512 on AVX2 CPUs: each transposed row of 16 codes is two 8-lane halves.
ACTLAB_AVX2 void block_dequantize_avx2(float* out, const uint8_t* codes, int64_t stride, const float* lfc_t,
                                       const int32_t* lfc_index, const float* min, const float* step, int64_t E) {
  const __m256 min_lo = _mm256_loadu_ps(min), min_hi = _mm256_loadu_ps(min + 8);
  const __m256 step_lo = _mm256_loadu_ps(step), step_hi = _mm256_loadu_ps(step + 8);
  int64_t e0 = 0;
  for (; codes && e0 + 16 <= E; e0 += 16) {
    __m128i row[16], col[16];
    for (int j = 0; j < 16; ++j) row[j] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + j * stride + e0));
    transpose_bytes16(col, row);
    for (int k = 0; k < 16; ++k) {
      __m256 lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(col[k])), step_lo, min_lo);
      __m256 hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(col[k], 8))), step_hi, min_hi);
      if (lfc_t) {
        const float* l = lfc_t + lfc_index[e0 + k] * 16;
        lo = _mm256_add_ps(_mm256_loadu_ps(l), lo), hi = _mm256_add_ps(_mm256_loadu_ps(l + 8), hi);
      }
      _mm256_storeu_ps(out + (e0 + k) * 16, lo);
      _mm256_storeu_ps(out + (e0 + k) * 16 + 8, hi);
    }
  }
  for (int64_t e = e0; e < E; ++e)
    for (int j = 0; j < 16; ++j) out[e * 16 + j] = block_value(codes, stride, lfc_t, lfc_index, min, step, e, j);
}
#else
void block_dequantize_avx512(float*, const uint8_t*, int64_t, const float*, const int32_t*, const float*,
                             const float*, int64_t) {}
void block_dequantize_avx2(float*, const uint8_t*, int64_t, const float*, const int32_t*, const float*,
                           const float*, int64_t) {}
#endif

// Channel blocks [first, last) (block k = planes 16k..16k+15). With out16, each block is decoded into the
// scratch instead and written to out16 rounded to bf16, channels-last: value (n, c, e) at
// out16[(n·E + e)·channels + c] (a block's sixteen channels are one 32-byte run per element).
ACTLAB_CODEC_CLONES
void unpack_blocks16(const PlaneUnpackArgs& a, int64_t first, int64_t last, uint8_t* scratch, uint16_t* out16 = nullptr,
                     int64_t channels = 0) {
  const PlaneGeometry& g = *a.g;
  const int64_t E = g.plane_elems(), LE = g.lfc_elems(), code_bytes = g.code_bytes_per_plane();
  const int64_t stride = code_stride16(g);
  uint8_t* cbuf = scratch;
  float* lfc_t = reinterpret_cast<float*>(scratch + (kChannelBlock * stride + 63) / 64 * 64);
  int32_t* lfc_index = reinterpret_cast<int32_t*>(lfc_t + LE * kChannelBlock);
  if (a.lfc)
    for (int64_t e = 0; e < E; ++e)
      lfc_index[e] = static_cast<int32_t>(a.map->row[e / g.width] * g.lfc_w + a.map->col[e % g.width]);
  for (int64_t k = first; k < last; ++k) {
    const int64_t p0 = k * kChannelBlock;
    float min[kChannelBlock] = {}, step[kChannelBlock] = {};
    if (a.codes) {
      if (stride == E) {  // E % 16 == 0, so the sixteen runs are contiguous (whole bytes): one pass
        unpack_run(cbuf, a.codes + p0 * code_bytes, kChannelBlock * E, g.bits);
      } else {
        for (int j = 0; j < kChannelBlock; ++j) unpack_run(cbuf + j * stride, a.codes + (p0 + j) * code_bytes, E, g.bits);
      }
      for (int j = 0; j < kChannelBlock; ++j)
        min[j] = bf16_to_float(a.mins[p0 + j]), step[j] = bf16_to_float(a.steps[p0 + j]);
    }
    if (a.lfc)
      for (int64_t i = 0; i < LE; ++i)
        for (int j = 0; j < kChannelBlock; ++j) lfc_t[i * 16 + j] = bf16_to_float(a.lfc[(p0 + j) * LE + i]);
    const uint8_t* codes = a.codes ? cbuf : nullptr;
    const float* lfc = a.lfc ? lfc_t : nullptr;
    float* block = reinterpret_cast<float*>(lfc_index + E);
    float* out = out16 ? block : a.out + p0 * E;
    if (has_avx512f) {
      block_dequantize_avx512(out, codes, stride, lfc, lfc_index, min, step, E);
    } else if (has_avx2) {
      block_dequantize_avx2(out, codes, stride, lfc, lfc_index, min, step, E);
    } else {
      for (int64_t e = 0; e < E; ++e)
        for (int j = 0; j < kChannelBlock; ++j) out[e * 16 + j] = block_value(codes, stride, lfc, lfc_index, min, step, e, j);
    }
    if (out16) {
      uint16_t* dst = out16 + p0 / channels * E * channels + p0 % channels;
      for (int64_t e = 0; e < E; ++e)
        for (int j = 0; j < kChannelBlock; ++j) dst[e * channels + j] = float_to_bf16(block[e * 16 + j]);
    }
  }
}

// Splits [0, n) evenly over the team (one contiguous range per thread) and calls
// f(first, last, scratch of this thread).
template <typename F>
void for_each_thread_range(int64_t n, int64_t work, int64_t scratch_bytes, F f) {
  const int threads = work >= kParallelElems ? std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>(n))) : 1;
  Buffer scratch(static_cast<size_t>(scratch_bytes * threads), MemTag::Workspace);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
    f(n * t / team, n * (t + 1) / team, scratch.as<uint8_t>() + scratch_bytes * t);
  }
}

// ---------------------------------------------------------------- channels-last pack, sixteen planes per vector
// A channels-last activation (plane_pack_channels_last: a bf16 run's) holds sixteen planes' values at one position
// in one vector: channels c0..c0+15 of image n. Those sixteen planes pack with the planes in the lanes, in three
// passes over their values: the pool (each lane sums its own plane's blocks in codec.h's order), the order keys of
// the residual's min and max, then the codes. The uniforms need no transpose either: a plane's draws at positions
// e0..e0+15 are one Philox block, (p·E + e0)/16 when E % 16 == 0, so the sixteen planes' blocks are one register per
// word (philox_rounds_avx512), and draw e0 + i of every plane is byte i % 4 of word i / 4: a shift. When (p·E) mod 16
// != 0 a lane's sixteen draws start that many bytes into one block and end in the next, and are funnelled out of
// the two (LaneDrawSource); a plane's last chunk may hold fewer than sixteen positions. Each lane's
// codes are shifted into its run's words in registers, then scattered to the sixteen runs. Per value the IEEE
// operations of plane_pack, so the same bytes (tests/test_codec.cpp); the transpose into a planar tile it replaces
// (plane_pack_channels_last's other path) cost about as much as the pack behind it (bench/RESULTS.md §7,
// forty-fourth session).
// The scratch of one thread: the LFC of sixteen planes widened (lfc_up: LFC value k of lane q at lfc_up[16k + q]),
// one LFC row's column sums (colsum, width·16 floats) and each position's offset into lfc_up (up_at, E int32: the
// nearest rule's LFC value × 16), the last computed once per call.
struct Group16Scratch {
  float* lfc_up;
  float* colsum;
  int32_t* up_at;
};
int64_t group16_scratch(Group16Scratch* s, uint8_t* at, const PlaneGeometry& g) {
  const int64_t lfc_up = g.lfc_elems() * 64, colsum = g.width * 64, up_at = (g.plane_elems() * 4 + 63) / 64 * 64;
  if (s) {
    s->lfc_up = reinterpret_cast<float*>(at);
    s->colsum = reinterpret_cast<float*>(at + lfc_up);
    s->up_at = reinterpret_cast<int32_t*>(at + lfc_up + colsum);
  }
  return lfc_up + colsum + up_at;
}
// The code widths the lane kernels' switches take, checked before their threads start (a throw inside an OpenMP
// region would end the process).
void check_lane_bits(const char* op, const PlaneGeometry& g, bool with_codes) {
  ACTLAB_CHECK(!with_codes || g.bits == 1 || g.bits == 2 || g.bits == 4 || g.bits == 8, op, ": ", g.bits,
               "-bit codes (1, 2, 4 or 8)");
}
void fill_up_at(int32_t* up_at, const UpsampleMap& map, const PlaneGeometry& g) {
  for (int64_t h = 0; h < g.height; ++h)
    for (int64_t w = 0; w < g.width; ++w)
      up_at[h * g.width + w] = static_cast<int32_t>((map.row[h] * g.lfc_w + map.col[w]) * 16);
}
#ifdef ACTLAB_X86_INTRINSICS
bool lanes16(const PlaneGeometry& g, int64_t channels) {
  return has_avx512bw && channels > 0 && channels % 16 == 0 && g.planes % channels == 0 && g.ranges_per_plane() == 1;
}
// The residual of sixteen planes at one position (their values xv, their LFC↑ at lfc_up): x − LFC↑, or x
// without an LFC. (Lambdas would not inherit the callers' target attributes.)
ACTLAB_AVX512BW ACTLAB_INLINE __m512 residual16(const float* xv, const float* lfc_up, bool with_lfc) {
  return with_lfc ? _mm512_sub_ps(_mm512_loadu_ps(xv), _mm512_load_ps(lfc_up)) : _mm512_loadu_ps(xv);
}
// The order keys of the min and max of positions [e0, e1) of sixteen planes' residuals, folded into lo and hi.
ACTLAB_AVX512BW ACTLAB_INLINE void keys16(__m512i& lo, __m512i& hi, const float* x, int64_t C, const Group16Scratch& s,
                                          bool with_lfc, int64_t e0, int64_t e1) {
  for (int64_t e = e0; e < e1; ++e) {
    const __m512i key = order_keys(residual16(x + e * C, s.lfc_up + s.up_at[e], with_lfc));
    lo = _mm512_min_epi32(lo, key), hi = _mm512_max_epi32(hi, key);
  }
}
// The Philox draws of sixteen planes, one per lane (pack_group16): blocks(w, first) computes the four words of
// block first + lane_block of every lane, funnel(words, current, next) the sixteen draws of each lane that start
// byte_of bytes into its current block and run into its next one.
struct LaneDrawSource {
  __m512i lane_block, s0, s1, right, left;
  __mmask16 at1, at2, at3;  // lanes whose draws start in word 1, 2, 3 of their block
  uint32_t k0, k1;
  ACTLAB_AVX512BW LaneDrawSource(__m512i lane_blocks, __m512i byte_of, uint64_t seed, uint64_t stream)
      : lane_block(lane_blocks), s0(_mm512_set1_epi32(static_cast<int>(stream))),
        s1(_mm512_set1_epi32(static_cast<int>(stream >> 32))),
        right(_mm512_slli_epi32(_mm512_and_si512(byte_of, _mm512_set1_epi32(3)), 3)),
        left(_mm512_sub_epi32(_mm512_set1_epi32(32), right)),
        at1(_mm512_cmpeq_epi32_mask(_mm512_srli_epi32(byte_of, 2), _mm512_set1_epi32(1))),
        at2(_mm512_cmpeq_epi32_mask(_mm512_srli_epi32(byte_of, 2), _mm512_set1_epi32(2))),
        at3(_mm512_cmpeq_epi32_mask(_mm512_srli_epi32(byte_of, 2), _mm512_set1_epi32(3))),
        k0(static_cast<uint32_t>(seed)), k1(static_cast<uint32_t>(seed >> 32)) {}
  ACTLAB_AVX512BW ACTLAB_INLINE void blocks(__m512i (&w)[4], uint64_t first) const {
    const __m512i first_lo = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(first)));
    const __m512i first_hi = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(first >> 32)));
    w[0] = _mm512_add_epi32(first_lo, lane_block);
    w[1] = _mm512_mask_add_epi32(first_hi, _mm512_cmplt_epu32_mask(w[0], first_lo), first_hi, _mm512_set1_epi32(1));
    w[2] = s0, w[3] = s1;
    philox_rounds_avx512(w[0], w[1], w[2], w[3], k0, k1);
  }
  ACTLAB_AVX512BW ACTLAB_INLINE void funnel(__m512i (&words)[4], const __m512i (&current)[4],
                                            const __m512i (&next)[4]) const {
    const __m512i all[8] = {current[0], current[1], current[2], current[3], next[0], next[1], next[2], next[3]};
    __m512i from[5];  // lane q: word k + (its start byte) / 4 of the two blocks
    for (int k = 0; k < 5; ++k) {
      from[k] = _mm512_mask_mov_epi32(all[k], at1, all[k + 1]);
      from[k] = _mm512_mask_mov_epi32(from[k], at2, all[k + 2]);
      from[k] = _mm512_mask_mov_epi32(from[k], at3, all[k + 3]);
    }
    for (int k = 0; k < 4; ++k)  // a shift by 32 gives 0: lanes that start on a word take it whole
      words[k] = _mm512_or_si512(_mm512_srlv_epi32(from[k], right), _mm512_sllv_epi32(from[k + 1], left));
  }
};
// Each lane's run words (kWords vectors, lane q's bytes in little-endian order) → its first `bytes` bytes at
// dst + q·run_bytes, no further (the next plane's run follows).
template <int kWords>
ACTLAB_AVX512BW void store_lane_runs(uint8_t* dst, int64_t run_bytes, const __m512i (&run)[kWords], int64_t bytes) {
  alignas(64) uint32_t lanes[kWords][16];
  for (int k = 0; k < kWords; ++k) _mm512_storeu_si512(lanes[k], run[k]);
  for (int q = 0; q < 16; ++q) {
    uint32_t words[kWords];
    for (int k = 0; k < kWords; ++k) words[k] = lanes[k][q];
    std::memcpy(dst + q * run_bytes, words, static_cast<size_t>(bytes));
  }
}
// The inverse: lane q's first `bytes` bytes at src + q·run_bytes → its run words (the rest zero).
template <int kWords>
ACTLAB_AVX512BW void load_lane_runs(__m512i (&run)[kWords], const uint8_t* src, int64_t run_bytes, int64_t bytes) {
  alignas(64) uint32_t lanes[kWords][16];
  for (int q = 0; q < 16; ++q) {
    uint32_t words[kWords] = {};
    std::memcpy(words, src + q * run_bytes, static_cast<size_t>(bytes));
    for (int k = 0; k < kWords; ++k) lanes[k][q] = words[k];
  }
  for (int k = 0; k < kWords; ++k) run[k] = _mm512_loadu_si512(lanes[k]);
}
// Planes p0..p0+15 = channels c0..c0+15 of image n (p0 = n·channels + c0). The pool runs a row of LFC blocks at a
// time, its column sums row by row (the positions in memory order), and the residual's keys follow on the rows just
// pooled, while they are in L1. The pool's first read of each activation, which a bf16 step has written past L2 by
// then, is a line a position C floats apart, a stride the hardware prefetcher does not follow across pages: it took
// about 30 % of the pack's time. Asking for it one LFC row ahead did not help; asking for the next group's positions
// (ahead: its value at position 0, nullptr for none) during this group's code pass, sixteen lines a chunk into L2,
// packed 32² planes 1.2× and 16² ones 1.1× faster on a Zen 5 EPYC (bench/RESULTS_compress.md, "The lane kernels ask
// for the next group").
template <int kBits>
ACTLAB_AVX512BW void pack_group16(const PlanePackArgs& a, int64_t channels, int64_t n, int64_t c0,
                                  const Group16Scratch& s, const float* ahead) {
  const PlaneGeometry& g = *a.g;
  const int64_t H = g.height, W = g.width, E = g.plane_elems(), C = channels, LE = g.lfc_elems(), lw = g.lfc_w;
  const int64_t p0 = n * C + c0;
  const float* x = a.x + n * E * C + c0;  // the sixteen values at position e: x + e·C
  __m512i lo = _mm512_set1_epi32(INT32_MAX), hi = _mm512_set1_epi32(INT32_MIN);
  int64_t keyed = 0;  // rows whose keys are folded in
  if (a.with_lfc) {
    const __m512 area = _mm512_set1_ps(static_cast<float>(g.block_h * g.block_w));
    const int64_t used_w = lw * g.block_w;
    for (int64_t i = 0; i < g.lfc_h; ++i) {
      const float* top = x + i * g.block_h * W * C;
      for (int64_t w = 0; w < used_w; ++w) _mm512_store_ps(s.colsum + 16 * w, _mm512_loadu_ps(top + w * C));
      for (int64_t r = 1; r < g.block_h; ++r)
        for (int64_t w = 0; w < used_w; ++w)
          _mm512_store_ps(s.colsum + 16 * w, _mm512_add_ps(_mm512_load_ps(s.colsum + 16 * w),
                                                           _mm512_loadu_ps(top + (r * W + w) * C)));
      for (int64_t j = 0; j < lw; ++j) {
        __m512 sum = _mm512_load_ps(s.colsum + 16 * j * g.block_w);
        for (int64_t b = 1; b < g.block_w; ++b) sum = _mm512_add_ps(sum, _mm512_load_ps(s.colsum + 16 * (j * g.block_w + b)));
        const __m256i lfc = narrow_bf16(_mm512_div_ps(sum, area));
        _mm512_store_ps(s.lfc_up + (i * lw + j) * 16,
                        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(lfc), 16)));
        if (a.lfc) {
          alignas(32) uint16_t lanes[16];
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), lfc);
          for (int q = 0; q < 16; ++q) a.lfc[(p0 + q) * LE + i * lw + j] = lanes[q];
        }
      }
      // Rows up to this LFC row's last take their LFC from rows pooled by now (the nearest rule's source row of
      // row h is at most h / block_h).
      if constexpr (kBits > 0) {
        const int64_t rows = (i + 1) * g.block_h;
        keys16(lo, hi, x, C, s, true, keyed * W, rows * W);
        keyed = rows;
      }
    }
  }
  if constexpr (kBits == 0) {
    return;
  } else {
    keys16(lo, hi, x, C, s, a.with_lfc, keyed * W, H * W);
    const QuantParams16 params = quant_params16(lo, hi, kBits);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.mins + p0), _mm512_cvtepi32_epi16(params.min_bits));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.steps + p0), _mm512_cvtepi32_epi16(params.step_bits));
    const QuantizerAvx512 quantizer(params.min, params.scale, quant_levels(kBits));
    const int64_t run_bytes = g.code_bytes_per_plane();
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i run_offsets = _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(run_bytes)));
    // Lane q's draw at e is byte ((p0 + q)·E + e) mod 16 of Philox block ((p0 + q)·E + e) / 16: the lanes' first
    // blocks as offsets from plane p0's (< 2^32), and the byte a lane's draws start at in its block, the same in
    // every chunk of sixteen positions (0 for all lanes when E % 16 == 0).
    alignas(64) uint32_t block_of[16];
    alignas(64) int32_t byte_of[16];
    const uint64_t base = static_cast<uint64_t>(p0 * E) >> 4;
    for (int q = 0; q < 16; ++q) {
      const uint64_t d = static_cast<uint64_t>((p0 + q) * E);
      block_of[q] = static_cast<uint32_t>((d >> 4) - base), byte_of[q] = static_cast<int32_t>(d & 15);
    }
    const LaneDrawSource draws(_mm512_loadu_si512(block_of), _mm512_loadu_si512(byte_of), a.seed, a.stream);
    const bool whole_blocks = E % 16 == 0;
    __m512i current[4];
    if (!whole_blocks) draws.blocks(current, base);
    uint8_t* runs = a.codes + p0 * run_bytes;
    constexpr int kWords = (16 * kBits + 31) / 32;
    for (int64_t e0 = 0; e0 < E; e0 += 16) {
      __m512i words[4];  // the sixteen draws of every lane, four to a word
      if (whole_blocks) {
        draws.blocks(words, base + static_cast<uint64_t>(e0 / 16));
      } else {
        __m512i next[4];
        draws.blocks(next, base + static_cast<uint64_t>(e0 / 16) + 1);
        draws.funnel(words, current, next);
        for (int k = 0; k < 4; ++k) current[k] = next[k];
      }
      __m512i run[kWords];
      for (int k = 0; k < kWords; ++k) run[k] = _mm512_setzero_si512();
      uint8_t* dst = runs + e0 * kBits / 8;
      const int64_t n = std::min<int64_t>(16, E - e0);
      if (n < 16) {  // a plane's last, partial chunk: only its positions, and each lane's bytes alone
        for (int64_t i = 0; i < n; ++i) {
          const __m512i u = _mm512_and_si512(_mm512_srlv_epi32(words[i / 4], _mm512_set1_epi32(static_cast<int>(8 * (i % 4)))),
                                             _mm512_set1_epi32(0xFF));
          const __m512 r = residual16(x + (e0 + i) * C, s.lfc_up + s.up_at[e0 + i], a.with_lfc);
          run[i * kBits / 32] = _mm512_or_si512(
              run[i * kBits / 32],
              _mm512_sllv_epi32(quantizer.codes(r, u), _mm512_set1_epi32(static_cast<int>(i * kBits % 32))));
        }
        store_lane_runs<kWords>(dst, run_bytes, run, (n * kBits + 7) / 8);
        continue;
      }
      if (ahead != nullptr)
        for (int i = 0; i < 16; ++i) _mm_prefetch(reinterpret_cast<const char*>(ahead + (e0 + i) * C), _MM_HINT_T1);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const __m512i u = _mm512_and_si512(_mm512_srli_epi32(words[i / 4], 8 * (i % 4)), _mm512_set1_epi32(0xFF));
        const int64_t e = e0 + i;
        const __m512i code = quantizer.codes(residual16(x + e * C, s.lfc_up + s.up_at[e], a.with_lfc), u);
        run[i * kBits / 32] = _mm512_or_si512(run[i * kBits / 32], _mm512_slli_epi32(code, i * kBits % 32));
      }
      if constexpr (kBits == 1) {  // two bytes a plane: no dword scatter
        store_lane_runs<kWords>(dst, run_bytes, run, 2);
      } else {
        for (int k = 0; k < kWords; ++k) _mm512_i32scatter_epi32(dst + 4 * k, run_offsets, run[k], 1);
      }
    }
  }
}
// pack_group16 for g.bits (0: no codes).
void pack_group16_bits(const PlanePackArgs& a, int64_t channels, int64_t n, int64_t c0, const Group16Scratch& s,
                       const float* ahead) {
  switch (a.codes ? a.g->bits : 0) {
    case 0: return pack_group16<0>(a, channels, n, c0, s, ahead);
    case 1: return pack_group16<1>(a, channels, n, c0, s, ahead);
    case 2: return pack_group16<2>(a, channels, n, c0, s, ahead);
    case 4: return pack_group16<4>(a, channels, n, c0, s, ahead);
    case 8: return pack_group16<8>(a, channels, n, c0, s, ahead);
    default: return;  // plane_pack_channels_last refused other widths before the threads started
  }
}
// One position of unpack_group16: the sixteen lanes' values, LFC↑ (up; nullptr: none) + (min + code·step) (no
// codes: LFC↑ alone), stored at out + at (f32) or out16 + at (rounded to bf16).
template <int kBits, bool kBf16>
ACTLAB_AVX512BW ACTLAB_INLINE void put_lanes16(float* out, uint16_t* out16, int64_t at, __m512i code, __m512 min,
                                               __m512 step, const float* up) {
  __m512 v;
  if constexpr (kBits > 0) {
    v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(code), step, min);  // exact product: dequantize's bits
    if (up) v = _mm512_add_ps(_mm512_load_ps(up), v);
  } else {
    (void)code, (void)min, (void)step;
    v = _mm512_load_ps(up);
  }
  if constexpr (kBf16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out16 + at), narrow_bf16(v));
  } else {
    _mm512_storeu_ps(out + at, v);
  }
}
// The decode of pack_group16's planes, channels-last: out + (n·E + e)·channels + c0 gets the sixteen values at
// position e, f32 (kBf16 false) or rounded to bf16 (float_to_bf16; out16). Each lane reads its own plane's run,
// sixteen positions' codes per gathered word; per value the operations of plane_unpack (LFC↑ + (min + code·step)),
// so the same values. lfc_up and up_at as in pack_group16; ahead: the next group's output at position 0 (nullptr
// for none), asked for into L2 during this group's chunks as pack_group16 asks for its input, with the next group's
// codes (the channels-last f32 decode of 32² planes ran 1.3× faster for the output, 1.15× more for the codes:
// bench/RESULTS_compress.md, "The lane kernels ask for the next group").
template <int kBits, bool kBf16>
ACTLAB_AVX512BW void unpack_group16(float* out, uint16_t* out16, const PlaneUnpackArgs& a, int64_t channels, int64_t n,
                                    int64_t c0, const Group16Scratch& s, const char* ahead) {
  const PlaneGeometry& g = *a.g;
  const int64_t E = g.plane_elems(), C = channels, LE = g.lfc_elems();
  const int64_t p0 = n * C + c0, at = n * E * C + c0;  // position e of the sixteen planes: at + e·C
  if (a.lfc) {
    for (int64_t k = 0; k < LE; ++k) {
      alignas(64) uint32_t lanes[16];
      for (int q = 0; q < 16; ++q) lanes[q] = static_cast<uint32_t>(a.lfc[(p0 + q) * LE + k]) << 16;
      _mm512_store_si512(s.lfc_up + 16 * k, _mm512_loadu_si512(lanes));
    }
  }
  __m512 min = _mm512_setzero_ps(), step = _mm512_setzero_ps();
  if constexpr (kBits > 0) {
    min = bf16x16(a.mins + p0), step = bf16x16(a.steps + p0);
  }
  const int64_t run_bytes = kBits > 0 ? g.code_bytes_per_plane() : 0;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i run_offsets = _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(run_bytes)));
  const __m512i mask = _mm512_set1_epi32(quant_levels(kBits > 0 ? kBits : 1));
  const uint8_t* runs = kBits > 0 ? a.codes + p0 * run_bytes : nullptr;
  constexpr int kWords = kBits > 0 ? (16 * kBits + 31) / 32 : 1;
  const bool with_lfc = a.lfc != nullptr;
  for (int64_t e0 = 0; e0 < E; e0 += 16) {
    __m512i run[kWords];
    const int64_t n = std::min<int64_t>(16, E - e0);
    if constexpr (kBits > 0) {
      if (n < 16 || kBits == 1)  // a partial chunk, or two bytes a lane: a dword gather would read past the runs
        load_lane_runs<kWords>(run, runs + e0 * kBits / 8, run_bytes, (n * kBits + 7) / 8);
      else
        for (int k = 0; k < kWords; ++k) run[k] = _mm512_i32gather_epi32(run_offsets, runs + e0 * kBits / 8 + 4 * k, 1);
    }
    if (n < 16) {
      for (int64_t i = 0; i < n; ++i) {
        __m512i code = _mm512_setzero_si512();
        if constexpr (kBits > 0)
          code = _mm512_and_si512(_mm512_srlv_epi32(run[i * kBits / 32], _mm512_set1_epi32(static_cast<int>(i * kBits % 32))),
                                  mask);
        put_lanes16<kBits, kBf16>(out, out16, at + (e0 + i) * C, code, min, step,
                                  with_lfc ? s.lfc_up + s.up_at[e0 + i] : nullptr);
      }
      continue;
    }
    if (ahead != nullptr) {  // the next group's lines, so that its stores find them in L2 (pack_group16's reason)
      for (int i = 0; i < 16; ++i) _mm_prefetch(ahead + (e0 + i) * C * (kBf16 ? 2 : 4), _MM_HINT_T1);
      // And its codes: the next sixteen planes' runs follow these (16·run_bytes ≥ 2·E·kBits bytes, equal when a
      // plane's codes are whole bytes: kBits/2 lines a chunk), read for the first time since the pack, where the
      // gathers waited on them.
      if constexpr (kBits > 0)
        for (int k = 0; k < (kBits + 1) / 2; ++k)
          _mm_prefetch(reinterpret_cast<const char*>(runs + 16 * run_bytes + e0 * 2 * kBits + 64 * k), _MM_HINT_T1);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      __m512i code = _mm512_setzero_si512();
      if constexpr (kBits > 0) code = _mm512_and_si512(_mm512_srli_epi32(run[i * kBits / 32], i * kBits % 32), mask);
      put_lanes16<kBits, kBf16>(out, out16, at + (e0 + i) * C, code, min, step,
                                with_lfc ? s.lfc_up + s.up_at[e0 + i] : nullptr);
    }
  }
}
template <bool kBf16>
void unpack_group16_bits(float* out, uint16_t* out16, const PlaneUnpackArgs& a, int64_t channels, int64_t n,
                         int64_t c0, const Group16Scratch& s, const char* ahead) {
  switch (a.codes ? a.g->bits : 0) {
    case 0: return unpack_group16<0, kBf16>(out, out16, a, channels, n, c0, s, ahead);
    case 1: return unpack_group16<1, kBf16>(out, out16, a, channels, n, c0, s, ahead);
    case 2: return unpack_group16<2, kBf16>(out, out16, a, channels, n, c0, s, ahead);
    case 4: return unpack_group16<4, kBf16>(out, out16, a, channels, n, c0, s, ahead);
    case 8: return unpack_group16<8, kBf16>(out, out16, a, channels, n, c0, s, ahead);
    default: return;  // unpack_all_groups16 refused other widths before the threads started
  }
}
#else
bool lanes16(const PlaneGeometry&, int64_t) { return false; }
void pack_group16_bits(const PlanePackArgs&, int64_t, int64_t, int64_t, const Group16Scratch&, const float*) {}
template <bool kBf16>
void unpack_group16_bits(float*, uint16_t*, const PlaneUnpackArgs&, int64_t, int64_t, int64_t, const Group16Scratch&,
                         const char*) {}
#endif

}  // namespace

CodecSimd set_codec_simd(CodecSimd widest) {
  const CodecSimd was = has_avx512f ? CodecSimd::Avx512 : has_avx2 ? CodecSimd::Avx2 : CodecSimd::Portable;
  has_avx512f = widest == CodecSimd::Avx512 && cpu_has_avx512f;
  has_avx512bw = widest == CodecSimd::Avx512 && cpu_has_avx512bw;
  has_avx2 = widest != CodecSimd::Portable && cpu_has_avx2 && !has_avx512bw;
  return was;
}
CodecSimd codec_simd_supported() {
  return cpu_has_avx512bw ? CodecSimd::Avx512 : cpu_has_avx2 ? CodecSimd::Avx2 : CodecSimd::Portable;
}
const char* codec_simd_name(CodecSimd level) {
  switch (level) {
    case CodecSimd::Avx512: return "avx512";
    case CodecSimd::Avx2: return "avx2";
    case CodecSimd::Portable: return "portable";
  }
  return "?";
}

void quant_params_from_keys(uint16_t* mins, uint16_t* steps, const int32_t* lo_keys, const int32_t* hi_keys, int64_t n,
                            int bits) {
  int64_t j = 0;
#ifdef ACTLAB_X86_INTRINSICS
  if (has_avx512bw)
    for (; j + 16 <= n; j += 16) quant_params16_store(mins + j, steps + j, lo_keys + j, hi_keys + j, bits);
#endif
  for (; j < n; ++j)
    quant_params(mins[j], steps[j], float_from_order_key(lo_keys[j]), float_from_order_key(hi_keys[j]), bits);
}

void plane_pack(uint16_t* lfc, uint8_t* codes, uint16_t* mins, uint16_t* steps, float* residual,
                const float* x, const PlaneGeometry& g, bool with_lfc, uint64_t seed, uint64_t stream) {
  const UpsampleMap map(g);
  const PlanePackArgs args{lfc, codes, mins, steps, residual, x, &g, &map, with_lfc, seed, stream};
  PackScratch sizing;
  for_each_thread_range(g.planes, g.planes * g.plane_elems(), carve_pack_scratch(sizing, nullptr, g),
                        [&](int64_t first, int64_t last, uint8_t* scratch) { pack_planes(args, first, last, scratch); });
}

void plane_pack_channels_last(uint16_t* lfc, uint8_t* codes, uint16_t* mins, uint16_t* steps, float* residual,
                              const float* x, const PlaneGeometry& g, int64_t channels, bool with_lfc, uint64_t seed,
                              uint64_t stream) {
  ACTLAB_CHECK(channels > 0 && g.planes % channels == 0, "plane_pack_channels_last: ", channels, " channels for ",
               g.planes, " planes");
  const UpsampleMap map(g);
  const int64_t E = g.plane_elems(), C = channels, images = g.planes / C;
  if (lanes16(g, C) && !residual) {
    check_lane_bits("plane_pack_channels_last", g, codes != nullptr);
    const PlanePackArgs args{lfc, codes, mins, steps, residual, x, &g, &map, with_lfc, seed, stream};
    const int64_t groups = C / 16;
    for_each_thread_range(images * groups, g.planes * E, group16_scratch(nullptr, nullptr, g),
                          [&](int64_t first, int64_t last, uint8_t* scratch) {
                            Group16Scratch s;
                            group16_scratch(&s, scratch, g);
                            fill_up_at(s.up_at, map, g);
                            for (int64_t t = first; t < last; ++t) {
                              const float* ahead =
                                  t + 1 < last ? x + (t + 1) / groups * E * C + (t + 1) % groups * 16 : nullptr;
                              pack_group16_bits(args, C, t / groups, t % groups * 16, s, ahead);
                            }
                          });
    return;
  }
  // Otherwise a task is one image's tile of channels: sixteen-channel multiples of about 64 KiB of f32, smaller while there are
  // fewer tasks than threads (a small batch), never under sixteen channels.
  int64_t tile = std::min(C, std::max<int64_t>(16, 16384 / E / 16 * 16));
  while (tile > 16 && images * ((C + tile - 1) / tile) < omp_get_max_threads()) tile = (tile / 2 + 15) / 16 * 16;
  const int64_t tiles = (C + tile - 1) / tile;
  PackScratch sizing;
  const int64_t pack_bytes = (carve_pack_scratch(sizing, nullptr, g) + 63) / 64 * 64;
  const int64_t tile_bytes = (tile * E * 4 + 63) / 64 * 64;  // each thread's scratch stays 64-byte aligned
  for_each_thread_range(images * tiles, g.planes * E, pack_bytes + tile_bytes,
                        [&](int64_t first, int64_t last, uint8_t* scratch) {
                          auto* planes = reinterpret_cast<float*>(scratch + pack_bytes);
                          for (int64_t t = first; t < last; ++t) {
                            const int64_t n = t / tiles, c0 = t % tiles * tile, nc = std::min(tile, C - c0);
                            const int64_t p0 = n * C + c0;
                            channels_last_planes(planes, x + n * E * C, C, E, c0, nc);
                            // Plane p of the pack reads planes + (p - p0)·E: the tile stands where the (N, C, H, W)
                            // tensor's planes would.
                            const PlanePackArgs args{lfc, codes, mins, steps, residual, planes - p0 * E, &g, &map,
                                                     with_lfc, seed, stream};
                            pack_planes(args, p0, p0 + nc, scratch);
                          }
                        });
}

void plane_unpack(float* out, const uint16_t* lfc, const uint8_t* codes, const uint16_t* mins,
                  const uint16_t* steps, const PlaneGeometry& g) {
  const UpsampleMap map(g);
  const PlaneUnpackArgs args{out, lfc, codes, mins, steps, &g, &map};
  for_each_thread_range(g.planes, g.planes * g.plane_elems(), unpack_scratch_bytes(g),
                        [&](int64_t first, int64_t last, uint8_t* scratch) { unpack_planes(args, first, last, scratch); });
}

bool plane_channels_last_lanes(const PlaneGeometry& g, int64_t channels) { return lanes16(g, channels); }

namespace {
// The sixteen-channel decodes with the planes in the lanes (unpack_group16), f32 or bf16.
void unpack_all_groups16(float* out, uint16_t* out16, const uint16_t* lfc, const uint8_t* codes, const uint16_t* mins,
                         const uint16_t* steps, const PlaneGeometry& g, int64_t channels) {
  check_lane_bits("plane decode", g, codes != nullptr);
  ACTLAB_CHECK(lfc || codes, "plane decode: neither an LFC nor codes to decode");
  const UpsampleMap map(g);
  const PlaneUnpackArgs args{out, lfc, codes, mins, steps, &g, &map};
  const int64_t groups = channels / 16;
  for_each_thread_range(g.planes / 16, g.planes * g.plane_elems(), group16_scratch(nullptr, nullptr, g),
                        [&](int64_t first, int64_t last, uint8_t* scratch) {
                          Group16Scratch s;
                          group16_scratch(&s, scratch, g);
                          fill_up_at(s.up_at, map, g);
                          const int64_t E = g.plane_elems();
                          for (int64_t t = first; t < last; ++t) {
                            // The next group's first value (its position e at + e·channels), or none.
                            const int64_t next =
                                t + 1 < last ? (t + 1) / groups * E * channels + (t + 1) % groups * 16 : -1;
                            if (out16)
                              unpack_group16_bits<true>(
                                  nullptr, out16, args, channels, t / groups, t % groups * 16, s,
                                  next < 0 ? nullptr : reinterpret_cast<const char*>(out16 + next));
                            else
                              unpack_group16_bits<false>(
                                  out, nullptr, args, channels, t / groups, t % groups * 16, s,
                                  next < 0 ? nullptr : reinterpret_cast<const char*>(out + next));
                          }
                        });
}
}  // namespace

void plane_unpack_channels_last(float* out, const uint16_t* lfc, const uint8_t* codes, const uint16_t* mins,
                                const uint16_t* steps, const PlaneGeometry& g, int64_t channels) {
  ACTLAB_CHECK(lanes16(g, channels), "plane_unpack_channels_last: ", channels, " channels of ", g.height, "x", g.width,
               " planes with ", g.ranges_per_plane(), " code ranges each (plane_channels_last_lanes: AVX-512, channels ",
               "a multiple of 16, one range)");
  unpack_all_groups16(out, nullptr, lfc, codes, mins, steps, g, channels);
}

namespace {
// The sixteen-channel block decodes: out (blocked f32) or out16 (channels-last bf16), whole blocks, one range.
void unpack_all_blocks16(const char* op, float* out, uint16_t* out16, const uint16_t* lfc, const uint8_t* codes,
                         const uint16_t* mins, const uint16_t* steps, const PlaneGeometry& g, int64_t channels) {
  ACTLAB_CHECK(channels > 0 && channels % kChannelBlock == 0 && g.planes % channels == 0, op, ": ", channels,
               " channels (need a multiple of ", kChannelBlock, ") for ", g.planes, " planes");
  ACTLAB_CHECK(g.ranges_per_plane() == 1, op, ": ", g.ranges_per_plane(), " code ranges per plane (it decodes one)");
  const UpsampleMap map(g);
  const PlaneUnpackArgs args{out, lfc, codes, mins, steps, &g, &map};
  for_each_thread_range(g.planes / kChannelBlock, g.planes * g.plane_elems(), block_scratch_bytes(g, out16 != nullptr),
                        [&](int64_t first, int64_t last, uint8_t* scratch) {
                          unpack_blocks16(args, first, last, scratch, out16, channels);
                        });
}
}  // namespace

void plane_unpack_blocked(float* out, const uint16_t* lfc, const uint8_t* codes, const uint16_t* mins,
                          const uint16_t* steps, const PlaneGeometry& g, int64_t channels) {
  unpack_all_blocks16("plane_unpack_blocked", out, nullptr, lfc, codes, mins, steps, g, channels);
}

void plane_unpack_bf16_channels_last(uint16_t* out, const uint16_t* lfc, const uint8_t* codes, const uint16_t* mins,
                                     const uint16_t* steps, const PlaneGeometry& g, int64_t channels) {
  if (lanes16(g, channels)) return unpack_all_groups16(nullptr, out, lfc, codes, mins, steps, g, channels);
  unpack_all_blocks16("plane_unpack_bf16_channels_last", nullptr, out, lfc, codes, mins, steps, g, channels);
}

void plane_unpack_channel(float* out, const uint16_t* lfc, const uint8_t* codes, const uint16_t* mins,
                          const uint16_t* steps, const PlaneGeometry& g, int64_t channels, int64_t c) {
  ACTLAB_CHECK(channels > 0 && g.planes % channels == 0 && c >= 0 && c < channels, "plane_unpack_channel: channel ",
               c, " of ", channels, " for ", g.planes, " planes");
  ACTLAB_CHECK(g.ranges_per_plane() == 1, "plane_unpack_channel: ", g.ranges_per_plane(),
               " code ranges per plane (it decodes one)");
  const UpsampleMap map(g);
  const PlaneUnpackArgs args{out, lfc, codes, mins, steps, &g, &map};
  // Codes of one plane and one up-sampled row: on the stack up to 64×64 planes (called once per channel).
  const size_t bytes = static_cast<size_t>((g.plane_elems() + 63) / 64 * 64 + g.width * 4);
  alignas(64) uint8_t local[4096 + 256 * 4];
  Buffer heap;
  if (bytes > sizeof(local)) heap = Buffer(bytes, MemTag::Workspace);
  unpack_planes_strided(args, c, g.planes / channels, channels, bytes > sizeof(local) ? heap.as<uint8_t>() : local);
}

namespace {

// ---------------------------------------------------------------- per-group pack
ACTLAB_CODEC_CLONES
void pack_groups(uint8_t* codes, uint16_t* mins, uint16_t* steps, const float* x, const GroupGeometry& g,
                 uint64_t seed, uint64_t stream, int64_t first, int64_t last, uint8_t* scratch) {
  const int64_t G = g.group_size, per_sample = g.groups_per_sample(), code_bytes = g.code_bytes_per_group();
  const int levels = quant_levels(g.bits);
  uint8_t* bits = scratch;
  uint8_t* cbuf = scratch + (G + 63) / 64 * 64;
  for (int64_t k = first; k < last; ++k) {
    const int64_t n = k / per_sample, begin = (k % per_sample) * G;
    const int64_t count = std::min(G, g.sample_elems - begin);
    const float* v = x + n * g.sample_elems + begin;
    int32_t lo, hi;
    min_max_keys(lo, hi, v, count);
    if (count < G) lo = std::min(lo, float_order_key(0.f)), hi = std::max(hi, float_order_key(0.f));  // padding
    uint16_t min_bits, step_bits;
    quant_params(min_bits, step_bits, float_from_order_key(lo), float_from_order_key(hi), g.bits);
    mins[k] = min_bits, steps[k] = step_bits;
    const float min = bf16_to_float(min_bits), scale = quant_scale(bf16_to_float(step_bits));
    fill_bits8(bits, seed, stream, static_cast<uint64_t>((g.first_sample + n) * g.sample_elems + begin), count);
    quantize_plane(cbuf, v, bits, count, min, scale, levels);
    std::memset(cbuf + count, 0, static_cast<size_t>(G - count));  // padding: code 0
    pack_run(codes + k * code_bytes, cbuf, G, g.bits);
  }
}

ACTLAB_CODEC_CLONES
void unpack_groups(float* out, const uint8_t* codes, const uint16_t* mins, const uint16_t* steps,
                   const GroupGeometry& g, int64_t first, int64_t last, uint8_t* scratch) {
  const int64_t G = g.group_size, per_sample = g.groups_per_sample(), code_bytes = g.code_bytes_per_group();
  for (int64_t k = first; k < last; ++k) {
    const int64_t n = k / per_sample, begin = (k % per_sample) * G;
    const int64_t count = std::min(G, g.sample_elems - begin);
    unpack_run(scratch, codes + k * code_bytes, count, g.bits);
    const float min = bf16_to_float(mins[k]), step = bf16_to_float(steps[k]);
    float* o = out + n * g.sample_elems + begin;
    for (int64_t e = 0; e < count; ++e) o[e] = dequantize(scratch[e], min, step);
  }
}

}  // namespace

void group_pack(uint8_t* codes, uint16_t* mins, uint16_t* steps, const float* x, const GroupGeometry& g,
                uint64_t seed, uint64_t stream) {
  for_each_thread_range(g.groups(), g.samples * g.sample_elems, (g.group_size + 63) / 64 * 64 * 2,
                        [&](int64_t first, int64_t last, uint8_t* scratch) {
                          pack_groups(codes, mins, steps, x, g, seed, stream, first, last, scratch);
                        });
}

void group_unpack(float* out, const uint8_t* codes, const uint16_t* mins, const uint16_t* steps,
                  const GroupGeometry& g) {
  for_each_thread_range(g.groups(), g.samples * g.sample_elems, (g.group_size + 63) / 64 * 64,
                        [&](int64_t first, int64_t last, uint8_t* scratch) {
                          unpack_groups(out, codes, mins, steps, g, first, last, scratch);
                        });
}

namespace {
ACTLAB_CODEC_CLONES
void range_norms(double* out, const float* x, const GroupGeometry& g, int64_t first, int64_t last) {
  const int64_t G = g.group_size;
  for (int64_t n = first; n < last; ++n) {
    double sum = 0.0;
    for (int64_t begin = 0; begin < g.sample_elems; begin += G) {
      const int64_t count = std::min(G, g.sample_elems - begin);
      int32_t lo, hi;
      min_max_keys(lo, hi, x + n * g.sample_elems + begin, count);
      if (count < G) lo = std::min(lo, float_order_key(0.f)), hi = std::max(hi, float_order_key(0.f));  // padding
      const double range = static_cast<double>(float_from_order_key(hi) - float_from_order_key(lo));
      sum += range * range;
    }
    out[n] = sum;
  }
}
}  // namespace

void group_range_norms(double* out, const float* x, const GroupGeometry& g) {
  for_each_thread_range(g.samples, g.samples * g.sample_elems, 0,
                        [&](int64_t first, int64_t last, uint8_t*) { range_norms(out, x, g, first, last); });
}

}  // namespace cpu
}  // namespace actlab
