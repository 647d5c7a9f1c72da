// CPU pooling: max pool 2-D with a u8 in-window argmax, average pool 2-D (count_include_pad) and
// global average pool, forward and backward. Contracts in core/cpu/kernels.h; tested in
// tests/test_cpu_kernels.cpp. Every kernel is parallel over the N·C planes, which are independent,
// so backward scatters (overlapping windows) need no atomics.
#include <algorithm>
#include <cstring>

#include "actlab/core/cpu/kernels.h"
#include "actlab/core/error.h"

namespace actlab::cpu {
namespace {

// The rows [lo, hi) of a window starting at input row `start` (may be negative: padding) that fall
// inside an input of `extent` rows; same for columns.
struct WindowRange {
  int64_t lo, hi;
};
inline WindowRange clip_window(int64_t start, int64_t window, int64_t extent) {
  return {std::max<int64_t>(0, -start), std::min<int64_t>(window, extent - start)};
}

void maxpool_plane(float* y, uint8_t* argmax, const float* x, const Pool2dShape& s, int64_t P,
                   int64_t Q) {
  for (int64_t p = 0; p < P; ++p) {
    const int64_t h0 = p * s.stride_h - s.pad_h;
    const WindowRange rr = clip_window(h0, s.R, s.H);
    for (int64_t q = 0; q < Q; ++q) {
      const int64_t w0 = q * s.stride_w - s.pad_w;
      const WindowRange sr = clip_window(w0, s.S, s.W);
      float best = x[(h0 + rr.lo) * s.W + w0 + sr.lo];
      int64_t best_pos = rr.lo * s.S + sr.lo;
      for (int64_t r = rr.lo; r < rr.hi; ++r) {
        const float* row = x + (h0 + r) * s.W;
        for (int64_t t = sr.lo; t < sr.hi; ++t) {
          const float v = row[w0 + t];
          // Strictly greater: the first maximum wins. A NaN replaces a number, never a NaN.
          if (v > best || (v != v && best == best)) {
            best = v;
            best_pos = r * s.S + t;
          }
        }
      }
      y[p * Q + q] = best;
      argmax[p * Q + q] = static_cast<uint8_t>(best_pos);
    }
  }
}

}  // namespace

void check_pool_shape(const Pool2dShape& s) {
  ACTLAB_CHECK(s.N > 0 && s.C > 0 && s.H > 0 && s.W > 0,
               "pool2d: input sizes must be positive, got (", s.N, ",", s.C, ",", s.H, ",", s.W,
               ")");
  ACTLAB_CHECK(s.R > 0 && s.S > 0, "pool2d: window must be positive, got ", s.R, "x", s.S);
  ACTLAB_CHECK(s.stride_h >= 1 && s.stride_w >= 1, "pool2d: strides must be >= 1, got ", s.stride_h,
               "x", s.stride_w);
  ACTLAB_CHECK(s.pad_h >= 0 && s.pad_w >= 0 && 2 * s.pad_h <= s.R && 2 * s.pad_w <= s.S,
               "pool2d: padding ", s.pad_h, "x", s.pad_w,
               " must be >= 0 and at most half the window ", s.R, "x", s.S);
  ACTLAB_CHECK(s.H + 2 * s.pad_h >= s.R && s.W + 2 * s.pad_w >= s.S, "pool2d: window ", s.R, "x",
               s.S, " larger than padded input ", s.H + 2 * s.pad_h, "x", s.W + 2 * s.pad_w);
}

void maxpool2d_forward(float* y, uint8_t* argmax, const float* x, const Pool2dShape& s) {
  check_pool_shape(s);
  ACTLAB_CHECK(s.R * s.S <= 256, "maxpool2d: window ", s.R, "x", s.S,
               " has more than 256 positions; the u8 argmax cannot index it");
  const int64_t P = s.P(), Q = s.Q(), planes = s.N * s.C;
#pragma omp parallel for schedule(static) if (parallel : planes * s.H * s.W >= kParallelGrain)
  for (int64_t nc = 0; nc < planes; ++nc)
    maxpool_plane(y + nc * P * Q, argmax + nc * P * Q, x + nc * s.H * s.W, s, P, Q);
}

void maxpool2d_backward(float* dx, const float* dy, const uint8_t* argmax, const Pool2dShape& s) {
  check_pool_shape(s);
  const int64_t P = s.P(), Q = s.Q(), planes = s.N * s.C;
#pragma omp parallel for schedule(static) if (parallel : planes * s.H * s.W >= kParallelGrain)
  for (int64_t nc = 0; nc < planes; ++nc) {
    float* dxp = dx + nc * s.H * s.W;
    const float* dyp = dy + nc * P * Q;
    const uint8_t* ap = argmax + nc * P * Q;
    std::memset(dxp, 0, sizeof(float) * s.H * s.W);
    for (int64_t p = 0; p < P; ++p) {
      const int64_t h0 = p * s.stride_h - s.pad_h;
      for (int64_t q = 0; q < Q; ++q) {
        const int64_t pos = ap[p * Q + q];
        const int64_t h = h0 + pos / s.S, w = q * s.stride_w - s.pad_w + pos % s.S;
        dxp[h * s.W + w] += dyp[p * Q + q];
      }
    }
  }
}

void avgpool2d_forward(float* y, const float* x, const Pool2dShape& s) {
  check_pool_shape(s);
  const int64_t P = s.P(), Q = s.Q(), planes = s.N * s.C;
  const float inv_area = 1.f / static_cast<float>(s.R * s.S);
#pragma omp parallel for schedule(static) if (parallel : planes * s.H * s.W >= kParallelGrain)
  for (int64_t nc = 0; nc < planes; ++nc) {
    const float* xp = x + nc * s.H * s.W;
    float* yp = y + nc * P * Q;
    for (int64_t p = 0; p < P; ++p) {
      const int64_t h0 = p * s.stride_h - s.pad_h;
      const WindowRange rr = clip_window(h0, s.R, s.H);
      for (int64_t q = 0; q < Q; ++q) {
        const int64_t w0 = q * s.stride_w - s.pad_w;
        const WindowRange sr = clip_window(w0, s.S, s.W);
        float sum = 0.f;
        for (int64_t r = rr.lo; r < rr.hi; ++r) {
          const float* row = xp + (h0 + r) * s.W;
          for (int64_t t = sr.lo; t < sr.hi; ++t) sum += row[w0 + t];
        }
        yp[p * Q + q] = sum * inv_area;
      }
    }
  }
}

void avgpool2d_backward(float* dx, const float* dy, const Pool2dShape& s) {
  check_pool_shape(s);
  const int64_t P = s.P(), Q = s.Q(), planes = s.N * s.C;
  const float inv_area = 1.f / static_cast<float>(s.R * s.S);
#pragma omp parallel for schedule(static) if (parallel : planes * s.H * s.W >= kParallelGrain)
  for (int64_t nc = 0; nc < planes; ++nc) {
    float* dxp = dx + nc * s.H * s.W;
    const float* dyp = dy + nc * P * Q;
    std::memset(dxp, 0, sizeof(float) * s.H * s.W);
    for (int64_t p = 0; p < P; ++p) {
      const int64_t h0 = p * s.stride_h - s.pad_h;
      const WindowRange rr = clip_window(h0, s.R, s.H);
      for (int64_t q = 0; q < Q; ++q) {
        const int64_t w0 = q * s.stride_w - s.pad_w;
        const WindowRange sr = clip_window(w0, s.S, s.W);
        const float g = dyp[p * Q + q] * inv_area;
        for (int64_t r = rr.lo; r < rr.hi; ++r) {
          float* row = dxp + (h0 + r) * s.W;
          for (int64_t t = sr.lo; t < sr.hi; ++t) row[w0 + t] += g;
        }
      }
    }
  }
}

void global_avgpool_forward(float* y, const float* x, int64_t N, int64_t C, int64_t HW) {
  ACTLAB_CHECK(N > 0 && C > 0 && HW > 0, "global_avgpool: sizes must be positive, got N=", N,
               " C=", C, " HW=", HW);
  const double inv_hw = 1.0 / static_cast<double>(HW);
#pragma omp parallel for schedule(static) if (parallel : N * C * HW >= kParallelGrain)
  for (int64_t nc = 0; nc < N * C; ++nc) {
    const float* xp = x + nc * HW;
    double total = 0.0;
    for (int64_t i0 = 0; i0 < HW; i0 += 2048) {  // float lanes per chunk, double across chunks
      const int64_t i1 = std::min<int64_t>(HW, i0 + 2048);
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = i0; i < i1; ++i) sum += xp[i];
      total += sum;
    }
    y[nc] = static_cast<float>(total * inv_hw);
  }
}

void global_avgpool_backward(float* dx, const float* dy, int64_t N, int64_t C, int64_t HW) {
  ACTLAB_CHECK(N > 0 && C > 0 && HW > 0, "global_avgpool: sizes must be positive, got N=", N,
               " C=", C, " HW=", HW);
  const float inv_hw = 1.f / static_cast<float>(HW);
#pragma omp parallel for schedule(static) if (parallel : N * C * HW >= kParallelGrain)
  for (int64_t nc = 0; nc < N * C; ++nc) {
    const float g = dy[nc] * inv_hw;
    float* dxp = dx + nc * HW;
#pragma omp simd
    for (int64_t i = 0; i < HW; ++i) dxp[i] = g;
  }
}

}  // namespace actlab::cpu
