// CPU element-wise kernels: ReLU / ReLU6 / add+ReLU with 1-bit masks, add, accumulate, Philox
// dropout, and the CIFAR ResNet "option A" shortcut. Contracts in core/cpu/kernels.h; tested in
// tests/test_cpu_kernels.cpp.
// Mask kernels work one 32-element word at a time: a full word is a fixed 32-trip loop the compiler
// unrolls and vectorizes (bits come from a constant table, not per-lane shifts, which SSE2 lacks),
// the tail word a short loop. The hot loops sit in ACTLAB_CPU_CLONES *_range functions, called
// once per chunk of 512 words, so they run as AVX2/AVX-512 code where the CPU has it.
#include <algorithm>
#include <cfloat>
#include <cstring>

#include "actlab/core/cpu/kernels.h"
#include "actlab/core/error.h"
#include "actlab/core/philox.h"

namespace actlab::cpu {
namespace {

// Runs range(first_word, end_word) over chunks of the mask words of n elements, in parallel.
template <typename RangeFn>
void parallel_words(int64_t n, RangeFn range) {
  constexpr int64_t kChunkWords = 512;  // 16384 elements per call
  const int64_t words = mask_words(n);
  const int64_t chunks = (words + kChunkWords - 1) / kChunkWords;
#pragma omp parallel for schedule(static) if (parallel : n >= kParallelGrain)
  for (int64_t c = 0; c < chunks; ++c)
    range(c * kChunkWords, std::min(words, (c + 1) * kChunkWords));
}

// Bit j of a mask word as a table entry: SSE2 has no per-lane variable shift, but an AND with a
// constant vector and a compare vectorize everywhere.
alignas(64) constexpr uint32_t kBit[32] = {
    1u << 0,  1u << 1,  1u << 2,  1u << 3,  1u << 4,  1u << 5,  1u << 6,  1u << 7,
    1u << 8,  1u << 9,  1u << 10, 1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15,
    1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, 1u << 22, 1u << 23,
    1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31};

// Writes mask words [w0, w1) of an n-element mask: bit i = elem(i), where elem also stores the
// op's output for element i. Inlined into each cloned caller, so it vectorizes for that clone.
template <typename ElemFn>
inline void build_mask_words(uint32_t* mask, int64_t w0, int64_t w1, int64_t n, ElemFn elem) {
  for (int64_t w = w0; w < w1; ++w) {
    const int64_t first = w * 32;
    uint32_t bits = 0;
    if (first + 32 <= n) {
#pragma omp simd reduction(| : bits)
      for (int j = 0; j < 32; ++j) bits |= elem(first + j) ? kBit[j] : 0u;
    } else {
      for (int j = 0; j < n - first; ++j) bits |= elem(first + j) ? kBit[j] : 0u;
    }
    mask[w] = bits;
  }
}

// v if bit j of bits is set, else +0 (also for a NaN v), as a bitwise AND: a `?:` here is
// "control flow" to GCC's vectorizer without AVX-512 masks.
inline float keep_if_bit(float v, uint32_t bits, int j) {
  const uint32_t all_or_none = 0u - static_cast<uint32_t>((bits & kBit[j]) != 0);
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  u &= all_or_none;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

// dx = bit ? dy·scale : 0 over mask words [w0, w1) of n elements.
ACTLAB_CPU_CLONES void masked_scale_range(float* dx, const uint32_t* mask, const float* dy,
                                          int64_t w0, int64_t w1, int64_t n, float scale) {
  for (int64_t w = w0; w < w1; ++w) {
    const int64_t first = w * 32;
    const uint32_t bits = mask[w];
    float* d = dx + first;
    const float* g = dy + first;
    if (first + 32 <= n) {
#pragma omp simd
      for (int j = 0; j < 32; ++j) d[j] = keep_if_bit(g[j] * scale, bits, j);
    } else {
      for (int j = 0; j < n - first; ++j) d[j] = keep_if_bit(g[j] * scale, bits, j);
    }
  }
}

void masked_scale(float* dx, const uint32_t* mask, const float* dy, int64_t n, float scale) {
  parallel_words(
      n, [=](int64_t w0, int64_t w1) { masked_scale_range(dx, mask, dy, w0, w1, n, scale); });
}

// ReLU keeps NaN: (v <= 0) is false for NaN, so y = v. The mask bit (v > 0) is 0 for NaN.
ACTLAB_CPU_CLONES void relu_range(float* y, uint32_t* mask, const float* x, int64_t w0, int64_t w1,
                                  int64_t n) {
  build_mask_words(mask, w0, w1, n, [=](int64_t i) {
    const float v = x[i];
    y[i] = (v <= 0.f) ? 0.f : v;
    return v > 0.f;
  });
}

ACTLAB_CPU_CLONES void relu_mask_range(uint32_t* mask, const float* y, int64_t w0, int64_t w1,
                                       int64_t n) {
  build_mask_words(mask, w0, w1, n, [=](int64_t i) { return y[i] > 0.f; });
}

ACTLAB_CPU_CLONES void add_relu_range(float* y, uint32_t* mask, const float* a, const float* b,
                                      int64_t w0, int64_t w1, int64_t n) {
  build_mask_words(mask, w0, w1, n, [=](int64_t i) {
    const float v = a[i] + b[i];
    y[i] = (v <= 0.f) ? 0.f : v;
    return v > 0.f;
  });
}

ACTLAB_CPU_CLONES void relu6_range(float* y, uint32_t* mask, const float* x, int64_t w0, int64_t w1,
                                   int64_t n) {
  build_mask_words(mask, w0, w1, n, [=](int64_t i) {
    const float v = x[i];
    y[i] = (v <= 0.f) ? 0.f : ((v >= 6.f) ? 6.f : v);  // NaN fails both tests and passes
    return v > 0.f && v < 6.f;
  });
}

// Plain element-wise loops go through parallel_elements (kernels.h) for the same dispatch-once-per-chunk
// reason.

ACTLAB_CPU_CLONES void add_range(float* y, const float* a, const float* b, int64_t i0, int64_t i1) {
#pragma omp simd
  for (int64_t i = i0; i < i1; ++i) y[i] = a[i] + b[i];
}

ACTLAB_CPU_CLONES void accumulate_range(float* y, const float* a, int64_t i0, int64_t i1) {
#pragma omp simd
  for (int64_t i = i0; i < i1; ++i) y[i] += a[i];
}

}  // namespace

void relu_forward(float* y, uint32_t* mask, const float* x, int64_t n) {
  parallel_words(n, [=](int64_t w0, int64_t w1) { relu_range(y, mask, x, w0, w1, n); });
}

void relu_mask_from_output(uint32_t* mask, const float* y, int64_t n) {
  parallel_words(n, [=](int64_t w0, int64_t w1) { relu_mask_range(mask, y, w0, w1, n); });
}

namespace {
// Element j of a word: bit set -> max(v, FLT_MIN) (positive) or v, clear -> +0, NaN either way (selects, which
// vectorize).
ACTLAB_CPU_CLONES void restore_sign_range(float* v, const uint32_t* mask, bool positive, int64_t w0, int64_t w1,
                                          int64_t n) {
  for (int64_t w = w0; w < w1; ++w) {
    const int64_t first = w * 32;
    const uint32_t bits = mask[w];
    float* p = v + first;
    const int count = static_cast<int>(std::min<int64_t>(32, n - first));
#pragma omp simd
    for (int j = 0; j < count; ++j) {
      const float x = p[j];
      const float set = positive && !(x > FLT_MIN) ? FLT_MIN : x;
      const float signed_value = (bits & kBit[j]) ? set : 0.f;
      p[j] = x != x ? x : signed_value;
    }
  }
}
}  // namespace

void restore_sign(float* v, const uint32_t* mask, int64_t n, bool positive) {
  parallel_words(n, [=](int64_t w0, int64_t w1) { restore_sign_range(v, mask, positive, w0, w1, n); });
}

void relu_backward(float* dx, const uint32_t* mask, const float* dy, int64_t n) {
  masked_scale(dx, mask, dy, n, 1.f);
}

void add_relu_forward(float* y, uint32_t* mask, const float* a, const float* b, int64_t n) {
  parallel_words(n, [=](int64_t w0, int64_t w1) { add_relu_range(y, mask, a, b, w0, w1, n); });
}

void relu6_forward(float* y, uint32_t* mask, const float* x, int64_t n) {
  parallel_words(n, [=](int64_t w0, int64_t w1) { relu6_range(y, mask, x, w0, w1, n); });
}

void relu6_backward(float* dx, const uint32_t* mask, const float* dy, int64_t n) {
  masked_scale(dx, mask, dy, n, 1.f);
}

void add(float* y, const float* a, const float* b, int64_t n) {
  parallel_elements(n, [=](int64_t i0, int64_t i1) { add_range(y, a, b, i0, i1); });
}

void accumulate(float* y, const float* a, int64_t n) {
  parallel_elements(n, [=](int64_t i0, int64_t i1) { accumulate_range(y, a, i0, i1); });
}

void dropout_forward(float* y, uint32_t* keep_mask, const float* x, int64_t n, float p,
                     uint64_t seed, uint64_t stream) {
  ACTLAB_CHECK(p >= 0.f && p <= 1.f, "dropout: p must be in [0, 1], got ", p);
  const float scale = p < 1.f ? 1.f / (1.f - p) : 0.f;
  parallel_words(n, [=](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t first = w * 32, count = std::min<int64_t>(32, n - first);
      // philox_bits(seed, stream, i) is lane i % 4 of block i / 4; a word starts on a block
      // boundary (32 % 4 == 0), so one Philox call serves four elements here, same numbers.
      uint32_t bits = 0;
      for (int64_t j0 = 0; j0 < count; j0 += 4) {
        const uint64_t block = static_cast<uint64_t>(first + j0) >> 2;
        const Philox4 c{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                         static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)}};
        const Philox4 r =
            philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
        for (int64_t j = j0; j < std::min<int64_t>(count, j0 + 4); ++j) {
          const float u = static_cast<float>(r.v[j & 3] >> 8) * (1.0f / 16777216.0f);
          const bool keep = u >= p;
          bits |= keep ? kBit[j] : 0u;
          y[first + j] = keep ? x[first + j] * scale : 0.f;
        }
      }
      keep_mask[w] = bits;
    }
  });
}

