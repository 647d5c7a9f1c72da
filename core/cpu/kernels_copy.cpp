// Copies between tensor layouts (core/cpu/kernels.h, StridedCopy): the fast loop Tensor::copy_ runs and
// the one-element-at-a-time reference it is tested against (tests/test_token_ops.cpp). And the conversions
// to bf16: plain, and the transposing ones between (N, C, H, W) and channels-last that a bf16 convolution's
// operands take (tests/test_cpu_kernels.cpp, against plain loops).
#include <algorithm>
#include <cstring>

#include "actlab/core/bf16.h"
#include "actlab/core/cpu/intrinsics.h"
#include "actlab/core/cpu/kernels.h"
#include "actlab/core/token_math.h"

namespace actlab::cpu {
namespace {

template <typename T>
void copy_rows(T* dst, const T* src, const StridedCopy& c) {
  const int last = c.ndim - 1;
  const int64_t n = c.shape[last], ds = c.dst_strides[last], ss = c.src_strides[last];
  int64_t rows = 1;
  for (int k = 0; k < last; ++k) rows *= c.shape[k];
#pragma omp parallel for if (rows * n > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    T* d = dst + token_math::strided_offset(r, c.shape, c.dst_strides, last);
    const T* s = src + token_math::strided_offset(r, c.shape, c.src_strides, last);
    if (ds == 1 && ss == 1) {
      std::memcpy(d, s, static_cast<size_t>(n) * sizeof(T));
    } else {
      for (int64_t j = 0; j < n; ++j) d[j * ds] = s[j * ss];
    }
  }
}

}  // namespace

void strided_copy(void* dst, const void* src, const StridedCopy& c) {
  if (c.ndim == 0) {
    std::memcpy(dst, src, static_cast<size_t>(c.elem_bytes));
    return;
  }
  for (int k = 0; k < c.ndim; ++k)
    if (c.shape[k] == 0) return;
  switch (c.elem_bytes) {
    case 1: copy_rows(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), c); break;
    case 2: copy_rows(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), c); break;
    case 4: copy_rows(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), c); break;
    default: copy_rows(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(src), c); break;
  }
}

StridedCopy coalesce_dims(const StridedCopy& c) {
  StridedCopy out;
  out.elem_bytes = c.elem_bytes;
  for (int k = 0; k < c.ndim; ++k) {
    if (c.shape[k] == 1) continue;
    const int m = out.ndim - 1;  // the last dim kept so far: merge dim k into it when both layouts allow
    if (m >= 0 && out.dst_strides[m] == c.dst_strides[k] * c.shape[k] &&
        out.src_strides[m] == c.src_strides[k] * c.shape[k]) {
      out.shape[m] *= c.shape[k];
      out.dst_strides[m] = c.dst_strides[k];
      out.src_strides[m] = c.src_strides[k];
      continue;
    }
    out.shape[out.ndim] = c.shape[k];
    out.dst_strides[out.ndim] = c.dst_strides[k];
    out.src_strides[out.ndim] = c.src_strides[k];
    ++out.ndim;
  }
  return out;
}

void strided_copy_ref(void* dst, const void* src, const StridedCopy& c) {
  int64_t numel = 1;
  for (int k = 0; k < c.ndim; ++k) numel *= c.shape[k];
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  for (int64_t i = 0; i < numel; ++i) {
    std::memcpy(d + token_math::strided_offset(i, c.shape, c.dst_strides, c.ndim) * c.elem_bytes,
                s + token_math::strided_offset(i, c.shape, c.src_strides, c.ndim) * c.elem_bytes,
                static_cast<size_t>(c.elem_bytes));
  }
}

// The bf16 conversions' loops are compiled for AVX-512 and AVX2 as well (ACTLAB_CPU_CLONES; integer
// operations only, so every clone gives the same bits). Compiled for the baseline alone, the narrowing
// to 16 bits was a chain of SSE2 unpacks: to_bf16 ran at a third of memcpy's rate and took 12.5 % of a
// bf16 MobileNetV2 step on an Intel Xeon (model 207), more than its bf16 convolutions saved.
ACTLAB_CPU_CLONES void to_bf16_serial(uint16_t* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_bf16(x[i]);
}
ACTLAB_CPU_CLONES void from_bf16_serial(float* y, const uint16_t* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_float(x[i]);
}

namespace {
// to_bf16_channels_last works on one image's positions [p0, p0 + np), np <= kTile, channel block by channel block.
constexpr int64_t kTile = 32;

// The portable tile: each channel's row is narrowed (a vector loop) into a small block, which is then written out
// transposed, one contiguous run of channels per position. A clone called once per tile from the parallel loop
// below, as parallel_elements calls its ranges.
ACTLAB_CPU_CLONES void to_bf16_channels_last_tile(uint16_t* y, const float* x, int64_t C, int64_t HW, int64_t p0,
                                                  int64_t np) {
  uint16_t block[kTile][kTile];
  for (int64_t c0 = 0; c0 < C; c0 += kTile) {
    const int64_t nc = std::min(kTile, C - c0);
    for (int64_t c = 0; c < nc; ++c) {
      const float* from = x + (c0 + c) * HW + p0;
      for (int64_t p = 0; p < np; ++p) block[c][p] = float_to_bf16(from[p]);
    }
    for (int64_t p = 0; p < np; ++p) {
      uint16_t* row = y + (p0 + p) * C + c0;
      for (int64_t c = 0; c < nc; ++c) row[c] = block[c][p];
    }
  }
}

#ifdef ACTLAB_X86_INTRINSICS

// r[i] holds row i of a 16 x 16 f32 block; afterwards r[j] holds its column j. Interleaves within 128-bit lanes
// (32-bit, then 64-bit), then transposes the 4 x 4 matrix of lanes of each group of four vectors.
ACTLAB_AVX512 inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  __m512 u[16];  // u[4g + m], lane k: rows 4g .. 4g+3 at column 4k + m
  for (int g = 0; g < 16; g += 4) {
    u[g] = _mm512_shuffle_ps(t[g], t[g + 2], 0x44);
    u[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], 0xEE);
    u[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0x44);
    u[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
  }
  for (int m = 0; m < 4; ++m) {  // column 4k + m, lane g = u[4g + m], lane k
    const __m512 v0 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x44), v1 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xEE);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x44);
    const __m512 v3 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xEE);
    r[m] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    r[4 + m] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
    r[8 + m] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    r[12 + m] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
  }
}

// The tile on AVX-512: whole 16 x 16 blocks transposed in registers and narrowed there, one 32-byte store of 16
// channels per position; the ragged edges (C or np not a multiple of 16) one element at a time.
ACTLAB_AVX512 void to_bf16_channels_last_tile_avx512(uint16_t* y, const float* x, int64_t C, int64_t HW, int64_t p0,
                                                     int64_t np) {
  const int64_t c_full = C / 16 * 16, p_full = np / 16 * 16;
  for (int64_t c0 = 0; c0 < c_full; c0 += 16)
    for (int64_t q0 = 0; q0 < p_full; q0 += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(x + (c0 + i) * HW + p0 + q0);
      transpose16(r);
      for (int j = 0; j < 16; ++j)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + (p0 + q0 + j) * C + c0), narrow_bf16(r[j]));
    }
  for (int64_t p = 0; p < np; ++p) {
    const int64_t c_begin = p < p_full ? c_full : 0;  // positions past p_full: every channel
    for (int64_t c = c_begin; c < C; ++c) y[(p0 + p) * C + c] = float_to_bf16(x[c * HW + p0 + p]);
  }
}

// One image's channels [c0, c0 + 16) over all positions: 16 x 16 blocks read as 16 positions' channel runs,
// transposed in registers and written as 16 channels' position runs; positions past the last whole block one
// element at a time.
ACTLAB_AVX512 void channels_last_to_nchw_block_avx512(float* y, const float* x, int64_t C, int64_t HW, int64_t c0) {
  const int64_t p_full = HW / 16 * 16;
  for (int64_t p0 = 0; p0 < p_full; p0 += 16) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(x + (p0 + i) * C + c0);
    transpose16(r);
    for (int j = 0; j < 16; ++j) _mm512_storeu_ps(y + (c0 + j) * HW + p0, r[j]);
  }
  for (int64_t c = c0; c < c0 + 16; ++c)
    for (int64_t p = p_full; p < HW; ++p) y[c * HW + p] = x[p * C + c];
}