void dropout_backward(float* dx, const uint32_t* keep_mask, const float* dy, int64_t n, float p) {
  ACTLAB_CHECK(p >= 0.f && p <= 1.f, "dropout: p must be in [0, 1], got ", p);
  masked_scale(dx, keep_mask, dy, n, p < 1.f ? 1.f / (1.f - p) : 0.f);
}

namespace {
// The output's size and the channels padded in front, once the sizes are checked.
struct ShortcutDims {
  int64_t Ho, Wo, pad_front;
};
ShortcutDims check_shortcut(int64_t N, int64_t C_in, int64_t H, int64_t W, int64_t stride, int64_t C_out) {
  ACTLAB_CHECK(N > 0 && C_in > 0 && H > 0 && W > 0,
               "shortcut_pad: sizes must be positive, got N=", N, " C_in=", C_in, " H=", H,
               " W=", W);
  ACTLAB_CHECK(stride >= 1, "shortcut_pad: stride must be >= 1, got ", stride);
  ACTLAB_CHECK(C_out >= C_in, "shortcut_pad: C_out ", C_out, " < C_in ", C_in);
  return {(H + stride - 1) / stride, (W + stride - 1) / stride, (C_out - C_in) / 2};
}
}  // namespace

void shortcut_pad_forward(float* y, const float* x, int64_t N, int64_t C_in, int64_t H, int64_t W,
                          int64_t stride, int64_t C_out) {
  const ShortcutDims d = check_shortcut(N, C_in, H, W, stride, C_out);
  const int64_t Ho = d.Ho, Wo = d.Wo, pad_front = d.pad_front;
#pragma omp parallel for schedule(static) if (parallel : N * C_out * Ho * Wo >= kParallelGrain)
  for (int64_t nc = 0; nc < N * C_out; ++nc) {
    const int64_t n = nc / C_out, c = nc % C_out - pad_front;  // c: input channel
    float* yp = y + nc * Ho * Wo;
    if (c < 0 || c >= C_in) {
      std::memset(yp, 0, sizeof(float) * Ho * Wo);
      continue;
    }
    const float* xp = x + (n * C_in + c) * H * W;
    if (stride == 1) {
      std::memcpy(yp, xp, sizeof(float) * H * W);
      continue;
    }
    for (int64_t h = 0; h < Ho; ++h)
      for (int64_t w = 0; w < Wo; ++w) yp[h * Wo + w] = xp[h * stride * W + w * stride];
  }
}