// The inverse: one image's channels [c0, c0 + 16), 16 x 16 blocks read as 16 channels' position runs and written
// as 16 positions' channel runs.
ACTLAB_AVX512 void nchw_to_channels_last_block_avx512(float* y, const float* x, int64_t C, int64_t HW, int64_t c0) {
  const int64_t p_full = HW / 16 * 16;
  for (int64_t p0 = 0; p0 < p_full; p0 += 16) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(x + (c0 + i) * HW + p0);
    transpose16(r);
    for (int j = 0; j < 16; ++j) _mm512_storeu_ps(y + (p0 + j) * C + c0, r[j]);
  }
  for (int64_t c = c0; c < c0 + 16; ++c)
    for (int64_t p = p_full; p < HW; ++p) y[p * C + c] = x[c * HW + p];
}
#endif
}  // namespace

namespace {
// The f32 transposes between (N, C, HW) and (N, HW, C), to_channels_last saying which way: one image's block of
// 16 channels per task, in registers on AVX-512 CPUs.
void transpose_f32(float* y, const float* x, int64_t N, int64_t C, int64_t HW, bool to_channels_last,
                   bool allow_avx512) {
  const int64_t blocks = (C + 15) / 16;
#pragma omp parallel for schedule(static) if (N * C * HW > kParallelGrain)
  for (int64_t t = 0; t < N * blocks; ++t) {
    const int64_t n = t / blocks, c0 = t % blocks * 16, nc = std::min<int64_t>(16, C - c0);
    float* image_y = y + n * C * HW;
    const float* image_x = x + n * C * HW;
#ifdef ACTLAB_X86_INTRINSICS
    if (allow_avx512 && cpu_has_avx512f && nc == 16) {
      if (to_channels_last)
        nchw_to_channels_last_block_avx512(image_y, image_x, C, HW, c0);
      else
        channels_last_to_nchw_block_avx512(image_y, image_x, C, HW, c0);
      continue;
    }
#endif
    for (int64_t c = c0; c < c0 + nc; ++c)
      for (int64_t p = 0; p < HW; ++p) {
        if (to_channels_last)
          image_y[p * C + c] = image_x[c * HW + p];
        else
          image_y[c * HW + p] = image_x[p * C + c];
      }
  }
}
}  // namespace

void channels_last_to_nchw(float* y, const float* x, int64_t N, int64_t C, int64_t HW, bool allow_avx512) {
  transpose_f32(y, x, N, C, HW, false, allow_avx512);
}

void channels_last_planes(float* planes, const float* x, int64_t C, int64_t HW, int64_t c0, int64_t nc) {
  float* const y = planes - c0 * HW;  // the block functions index planes by absolute channel
  int64_t c = c0;
#ifdef ACTLAB_X86_INTRINSICS
  if (cpu_has_avx512f)
    for (; c + 16 <= c0 + nc; c += 16) channels_last_to_nchw_block_avx512(y, x, C, HW, c);
#endif
  for (; c < c0 + nc; ++c)
    for (int64_t p = 0; p < HW; ++p) y[c * HW + p] = x[p * C + c];
}

void nchw_to_channels_last(float* y, const float* x, int64_t N, int64_t C, int64_t HW, bool allow_avx512) {
  transpose_f32(y, x, N, C, HW, true, allow_avx512);
}

void to_bf16_channels_last(uint16_t* y, const float* x, int64_t N, int64_t C, int64_t HW, bool allow_avx512) {
  const int64_t tiles = (HW + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) if (N * C * HW > kParallelGrain)
  for (int64_t t = 0; t < N * tiles; ++t) {
    const int64_t n = t / tiles, p0 = t % tiles * kTile, np = std::min(kTile, HW - p0);
    uint16_t* image_y = y + n * HW * C;
    const float* image_x = x + n * C * HW;
#ifdef ACTLAB_X86_INTRINSICS
    if (allow_avx512 && cpu_has_avx512f) {
      to_bf16_channels_last_tile_avx512(image_y, image_x, C, HW, p0, np);
      continue;
    }
#endif
    to_bf16_channels_last_tile(image_y, image_x, C, HW, p0, np);
  }
}

void to_bf16(uint16_t* y, const float* x, int64_t n) {
  parallel_elements(n, [=](int64_t i0, int64_t i1) { to_bf16_serial(y + i0, x + i0, i1 - i0); });
}

void from_bf16(float* y, const uint16_t* x, int64_t n) {
  parallel_elements(n, [=](int64_t i0, int64_t i1) { from_bf16_serial(y + i0, x + i0, i1 - i0); });
}

void to_f16(uint16_t* y, const float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_f16(x[i]);
}

void from_f16(float* y, const uint16_t* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) y[i] = f16_to_float(x[i]);
}

}  // namespace actlab::cpu