void shortcut_pad_backward(float* dx, const float* dy, int64_t N, int64_t C_in, int64_t H,
                           int64_t W, int64_t stride, int64_t C_out) {
  const ShortcutDims d = check_shortcut(N, C_in, H, W, stride, C_out);
  const int64_t Ho = d.Ho, Wo = d.Wo, pad_front = d.pad_front;
#pragma omp parallel for schedule(static) if (parallel : N * C_in * H * W >= kParallelGrain)
  for (int64_t nc = 0; nc < N * C_in; ++nc) {
    const int64_t n = nc / C_in, c = nc % C_in;
    float* dxp = dx + nc * H * W;
    const float* dyp = dy + (n * C_out + c + pad_front) * Ho * Wo;
    if (stride == 1) {
      std::memcpy(dxp, dyp, sizeof(float) * H * W);
      continue;
    }
    std::memset(dxp, 0, sizeof(float) * H * W);
    for (int64_t h = 0; h < Ho; ++h)
      for (int64_t w = 0; w < Wo; ++w) dxp[h * stride * W + w * stride] = dyp[h * Wo + w];
  }
}

void shortcut_pad_forward_channels_last(float* y, const float* x, int64_t N, int64_t C_in, int64_t H, int64_t W,
                                        int64_t stride, int64_t C_out) {
  const ShortcutDims d = check_shortcut(N, C_in, H, W, stride, C_out);
  const int64_t Ho = d.Ho, Wo = d.Wo, pad_front = d.pad_front;
  const int64_t pad_back = C_out - C_in - pad_front;
#pragma omp parallel for schedule(static) if (parallel : N * C_out * Ho * Wo >= kParallelGrain)
  for (int64_t nh = 0; nh < N * Ho; ++nh) {
    const int64_t n = nh / Ho, h = nh % Ho;
    for (int64_t w = 0; w < Wo; ++w) {
      float* row = y + (nh * Wo + w) * C_out;
      const float* from = x + ((n * H + h * stride) * W + w * stride) * C_in;
      std::memset(row, 0, sizeof(float) * pad_front);
      std::memcpy(row + pad_front, from, sizeof(float) * C_in);
      std::memset(row + pad_front + C_in, 0, sizeof(float) * pad_back);
    }
  }
}

void shortcut_pad_backward_channels_last(float* dx, const float* dy, int64_t N, int64_t C_in, int64_t H, int64_t W,
                                         int64_t stride, int64_t C_out) {
  const ShortcutDims d = check_shortcut(N, C_in, H, W, stride, C_out);
  const int64_t Ho = d.Ho, Wo = d.Wo, pad_front = d.pad_front;
#pragma omp parallel for schedule(static) if (parallel : N * C_in * H * W >= kParallelGrain)
  for (int64_t nh = 0; nh < N * H; ++nh) {
    const int64_t n = nh / H, h = nh % H;
    for (int64_t w = 0; w < W; ++w) {
      float* row = dx + (nh * W + w) * C_in;
      if (h % stride != 0 || w % stride != 0) {
        std::memset(row, 0, sizeof(float) * C_in);
        continue;
      }
      std::memcpy(row, dy + ((n * Ho + h / stride) * Wo + w / stride) * C_out + pad_front, sizeof(float) * C_in);
    }
  }
}

}  // namespace actlab::cpu
